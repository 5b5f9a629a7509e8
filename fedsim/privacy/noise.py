"""Noise mechanisms behind one interface: ``row(t)`` is the standardized noise of round ``t``.

The server adds ``c · z · sensitivity · row(t)`` to the summed clipped updates
(docs/algorithms.md §1, step 4). For independent Gaussian noise ``row(t) = ξ_t``
and ``sensitivity = 1``; correlated (matrix-factorization) mechanisms return row
``t`` of ``C⁻¹Z`` and their ``sens(C)``.

Randomness: ``ξ_t`` is ``rng.gaussians(key.derive(t), d)``: AES-256-CTR under a 256-bit
sub-key of the run's :class:`~fedsim.privacy.rng.PrivacyKey`, turned into normals in float64 and
cast to float32. Row ``t`` is a pure function of the key and ``t`` (bit-reproducible after a
resume, independent of the rows drawn before), and nobody without the key can predict it. The
key is derived from the config seed in simulation and drawn from the OS in deployment. Rows are
generated on the CPU and moved to the server's device, so a GPU run adds the same numbers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from fedsim.errors import FedsimError
from fedsim.privacy.rng import PrivacyKey, gaussians


class NoiseMechanism(ABC):
    """Streaming noise of a DP mechanism.

    Parameters
    ----------
    dim : ``d``, length of the flat parameter vector.
    seed : the noise stream's :class:`~fedsim.privacy.rng.PrivacyKey` (an int is taken as a
        config seed: ``PrivacyKey.from_seed``); kept as ``self.key``.
    device : where rows are used (the server's device).
    """

    name: str = "base"

    def __init__(self, dim: int, seed: PrivacyKey | int, device: str | torch.device = "cpu") -> None:
        self.dim = int(dim)
        self.key = PrivacyKey.of(seed)
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
        return {"name": self.name, "dim": self.dim, "key": self.key.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name or int(state.get("dim", -1)) != self.dim:
            raise FedsimError(
                f"checkpoint noise state is for {state.get('name')} with dim {state.get('dim')}, "
                f"but this run uses {self.name} with dim {self.dim}"
            )
        self.key = PrivacyKey.from_state_dict(state["key"])


class GaussianNoise(NoiseMechanism):
    """Independent Gaussian noise: ``row(t) = ξ_t ~ N(0, I_d)``, ``sens = 1``."""

    name = "gaussian"

    def row(self, t: int) -> torch.Tensor:
        return _xi(self.key, t, self.dim, self.device)


class ZeroNoise(NoiseMechanism):
    """No noise (``privacy.mechanism = "none"``): ε = ∞."""

    name = "none"

    def row(self, t: int) -> torch.Tensor:
        return torch.zeros(self.dim, device=self.device, dtype=torch.float32)

    def row_variance(self, t: int) -> float:
        return 0.0


def _xi(key: PrivacyKey | int, j: int, dim: int, device: torch.device) -> torch.Tensor:
    """``ξ_j ~ N(0, I_d)``: the standard normal row ``j`` of ``Z``, a pure function of (key, j)."""
    return gaussians(PrivacyKey.of(key).derive("xi", int(j)), dim, dtype=torch.float32, device=device)


class MatrixNoise(NoiseMechanism):
    """Correlated noise ``n_t = (M·Z)_t = Σ_j M[t, j] ξ_j`` for a noising matrix ``M``.

    ``M = C⁻¹`` for a square strategy ``C`` (``A⁻¹B`` in general, e.g. for the tree).
    ``ξ_j`` is regenerated from its per-row seed when needed (``O(t·d)`` work at round
    ``t``, ``O(d)`` memory), or kept in memory when all ``m`` rows fit in
    ``memory_budget`` bytes — either way the same numbers, bit for bit.

    Parameters
    ----------
    dim, seed, device : as for :class:`NoiseMechanism` (``seed``: the key, or an int seed).
    noising : ``M`` (``n × m``, float64).
    sens : ``sens(C)`` under the run's scheme.
    label : mechanism name for messages and checkpoints.
    memory_budget : bytes allowed for keeping ``ξ`` rows in memory (default 1 GiB).
    """

    def __init__(
        self,
        dim: int,
        seed: PrivacyKey | int,
        device: str | torch.device,
        noising: Any,
        sens: float,
        label: str = "matrix",
        memory_budget: int = 1 << 30,
    ) -> None:
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
            return _xi(self.key, j, self.dim, self.device)
        if j not in self._store:
            self._store[j] = _xi(self.key, j, self.dim, self.device)
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

    def __init__(
        self, dim: int, seed: PrivacyKey | int, device: str | torch.device, C: Any, sens: float, label: str = "banded"
    ) -> None:
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
        self._buf: torch.Tensor | None = None  # ring of the last b − 1 rows, float32 (b−1)×d

    @property
    def sensitivity(self) -> float:
        return self._sens

    def _ring(self) -> torch.Tensor:
        if self._buf is None:
            self._buf = torch.zeros(max(self.bands - 1, 0), self.dim, dtype=torch.float32, device=self.device)
        return self._buf

    def row(self, t: int) -> torch.Tensor:
        if t != self.next_t:
            raise RuntimeError(f"banded noise is streamed in order: expected round {self.next_t}, got {t}")
        xi = _xi(self.key, t, self.dim, self.device)
        nb = self.bands - 1
        if nb > 0 and t > 0:
            ring = self._ring()
            # slot of n_{t−j} is (t − j) mod (b − 1); coefficient C[t, t−j]
            coef = torch.zeros(nb, dtype=torch.float32, device=self.device)
            for j in range(1, min(nb, t) + 1):
                coef[(t - j) % nb] = float(self.band[t, j])
            xi.sub_(torch.mv(ring.t(), coef))  # one pass over the b − 1 stored rows
        out = xi.div_(float(self.band[t, 0]))
        if nb > 0:
            self._ring()[t % nb].copy_(out)
        self.next_t += 1
        return out

    @property
    def buffer(self) -> list[torch.Tensor]:
        """The stored rows ``n_{t−1}, n_{t−2}, …`` (most recent first)."""
        nb = self.bands - 1
        if nb == 0 or self._buf is None:
            return []
        return [self._buf[(self.next_t - j) % nb] for j in range(1, min(nb, self.next_t) + 1)]

    @buffer.setter
    def buffer(self, rows: list[torch.Tensor]) -> None:
        nb = self.bands - 1
        self._buf = None
        for j, r in enumerate(rows, start=1):
            self._ring()[(self.next_t - j) % nb].copy_(r)

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
        d.update(next_t=self.next_t, buffer=[b.clone().cpu() for b in self.buffer])  # most recent first
        return d

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.next_t = int(state["next_t"])
        self.buffer = [b.to(self.device) for b in state["buffer"]]  # after next_t: slots depend on it


class BLTNoise(NoiseMechanism):
    """Streaming noise of a buffered-linear-Toeplitz ``C = BLT(θ, ω)`` with ``m`` buffers of
    size ``d`` (:func:`fedsim.privacy.blt.blt_stream_step`). Rows are drawn in order."""

    def __init__(
        self,
        dim: int,
        seed: PrivacyKey | int,
        device: str | torch.device,
        theta: Any,
        omega: Any,
        sens: float,
        label: str = "blt",
    ) -> None:
        super().__init__(dim, seed, device)
        from fedsim.privacy.blt import blt_stream_init

        self.name = label
        self._sens = float(sens)
        self.theta, self.omega = theta, omega
        self.state = blt_stream_init(theta, omega)

    @property
    def sensitivity(self) -> float:
        return self._sens

    def row(self, t: int) -> torch.Tensor:
        """``n_t = ξ_t − Σ_j ω_j s_j``, then ``s_j ← θ_j s_j + n_t`` — in place, so memory is
        the ``m`` buffers plus ``ξ_t`` (same recursion as :func:`fedsim.privacy.blt.blt_stream_step`)."""
        import dataclasses

        if t != self.state.t:
            raise RuntimeError(f"BLT noise is streamed in order: expected round {self.state.t}, got {t}")
        noise = _xi(self.key, t, self.dim, self.device)
        bufs = self.state.buffers
        if bufs is None:
            bufs = tuple(noise.clone() for _ in range(len(self.state.theta)))
        else:
            for w, s in zip(self.state.omega.tolist(), bufs):
                noise.sub_(s, alpha=float(w))
            for th, s in zip(self.state.theta.tolist(), bufs):
                s.mul_(float(th)).add_(noise)
        self.state = dataclasses.replace(self.state, t=t + 1, buffers=bufs)
        return noise

    def state_dict(self) -> dict[str, Any]:
        d = super().state_dict()
        bufs = None if self.state.buffers is None else [b.clone().cpu() for b in self.state.buffers]
        d.update(t=self.state.t, buffers=bufs)
        return d

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import dataclasses

        super().load_state_dict(state)
        bufs = state["buffers"]
        self.state = dataclasses.replace(
            self.state, t=int(state["t"]), buffers=None if bufs is None else tuple(b.to(self.device) for b in bufs)
        )


def make_noise_mechanism(
    name: str, dim: int, seed: PrivacyKey | int, device: str | torch.device = "cpu"
) -> NoiseMechanism:
    """The mechanism called ``name`` (``none`` | ``gaussian``)."""
    mechanisms: dict[str, type[NoiseMechanism]] = {"none": ZeroNoise, "gaussian": GaussianNoise}
    if name not in mechanisms:
        raise FedsimError(f"privacy.mechanism = {name!r}: allowed are {', '.join(mechanisms)}")
    return mechanisms[name](dim, seed, device)
