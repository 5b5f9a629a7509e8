"""Secret-sharer canary users: the canary set, the canary view of a dataset, hiding users."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from fedsim.attacks.canaries import (
    CANARY_NAME_PREFIX,
    DEFAULT_CHAR_PREFIX,
    CanarySet,
    canary_text,
    donor_text,
    make_canary_set,
    with_canary_users,
)
from fedsim.attacks.views import without_users
from fedsim.data import FederatedText, shakespeare
from fedsim.data.stackoverflow.dataset import SOSettings, StackOverflowFederated
from fedsim.data.stackoverflow.synthetic import generate
from fedsim.errors import FedsimError

WINDOW = 10


def tiny_text(users: int = 8, seed: int = 0, lengths: tuple[int, int] = (120, 400)) -> FederatedText:
    """Users with random lower-case 'words' of random lengths (no secret can occur by chance)."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(users):
        n = int(rng.integers(*lengths))
        words = ("".join(rng.choice(list("abcdefghij"), size=int(rng.integers(2, 7)))) for _ in range(n))
        texts.append(shakespeare.encode(" ".join(words)[:n]))
    return FederatedText([f"user{u}" for u in range(users)], texts, WINDOW, shakespeare.VOCAB_SIZE)


def occurrences(text: np.ndarray, pattern: np.ndarray) -> list[int]:
    windows = np.lib.stride_tricks.sliding_window_view(text, len(pattern))
    return np.flatnonzero((windows == pattern).all(axis=1)).tolist()


@pytest.fixture(scope="module")
def so_data(tmp_path_factory) -> StackOverflowFederated:
    root = generate(tmp_path_factory.mktemp("so") / "d", users=10, per_user=8, vocab=30, tags=3, seed=1)
    return StackOverflowFederated(str(root), SOSettings("nwp", vocab_size=30, seq_len=12, max_elements_per_user=16))


# --------------------------------------------------------------------------- the set
def test_canary_set_is_seeded_cycles_levels_and_round_trips_json():
    data = tiny_text()
    a = make_canary_set(data, 4, repetitions=(1, 3), sizes=(60, None), secret_length=6, seed=7, exclude=[0, 1])
    b = make_canary_set(data, 4, repetitions=(1, 3), sizes=(60, None), secret_length=6, seed=7, exclude=[0, 1])
    assert a == b and CanarySet.from_json(a.to_json()) == a
    assert make_canary_set(data, 4, repetitions=(1, 3), sizes=(60, None), secret_length=6, seed=8) != a
    assert [(c.repetitions, c.size) for c in a.canaries] == [(1, 60), (3, 60), (1, None), (3, None)]
    assert len(set(a.donors)) == 4 and not set(a.donors) & {0, 1}
    assert [data.names[c.donor] for c in a.canaries] == [c.donor_name for c in a.canaries]
    assert a.context == tuple(shakespeare.encode(DEFAULT_CHAR_PREFIX).tolist())
    assert a.alphabet == tuple(range(1, shakespeare.VOCAB_SIZE)) and a.window == WINDOW
    assert all(len(c.secret) == 6 and set(c.secret) <= set(a.alphabet) for c in a.canaries)
    assert len({c.secret for c in a.canaries}) == 4
    assert a.secret_space_bits == pytest.approx(6 * np.log2(95))


def test_char_secret_is_inserted_exactly_r_times_at_the_documented_positions():
    data = tiny_text()
    cs = make_canary_set(data, 6, repetitions=(1, 4, 16), sizes=(80, None), secret_length=8, seed=3)
    for c in cs.canaries:
        text = canary_text(data, cs, c.index)
        copy = cs.copy_tokens(c.secret)
        assert len(c.positions) == c.repetitions and list(c.positions) == sorted(c.positions)
        for p in c.positions:
            assert np.array_equal(text[p : p + len(copy)], copy)
        assert occurrences(text, np.asarray(c.secret)) == [p + len(cs.prefix) for p in c.positions]
        # Removing the copies gives back the donor's text, truncated to the canary's size.
        keep = np.ones(len(text), dtype=bool)
        for p in c.positions:
            keep[p : p + len(copy)] = False
        donor = donor_text(data, c.donor)
        assert np.array_equal(text[keep], donor if c.size is None else donor[: c.size])
        assert c.num_train == len(text) - WINDOW


