"""fedsim's own checks of a noise mechanism, run before any ε is computed or printed.

ε is computed for the release ``C·G + σ·Z`` (one Gaussian mechanism of sensitivity ``sens(C)``),
and the server adds the stream's rows ``σ·n_t``. The two agree only when the noise on the sums is
``M·Z`` with ``M·C = I``, so that what is released is a post-processing of ``C·G + σ·Z``. A
mechanism (shipped or registered by a plugin) is therefore checked here, by fedsim's code, not by
the mechanism's:

1. ``C`` (from `Strategy.materialize`) is finite, ``m × n`` with ``m ≥ n`` and ``n`` the rounds;
   a square ``C`` is lower-triangular with a non-zero diagonal.
2. Where ``M`` is data handed in (a `DenseStrategy`, or any strategy class that is not fedsim's):
   ``M·C = I`` within `TOLERANCE` (on fresh random probe vectors, so the cost is O(n·m) and a
   plugin cannot tune its matrix to them), and ``M`` is causal: round ``t``'s noise uses only the
   rows of ``Z`` whose row of ``C`` ends by round ``t`` (for a square ``C``: ``M`` is
   lower-triangular).
3. ``sens(C)`` comes from fedsim's code: a strategy class that is not fedsim's has its
   ``sensitivity`` override ignored, and ``sens(C)`` is computed from the checked ``C``
   (`fedsim.privacy.sensitivity`).
4. The stream (`Strategy.stream`, via the mechanism) is run by fedsim for the first
   `PROBE_ROUNDS` rounds at dimension `PROBE_DIM`, fed with fresh normal rows: each row must equal
   the row of ``C⁻¹·Z`` (``M·Z`` for a non-square ``C``) within `TOLERANCE`, its ``sensitivity``
   must be the plan's, and its ``row_variance`` the row's squared norm. An independent mechanism
   other than ``none`` must stream exactly ``ξ_t`` with sensitivity 1.

Anything else is refused with a `FedsimError` naming the rule. What stays trusted: that a
plugin's stream keeps behaving past the probed rounds as it did on them, and that the mechanism
object returns the same stream on every call (docs/threat-model.md).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import numpy as np

from fedsim.errors import FedsimError

if TYPE_CHECKING:
    import torch

    from fedsim.privacy.mechanisms.base import Strategy
    from fedsim.privacy.stream import NoiseStream
else:
    from fedsim._lazy import torch

#: relative tolerance of every numerical check (float64 products; float32 for stream rows).
TOLERANCE = 1e-6
#: rounds of a stream that fedsim runs itself before a run (all of them when there are fewer).
PROBE_ROUNDS = 24
#: the row length the probe runs the stream at.
PROBE_DIM = 3
#: random vectors that probe ``M·C = I``.
PROBE_VECTORS = 8


def _refuse(name: str, rule: str) -> FedsimError:
    return FedsimError(f"privacy.mechanism = {name!r} is refused: {rule}")


def defined_by_fedsim(cls: type, attr: str) -> bool:
    """Whether the class that defines ``attr`` for ``cls`` is fedsim's own."""
    owner = next((k for k in cls.__mro__ if attr in vars(k)), object)
    return owner.__module__.startswith("fedsim.")


def _m_is_data(strategy: Strategy) -> bool:
    """Whether ``M`` is handed in rather than computed from ``C``'s parameters by fedsim's code:
    a `DenseStrategy` (``M`` is a field) or a strategy class of a plugin."""
    from fedsim.privacy.mechanisms.base import DenseStrategy

    return isinstance(strategy, DenseStrategy) or not defined_by_fedsim(type(strategy), "noising")


