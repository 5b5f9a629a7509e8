"""Secret-sharer canary users: extra users whose train text holds a random secret, inserted a
known number of times (Carlini, Liu, Erlingsson, Kos and Song, USENIX Security 2019, "The
Secret Sharer: Evaluating and Testing Unintended Memorization in Neural Networks").

Method
------
A :class:`CanarySet` (made by :func:`make_canary_set`, a frozen description that serialises to
JSON) describes ``M`` canary users. Canary ``k`` is built from the ordinary text of a real user,
its *donor*, plus one random secret of ``secret_length`` tokens inserted ``r_k`` times:

- **Donors** are distinct users of the source dataset, chosen by a seeded rule (a seeded
  permutation of the users not in ``exclude``; each canary takes the first unused user with
  enough data, canaries needing the most data first). :func:`with_canary_users` hides the
  donors, so a donor's text enters training only through its canary: canary users are *extra*
  users, not copies of trained ones.
- **Levels.** The canaries cycle through the cells ``(r, size)`` of ``repetitions × sizes``:
  canary ``k`` takes cell ``k mod (len(repetitions)·len(sizes))``, repetitions varying fastest.
  ``size`` truncates the donor's data (characters of text, or sentences); None keeps all of it.
- **Character task** (``task = "char"``). The secret is ``secret_length`` characters drawn
  uniformly from ``alphabet`` (default: every id but the unknown id 0, i.e. printable ASCII).
  A copy is ``prefix + secret + " "`` (default prefix :data:`DEFAULT_CHAR_PREFIX`); ``r`` copies
  are inserted (not overwritten) into the donor's text at ``r`` cut points drawn uniformly with
  replacement from ``0..len(text)``, sorted. ``Canary.positions`` are the start offsets of the
  copies in the canary's final text. All of a canary's windows are train samples.
- **Next-word task** (``task = "nwp"``). The secret is ``secret_length`` word ids drawn
  uniformly from the non-special ids ``1..V`` (never pad, OOV, BOS or EOS). A copy is the
  sentence ``[BOS] + prefix + secret (+ [EOS] if shorter than L)``, padded to ``L + 1`` ids
  like every Stack Overflow row; ``r`` copies are added to the donor's sentences as extra train
  rows at ``r`` distinct seeded row positions (``Canary.positions``, sorted).

Randomness (donors, secrets, positions) comes from ``numpy.random.default_rng`` seeded with
``[seed, stream, k]``: it is *analysis* randomness, known to the auditor, and never DP noise.
Canary ``k``'s secret and positions depend only on ``(seed, k)`` and its donor's data.

Keeping canaries out of evaluation
----------------------------------
Canary users have **no test samples** (``num_test = 0``; ``test_samples`` is empty), so an
evaluation over any users gets nothing from them, and :meth:`CanaryFederatedData.ordinary_users`
lists the real users only: pass those (not ``range(population)``) wherever evaluation users or
their count are chosen, so the canaries do not even change which real users are drawn.
``majority_baseline`` ignores canary users. The canaries' users are ids
``R..R+M−1`` (after the ``R`` real users), named ``__canary_<k>``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from fedsim.attacks.views import FederatedView, check_seed, check_users
from fedsim.data import FederatedData, shakespeare
from fedsim.errors import FedsimError

#: Canary users' names: ``__canary_<k>``.
CANARY_NAME_PREFIX = "__canary_"
#: The default character prefix (the secret's format, "my secret code is XXXXXXXX").
DEFAULT_CHAR_PREFIX = " my secret code is "
TASKS = ("char", "nwp")
# Streams of numpy.random.default_rng([seed, stream, ...]); analysis randomness, not DP noise.
_DONORS, _SECRET, _POSITIONS = 0, 1, 2


@dataclass(frozen=True)
class Canary:
    """One canary user.

    Parameters
    ----------
    index : ``k``, its number in the set (``0..M−1``); its name is ``__canary_<k>``.
    donor : the donor's index in the source dataset.
    donor_name : the donor's name there (checked when the canary users are built).
    repetitions : ``r``, how many copies of the secret its train data holds.
    size : the donor data kept (characters or sentences); None: all of it.
    secret : the secret's token ids (``secret_length`` of them).
    positions : char: start offsets of the copies in the canary's text; nwp: the copies' row
        indices among its train samples. Sorted, ``r`` of them.
    num_train : the canary user's train samples (windows or sentences).
    """

    index: int
    donor: int
    donor_name: str
    repetitions: int
    size: int | None
    secret: tuple[int, ...]
    positions: tuple[int, ...]
    num_train: int

    @property
    def name(self) -> str:
        return f"{CANARY_NAME_PREFIX}{self.index}"


@dataclass(frozen=True)
class CanarySet:
    """A set of canary users (see the module docstring); frozen, JSON-serialisable.

    Parameters
    ----------
    task : ``char`` or ``nwp``.
    seed : the seed everything was drawn from.
    secret_length : tokens per secret.
    alphabet : the secret space: each secret token is uniform over these ids.
    prefix : token ids before the secret in every copy (char: the format; nwp: words after BOS).
    suffix : char: token ids after the secret in every copy (a space); nwp: empty.
    window : char: the dataset's window ``w``; nwp: the sequence length ``L``.
    bos, eos : nwp: the BOS and EOS ids; char: 0.
    source_population : the source dataset's population (checked when building the users).
    canaries : the canary users.
    """

    task: str
    seed: int
    secret_length: int
    alphabet: tuple[int, ...]
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    window: int
    bos: int
    eos: int
    source_population: int
    canaries: tuple[Canary, ...]

    @property
    def context(self) -> tuple[int, ...]:
        """The tokens every copy of a secret follows: char ``prefix``; nwp ``[BOS] + prefix``."""
        return self.prefix if self.task == "char" else (self.bos, *self.prefix)

    @property
    def donors(self) -> tuple[int, ...]:
        return tuple(c.donor for c in self.canaries)

    @property
    def secret_space_bits(self) -> float:
        """``log2`` of the number of possible secrets, ``secret_length·log2|alphabet|``."""
        return self.secret_length * math.log2(len(self.alphabet))

    def copy_tokens(self, secret: Sequence[int]) -> np.ndarray:
        """One inserted copy of ``secret`` (int64): char ``prefix + secret + suffix``; nwp the
        padded row ``[BOS] + prefix + secret (+ [EOS])`` of ``L + 1`` ids."""
        body = [*self.prefix, *secret, *self.suffix]
        if self.task == "char":
            return np.asarray(body, dtype=np.int64)
        row = np.zeros(self.window + 1, dtype=np.int64)
        ids = [self.bos, *body] + ([self.eos] if len(body) < self.window else [])
        row[: len(ids)] = ids
        return row

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CanarySet:
        d: dict[str, Any] = json.loads(text)
        canaries = tuple(
            Canary(**{**c, "secret": tuple(c["secret"]), "positions": tuple(c["positions"])}) for c in d["canaries"]
        )
        tuples = {k: tuple(d[k]) for k in ("alphabet", "prefix", "suffix")}
        return cls(**{**d, **tuples, "canaries": canaries})


# ---------------------------------------------------------------------------- donor data
def char_window(data: FederatedData) -> int:
    """The character window ``w`` of a ``char`` dataset (its ``window``, else a sample's width)."""
    w = getattr(data, "window", None)
    if w is None:
        w = int(data.train_samples(0, np.zeros(1, dtype=np.int64))[0].shape[1])
    return int(w)


def donor_text(data: FederatedData, u: int) -> np.ndarray:
    """User ``u``'s text (uint8 ids) of a ``char`` dataset: the whole text of a
    :class:`~fedsim.data.FederatedText`; otherwise the text its train windows cover, rebuilt
    from them (they must be consecutive stride-1 windows)."""
    texts = getattr(data, "texts", None)
    if texts is not None:
        return np.asarray(texts[u], dtype=np.uint8)
    n = data.num_train(u)
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    x, y = (t.numpy() for t in data.train_samples(u, np.arange(n)))
    text = np.concatenate([x[0], y]).astype(np.uint8)
    if not np.array_equal(np.lib.stride_tricks.sliding_window_view(text, x.shape[1])[:n], x):
        raise FedsimError(
            f"user {u} ({data.names[u]!r}): its train windows are not consecutive stride-1 windows of "
            f"one text, so no donor text can be rebuilt; pick donors from a text dataset (data.name = 'shakespeare')"
        )
    return text


def _available(data: FederatedData, u: int, w: int) -> int:
    """How much data user ``u`` can give: characters of text (char) or train sentences (nwp)."""
    if data.task == "nwp":
        return data.num_train(u)
    texts = getattr(data, "texts", None)
    return len(texts[u]) if texts is not None else data.num_train(u) + w if data.num_train(u) else 0


def _nwp_space(data: FederatedData) -> tuple[tuple[int, ...], int, int, int]:
    """``(alphabet 1..V, L, BOS, EOS)`` from the dataset's ``nwp`` spec."""
    nwp = getattr(data, "nwp", None)
    if nwp is None:
        raise FedsimError(
            "nwp canaries need the dataset's next-word vocabulary (a `nwp` attribute with V, seq_len, "
            "bos and eos, as StackOverflowFederated has); use data.name = 'stackoverflow_nwp'"
        )
    return tuple(range(1, int(nwp.V) + 1)), int(nwp.seq_len), int(nwp.bos), int(nwp.eos)


# ---------------------------------------------------------------------------- the set
def _check_levels(num_canaries: int, repetitions: Sequence[int], sizes: Sequence[int | None], length: int) -> None:
    if num_canaries < 1:
        raise FedsimError(f"num_canaries must be ≥ 1, got {num_canaries}")
    if not repetitions or any(int(r) < 1 for r in repetitions):
        raise FedsimError(f"repetitions must be a non-empty list of integers ≥ 1, got {list(repetitions)}")
    if not sizes or any(s is not None and int(s) < 1 for s in sizes):
        raise FedsimError(f"sizes must be a non-empty list of integers ≥ 1 or None (all), got {list(sizes)}")
    if length < 1:
        raise FedsimError(f"secret_length must be ≥ 1, got {length}")


def _space(
    data: FederatedData, prefix: Sequence[int] | None, alphabet: Sequence[int] | None, length: int
) -> dict[str, Any]:
    """The secret space and copy format: ``alphabet``, ``prefix``, ``suffix``, ``window``, ``bos``, ``eos``."""
    space: dict[str, Any]
    if data.task not in TASKS:
        raise FedsimError(f"canaries need a text task ({', '.join(TASKS)}); the dataset's task is {data.task!r}")
    if data.task == "char":
        pre = tuple(int(t) for t in (shakespeare.encode(DEFAULT_CHAR_PREFIX) if prefix is None else prefix))
        space = dict(alphabet=tuple(range(1, data.vocab_size)), prefix=pre, window=char_window(data), bos=0, eos=0)
        space["suffix"] = tuple(int(t) for t in shakespeare.encode(" "))
        if not pre:
            raise FedsimError("char canaries need a non-empty prefix (the context the secret is scored after)")
    else:
        ids, seq_len, bos, eos = _nwp_space(data)
        pre = tuple(int(t) for t in (prefix or ()))
        space = dict(alphabet=ids, prefix=pre, suffix=(), window=seq_len, bos=bos, eos=eos)
        if len(pre) + length > seq_len:
            raise FedsimError(
                f"an nwp secret of {length} words after a {len(pre)}-word prefix exceeds data.seq_len = {seq_len}; "
                f"shorten secret_length or the prefix"
            )
    if alphabet is not None:
        space["alphabet"] = tuple(sorted({int(a) for a in alphabet}))
    a: tuple[int, ...] = space["alphabet"]
    if not a or a[0] < 0 or a[-1] >= data.vocab_size:
        raise FedsimError(f"alphabet must be non-empty ids in 0..{data.vocab_size - 1}")
    return space


def _choose_donors(data: FederatedData, needs: list[int], exclude: Sequence[int], seed: int, w: int) -> list[int]:
    """Distinct donors, one per canary: a seeded permutation of the users not in ``exclude``;
    canaries are served in decreasing order of ``needs`` (data each requires), each taking the
    first unused user with at least that much data."""
    skip = set(check_users(exclude, data.population, "exclude"))
    rng = np.random.default_rng([seed, _DONORS])
    order = [int(u) for u in rng.permutation(data.population) if int(u) not in skip]
    have = {u: _available(data, u, w) for u in order}
    donors = [-1] * len(needs)
    used: set[int] = set()
    for k in sorted(range(len(needs)), key=lambda k: -needs[k]):
        pick = next((u for u in order if u not in used and have[u] >= needs[k]), None)
        if pick is None:
            raise FedsimError(
                f"no unused user has the {needs[k]} characters/sentences canary {k} needs "
                f"({len(used)} donors taken, {len(order)} candidates); lower num_canaries or sizes"
            )
        donors[k] = pick
        used.add(pick)
    if data.population - len(skip) - len(used) < 2:
        raise FedsimError(f"{len(used)} donors leave fewer than 2 real users; lower num_canaries")
    return donors


def _positions(task: str, r: int, n: int, copy_len: int, rng: np.random.Generator) -> tuple[int, ...]:
    """Where the ``r`` copies (of ``copy_len`` characters) go in a donor's ``n`` characters
    (char: the copies' start offsets in the final text) or sentences (nwp: their row indices)."""
    if task == "char":
        cuts = np.sort(rng.integers(0, n + 1, size=r))
        return tuple(int(c) + j * copy_len for j, c in enumerate(cuts))
    return tuple(int(p) for p in np.sort(rng.choice(n + r, size=r, replace=False)))


def make_canary_set(
    data: FederatedData,
    num_canaries: int,
    repetitions: Sequence[int] = (1, 4, 16),
    sizes: Sequence[int | None] = (None,),
    secret_length: int = 8,
    seed: int = 0,
    *,
    prefix: Sequence[int] | None = None,
    alphabet: Sequence[int] | None = None,
    exclude: Sequence[int] = (),
) -> CanarySet:
    """Describe ``num_canaries`` canary users built from donors of ``data`` (module docstring).

    Parameters
    ----------
    data : the source dataset (task ``char`` or ``nwp``), before any user is hidden.
    num_canaries : ``M``, the canary users.
    repetitions : the levels ``r``: copies of the secret in a canary's train data. Default (1, 4, 16).
    sizes : donor data kept per canary (characters or sentences; None: all). Default (None,).
    secret_length : tokens per secret (characters or words). Default 8.
    seed : seed of the analysis randomness (donors, secrets, positions). Default 0.
    prefix : token ids before the secret in each copy. Default: char ``DEFAULT_CHAR_PREFIX``
        encoded (``shakespeare.encode``); nwp none (the secret follows BOS). A char prefix of at
        least ``w`` characters makes scoring use exactly the windows training saw.
    alphabet : ids each secret token is drawn from. Default: char ``1..vocab_size−1``; nwp ``1..V``.
    exclude : users of ``data`` never chosen as donors (e.g. user inference's held-in and
        held-out users). Default none.
    """
    _check_levels(num_canaries, repetitions, sizes, secret_length)
    seed = check_seed(seed, "seed")
    space = _space(data, prefix, alphabet, secret_length)
    cells = [(int(r), None if s is None else int(s)) for s in sizes for r in repetitions]
    levels = [cells[k % len(cells)] for k in range(num_canaries)]
    w = int(space["window"])
    needs = [1 if s is None else s for _, s in levels]
    donors = _choose_donors(data, needs, exclude, seed, w)
    names = data.names
    canaries = []
    for k, ((r, size), donor) in enumerate(zip(levels, donors)):
        have = _available(data, donor, w)
        n = have if size is None else size
        secret = tuple(
            int(t) for t in np.random.default_rng([seed, _SECRET, k]).choice(space["alphabet"], secret_length)
        )
        copy_len = len(space["prefix"]) + secret_length + len(space["suffix"])
        positions = _positions(data.task, r, n, copy_len, np.random.default_rng([seed, _POSITIONS, k]))
        num_train = n + r if data.task == "nwp" else n + r * copy_len - w
        if num_train < 1:
            raise FedsimError(
                f"canary {k}: {n} donor characters and {r} copies make no window of {w}; raise the canary size (--canary-size)"
            )
        canaries.append(Canary(k, donor, str(names[donor]), r, size, secret, positions, num_train))
    return CanarySet(
        data.task, seed, secret_length, **space, source_population=data.population, canaries=tuple(canaries)
    )


# ---------------------------------------------------------------------------- the users
def canary_text(data: FederatedData, canaries: CanarySet, k: int) -> np.ndarray:
    """Canary ``k``'s text (char task, uint8 ids): its donor's text (truncated to ``size``) with
    the ``r`` copies inserted at ``positions``."""
    c = canaries.canaries[k]
    d = donor_text(data, c.donor)
    d = d if c.size is None else d[: c.size]
    copy = canaries.copy_tokens(c.secret).astype(np.uint8)
    parts, prev = [], 0
    for j, p in enumerate(c.positions):
        cut = p - j * len(copy)
        parts += [d[prev:cut], copy]
        prev = cut
    parts.append(d[prev:])
    return np.concatenate(parts)


def canary_rows(data: FederatedData, canaries: CanarySet, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Canary ``k``'s train samples (nwp task): its donor's first ``size`` sentences with the ``r``
    copies of the secret row placed at rows ``positions`` (``x = row[:-1]``, ``y = row[1:]``)."""
    c = canaries.canaries[k]
    n = c.num_train - c.repetitions
    dx, dy = data.train_samples(c.donor, np.arange(n))
    row = torch.from_numpy(canaries.copy_tokens(c.secret))
    x = torch.empty((c.num_train, canaries.window), dtype=torch.int64)
    y = torch.empty_like(x)
    is_copy = torch.zeros(c.num_train, dtype=torch.bool)
    is_copy[list(c.positions)] = True
    x[is_copy], y[is_copy] = row[:-1], row[1:]
    x[~is_copy], y[~is_copy] = dx.to(torch.int64), dy.to(torch.int64)
    return x, y


class CanaryFederatedData(FederatedView):
    """The source dataset's users but the donors (and ``exclude``), then the canary users.

    Users ``0..R−1`` are the real users in their original order (``source_index`` maps them
    back); users ``R..R+M−1`` are the canaries, named ``__canary_<k>``, with no test samples.
    Implements :class:`~fedsim.data.FederatedData` (see the module docstring on evaluation).

    Parameters
    ----------
    data : the source dataset the set was made from.
    canaries : the canary set.
    exclude : further users of ``data`` to hide (e.g. user inference's held-out users).
    """

    def __init__(self, data: FederatedData, canaries: CanarySet, exclude: Sequence[int] = ()) -> None:
        if data.population != canaries.source_population or data.task != canaries.task:
            raise FedsimError(
                f"the canary set was made from a {canaries.task!r} dataset of {canaries.source_population} users; "
                f"this one is {data.task!r} with {data.population}: pass the dataset the set was made from"
            )
        names = data.names
        for c in canaries.canaries:
            if names[c.donor] != c.donor_name:
                raise FedsimError(f"canary {c.index}: user {c.donor} is {names[c.donor]!r}, not {c.donor_name!r}")
        hidden = set(canaries.donors) | set(check_users(exclude, data.population, "exclude"))
        super().__init__(data, [u for u in range(data.population) if u not in hidden])
        self.canaries = canaries
        self._first = len(self._names)
        self._names = self._names + [c.name for c in canaries.canaries]
        self._texts: list[np.ndarray] = []
        self._rows: list[tuple[torch.Tensor, torch.Tensor]] = []
        for c in canaries.canaries:
            if canaries.task == "char":
                self._texts.append(canary_text(data, canaries, c.index))
                n = len(self._texts[-1]) - canaries.window
            else:
                self._rows.append(canary_rows(data, canaries, c.index))
                n = len(self._rows[-1][0])
            if n != c.num_train:
                raise FedsimError(f"canary {c.index}: its donor's data changed since the set was made; remake it")

    def canary_users(self) -> list[int]:
        """The canary users' indices, ``R..R+M−1``."""
        return list(range(self._first, len(self._names)))

    def is_canary(self, u: int) -> bool:
        return u >= self._first

    def canary_of(self, u: int) -> Canary:
        """The :class:`Canary` of canary user ``u``."""
        if not self._first <= u < len(self._names):
            raise FedsimError(f"user {u} is not a canary user ({self._first}..{len(self._names) - 1})")
        return self.canaries.canaries[u - self._first]

    def num_train(self, u: int) -> int:
        return self.canary_of(u).num_train if self.is_canary(u) else super().num_train(u)

    def num_test(self, u: int) -> int:
        return 0 if self.is_canary(u) else super().num_test(u)

    def examples_per_user(self) -> np.ndarray:
        extra = np.array([c.num_train for c in self.canaries.canaries], dtype=np.int64)
        return np.concatenate([super().examples_per_user(), extra])

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Train samples ``idx`` (indices into ``0..num_train(u)−1``) of user ``u``."""
        if not self.is_canary(u):
            return super().train_samples(u, idx)
        k = self.canary_of(u).index
        i = np.asarray(idx, dtype=np.int64)
        if self.canaries.task == "nwp":
            x, y = self._rows[k]
            t = torch.from_numpy(i)
            return x[t], y[t]
        w = self.canaries.window
        windows = np.lib.stride_tricks.sliding_window_view(self._texts[k], w + 1)[i]
        s = torch.from_numpy(np.ascontiguousarray(windows).astype(np.int64))
        return s[:, :w], s[:, w]

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Test samples of user ``u``; none for a canary user."""
        if not self.is_canary(u):
            return super().test_samples(u, max_examples)
        w = self.canaries.window
        x = torch.zeros((0, w), dtype=torch.int64)
        return x, (torch.zeros(0, dtype=torch.int64) if self.canaries.task == "char" else x.clone())

    def canary_text(self, k: int) -> np.ndarray:
        """Canary ``k``'s whole text (char task; all of it is train)."""
        return self._texts[k]


def with_canary_users(data: FederatedData, canaries: CanarySet, exclude: Sequence[int] = ()) -> CanaryFederatedData:
    """``data`` without the canaries' donors (and ``exclude``), plus the canary users.

    Parameters
    ----------
    data : the dataset ``canaries`` was made from (same population and donor names).
    canaries : from :func:`make_canary_set`.
    exclude : further users of ``data`` to hide (user inference's held-out users). Default none.

    Returns a :class:`CanaryFederatedData` of ``data.population − |donors ∪ exclude| + M`` users:
    the population to sample and account. Evaluate only its ``ordinary_users()``.
    """
    return CanaryFederatedData(data, canaries, exclude)