# --------------------------------------------------------------------------- the canary view
def test_canary_view_is_exact_for_real_and_canary_users():
    data = tiny_text()
    cs = make_canary_set(data, 3, repetitions=(2,), secret_length=5, seed=1, exclude=[2])
    view = with_canary_users(data, cs, exclude=[2])
    hidden = set(cs.donors) | {2}
    real = [u for u in range(data.population) if u not in hidden]
    assert view.population == len(real) + 3 == data.population - len(hidden) + 3
    assert list(view.names) == [data.names[u] for u in real] + [f"{CANARY_NAME_PREFIX}{k}" for k in range(3)]
    assert view.ordinary_users() == list(range(len(real))) and view.canary_users() == [len(real) + k for k in range(3)]
    for u, src in enumerate(real):
        assert view.source_index(u) == src and not view.is_canary(u)
        assert (view.num_train(u), view.num_test(u)) == (data.num_train(src), data.num_test(src))
        idx = np.array([0, data.num_train(src) - 1])
        for got, want in zip(view.train_samples(u, idx), data.train_samples(src, idx)):
            assert torch.equal(got, want)
        for got, want in zip(view.test_samples(u, 3), data.test_samples(src, 3)):
            assert torch.equal(got, want)
    for k, u in enumerate(view.canary_users()):
        c = view.canary_of(u)
        text = view.canary_text(k)
        assert c.index == k and view.num_train(u) == c.num_train == len(text) - WINDOW
        x, y = view.train_samples(u, np.arange(c.num_train))
        windows = np.lib.stride_tricks.sliding_window_view(text, WINDOW + 1)
        assert torch.equal(x, torch.from_numpy(windows[:, :WINDOW].astype(np.int64)))
        assert torch.equal(y, torch.from_numpy(windows[:, WINDOW].astype(np.int64)))
    want = [data.num_train(u) for u in real] + [c.num_train for c in cs.canaries]
    assert view.examples_per_user().tolist() == want
    assert view.model_dims() == data.model_dims() and view.task == "char" and view.window == WINDOW
    with pytest.raises(FedsimError, match="not an ordinary user"):
        view.source_index(view.canary_users()[0])


def test_canary_users_never_reach_ordinary_evaluation():
    data = tiny_text()
    cs = make_canary_set(data, 2, repetitions=(4,), secret_length=5, seed=2)
    view = with_canary_users(data, cs)
    model = torch.nn.Sequential(torch.nn.Embedding(data.vocab_size, 4), torch.nn.Flatten(), torch.nn.LazyLinear(96))
    model(torch.zeros((1, WINDOW), dtype=torch.int64))

    @torch.no_grad()
    def evaluate(d, users):  # what fedsim.training.local.evaluate_users sums
        sums: dict[str, float] = {}
        for u in users:
            xb, yb = d.test_samples(u, None)
            for s in range(0, len(yb), 256):
                for key, v in d.eval_sums(model(xb[s : s + 256]), yb[s : s + 256]).items():
                    sums[key] = sums.get(key, 0.0) + v
        return sums

    for u in view.canary_users():
        x, y = view.test_samples(u, 5)
        assert view.num_test(u) == 0 and x.shape == (0, WINDOW) and y.shape == (0,)
    everyone = evaluate(view, range(view.population))
    assert everyone == evaluate(view, view.ordinary_users())
    assert everyone == evaluate(data, [view.source_index(u) for u in view.ordinary_users()])
    assert view.majority_baseline(list(range(view.population))) == data.majority_baseline(
        [view.source_index(u) for u in view.ordinary_users()]
    )