def check_strategy_matrix(C: np.ndarray, rounds: int, name: str) -> np.ndarray:
    """Rule 1: ``C`` as float64, or a refusal.

    Parameters
    ----------
    C : the strategy's matrix as `Strategy.materialize` returned it.
    rounds : ``n``, the rounds the strategy says it covers.
    name : the mechanism's name, for the message.
    """
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2 or C.shape[1] != rounds or C.shape[0] < C.shape[1]:
        raise _refuse(name, f"its C has shape {C.shape}; it must be m × n with m ≥ n = {rounds} rounds")
    if not np.isfinite(C).all():
        raise _refuse(name, "its C has entries that are not finite")
    scale = float(np.abs(C).max()) if C.size else 0.0
    if scale == 0.0:
        raise _refuse(name, "its C is zero")
    if C.shape[0] == C.shape[1]:
        upper = float(np.abs(np.triu(C, 1)).max()) if rounds > 1 else 0.0
        if upper > TOLERANCE * scale:
            raise _refuse(
                name,
                f"its C is not lower-triangular (|C[i, j]| up to {upper:.3g} above the diagonal); "
                "round t's release may use only rounds ≤ t",
            )
        if float(np.abs(np.diag(C)).min()) <= TOLERANCE * scale:
            raise _refuse(name, "its C has a zero on the diagonal (it is not invertible)")
    return C


def _last_column(C: np.ndarray) -> np.ndarray:
    """For each row ``j`` of ``C``, the last round it depends on (−1 for a zero row)."""
    nz = np.abs(C) > 0
    last = C.shape[1] - 1 - np.argmax(nz[:, ::-1], axis=1)
    return np.where(nz.any(axis=1), last, -1)


def check_noising_matrix(M: np.ndarray, C: np.ndarray, name: str) -> np.ndarray:
    """Rule 2: ``M`` as float64 when ``M·C = I`` and ``M`` is causal; a refusal otherwise.

    Parameters
    ----------
    M : the noising matrix (``n × m``).
    C : the checked strategy (``m × n``, `check_strategy_matrix`).
    name : the mechanism's name, for the message.
    """
    m, n = C.shape
    M = np.asarray(M, dtype=np.float64)
    if M.shape != (n, m):
        raise _refuse(name, f"its noising matrix M has shape {M.shape}; it must be {(n, m)} (n × m for C of m × n)")
    if not np.isfinite(M).all():
        raise _refuse(name, "its noising matrix M has entries that are not finite")
    rng = np.random.default_rng(secrets.randbits(128))  # fresh: a matrix cannot be tuned to the probes
    V = rng.standard_normal((n, PROBE_VECTORS))
    residual = float(np.linalg.norm(M @ (C @ V) - V) / np.linalg.norm(V))
    if residual > TOLERANCE:
        raise _refuse(
            name,
            f"its noising matrix M is not a left inverse of C (‖M·C·v − v‖/‖v‖ = {residual:.3g} > {TOLERANCE:g}): "
            "the noise added would not be the noise accounted",
        )
    late = _last_column(C)[None, :] > np.arange(n)[:, None]
    if late.any():
        leak = float(np.abs(M[late]).max())
        if leak > TOLERANCE * float(np.abs(M).max()):
            raise _refuse(name, "its noising matrix M is not causal: round t's noise uses rows of Z of later rounds")
    return M


def checked_sensitivity(strategy: Strategy, scheme: object) -> tuple[float, bool]:
    """Rule 3: ``(sens(C), exact)`` by fedsim's code: the strategy's own method where its class
    is fedsim's, the base computation from ``C`` otherwise (a plugin's override is ignored).

    Parameters
    ----------
    strategy : the strategy.
    scheme : the participation scheme the sampler enforces.
    """
    from fedsim.privacy.mechanisms.base import Strategy

    if defined_by_fedsim(type(strategy), "sensitivity"):
        return strategy.sensitivity(scheme)  # type: ignore[arg-type]
    return Strategy.sensitivity(strategy, scheme)  # type: ignore[arg-type]


