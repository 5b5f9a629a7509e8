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

from concurrent.futures import Future
from typing import Any

import torch

from fedsim.errors import FedsimError
from fedsim.privacy.background import worker
from fedsim.privacy.rng import PrivacyKey, gaussians
from fedsim.privacy.stream import Draw, NoiseStream


def _xi(key: PrivacyKey | int, j: int, dim: int, device: torch.device) -> torch.Tensor:
    """``ξ_j ~ N(0, I_d)``: the standard normal row ``j`` of ``Z``, a pure function of (key, j)."""
    return gaussians(PrivacyKey.of(key).derive("xi", int(j)), dim, dtype=torch.float32, device=device)


class NoiseMechanism:
    """The one noise class: a mechanism's :class:`~fedsim.privacy.stream.NoiseStream` fed with the
    rows ``ξ_j`` of ``Z`` drawn from the run's key.

    Parameters
    ----------
    dim : ``d``, length of the flat parameter vector.
    seed : the noise stream's :class:`~fedsim.privacy.rng.PrivacyKey` (an int is taken as a
        config seed: ``PrivacyKey.from_seed``); kept as ``self.key``.
    device : where rows are used (the server's device).
    stream : the mechanism's stream (bound here to ``dim`` and ``device``).
    """

    def __init__(self, dim: int, seed: PrivacyKey | int, device: str | torch.device, stream: NoiseStream) -> None:
        self.dim = int(dim)
        self.key = PrivacyKey.of(seed)
        self.device = torch.device(device)
        self.stream = stream
        self.name = stream.name
        stream.bind(self.dim, self.device)
        #: (key, j, future of ξ_j) from :meth:`prefetch`; not state (a checkpoint never holds it).
        self._ahead: tuple[PrivacyKey, int, Future[torch.Tensor]] | None = None

    @property
    def sensitivity(self) -> float:
        """``sens(C)``: L2 sensitivity of the strategy matrix under the run's scheme."""
        return self.stream.sensitivity

    def prefetch(self, j: int) -> None:
        """Start drawing ``ξ_j`` in a background thread, so that the draw overlaps the round's
        local training; :meth:`draw` of the same ``j`` and key then takes it. ``ξ_j`` is a pure
        function of (key, j), so the row is the same, bit for bit, whenever it is computed; a
        prefetched row whose key or index does not match is never used."""
        if self._ahead is not None and self._ahead[0] == self.key and self._ahead[1] == int(j):
            return
        self._ahead = (self.key, int(j), worker("fedsim-noise").submit(_xi, self.key, int(j), self.dim, self.device))

    def draw(self, j: int) -> torch.Tensor:
        """``ξ_j`` of this run's key (the prefetched row when :meth:`prefetch` asked for it)."""
        ahead = self._ahead
        if ahead is not None and ahead[0] == self.key and ahead[1] == int(j):
            self._ahead = None
            return ahead[2].result()
        return _xi(self.key, j, self.dim, self.device)

    def row(self, t: int) -> torch.Tensor:
        """Standardized noise row of round ``t`` (0-based): float32, shape ``(dim,)``."""
        expected = self.stream.next_round()
        if expected is not None and t != expected:
            raise RuntimeError(f"{self.name} noise is streamed in order: expected round {expected}, got {t}")
        return self.stream.step(int(t), self.draw)

    def row_variance(self, t: int) -> float:
        """Per-coordinate variance of ``row(t)`` (``‖row_t(C⁻¹)‖²``; 1 for independent noise)."""
        return self.stream.row_variance(t)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "key": self.key.state_dict(), **self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name or int(state.get("dim", -1)) != self.dim:
            raise FedsimError(
                f"checkpoint noise state is for {state.get('name')} with dim {state.get('dim')}, "
                f"but this run uses {self.name} with dim {self.dim}"
            )
        self.key = PrivacyKey.from_state_dict(state["key"])
        self.stream.load_state_dict(state)


class IndependentStream(NoiseStream):
    """Independent Gaussian noise: ``n_t = ξ_t ~ N(0, I_d)``, ``sens = 1``."""

    def __init__(self) -> None:
        super().__init__(1.0, "gaussian")

    def step(self, t: int, draw: Draw) -> torch.Tensor:
        return draw(t)


class ZeroStream(NoiseStream):
    """No noise (``privacy.mechanism = "none"``): ε = ∞."""

    def __init__(self) -> None:
        super().__init__(1.0, "none")

    def step(self, t: int, draw: Draw) -> torch.Tensor:
        return torch.zeros(self.dim, device=self.device, dtype=torch.float32)

    def row_variance(self, t: int) -> float:
        return 0.0


class MatrixStream(NoiseStream):
    """Correlated noise ``n_t = (M·Z)_t = Σ_j M[t, j] ξ_j`` for a noising matrix ``M``
    (tree, sqrt, dense, DP-MF+).

    ``M = C⁻¹`` for a square strategy ``C`` (``A⁻¹B`` in general, e.g. for the tree). ``ξ_j`` is
    drawn again when needed (``O(t·d)`` work at round ``t``, ``O(d)`` memory), or kept in
    memory when all ``m`` rows fit in ``memory_budget`` bytes — either way the same numbers,
    bit for bit. Rows can be drawn in any order; the stream has no state to checkpoint.

    Parameters
    ----------
    noising : ``M`` (``n × m``, float64).
    sens : ``sens(C)`` under the run's scheme.
    name : the mechanism's name (default ``matrix``).
    memory_budget : bytes allowed for keeping ``ξ`` rows in memory (default 1 GiB).
    """

    def __init__(self, noising: Any, sens: float, name: str = "matrix", memory_budget: int = 1 << 30) -> None:
        super().__init__(sens, name)
        import numpy as np

        self.noising = np.asarray(noising, dtype=np.float64)
        self.memory_budget = int(memory_budget)
        self._store: dict[int, torch.Tensor] = {}

    def _row_xi(self, j: int, draw: Draw) -> torch.Tensor:
        if self.noising.shape[1] * self.dim * 4 > self.memory_budget:
            return draw(j)
        if j not in self._store:
            self._store[j] = draw(j)
        return self._store[j]

    def step(self, t: int, draw: Draw) -> torch.Tensor:
        coeffs = self.noising[int(t)]
        out = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
        for j in coeffs.nonzero()[0].tolist():
            out.add_(self._row_xi(j, draw).to(torch.float64), alpha=float(coeffs[j]))
        return out.to(torch.float32)

    def row_variance(self, t: int) -> float:
        return float((self.noising[int(t)] ** 2).sum())


def gaussian_noise(dim: int, seed: PrivacyKey | int, device: str | torch.device = "cpu") -> NoiseMechanism:
    """Independent Gaussian noise (:class:`IndependentStream`) of length ``dim`` under key ``seed``."""
    return NoiseMechanism(dim, seed, device, IndependentStream())


def zero_noise(dim: int, seed: PrivacyKey | int = 0, device: str | torch.device = "cpu") -> NoiseMechanism:
    """No noise (:class:`ZeroStream`): ``privacy.mechanism = "none"``."""
    return NoiseMechanism(dim, seed, device, ZeroStream())
