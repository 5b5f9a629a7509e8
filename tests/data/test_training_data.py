"""Local training (clipping, determinism, no aliasing), the Shakespeare parser and data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

from fedsim.data import FederatedText, data_spec, load_federated
from fedsim.data import subset as _subset
from fedsim.data.shakespeare import UNK_ID, VOCAB_SIZE, decode, encode, parse_play
from fedsim.models import make_model, num_parameters
from fedsim.training.local import LocalTraining, evaluate_users, load_flat_, train_one_user, train_users
from fedsim.training.scheduling import assign_users

PLAY = """# The Tragedy of Testing

## ACT I

### SCENE I. A room.

_Enter ALPHA and BETA_

**ALPHA**  
First line of alpha,  
second line.

**BETA**  
Beta speaks once.

_Exit ALPHA_

**ALPHA**  
Alpha again.

## ACT II

Stray text without a speaker.

**BETA**  
Beta twice.
"""


def test_parse_play_groups_speeches_by_speaker():
    title, speeches = parse_play(PLAY)
    assert title == "The Tragedy of Testing"
    assert speeches == [
        ("ALPHA", "First line of alpha, second line."),
        ("BETA", "Beta speaks once."),
        ("ALPHA", "Alpha again."),
        ("BETA", "Beta twice."),
    ]


def test_encode_decode_and_unknown():
    s = "Hello, world!"
    assert decode(encode(s)) == s
    ids = encode("a—b")
    assert ids[1] == UNK_ID and ids.max() < VOCAB_SIZE


def _toy_data(lengths, window=5):
    rng = np.random.default_rng(0)
    texts = [rng.integers(1, 20, size=n).astype(np.uint8) for n in lengths]
    return FederatedText([f"u{i}" for i in range(len(lengths))], texts, window, 20)


def test_windows_and_80_20_split():
    d = _toy_data([105], window=5)
    m = 100
    assert d.num_train(0) == 80 and d.num_test(0) == 20 and d.num_train(0) + d.num_test(0) == m
    x, y = d.train_samples(0, np.array([0, 7]))
    t = d.texts[0]
    assert x[1].tolist() == t[7:12].tolist() and int(y[1]) == int(t[12])
    xt, yt = d.test_samples(0)
    assert xt[0].tolist() == t[80:85].tolist() and int(yt[-1]) == int(t[-1])
    xs, _ = d.test_samples(0, max_examples=4)
    assert len(xs) == 4


def test_majority_baseline_independent_count():
    d = _toy_data([300, 400, 250])
    users = [0, 1, 2]
    ys_train = np.concatenate([d.texts[u][d.window : d.window + d.num_train(u)] for u in users])
    top = np.bincount(ys_train).argmax()
    ys_test = np.concatenate([d.texts[u][d.window + d.num_train(u) :] for u in users])
    got_top, acc = d.majority_baseline(users)
    assert got_top == top and acc == pytest.approx(float(np.mean(ys_test == top)))


def test_subset_is_stable_and_seeded():
    a = _subset(100, 10, seed=3)
    assert a == _subset(100, 10, seed=3) and a == sorted(a) and len(set(a)) == 10
    assert a != _subset(100, 10, seed=4)
    assert _subset(5, None, 0) == list(range(5))


@pytest.fixture(scope="module")
def shakespeare():
    return load_federated(data_spec("shakespeare", max_users=40))


def test_real_shakespeare_population(shakespeare):
    full = load_federated(data_spec("shakespeare"))
    assert full.population > 500  # (play, speaker) pairs with ≥ 500 characters
    assert shakespeare.population == 40
    assert set(shakespeare.names) <= set(full.names)
    for u in range(shakespeare.population):
        assert shakespeare.num_train(u) >= 4 * shakespeare.num_test(u) - 4
        assert len(shakespeare.texts[u]) >= 500
        assert "::" in shakespeare.names[u]


def test_models_sizes():
    assert num_parameters(make_model("shakespeare_lstm_small", VOCAB_SIZE)) < 100_000
    assert 800_000 < num_parameters(make_model("shakespeare_lstm", VOCAB_SIZE)) < 850_000
    a = parameters_to_vector(make_model("shakespeare_lstm_small", VOCAB_SIZE, seed=1).parameters())
    b = parameters_to_vector(make_model("shakespeare_lstm_small", VOCAB_SIZE, seed=1).parameters())
    assert torch.equal(a, b)


SPEC = LocalTraining(epochs=1, batch_size=4, lr=5.0, max_examples=8, clip_norm=0.05)


def test_user_update_is_clipped_and_does_not_alias_x0(shakespeare):
    model = make_model("shakespeare_lstm_small", VOCAB_SIZE, seed=0)
    x0 = parameters_to_vector(model.parameters()).detach().clone()
    x0_copy = x0.clone()
    u, res = train_one_user(model, x0, shakespeare, 0, round_index=0, seed=0, spec=SPEC)
    assert torch.equal(x0, x0_copy), "training must not modify the global vector"
    assert res.norm > SPEC.clip_norm and res.clipped
    assert float(torch.linalg.vector_norm(u.double())) <= SPEC.clip_norm
    assert float(torch.linalg.vector_norm(u.double())) > 0.9 * SPEC.clip_norm


def test_user_update_independent_of_order_and_worker(shakespeare):
    m1 = make_model("shakespeare_lstm_small", VOCAB_SIZE, seed=0)
    m2 = make_model("shakespeare_lstm_small", VOCAB_SIZE, seed=5)  # another worker's model object
    x0 = parameters_to_vector(m1.parameters()).detach().clone()
    s1, r1 = train_users(m1, x0, shakespeare, [1, 2, 3], 4, 7, SPEC)
    s2a, _ = train_users(m2, x0, shakespeare, [3, 1], 4, 7, SPEC)
    s2b, _ = train_users(m2, x0, shakespeare, [2], 4, 7, SPEC)
    torch.testing.assert_close(s1, s2a + s2b, rtol=1e-5, atol=1e-7)
    s3, _ = train_users(m1, x0, shakespeare, [1, 2, 3], 5, 7, SPEC)  # another round: other batches
    assert not torch.allclose(s1, s3)


def test_users_without_test_samples_give_zero_counts_not_a_failed_reply():
    """A worker whose evaluation users hold no test samples (the generated Stack Overflow folders
    give every third user some) replies with the counts at 0: a reply without ``count`` would be
    taken by the server for a failed evaluation reply, and mark a healthy round irregular."""

    class NoTestSamples:
        def test_samples(self, u, max_examples):
            return torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)

        def eval_sums(self, out, y):
            raise AssertionError("no batch to evaluate")

    model = torch.nn.Linear(3, 4)
    sums = evaluate_users(model, parameters_to_vector(model.parameters()).detach(), NoTestSamples(), [0, 1], None)
    assert sums == dict.fromkeys(("loss_sum", "loss_count", "correct", "count", "examples", "failed_users"), 0.0)


def test_load_flat_checks_length():
    model = make_model("shakespeare_lstm_small", VOCAB_SIZE)
    with pytest.raises(ValueError):
        load_flat_(list(model.parameters()), torch.zeros(10))


def test_assign_users_balances_skewed_costs():
    rng = np.random.default_rng(0)
    costs = rng.pareto(1.5, size=1000) * 10 + 1
    users = list(range(0, 1000, 3))
    shares = assign_users(users, costs, 4)
    assert sorted(u for s in shares for u in s) == users
    loads = [sum(costs[u] for u in s) for s in shares]
    assert max(loads) <= max(1.2 * np.mean(loads), np.mean(loads) + max(costs[users]))
    assert assign_users([], costs, 3) == [[], [], []]


def test_assign_users_keeps_every_worker_within_1_2x_the_mean_load():
    rng = np.random.default_rng(1)
    costs = np.exp(rng.normal(0.0, 1.0, size=5000)) * 64  # skewed (lognormal), no single user dominates
    for workers in (2, 4, 8):
        users = sorted(rng.choice(5000, size=400, replace=False).tolist())
        loads = [sum(costs[u] for u in s) for s in assign_users(users, costs, workers)]
        assert max(loads) <= 1.2 * np.mean(loads), (workers, max(loads) / np.mean(loads))
