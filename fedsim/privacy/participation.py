"""Participation schemes (docs/algorithms.md §2).

One scheme object is read by the sampler (which users take part in round ``t``),
by the sensitivity computation (which participation patterns are possible) and by
the accountant (which DP events a round is), so they cannot disagree.

=============  ================================================================
scheme         who takes part in round ``t``
=============  ================================================================
``poisson``    each user independently with probability ``q = K̄/N``
``fixed``      exactly ``K`` users uniformly without replacement
``single``     each user at most once in the run: user ``i`` is in bucket
               ``PRF(i) mod B``, ``B = ⌈N/K⌉``, and round ``t`` trains bucket ``t``
               (``n ≤ B``)
``epochs``     user ``i`` is in group ``PRF(i) mod b``; round ``t`` trains group
               ``t mod b``; ``n ≤ k·b``
``min_sep``    the same groups, so a user's rounds are ``g, g+b, …`` (≤ ``k`` of
               them, ≥ ``b`` apart); optionally Poisson-thinned inside the group at
               rate ``p = K̄·b/N`` (amplified banded MF)
=============  ================================================================

Assignment (``single``, ``epochs``, ``min_sep``) and the neighbouring relation:

- ``keyed`` (default): a user's bucket or group is a keyed pseudo-random function of its own
  stable id (:func:`fedsim.privacy.rng.prf_mod`), and its Poisson coins too. Adding or removing a
  user changes no other user's rounds, so the ε holds for **add/remove one user**. Group sizes
  vary (about Binomial(N, 1/b)); the fixed denominator is the expected size ``K̄ = N/b``
  (``N/B`` for ``single``) unless ``sampling.cohort_size`` sets another constant.
- ``shuffle``: a seeded permutation of the users' positions cut into blocks of ``⌊N/b⌋`` (``K``
  for ``single``; the rest never train). Adding a user shifts the permutation and can push
  another user out of its slot, so neighbouring runs differ by ``u_x − u_y``: the ε holds only
  under **zero-out** adjacency (a user's data replaced by one that contributes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedsim.errors import FedsimError

ASSIGNMENTS = ("keyed", "shuffle")


@dataclass(frozen=True)
class ParticipationScheme:
    """Base: ``population`` users and ``cohort_size`` (``K̄``, the expected cohort and fixed
    denominator; ``K`` for ``fixed`` and ``single``).

    ``assignment``: ``keyed`` or ``shuffle`` (see the module docstring); only the bounded
    schemes use it."""

    population: int
    cohort_size: float
    assignment: str = "keyed"

    name = "base"

    def __post_init__(self) -> None:
        if self.population < 1:
            raise FedsimError(f"population must be ≥ 1 (got {self.population})")
        if not 0 < self.cohort_size <= self.population:
            raise FedsimError(
                f"sampling.cohort_size = {self.cohort_size} must be > 0 and at most the "
                f"population N = {self.population}"
            )
        if self.assignment not in ASSIGNMENTS:
            raise FedsimError(f"sampling.assignment = {self.assignment!r}: allowed are {', '.join(ASSIGNMENTS)}")

    @property
    def expected_cohort(self) -> float:
        """``K̄``: the fixed denominator of ``ĝ_t`` (a public constant of the mechanism)."""
        return float(self.cohort_size)

    @property
    def neighboring_relation(self) -> str:
        """The relation the accounted ε holds for under this scheme and assignment."""
        return "add_or_remove_one"

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

    def describe(self) -> dict[str, Any]:
        return {
            "scheme": self.name,
            "population": self.population,
            "cohort_size": self.cohort_size,
            "expected_cohort": self.expected_cohort,
            "sampling_rate": self.sampling_rate,
            "assignment": self.assignment,
            "neighboring_relation": self.neighboring_relation,
            "max_participations": self.max_participations,
            "min_separation": self.min_separation,
        }


@dataclass(frozen=True)
class PoissonScheme(ParticipationScheme):
    """Each user independently with probability ``q = K̄/N`` every round."""

    name = "poisson"


@dataclass(frozen=True)
class FixedScheme(ParticipationScheme):
    """Exactly ``K`` users uniformly without replacement every round (replace-one adjacency)."""

    name = "fixed"

    @property
    def neighboring_relation(self) -> str:
        return "replace_one"


@dataclass(frozen=True)
class SingleScheme(ParticipationScheme):
    """Each user at most once in the run; ``K`` users per round (keyed: ``K̄ = N/⌈N/K⌉`` expected)."""

    name = "single"

    @property
    def buckets(self) -> int:
        """``B``: keyed buckets ``⌈N/K⌉`` (shuffle: ``⌊N/K⌋`` whole blocks)."""
        k = int(self.cohort_size)
        return -(-self.population // k) if self.assignment == "keyed" else self.population // k

    @property
    def expected_cohort(self) -> float:
        return self.population / self.buckets if self.assignment == "keyed" else float(int(self.cohort_size))

    @property
    def neighboring_relation(self) -> str:
        return "add_or_remove_one" if self.assignment == "keyed" else "zero_out"

    @property
    def max_participations(self) -> int:
        return 1

    def check_rounds(self, rounds: int) -> None:
        if rounds > self.buckets:
            raise FedsimError(
                f"sampling.scheme = 'single' has ⌈N/K⌉ = {self.buckets} buckets of users (N = "
                f"{self.population}, K = sampling.cohort_size = {int(self.cohort_size)}), one per round, but "
                f"rounds = {rounds}; lower rounds or sampling.cohort_size"
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
        if self.poisson_within_group and self.cohort_size > g:
            raise FedsimError(
                f"sampling.cohort_size = {self.cohort_size} exceeds the expected group size "
                f"{'N/b' if self.assignment == 'keyed' else '⌊N/b⌋'} = {g:.4g}, so the thinning rate "
                f"K̄/group would exceed 1; lower sampling.cohort_size or sampling.min_sep"
            )

    @property
    def group_size(self) -> float:
        """Users per group: expected ``N/b`` (keyed; sizes vary) or exactly ``⌊N/b⌋`` (shuffle)."""
        if self.assignment == "keyed":
            return self.population / self.min_sep
        return float(self.population // self.min_sep)

    @property
    def neighboring_relation(self) -> str:
        return "add_or_remove_one" if self.assignment == "keyed" else "zero_out"

    @property
    def sampling_rate(self) -> float:
        """``p = K̄/group size`` inside the round's group with Poisson thinning, else 1."""
        return self.cohort_size / self.group_size if self.poisson_within_group else 1.0

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

    def describe(self) -> dict[str, Any]:
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

