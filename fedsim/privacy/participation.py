"""Participation schemes (ALGORITHMS.md section 2).

One scheme object is read by the sampler (which users take part in round ``t``),
by the sensitivity computation (which participation patterns are possible) and by
the accountant (which DP events a round is), so they cannot disagree.

=============  ================================================================
scheme         who takes part in round ``t``
=============  ================================================================
``poisson``    each user independently with probability ``q = K̄/N``
``fixed``      exactly ``K`` users uniformly without replacement
``single``     a seeded permutation cut into consecutive blocks of ``K``: each
               user at most once in the run (needs ``n·K ≤ N``)
``epochs``     users split by a seeded shuffle into ``b`` groups of ``G = ⌊N/b⌋``
               (the ``N − b·G`` left over never take part); round ``t`` is group
               ``t mod b``; ``n ≤ k·b``
``min_sep``    the same groups, so a user's rounds are ``g, g+b, …`` (≤ ``k`` of
               them, ≥ ``b`` apart); optionally Poisson-thinned inside the group at
               rate ``p = K̄/G`` (amplified banded MF)
=============  ================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.errors import FedsimError


@dataclass(frozen=True)
class ParticipationScheme:
    """Base: ``population`` users and a fixed denominator ``cohort_size`` (``K̄``)."""

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
        """Probability that a given user takes part in a round it is eligible for."""
        return self.cohort_size / self.population

    @property
    def max_participations(self) -> int | None:
        """``k``: the most rounds one user can take part in (None: unbounded)."""
        return None

    @property
    def min_separation(self) -> int | None:
        """``b``: the fewest rounds between two participations of a user (None: 1)."""
        return None

    def check_rounds(self, rounds: int) -> None:
        """Raise if the sampler cannot honour the scheme for ``rounds`` rounds."""

    def describe(self) -> dict:
        return {"scheme": self.name, "population": self.population,
                "cohort_size": self.cohort_size, "sampling_rate": self.sampling_rate,
                "max_participations": self.max_participations, "min_separation": self.min_separation}


@dataclass(frozen=True)
class PoissonScheme(ParticipationScheme):
    """Each user independently with probability ``q = K̄/N`` every round."""

    name = "poisson"


@dataclass(frozen=True)
class FixedScheme(ParticipationScheme):
    """Exactly ``K`` users uniformly without replacement every round (replace-one adjacency)."""

    name = "fixed"


@dataclass(frozen=True)
class SingleScheme(ParticipationScheme):
    """Each user at most once in the run; ``K`` users per round."""

    name = "single"

    @property
    def max_participations(self) -> int:
        return 1

    def check_rounds(self, rounds: int) -> None:
        if rounds * self.cohort_size > self.population:
            raise FedsimError(
                f"sampling.scheme = 'single' needs rounds × cohort_size ≤ N, but "
                f"{rounds} × {self.cohort_size} = {rounds * self.cohort_size} > {self.population}; "
                f"lower rounds or sampling.cohort_size"
            )


@dataclass(frozen=True)
class GroupScheme(ParticipationScheme):
    """Base of ``epochs`` and ``min_sep``: ``b`` fixed groups cycled in order.

    Parameters
    ----------
    min_sep : ``b``, number of groups (and the separation between a user's rounds).
    max_part : ``k``, the most participations per user (``rounds ≤ k·b``).
    poisson_within_group : thin each group with Poisson sampling at ``p = K̄/G``.
    """

    min_sep: int = 1
    max_part: int = 1
    poisson_within_group: bool = False

    def __post_init__(self) -> None:
        if self.min_sep < 1 or self.max_part < 1:
            raise FedsimError("sampling.min_sep and sampling.max_participations must be ≥ 1")
        if self.min_sep > self.population:
            raise FedsimError(
                f"sampling.min_sep = {self.min_sep} exceeds the population N = {self.population}; "
                f"each of the b groups needs at least one user"
            )
        super().__post_init__()
        g = self.group_size
        if self.poisson_within_group:
            if self.cohort_size > g:
                raise FedsimError(
                    f"sampling.cohort_size = {self.cohort_size} exceeds the group size ⌊N/b⌋ = {g}; "
                    f"lower sampling.cohort_size or sampling.min_sep"
                )
        elif self.cohort_size != g:
            raise FedsimError(
                f"sampling.scheme = '{self.name}' takes whole groups of ⌊N/b⌋ = {g} users per round; "
                f"set sampling.cohort_size = {g} (or sampling.poisson_within_group = true to "
                f"sample {self.cohort_size} per round in expectation)"
            )

    @property
    def group_size(self) -> int:
        """``G = ⌊N/b⌋`` users per group."""
        return self.population // self.min_sep

    @property
    def sampling_rate(self) -> float:
        """``p = K̄/G`` inside the round's group (1 without Poisson thinning)."""
        return self.cohort_size / self.group_size

    @property
    def max_participations(self) -> int:
        return self.max_part

    @property
    def min_separation(self) -> int:
        return self.min_sep

    def check_rounds(self, rounds: int) -> None:
        if rounds > self.max_part * self.min_sep:
            raise FedsimError(
                f"sampling.scheme = '{self.name}' with min_sep b = {self.min_sep} and "
                f"max_participations k = {self.max_part} allows at most k·b = "
                f"{self.max_part * self.min_sep} rounds, but rounds = {rounds}; raise "
                f"sampling.max_participations to {-(-rounds // self.min_sep)} or lower rounds"
            )

    def describe(self) -> dict:
        d = super().describe()
        d.update(group_size=self.group_size, poisson_within_group=self.poisson_within_group)
        return d


@dataclass(frozen=True)
class EpochsScheme(GroupScheme):
    """Fixed epochs: group ``t mod b`` in round ``t``; patterns ``{g, g+b, …}``."""

    name = "epochs"


@dataclass(frozen=True)
class MinSepScheme(GroupScheme):
    """At most ``k`` participations, any two ≥ ``b`` rounds apart (enforced by the groups)."""

    name = "min_sep"


SCHEMES = ("poisson", "fixed", "single", "epochs", "min_sep")


def make_scheme(name: str, population: int, cohort_size: int, *, min_sep: int | None = None,
                max_participations: int | None = None, poisson_within_group: bool = False,
                rounds: int | None = None) -> ParticipationScheme:
    """The scheme called ``name``; with ``rounds``, also checks the sampler can honour it.

    Parameters
    ----------
    name : one of ``poisson``, ``fixed``, ``single``, ``epochs``, ``min_sep``.
    population : ``N``.
    cohort_size : ``K̄`` (for ``epochs``/``min_sep`` without thinning: the group size ``⌊N/b⌋``).
    min_sep : ``b`` for ``epochs``/``min_sep`` (default: ``rounds`` when given, so ``k = 1``).
    max_participations : ``k`` for ``epochs``/``min_sep`` (default ``⌈rounds/b⌉``).
    poisson_within_group : Poisson thinning inside the group (``min_sep`` only).
    rounds : the run length ``n``.
    """
    if name in ("poisson", "fixed", "single"):
        for key, val in (("sampling.min_sep", min_sep), ("sampling.max_participations", max_participations)):
            if val is not None:
                raise FedsimError(f"{key} applies to sampling.scheme = 'epochs' or 'min_sep', not '{name}'")
        if poisson_within_group:
            raise FedsimError(f"sampling.poisson_within_group applies to 'min_sep', not '{name}'")
        scheme: ParticipationScheme = {"poisson": PoissonScheme, "fixed": FixedScheme,
                                       "single": SingleScheme}[name](population, cohort_size)
    elif name in ("epochs", "min_sep"):
        if poisson_within_group and name == "epochs":
            raise FedsimError("sampling.poisson_within_group applies to 'min_sep' only "
                              "(epochs take whole groups)")
        b = min_sep if min_sep is not None else rounds
        if b is None:
            raise FedsimError(f"sampling.scheme = '{name}' needs sampling.min_sep")
        k = max_participations if max_participations is not None else (
            -(-rounds // b) if rounds is not None else 1)
        cls = EpochsScheme if name == "epochs" else MinSepScheme
        scheme = cls(population, cohort_size, min_sep=b, max_part=k, poisson_within_group=poisson_within_group)
    else:
        raise FedsimError(f"sampling.scheme = {name!r}: allowed are {', '.join(SCHEMES)}")
    if rounds is not None:
        scheme.check_rounds(rounds)
    return scheme
