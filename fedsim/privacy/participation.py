"""Participation schemes (ALGORITHMS.md section 2).

One scheme object is read by the sampler (which users take part in round ``t``)
and by the accountant (which DP events a round is), so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.errors import FedsimError


@dataclass(frozen=True)
class ParticipationScheme:
    """Base: a population of ``population`` users and an expected cohort ``cohort_size``."""

    population: int
    cohort_size: int

    name = "base"

    def __post_init__(self) -> None:
        if self.population < 1:
            raise FedsimError(f"population must be ≥ 1 (got {self.population})")
        if not 1 <= self.cohort_size <= self.population:
            raise FedsimError(
                f"sampling.cohort_size = {self.cohort_size} must be between 1 and the "
                f"population N = {self.population}"
            )

    @property
    def sampling_rate(self) -> float:
        """``q = K̄ / N``: each user's probability of taking part in a given round."""
        return self.cohort_size / self.population

    def describe(self) -> dict:
        return {"scheme": self.name, "population": self.population,
                "cohort_size": self.cohort_size, "sampling_rate": self.sampling_rate}


@dataclass(frozen=True)
class PoissonScheme(ParticipationScheme):
    """Each user independently with probability ``q = K̄/N`` every round."""

    name = "poisson"


@dataclass(frozen=True)
class FixedScheme(ParticipationScheme):
    """Exactly ``K`` users uniformly without replacement every round (replace-one adjacency)."""

    name = "fixed"


def make_scheme(name: str, population: int, cohort_size: int) -> ParticipationScheme:
    """The scheme called ``name`` (``poisson`` | ``fixed``)."""
    schemes = {"poisson": PoissonScheme, "fixed": FixedScheme}
    if name not in schemes:
        raise FedsimError(f"sampling.scheme = {name!r}: allowed are {', '.join(schemes)}")
    return schemes[name](population=population, cohort_size=cohort_size)
