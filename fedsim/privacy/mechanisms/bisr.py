"""``bisr``: the banded inverse square root factorization (docs/algorithms.md §3, family ``bisr``).

Kalinin, McKenna, Upadhyay & Lampert, "Back to square roots: an optimal bound on the matrix
factorization error for multi-epoch differentially private SGD" (ICLR 2026). Where ``bsr``
truncates the square root of the workload, BISR truncates its *inverse* square root: the
noising matrix ``C⁻¹`` is banded, the strategy ``C`` is dense.

Coefficients. For the workloads fedsim builds (prefix sum ``S``, momentum ``A_β`` with unit
learning rates; :func:`fedsim.privacy.mechanisms.bsr.workload_beta`) the inverse square root is
the lower-triangular Toeplitz matrix of

    (1 − x)^{1/2} (1 − βx)^{1/2},   coefficients  p_k = Σ_{i=0..k} β^i s_i s_{k−i},

``s_k`` the series of ``(1 − x)^{1/2}``: ``1, −1/2, −1/8, −1/16, −5/128, …``
(``s_k = s_{k−1}(2k − 3)/(2k)``; :func:`inverse_square_root_coefficients`). ``C⁻¹`` keeps
``p_0 … p_{b−1}`` (``b`` bands) and ``C`` is its inverse, the Toeplitz matrix of ``1/P_b(x)``,
``P_b(x) = Σ_{k<b} p_k x^k`` (:func:`toeplitz_inverse_coefficients`). ``b = n`` gives
``C = A^{1/2}`` (for ``S``: the ``sqrt`` mechanism), ``b = 1`` gives ``C = I`` (DP-SGD). No
normalisation: ``p_0 = 1``.

Sensitivity. For both workloads ``p_k ≤ 0`` for ``k ≥ 1`` (checked numerically for ``β`` in
``[0, 1)``), so ``1/P_b = 1/(1 − Σ_{k≥1} |p_k| x^k)`` has non-negative coefficients ``c_k``. When
they are also non-increasing for ``k ≥ 1`` — checked for every plan, and true in every case we
computed — ``C`` satisfies the conditions of the exact ``min_sep`` argument of
:mod:`fedsim.privacy.mechanisms.blt` (its module docstring proves that the worst pattern is
``{0, b', 2b', …}`` with ``min(k, ⌈n/b'⌉)`` participations for a Toeplitz ``C`` with non-negative,
non-increasing coefficients), and that function computes ``sens`` exactly in ``O(k·n)``. The
same pattern is group 0 of ``epochs (k, b')``, a subset of the ``min_sep`` patterns, so the value
is exact for ``epochs`` too. Single participation is the largest column norm (exact). Otherwise
the generic :func:`fedsim.privacy.sensitivity.sensitivity` is used (exact or a proven upper
bound, as it says). ``plan.sens_exact`` and ``info["sensitivity_method"]`` say which.

Streaming (:class:`BISRStream`). ``n_t = Σ_{j<b} p_j ξ_{t−j}`` needs the last ``b − 1`` rows of
``Z``. They are kept in a ring of ``b − 1`` model-sized float32 vectors (one draw per round),
rather than drawn again each round (``b`` draws per round, ``O(d)`` memory): a draw is a keyed
AES-CTR stream turned into normals, which costs more than keeping ``b − 1`` vectors for the
bandwidths the paper uses. The ring is the stream's checkpoint state, so a resumed run continues
with identical rows without needing the key.

``bands`` is not limited by ``sampling.min_sep``: ``C`` is dense whatever ``b``, so the
sensitivity argument does not depend on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from fedsim.errors import FedsimError
from fedsim.privacy.mechanisms.base import Mechanism, MechanismOptions, MFOptions, Strategy
from fedsim.privacy.mechanisms.bsr import lower_toeplitz, resolve_bands, workload_beta
from fedsim.privacy.mechanisms.registry import register
from fedsim.privacy.participation import ParticipationScheme
from fedsim.privacy.sensitivity import toeplitz_pattern_sensitivity_squared
from fedsim.privacy.stream import Draw, NoiseStream

if TYPE_CHECKING:
    import torch
else:
    from fedsim._lazy import torch

__all__ = [
    "BISR",
    "BISROptions",
    "BISRStrategy",
    "BISRStream",
    "inverse_square_root_coefficients",
    "non_increasing",
    "toeplitz_inverse_coefficients",
]


def inverse_square_root_coefficients(n: int, beta: float = 0.0) -> np.ndarray:
    """First ``n`` coefficients of ``A_β^{−1/2}``: the series of ``(1 − x)^{1/2}(1 − βx)^{1/2}``.

    Parameters
    ----------
    n : int
        Number of coefficients; a positive integer.
    beta : float, default 0.0
        Momentum ``β ∈ [0, 1)``; ``0`` is the prefix sum (``1, −1/2, −1/8, −1/16, …``).

    Returns
    -------
    np.ndarray
        ``p_0 … p_{n−1}`` (float64, ``p_0 = 1``).
    """
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise FedsimError(f"the number of coefficients n must be a positive integer, got {n!r}")
    k = np.arange(1, int(n), dtype=np.float64)
    s = np.concatenate(([1.0], np.cumprod((2.0 * k - 3.0) / (2.0 * k))))
    if beta == 0.0:
        return s
    return np.asarray(np.convolve(s, s * beta ** np.arange(int(n), dtype=np.float64))[: int(n)])


def toeplitz_inverse_coefficients(p: np.ndarray, n: int) -> np.ndarray:
    """First ``n`` coefficients of ``1/P(x)``, ``P(x) = Σ_k p_k x^k`` (the Toeplitz inverse).

    ``c_0 = 1/p_0``, ``c_k = −(Σ_{j=1..min(k, b−1)} p_j c_{k−j}) / p_0``, run as an IIR filter
    on a unit impulse.

    Parameters
    ----------
    p : np.ndarray
        ``p_0 … p_{b−1}`` with ``p_0 ≠ 0``.
    n : int
        Number of coefficients.

    Returns
    -------
    np.ndarray
        ``c_0 … c_{n−1}`` (float64).
    """
    from scipy.signal import lfilter

    p = np.asarray(p, dtype=np.float64).reshape(-1)
    if p.size < 1 or p[0] == 0 or not np.all(np.isfinite(p)):
        raise FedsimError("the inverse needs finite coefficients with p_0 ≠ 0")
    impulse = np.zeros(int(n))
    impulse[0] = 1.0
    return np.asarray(lfilter([1.0], p, impulse), dtype=np.float64)


def non_increasing(c: np.ndarray) -> bool:
    """Whether ``c_k ≥ 0`` for all ``k`` and ``c_1 ≥ c_2 ≥ …`` (the exact-sensitivity conditions).

    Parameters
    ----------
    c : np.ndarray
        Toeplitz coefficients ``c_0 … c_{n−1}`` of ``C``.
    """
    c = np.asarray(c, dtype=np.float64)
    return bool(np.all(c >= 0.0) and np.all(np.diff(c[1:]) <= 0.0))


class BISRStream(NoiseStream):
    """Streaming noise of a banded ``C⁻¹``: ``n_t = Σ_{j=0..b−1} p_j ξ_{t−j}`` (``ξ_{<0} = 0``).

    Keeps ``ξ_{t−1} … ξ_{t−b+1}`` in a ring of ``b − 1`` float32 rows (slot of ``ξ_j`` is
    ``j mod (b − 1)``); rows are drawn in order. The state (:meth:`state_dict`) is the next round
    and the stored rows, most recent first.

    Parameters
    ----------
    inverse_coefficients : ``p_0 … p_{b−1}``, the band of ``C⁻¹`` (float64, ``p_0 ≠ 0``).
    rounds : ``n``, the number of rounds the stream covers.
    sens : ``sens(C)`` under the run's scheme.
    name : the mechanism's name (default ``bisr``).
    """

    in_order = True

    def __init__(self, inverse_coefficients: Any, rounds: int, sens: float, name: str = "bisr") -> None:
        super().__init__(sens, name)
        p = np.asarray(inverse_coefficients, dtype=np.float64).reshape(-1)
        if p.size < 1 or p[0] == 0 or not np.all(np.isfinite(p)):
            raise FedsimError("the BISR stream needs finite coefficients with p_0 ≠ 0")
        self.coefficients = p
        self.rounds = int(rounds)
        self.next_t = 0
        self._ring: torch.Tensor | None = None  # (b − 1) × d, float32

    @property
    def bands(self) -> int:
        """``b``: the number of bands of ``C⁻¹``."""
        return int(self.coefficients.size)

    def next_round(self) -> int | None:
        return self.next_t

    def _buffer(self) -> torch.Tensor:
        if self._ring is None:
            self._ring = torch.zeros(self.bands - 1, self.dim, dtype=torch.float32, device=self.device)
        return self._ring

    def step(self, t: int, draw: Draw) -> torch.Tensor:
        if not 0 <= t < self.rounds:
            raise FedsimError(f"the noise stream has {self.rounds} rounds; round {t} does not exist")
        if t != self.next_t:
            raise FedsimError(f"{self.name} noise is streamed in order: expected round {self.next_t}, got {t}")
        xi = draw(t)
        out = xi * float(self.coefficients[0])
        nb = self.bands - 1
        if nb > 0:
            ring = self._buffer()
            m = min(nb, t)
            if m > 0:
                coef = np.zeros(nb, dtype=np.float32)
                coef[(t - np.arange(1, m + 1)) % nb] = self.coefficients[1 : m + 1]
                out.add_(torch.mv(ring.t(), torch.as_tensor(coef, device=self.device)))
            ring[t % nb].copy_(xi)
        self.next_t = t + 1
        return out

    def row_variance(self, t: int) -> float:
        m = min(int(t), self.bands - 1) + 1
        return float(np.sum(self.coefficients[:m] ** 2))

    def state_dict(self) -> dict[str, Any]:
        nb, t = self.bands - 1, self.next_t
        rows = [] if nb == 0 or self._ring is None else [self._ring[(t - j) % nb] for j in range(1, min(nb, t) + 1)]
        return {"next_t": t, "buffer": [r.clone().cpu() for r in rows]}  # ξ_{t−1}, ξ_{t−2}, …

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_t = int(state["next_t"])
        rows = list(state["buffer"])
        nb = self.bands - 1
        if len(rows) != min(nb, self.next_t):
            raise FedsimError(
                f"{self.name} noise state holds {len(rows)} rows of Z, but round {self.next_t} of a stream with "
                f"{self.bands} bands needs {min(nb, self.next_t)}"
            )
        self._ring = None
        for j, r in enumerate(rows, start=1):
            self._buffer()[(self.next_t - j) % nb].copy_(r.to(self.device))


class BISROptions(MFOptions):
    """``privacy.mechanism = "bisr"``.

    Parameters
    ----------
    workload : ``prefix`` (the prefix sums of SGD, default) or ``momentum`` (SGD with the
        server's momentum β, ``server.momentum``; unit learning rates).
    bands : ``b``, the number of bands of ``C⁻¹`` and the rows of ``Z`` the noise stream keeps
        (``b − 1``). Default ``sampling.min_sep``, or the rounds when the scheme has no
        separation; at most the rounds; not limited by ``sampling.min_sep``.
    """

    mechanism: Literal["bisr"] = "bisr"
    bands: int | None = Field(default=None, ge=1)


@dataclass(frozen=True, eq=False)
class BISRStrategy(Strategy):
    """The banded inverse square root: ``C⁻¹`` is lower-triangular Toeplitz with
    ``C⁻¹[i, j] = p_{i−j}`` for ``i − j < b``, ``C`` its (dense, Toeplitz) inverse.

    Parameters
    ----------
    inverse_coefficients : ``p_0 … p_{b−1}``, the band of ``C⁻¹`` (``p_0 ≠ 0``).
    n : the number of rounds.
    info : how it was obtained (``bands``, ``workload_beta``, ``coefficients_monotone``,
        ``sensitivity_method``).
    """

    inverse_coefficients: np.ndarray
    n: int
    info: dict[str, Any]

    @property
    def rounds(self) -> int:
        return self.n

    def coefficients(self) -> np.ndarray:
        """``c_0 … c_{n−1}``, the Toeplitz coefficients of ``C``."""
        return toeplitz_inverse_coefficients(self.inverse_coefficients, self.n)

    def materialize(self) -> np.ndarray:
        return lower_toeplitz(self.coefficients(), self.n)

    def noising(self) -> np.ndarray:
        return lower_toeplitz(self.inverse_coefficients, self.n)

    def sensitivity(self, scheme: ParticipationScheme) -> tuple[float, bool]:
        k = scheme.max_participations or 1
        if k > 1 and scheme.name in ("epochs", "min_sep"):
            c = self.coefficients()
            if non_increasing(c):
                b = scheme.min_separation or self.n
                p = min(k, -(-self.n // b))
                with torch.no_grad():
                    s2 = float(toeplitz_pattern_sensitivity_squared(torch.as_tensor(c), p, b))
                return math.sqrt(s2), True
        return super().sensitivity(scheme)

    def stream(self, sens: float, name: str) -> NoiseStream:
        return BISRStream(self.inverse_coefficients, self.n, sens, name=name)


def sensitivity_method(strategy: BISRStrategy, scheme: ParticipationScheme) -> str:
    """How :meth:`BISRStrategy.sensitivity` computes ``sens`` under ``scheme`` (for reports).

    Parameters
    ----------
    strategy : BISRStrategy
        The plan's strategy.
    scheme : ParticipationScheme
        The run's participation scheme.
    """
    k = scheme.max_participations or 1
    if k == 1 or scheme.name not in ("epochs", "min_sep"):
        return "column norm (exact)"
    if non_increasing(strategy.coefficients()):
        return "toeplitz non-negative non-increasing: pattern {0, b, 2b, …} (exact)"
    return "generic (fedsim.privacy.sensitivity: exact or upper bound, see sens_exact)"


@register
class BISR(Mechanism):
    name = "bisr"
    options = BISROptions
    summary = "banded inverse square root (closed form): dense Toeplitz C, banded C⁻¹; noise from a ring of b − 1 draws"

    def check(self, opts: MechanismOptions, scheme: ParticipationScheme, rounds: int) -> None:
        assert isinstance(opts, BISROptions)
        resolve_bands(opts.bands, scheme, rounds, limit_by_min_sep=False)

    def strategy(self, opts: MechanismOptions, A: np.ndarray, scheme: ParticipationScheme) -> Strategy:
        assert isinstance(opts, BISROptions)
        n = int(A.shape[0])
        b = resolve_bands(opts.bands, scheme, n, limit_by_min_sep=False)
        beta = workload_beta(A)
        strategy = BISRStrategy(inverse_square_root_coefficients(b, beta), n, {"bands": b, "workload_beta": beta})
        strategy.info["coefficients_monotone"] = non_increasing(strategy.coefficients())
        strategy.info["sensitivity_method"] = sensitivity_method(strategy, scheme)
        return strategy
