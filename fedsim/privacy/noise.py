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


def make_noise_mechanism(name: str, dim: int, seed: int, device: str | torch.device = "cpu") -> NoiseMechanism:
    """The mechanism called ``name`` (``none`` | ``gaussian``)."""
    mechanisms: dict[str, type[NoiseMechanism]] = {"none": ZeroNoise, "gaussian": GaussianNoise}
    if name not in mechanisms:
        raise FedsimError(f"privacy.mechanism = {name!r}: allowed are {', '.join(mechanisms)}")
    return mechanisms[name](dim, seed, device)
