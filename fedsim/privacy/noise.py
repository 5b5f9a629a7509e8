"""Noise mechanisms behind one interface: ``row(t)`` is the standardized noise of round ``t``.

The server adds ``c · z · sensitivity · row(t)`` to the summed clipped updates
(ALGORITHMS.md section 1, step 4). For independent Gaussian noise ``row(t) = ξ_t``
and ``sensitivity = 1``; correlated (matrix-factorization) mechanisms return row
``t`` of ``C⁻¹Z`` and their ``sens(C)``.

Randomness: ``ξ_t`` comes from a ``torch.Generator`` seeded with
``derive_seed(seed, "noise", t)``, so row ``t`` is a pure function of the seed and
``t`` (bit-reproducible after a resume, independent of the rows drawn before).
In deployment mode the seed comes from the OS CSPRNG and is never logged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from fedsim.errors import FedsimError
from fedsim.seeding import make_generator


class NoiseMechanism(ABC):
    """Streaming noise of a DP mechanism.

    Parameters
    ----------
    dim : ``d``, length of the flat parameter vector.
    seed : base seed of the noise stream.
    device : where rows are generated (the server's device).
    """

    name: str = "base"

    def __init__(self, dim: int, seed: int, device: str | torch.device = "cpu") -> None:
        self.dim = int(dim)
        self.seed = int(seed)
        self.device = torch.device(device)

    @property
    def sensitivity(self) -> float:
        """``sens(C)``: L2 sensitivity of the strategy matrix under the run's scheme."""
        return 1.0

    @abstractmethod
    def row(self, t: int) -> torch.Tensor:
        """Standardized noise row of round ``t`` (0-based): float32, shape ``(dim,)``."""

    def row_variance(self, t: int) -> float:
        """Per-coordinate variance of ``row(t)`` (``‖row_t(C⁻¹)‖²``; 1 for independent noise)."""
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name or int(state.get("dim", -1)) != self.dim:
            raise FedsimError(
                f"checkpoint noise state is for {state.get('name')} with dim {state.get('dim')}, "
                f"but this run uses {self.name} with dim {self.dim}"
            )
        self.seed = int(state["seed"])


class GaussianNoise(NoiseMechanism):
    """Independent Gaussian noise: ``row(t) = ξ_t ~ N(0, I_d)``, ``sens = 1``."""

    name = "gaussian"

    def row(self, t: int) -> torch.Tensor:
        g = make_generator(self.seed, "noise", int(t), device=self.device)
        return torch.randn(self.dim, generator=g, device=self.device, dtype=torch.float32)


class ZeroNoise(NoiseMechanism):
    """No noise (``privacy.mechanism = "none"``): ε = ∞."""

    name = "none"

    def row(self, t: int) -> torch.Tensor:
        return torch.zeros(self.dim, device=self.device, dtype=torch.float32)

    def row_variance(self, t: int) -> float:
        return 0.0


def _xi(seed: int, j: int, dim: int, device: torch.device) -> torch.Tensor:
    """``ξ_j ~ N(0, I_d)``: the standard normal row ``j`` of ``Z``, a pure function of (seed, j)."""
    g = make_generator(seed, "noise", int(j), device=device)
    return torch.randn(dim, generator=g, device=device, dtype=torch.float32)


class MatrixNoise(NoiseMechanism):
    """Correlated noise ``n_t = (M·Z)_t = Σ_j M[t, j] ξ_j`` for a noising matrix ``M``.

    ``M = C⁻¹`` for a square strategy ``C`` (``A⁻¹B`` in general, e.g. for the tree).
    ``ξ_j`` is regenerated from its per-row seed when needed (``O(t·d)`` work at round
    ``t``, ``O(d)`` memory), or kept in memory when all ``m`` rows fit in
    ``memory_budget`` bytes — either way the same numbers, bit for bit.

    Parameters
    ----------
    dim, seed, device : as for :class:`NoiseMechanism`.
    noising : ``M`` (``n × m``, float64).
    sens : ``sens(C)`` under the run's scheme.
    label : mechanism name for messages and checkpoints.
    memory_budget : bytes allowed for keeping ``ξ`` rows in memory (default 1 GiB).
    """

    def __init__(self, dim: int, seed: int, device: str | torch.device, noising, sens: float,
                 label: str = "matrix", memory_budget: int = 1 << 30) -> None:
        super().__init__(dim, seed, device)
        import numpy as np

        self.name = label
        self.noising = np.asarray(noising, dtype=np.float64)
        self._sens = float(sens)
        self._keep = self.noising.shape[1] * dim * 4 <= memory_budget
        self._store: dict[int, torch.Tensor] = {}

    @property
    def sensitivity(self) -> float:
        return self._sens

    def _row_xi(self, j: int) -> torch.Tensor:
        if not self._keep:
            return _xi(self.seed, j, self.dim, self.device)
        if j not in self._store:
            self._store[j] = _xi(self.seed, j, self.dim, self.device)
        return self._store[j]

    def row(self, t: int) -> torch.Tensor:
        coeffs = self.noising[int(t)]
        out = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
        for j in coeffs.nonzero()[0].tolist():
            out.add_(self._row_xi(j).to(torch.float64), alpha=float(coeffs[j]))
        return out.to(torch.float32)

    def row_variance(self, t: int) -> float:
        return float((self.noising[int(t)] ** 2).sum())


class BandedNoise(NoiseMechanism):
    """Streaming noise of a banded lower-triangular ``C`` (``b`` bands), keeping only the
    last ``b − 1`` noise rows: ``n_t = (ξ_t − Σ_{j=1..b−1} C[t, t−j] n_{t−j}) / C[t, t]``.

    Rows must be drawn in order ``t = 0, 1, …`` (a resumed run restores the buffer
    from :meth:`state_dict`).
    """

    def __init__(self, dim: int, seed: int, device: str | torch.device, C, sens: float,
                 label: str = "banded") -> None:
        super().__init__(dim, seed, device)
        import numpy as np

        self.name = label
        C = np.asarray(C, dtype=np.float64)
        from fedsim.privacy.sensitivity import num_bands

        self.bands = num_bands(C)
        n = C.shape[0]
        # Only the band is kept: band[t, j] = C[t, t − j] for j < b (n·b floats, not n²).
        self.band = np.zeros((n, self.bands))
        for j in range(self.bands):
            self.band[j:, j] = np.diagonal(C, offset=-j)
        self._sens = float(sens)
        self.next_t = 0
        self.buffer: list[torch.Tensor] = []  # n_{t-1}, n_{t-2}, … (most recent first)

    @property
    def sensitivity(self) -> float:
        return self._sens

    def row(self, t: int) -> torch.Tensor:
        if t != self.next_t:
            raise RuntimeError(f"banded noise is streamed in order: expected round {self.next_t}, got {t}")
        acc = _xi(self.seed, t, self.dim, self.device).to(torch.float64)
        for j, prev in enumerate(self.buffer, start=1):
            coef = self.band[t, j]
            if coef != 0.0:
                acc.add_(prev, alpha=-float(coef))
        acc.div_(float(self.band[t, 0]))
        out = acc.to(torch.float32)
        self.buffer.insert(0, out)  # float32: memory (b − 1)·d floats, plus the round's ξ and sum
        del self.buffer[self.bands - 1:]
        self.next_t += 1
        return out

    def row_variance(self, t: int) -> float:
        import numpy as np
        from scipy.linalg import solve_triangular

        # row t of C⁻¹ = e_tᵀ C⁻¹ = solve(Cᵀ, e_t)ᵀ, using the leading (t+1)×(t+1) block
        m = int(t) + 1
        C = np.zeros((m, m))
        for j in range(min(self.bands, m)):
            idx = np.arange(j, m)
            C[idx, idx - j] = self.band[j:m, j]
        e = np.zeros(m)
        e[-1] = 1.0
        return float((solve_triangular(C, e, trans="T", lower=True) ** 2).sum())

    def state_dict(self) -> dict[str, Any]:
        d = super().state_dict()
        d.update(next_t=self.next_t, buffer=[b.clone().cpu() for b in self.buffer])
        return d

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.next_t = int(state["next_t"])
        self.buffer = [b.to(self.device) for b in state["buffer"]]


def make_noise_mechanism(name: str, dim: int, seed: int, device: str | torch.device = "cpu") -> NoiseMechanism:
    """The mechanism called ``name`` (``none`` | ``gaussian``)."""
    mechanisms: dict[str, type[NoiseMechanism]] = {"none": ZeroNoise, "gaussian": GaussianNoise}
    if name not in mechanisms:
        raise FedsimError(f"privacy.mechanism = {name!r}: allowed are {', '.join(mechanisms)}")
    return mechanisms[name](dim, seed, device)
