"""Cohort samplers that honour a participation scheme (docs/algorithms.md §2).

A sampler is built from the same :class:`~fedsim.privacy.participation.ParticipationScheme`
the accountant reads, so the two cannot disagree. Every decision comes from the keyed CSPRNG
(:mod:`fedsim.privacy.rng`) under the run's sampling key, so nobody without the key can predict
a cohort:

- ``poisson``: user ``i`` joins round ``t`` iff ``PRF(tag_i, t) < q``;
- ``fixed``: the ``K`` users with the smallest ``PRF(tag_i, t)`` (uniform without replacement);
- keyed ``single``/``epochs``/``min_sep``: user ``i``'s bucket or group is ``PRF(tag_i) mod B``
  (or ``mod b``), and its thinning coin in round ``t`` is ``PRF'(tag_i, t) < p``.

``tag_i`` is a hash of user ``i``'s stable id (its name, :func:`fedsim.privacy.rng.user_tags`), so
a user's rounds depend only on its own id and the key: adding or removing a user changes no
other user's rounds (add/remove adjacency). ``shuffle`` assignment instead cuts a keyed random
permutation of the users' *positions* into blocks, as earlier fedsim versions did: a new user
shifts it, which is why that assignment is labelled zero-out. The cohort of round ``t`` is a
pure function of (key, ids, t); resuming needs only the key.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedsim.errors import FedsimError
from fedsim.privacy.participation import (
    FixedScheme,
    GroupScheme,
    ParticipationScheme,
    PoissonScheme,
    SingleScheme,
)
from fedsim.privacy.rng import PrivacyKey, prf_mod, prf_u64, prf_uniform, user_tags


class CohortSampler(ABC):
    """Base: ``sample(t)`` returns the sorted user indices (0..N−1) of round ``t``.

    Parameters
    ----------
    scheme : the participation scheme (also read by the accountant).
    seed : the sampling :class:`~fedsim.privacy.rng.PrivacyKey` (an int is taken as a config seed).
    user_ids : each present user's stable id (its name), indexed like the data; default
        ``"0" … "N−1"``. Keyed assignment depends on these, never on the index. The scheme's
        constants (``N``, ``K̄``, ``q``, ``b``, ``B``) are public parameters fixed before the run; a
        neighbouring dataset with one user more or less is sampled with the same constants.
    """

    def __init__(
        self, scheme: ParticipationScheme, seed: PrivacyKey | int, user_ids: Sequence[str] | None = None
    ) -> None:
        self.scheme = scheme
        self.key = PrivacyKey.of(seed)
        self._ids = user_ids
        self._tags: np.ndarray | None = None

    @property
    def tags(self) -> np.ndarray:
        """Each user's 64-bit tag (computed once)."""
        if self._tags is None:
            ids = self._ids if self._ids is not None else [str(i) for i in range(self.scheme.population)]
            self._tags = user_tags(ids)
        return self._tags

    def _positions_permutation(self, label: str) -> np.ndarray:
        """A keyed random permutation of the positions ``0..N−1`` (shuffle assignment)."""
        pos = np.arange(len(self.tags), dtype=np.uint64)
        return np.argsort(prf_u64(self.key.derive(label), pos, 0), kind="stable")

    @abstractmethod
    def sample(self, t: int) -> list[int]:
        """Sorted user indices of round ``t``, a pure function of (key, ids, t)."""

    def state_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme.describe(), "key": self.key.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["scheme"] != self.scheme.describe():
            raise FedsimError(
                f"checkpoint sampler scheme {state['scheme']} differs from this run's {self.scheme.describe()}"
            )
        self.key = PrivacyKey.from_state_dict(state["key"])
        self._reset()

    def _reset(self) -> None:  # noqa: B027 - a hook; most samplers cache nothing
        """Drop anything cached from the key (after :meth:`load_state_dict`)."""


class PoissonSampler(CohortSampler):
    """Each user independently with probability ``q = K̄/N``: ``PRF(tag_i, t) < q``."""

    def sample(self, t: int) -> list[int]:
        u = prf_uniform(self.key.derive("poisson"), self.tags, int(t))
        return np.flatnonzero(u < self.scheme.sampling_rate).tolist()


