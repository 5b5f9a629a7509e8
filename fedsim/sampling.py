"""Cohort samplers that honour a participation scheme (ALGORITHMS.md section 2).

A sampler is built from the same :class:`~fedsim.privacy.participation.ParticipationScheme`
the accountant reads, so the two cannot disagree. The cohort of round ``t`` is a
pure function of (seed, t): nothing per user is allocated up front beyond one
length-``N`` draw per round, and resuming needs only the seed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from fedsim.errors import FedsimError
from fedsim.privacy.participation import (
    FixedScheme,
    GroupScheme,
    ParticipationScheme,
    PoissonScheme,
    SingleScheme,
)
from fedsim.seeding import make_generator


class CohortSampler(ABC):
    """Base: ``sample(t)`` returns the sorted user indices (0..N−1) of round ``t``."""

    def __init__(self, scheme: ParticipationScheme, seed: int) -> None:
        self.scheme = scheme
        self.seed = int(seed)

    def _generator(self, t: int) -> torch.Generator:
        return make_generator(self.seed, "sampling", self.scheme.name, int(t))

    @abstractmethod
    def sample(self, t: int) -> list[int]:
        """Sorted user indices of round ``t``, a pure function of (seed, t)."""

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


class _PermutationSampler(CohortSampler):
    """Base for schemes built on one seeded permutation of the population (O(N) ints)."""

    def __init__(self, scheme: ParticipationScheme, seed: int) -> None:
        super().__init__(scheme, seed)
        self._perm: torch.Tensor | None = None

    @property
    def permutation(self) -> torch.Tensor:
        if self._perm is None:
            g = make_generator(self.seed, "sampling", self.scheme.name, "permutation")
            self._perm = torch.randperm(self.scheme.population, generator=g)
        return self._perm

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._perm = None


class SingleSampler(_PermutationSampler):
    """Round ``t`` takes block ``t`` of ``K`` users of one seeded permutation: each user at most once."""

    def sample(self, t: int) -> list[int]:
        k = self.scheme.cohort_size
        if (t + 1) * k > self.scheme.population:
            raise FedsimError(f"'single' participation ran out of users at round {t}")
        return sorted(self.permutation[t * k: (t + 1) * k].tolist())


class GroupSampler(_PermutationSampler):
    """``epochs`` / ``min_sep``: group ``t mod b`` of a seeded split into ``b`` groups of
    ``⌊N/b⌋``; with Poisson thinning, each group member independently with ``p = K̄/G``."""

    def group(self, g: int) -> list[int]:
        size = self.scheme.group_size  # type: ignore[attr-defined]
        return sorted(self.permutation[g * size: (g + 1) * size].tolist())

    def sample(self, t: int) -> list[int]:
        scheme = self.scheme
        assert isinstance(scheme, GroupScheme)
        members = self.group(t % scheme.min_sep)
        if not scheme.poisson_within_group:
            return members
        u = torch.rand(len(members), generator=self._generator(t), dtype=torch.float64)
        return [m for m, keep in zip(members, (u < scheme.sampling_rate).tolist()) if keep]


def make_sampler(scheme: ParticipationScheme, seed: int) -> CohortSampler:
    """The sampler that enforces ``scheme``; refuses a scheme it cannot honour."""
    samplers: list[tuple[type, type[CohortSampler]]] = [
        (PoissonScheme, PoissonSampler), (FixedScheme, FixedSampler),
        (SingleScheme, SingleSampler), (GroupScheme, GroupSampler),
    ]
    for scheme_type, sampler_type in samplers:
        if type(scheme) is scheme_type or (scheme_type is GroupScheme and isinstance(scheme, GroupScheme)
                                           and type(scheme).__mro__[1] is GroupScheme):
            return sampler_type(scheme, seed)
    raise FedsimError(f"no sampler can honour the participation scheme {scheme.name!r}")
