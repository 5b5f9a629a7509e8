"""Cohort samplers that honour a participation scheme (ALGORITHMS.md section 2).

A sampler is built from the same :class:`~fedsim.privacy.participation.ParticipationScheme`
the accountant reads, so the two cannot disagree. The cohort of round ``t`` is a
pure function of (seed, t): nothing per user is allocated up front beyond one
length-``N`` draw per round, and resuming needs only the seed.
"""

from __future__ import annotations

from typing import Any

import torch

from fedsim.errors import FedsimError
from fedsim.privacy.participation import FixedScheme, ParticipationScheme, PoissonScheme
from fedsim.seeding import make_generator


class CohortSampler:
    """Base: ``sample(t)`` returns the sorted user indices (0..N−1) of round ``t``."""

    def __init__(self, scheme: ParticipationScheme, seed: int) -> None:
        self.scheme = scheme
        self.seed = int(seed)

    def _generator(self, t: int) -> torch.Generator:
        return make_generator(self.seed, "sampling", self.scheme.name, int(t))

    def sample(self, t: int) -> list[int]:  # pragma: no cover
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme.describe(), "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["scheme"] != self.scheme.describe():
            raise FedsimError(
                f"checkpoint sampler scheme {state['scheme']} differs from this run's {self.scheme.describe()}"
            )
        self.seed = int(state["seed"])


class PoissonSampler(CohortSampler):
    """Each user independently with probability ``q = K̄/N`` (cohort size varies)."""

    def sample(self, t: int) -> list[int]:
        n, q = self.scheme.population, self.scheme.sampling_rate
        u = torch.rand(n, generator=self._generator(t), dtype=torch.float64)
        return torch.nonzero(u < q).flatten().tolist()


class FixedSampler(CohortSampler):
    """Exactly ``K`` users uniformly without replacement."""

    def sample(self, t: int) -> list[int]:
        perm = torch.randperm(self.scheme.population, generator=self._generator(t))
        return sorted(perm[: self.scheme.cohort_size].tolist())


def make_sampler(scheme: ParticipationScheme, seed: int) -> CohortSampler:
    """The sampler that enforces ``scheme``; refuses a scheme it cannot honour."""
    if isinstance(scheme, PoissonScheme):
        return PoissonSampler(scheme, seed)
    if isinstance(scheme, FixedScheme):
        return FixedSampler(scheme, seed)
    raise FedsimError(f"no sampler can honour the participation scheme {scheme.name!r}")