class FixedSampler(CohortSampler):
    """Exactly ``K`` users uniformly without replacement: the ``K`` smallest ``PRF(tag_i, t)``."""

    def sample(self, t: int) -> list[int]:
        v = prf_u64(self.key.derive("fixed"), self.tags, int(t))
        k = int(self.scheme.cohort_size)
        return sorted(np.argsort(v, kind="stable")[:k].tolist())


class SingleSampler(CohortSampler):
    """Each user at most once. Keyed: bucket ``PRF(tag_i) mod ⌈N/K⌉``, round ``t`` = bucket ``t``.
    Shuffle: block ``t`` of ``K`` positions of a keyed permutation."""

    def __init__(
        self, scheme: ParticipationScheme, seed: PrivacyKey | int, user_ids: Sequence[str] | None = None
    ) -> None:
        super().__init__(scheme, seed, user_ids)
        self._bucket: np.ndarray | None = None

    def _reset(self) -> None:
        self._bucket = None

    def sample(self, t: int) -> list[int]:
        scheme = self.scheme
        assert isinstance(scheme, SingleScheme)
        if t >= scheme.buckets:
            raise FedsimError(f"'single' participation ran out of users at round {t}")
        if scheme.assignment == "shuffle":
            k = int(scheme.cohort_size)
            return sorted(self._positions_permutation("single-shuffle")[t * k : (t + 1) * k].tolist())
        if self._bucket is None:
            self._bucket = prf_mod(self.key.derive("single"), self.tags, 0, scheme.buckets)
        return np.flatnonzero(self._bucket == t).tolist()


class GroupSampler(CohortSampler):
    """``epochs`` / ``min_sep``: group ``t mod b``. Keyed: user ``i``'s group is ``PRF(tag_i) mod b``;
    shuffle: blocks of ``⌊N/b⌋`` positions of a keyed permutation. With Poisson thinning each
    member joins round ``t`` iff ``PRF'(tag_i, t) < p`` (its own coin)."""

    def __init__(
        self, scheme: ParticipationScheme, seed: PrivacyKey | int, user_ids: Sequence[str] | None = None
    ) -> None:
        super().__init__(scheme, seed, user_ids)
        self._group: np.ndarray | None = None

    def _reset(self) -> None:
        self._group = None

    def group_of_users(self) -> np.ndarray:
        """Each user's group in ``0..b−1`` (−1: never trains, shuffle's remainder)."""
        if self._group is None:
            scheme = self.scheme
            assert isinstance(scheme, GroupScheme)
            b, n = scheme.min_sep, len(self.tags)
            if scheme.assignment == "keyed":
                self._group = prf_mod(self.key.derive("group"), self.tags, 0, b)
            else:
                size = scheme.population // b  # the public group size ⌊N/b⌋
                g = np.full(n, -1, dtype=np.int64)
                perm = self._positions_permutation("group-shuffle")
                m = min(n, b * size)
                g[perm[:m]] = np.repeat(np.arange(b), size)[:m]
                self._group = g
        return self._group

    def group(self, g: int) -> list[int]:
        return np.flatnonzero(self.group_of_users() == g).tolist()

    def sample(self, t: int) -> list[int]:
        scheme = self.scheme
        assert isinstance(scheme, GroupScheme)
        members = np.flatnonzero(self.group_of_users() == t % scheme.min_sep)
        if not scheme.poisson_within_group:
            return members.tolist()
        coins = prf_uniform(self.key.derive("thin"), self.tags[members], int(t))
        return members[coins < scheme.sampling_rate].tolist()


def make_sampler(
    scheme: ParticipationScheme, seed: PrivacyKey | int, user_ids: Sequence[str] | None = None
) -> CohortSampler:
    """The sampler that enforces ``scheme``; refuses a scheme it cannot honour."""
    samplers: list[tuple[type, type[CohortSampler]]] = [
        (PoissonScheme, PoissonSampler),
        (FixedScheme, FixedSampler),
        (SingleScheme, SingleSampler),
        (GroupScheme, GroupSampler),
    ]
    for scheme_type, sampler_type in samplers:
        if isinstance(scheme, scheme_type):
            return sampler_type(scheme, seed, user_ids)
    raise FedsimError(f"no sampler can honour the participation scheme {scheme.name!r}")