def test_nwp_secret_rows_are_added_r_times_at_the_documented_rows(so_data):
    cs = make_canary_set(so_data, 4, repetitions=(1, 3), sizes=(2, None), secret_length=5, seed=4)
    nwp = so_data.nwp
    assert cs.alphabet == tuple(range(1, nwp.V + 1)) and cs.context == (nwp.bos,)
    view = with_canary_users(so_data, cs)
    for u in view.canary_users():
        c = view.canary_of(u)
        assert set(c.secret) <= set(range(1, nwp.V + 1)) and len(c.positions) == c.repetitions
        row = np.array([nwp.bos, *c.secret, nwp.eos] + [0] * (cs.window - 6))
        assert np.array_equal(cs.copy_tokens(c.secret), row)
        x, y = view.train_samples(u, np.arange(view.num_train(u)))
        n_donor = so_data.num_train(c.donor) if c.size is None else c.size
        assert len(x) == c.num_train == n_donor + c.repetitions
        is_copy = (x == torch.from_numpy(row[:-1])).all(dim=1) & (y == torch.from_numpy(row[1:])).all(dim=1)
        assert torch.nonzero(is_copy).flatten().tolist() == list(c.positions)
        dx, dy = so_data.train_samples(c.donor, np.arange(n_donor))
        assert torch.equal(x[~is_copy], dx) and torch.equal(y[~is_copy], dy)
        tx, ty = view.test_samples(u)
        assert tx.shape == ty.shape == (0, cs.window) and view.num_test(u) == 0
    assert CanarySet.from_json(cs.to_json()) == cs
    assert view.nwp is so_data.nwp and view.vocab_size == so_data.vocab_size


def test_nwp_sentence_must_fit_the_sequence_length(so_data):
    with pytest.raises(FedsimError, match="data.seq_len"):
        make_canary_set(so_data, 1, secret_length=13)
    with pytest.raises(FedsimError, match="data.seq_len"):
        make_canary_set(so_data, 1, secret_length=10, prefix=[1, 2, 3])
    full = make_canary_set(so_data, 1, secret_length=12)  # L words: no EOS
    c = full.canaries[0]
    assert np.array_equal(full.copy_tokens(c.secret), [full.bos, *c.secret])


def test_errors_say_what_to_change():
    data = tiny_text(users=4)
    with pytest.raises(FedsimError, match="lower num_canaries"):
        make_canary_set(data, 3)
    with pytest.raises(FedsimError, match="lower num_canaries or sizes"):
        make_canary_set(data, 1, sizes=(10_000,))
    with pytest.raises(FedsimError, match="repetitions"):
        make_canary_set(data, 1, repetitions=(0,))
    with pytest.raises(FedsimError, match="seed must be an integer ≥ 0"):
        make_canary_set(data, 1, seed=-1)
    with pytest.raises(FedsimError, match="alphabet"):
        make_canary_set(data, 1, alphabet=[500])
    cs = make_canary_set(data, 1)
    with pytest.raises(FedsimError, match="pass the dataset the set was made from"):
        with_canary_users(tiny_text(users=5), cs)
    renamed = FederatedText([f"other{u}" for u in range(4)], data.texts, WINDOW, data.vocab_size)
    with pytest.raises(FedsimError, match="not"):
        with_canary_users(renamed, cs)


# --------------------------------------------------------------------------- hiding users
def test_without_users_hides_exactly_the_given_users():
    data = tiny_text(users=6)
    view = without_users(data, [4, 1])
    assert view.population == 4 and list(view.names) == ["user0", "user2", "user3", "user5"]
    assert [view.source_index(u) for u in range(4)] == [0, 2, 3, 5]
    assert view.examples_per_user().tolist() == [data.num_train(u) for u in (0, 2, 3, 5)]
    for u, src in enumerate((0, 2, 3, 5)):
        assert view.num_train(u) == data.num_train(src) and view.num_test(u) == data.num_test(src)
        for got, want in zip(view.train_samples(u, np.arange(4)), data.train_samples(src, np.arange(4))):
            assert torch.equal(got, want)
    assert without_users(data, []).population == 6
    with pytest.raises(FedsimError, match="distinct"):
        without_users(data, [1, 1])
    with pytest.raises(FedsimError, match="0..5"):
        without_users(data, [6])
    with pytest.raises(FedsimError, match="hide fewer"):
        without_users(data, range(6))
    with pytest.raises(AttributeError):
        _ = view.texts  # per-user attributes of the source are not passed through


def test_views_pickle():
    data = tiny_text(users=5)
    view = with_canary_users(data, make_canary_set(data, 1, repetitions=(3,)))
    back = pickle.loads(pickle.dumps(view))
    u = back.canary_users()[0]
    assert list(back.names) == list(view.names)
    assert torch.equal(back.train_samples(u, np.arange(5))[0], view.train_samples(u, np.arange(5))[0])