#: Schemes whose participation is bounded, as MF accounting needs.
MF_SCHEMES = ("single", "epochs", "min_sep")


#: ``K`` of ``poisson``/``fixed``/``single`` when ``sampling.cohort_size`` is not given.
DEFAULT_COHORT = 40


def make_scheme(
    name: str,
    population: int,
    cohort_size: float | None,
    *,
    min_sep: int | None = None,
    max_participations: int | None = None,
    poisson_within_group: bool = False,
    rounds: int | None = None,
    assignment: str = "keyed",
) -> ParticipationScheme:
    """The scheme called ``name``; with ``rounds``, also checks the sampler can honour it.

    Parameters
    ----------
    name : one of ``poisson``, ``fixed``, ``single``, ``epochs``, ``min_sep``.
    population : ``N``.
    cohort_size : ``K̄``; None: :data:`DEFAULT_COHORT` for ``poisson``/``fixed``/``single``, and for
        ``epochs``/``min_sep`` without thinning the expected group size (``N/b`` keyed, ``⌊N/b⌋``
        shuffle). Thinned ``min_sep`` needs it.
    min_sep : ``b`` for ``epochs``/``min_sep`` (default: ``rounds`` when given, so ``k = 1``).
    max_participations : ``k`` for ``epochs``/``min_sep`` (default ``⌈rounds/b⌉``).
    poisson_within_group : Poisson thinning inside the group (``min_sep`` only).
    rounds : the run length ``n``.
    assignment : ``keyed`` (default) or ``shuffle`` for ``single``/``epochs``/``min_sep``.
    """
    if assignment not in ASSIGNMENTS:
        raise FedsimError(f"sampling.assignment = {assignment!r}: allowed are {', '.join(ASSIGNMENTS)}")
    if name in ("poisson", "fixed", "single"):
        for key, val in (("sampling.min_sep", min_sep), ("sampling.max_participations", max_participations)):
            if val is not None:
                raise FedsimError(f"{key} applies to sampling.scheme = 'epochs' or 'min_sep', not '{name}'")
        if poisson_within_group:
            raise FedsimError(f"sampling.poisson_within_group applies to 'min_sep', not '{name}'")
        k = DEFAULT_COHORT if cohort_size is None else cohort_size
        if name != "poisson":
            if k != int(k):
                raise FedsimError(f"sampling.cohort_size = {cohort_size} must be a whole number for '{name}'")
            k = int(k)
        scheme: ParticipationScheme = {"poisson": PoissonScheme, "fixed": FixedScheme, "single": SingleScheme}[name](
            population, k, assignment
        )
    elif name in ("epochs", "min_sep"):
        if poisson_within_group and name == "epochs":
            raise FedsimError("sampling.poisson_within_group applies to 'min_sep' only (epochs take whole groups)")
        b = min_sep if min_sep is not None else rounds
        if b is None:
            raise FedsimError(f"sampling.scheme = '{name}' needs sampling.min_sep")
        k = max_participations if max_participations is not None else (-(-rounds // b) if rounds is not None else 1)
        cls = EpochsScheme if name == "epochs" else MinSepScheme
        if b > population:
            raise FedsimError(
                f"sampling.min_sep = {b} exceeds the population N = {population}; each of "
                f"the b groups needs users: lower sampling.min_sep"
            )
        if cohort_size is None:
            if poisson_within_group:
                raise FedsimError(
                    "sampling.poisson_within_group needs sampling.cohort_size = K̄, the expected "
                    "users per round (at most N/b)"
                )
            cohort_size = population / b if assignment == "keyed" else float(population // b)
        scheme = cls(
            population, cohort_size, assignment, min_sep=b, max_part=k, poisson_within_group=poisson_within_group
        )
    else:
        raise FedsimError(f"sampling.scheme = {name!r}: allowed are {', '.join(SCHEMES)}")
    if rounds is not None:
        scheme.check_rounds(rounds)
    return scheme