def check_strategy(strategy: Strategy, rounds: int, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Rules 1 and 2 for ``strategy``: ``(C, M)``, with ``M`` None where fedsim computes it from
    ``C``'s parameters itself (banded, BLT, BSR, BISR).

    Parameters
    ----------
    strategy : the strategy a mechanism returned.
    rounds : ``n``, the rounds of the run (the workload's size); the strategy must cover them.
    name : the mechanism's name, for messages.
    """
    if int(strategy.rounds) != rounds:
        raise _refuse(name, f"its strategy covers {strategy.rounds} rounds; the run has {rounds}")
    C = check_strategy_matrix(strategy.materialize(), rounds, name)
    if _m_is_data(strategy) or C.shape[0] != C.shape[1]:
        return C, check_noising_matrix(strategy.noising(), C, name)
    return C, None


def _probe_rows(stream: NoiseStream, rounds: int) -> tuple[list[torch.Tensor], np.ndarray]:
    """Run ``stream`` for ``rounds`` rounds at `PROBE_DIM` on fresh normal rows; returns the rows
    and the ``Z`` fed to it (float64, one row per index asked)."""
    rng = np.random.default_rng(secrets.randbits(128))
    Z: dict[int, np.ndarray] = {}

    def draw(j: int) -> torch.Tensor:
        if j not in Z:
            Z[j] = rng.standard_normal(PROBE_DIM).astype(np.float32)
        return torch.from_numpy(Z[j].copy())

    stream.bind(PROBE_DIM, torch.device("cpu"))
    rows = [stream.step(t, draw).detach().to("cpu", torch.float64) for t in range(rounds)]
    top = max(Z) + 1 if Z else 0
    full = np.zeros((top, PROBE_DIM))
    for j, z in Z.items():
        full[j] = z
    return rows, full


def check_stream(stream: NoiseStream, C: np.ndarray, M: np.ndarray | None, sens: float, name: str) -> None:
    """Rule 4 for a matrix-factorization stream: its first rounds are ``C⁻¹·Z`` (``M·Z``).

    Parameters
    ----------
    stream : a fresh, unbound stream of the mechanism (it is bound and advanced here).
    C : the checked strategy.
    M : the checked noising matrix, or None (then ``C`` is square and ``C⁻¹`` is used).
    sens : the plan's ``sens(C)``.
    name : the mechanism's name, for messages.
    """
    from scipy.linalg import solve_triangular

    if not np.isclose(float(stream.sensitivity), sens, rtol=1e-12, atol=0.0):
        raise _refuse(name, f"its stream scales by sensitivity {stream.sensitivity:.6g}, fedsim computed {sens:.6g}")
    n = C.shape[1]
    P = min(n, PROBE_ROUNDS)
    rows, Z = _probe_rows(stream, P)
    if M is not None:
        if Z.shape[0] < M.shape[1]:
            Z = np.vstack([Z, np.zeros((M.shape[1] - Z.shape[0], PROBE_DIM))])
        want = M[:P] @ Z[: M.shape[1]]
        variances = (M[:P] ** 2).sum(axis=1)
    else:
        if Z.shape[0] < P:
            Z = np.vstack([Z, np.zeros((P - Z.shape[0], PROBE_DIM))])
        inv = solve_triangular(C[:P, :P], np.eye(P), lower=True)
        want = inv @ Z[:P]
        variances = (inv**2).sum(axis=1)
    for t in range(P):
        got = rows[t].numpy()
        scale = max(1.0, float(np.abs(want[t]).max()))
        if got.shape != (PROBE_DIM,) or float(np.abs(got - want[t]).max()) > 1e-4 * scale:
            raise _refuse(name, f"its noise stream's round {t} is not row {t} of C⁻¹·Z (fedsim ran it on known Z)")
        var = float(stream.row_variance(t))
        if not np.isclose(var, variances[t], rtol=1e-4, atol=1e-12):
            raise _refuse(name, f"its stream reports variance {var:.6g} for round {t}; the row's is {variances[t]:.6g}")


def check_independent_stream(stream: NoiseStream, name: str) -> None:
    """Rule 4 for an independent mechanism other than ``none``: ``n_t = ξ_t``, sensitivity 1.

    Parameters
    ----------
    stream : a fresh, unbound stream of the mechanism (bound and advanced here).
    name : the mechanism's name, for messages.
    """
    if float(stream.sensitivity) != 1.0:
        raise _refuse(name, f"an independent mechanism's stream must have sensitivity 1, not {stream.sensitivity}")
    rows, Z = _probe_rows(stream, PROBE_ROUNDS)
    for t, row in enumerate(rows):
        if Z.shape[0] <= t or not np.array_equal(row.numpy(), Z[t]) or float(stream.row_variance(t)) != 1.0:
            raise _refuse(name, f"an independent mechanism must add ξ_t itself in round t; round {t} differs")
