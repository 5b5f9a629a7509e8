"""User inference: the seeded split, the per-sample log-likelihood, and the statistic's sign on
a model that was (and was not) trained on a user."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.attacks.stats import roc_auc
from fedsim.attacks.user_inference import (
    sample_log_likelihood,
    split_users,
    user_inference_scores,
    user_statistic,
    users_with_test_samples,
)
from fedsim.attacks.views import without_users
from fedsim.data import FederatedText, shakespeare
from fedsim.errors import FedsimError
from fedsim.models import make_model

WINDOW = 8


def phrase_users(users: int, seed: int = 0) -> FederatedText:
    """Each user repeats a phrase of their own (with a little noise): their test text follows the
    same pattern as their train text, and differs from every other user's."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(users):
        phrase = "".join(rng.choice(list("abcdefghijklmnop"), size=9)) + " "
        text = np.array(list(phrase * 30))
        noise = rng.random(len(text)) < 0.03
        text[noise] = rng.choice(list("abcdefghijklmnop"), size=int(noise.sum()))
        texts.append(shakespeare.encode("".join(text)))
    return FederatedText([f"u{u}" for u in range(users)], texts, WINDOW, shakespeare.VOCAB_SIZE)


def fit(model: nn.Module, data, users, steps: int, lr: float = 0.02, batch: int = 64) -> nn.Module:
    xs, ys = zip(*(data.train_samples(u, np.arange(data.num_train(u))) for u in users))
    x, y = torch.cat(xs), torch.cat(ys)
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        i = torch.randint(len(y), (batch,), generator=g)
        opt.zero_grad()
        data.loss(model(x[i]), y[i]).backward()
        opt.step()
    return model


# --------------------------------------------------------------------------- the split
def test_split_is_seeded_disjoint_and_within_eligible():
    s = split_users(20, 4, seed=3)
    assert s == split_users(20, 4, seed=3) and s != split_users(20, 4, seed=4)
    assert len(s.held_out) == len(s.held_in) == 4 and not set(s.held_out) & set(s.held_in)
    assert list(s.held_out) == sorted(s.held_out) and set(s.held_out) | set(s.held_in) <= set(range(20))
    eligible = [1, 3, 5, 7, 9, 11]
    e = split_users(20, 3, seed=0, eligible=eligible)
    assert sorted(e.held_out + e.held_in) == eligible
    with pytest.raises(FedsimError, match="lower n_held_out"):
        split_users(20, 4, seed=0, eligible=eligible)
    with pytest.raises(FedsimError, match="lower n_held_out"):
        split_users(20, 0, seed=0)
    with pytest.raises(FedsimError, match="0..19"):
        split_users(20, 1, seed=0, eligible=[25, 1])


# --------------------------------------------------------------------------- log-likelihoods
def test_sample_log_likelihood_closed_form():
    out = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([4, 0, 2])
    want = [float(torch.log_softmax(out[b].double(), 0)[y[b]]) for b in range(3)]
    np.testing.assert_allclose(sample_log_likelihood(out, y).numpy(), want, rtol=1e-12)
    seq = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([[3, 1, 0, 0], [2, 2, 4, 1]])  # 0 = pad, not counted
    lp = torch.log_softmax(seq.double(), -1)
    want2 = [float(lp[0, 0, 3] + lp[0, 1, 1]), float(sum(lp[1, t, tokens[1, t]] for t in range(4)))]
    np.testing.assert_allclose(sample_log_likelihood(seq, tokens).numpy(), want2, rtol=1e-12)
    with pytest.raises(FedsimError, match="not supported"):
        sample_log_likelihood(out, torch.zeros(3, 5))


# --------------------------------------------------------------------------- the statistic
def test_statistic_is_zero_against_itself_and_positive_for_trained_users():
    data = phrase_users(10)
    split = split_users(data.population, 3, seed=0)
    train = without_users(data, split.held_out)
    trained_on = [train.source_index(u) for u in range(train.population)]
    assert set(split.held_in) <= set(trained_on) and not set(split.held_out) & set(trained_on)
    initial = make_model("shakespeare_lstm_small", data.model_dims(), seed=0)
    model = fit(make_model("shakespeare_lstm_small", data.model_dims(), seed=0), train, range(train.population), 400)
    same_in, same_out = user_inference_scores(model, model, data, split.held_in, split.held_out)
    assert np.array_equal(same_in, np.zeros(3)) and np.array_equal(same_out, np.zeros(3))
    s_in, s_out = user_inference_scores(model, initial, data, split.held_in, split.held_out, max_examples=40)
    assert s_in.shape == s_out.shape == (3,) and s_in.dtype == np.float64
    assert (s_in > 1.0).all() and s_in.min() > s_out.max()
    assert roc_auc(s_in, s_out) == 1.0
    one = user_statistic(model, initial, data, split.held_in[0], max_examples=40)
    assert math.isclose(one, s_in[0], rel_tol=1e-12)
    x, y = data.test_samples(split.held_in[0], 40)  # the statistic's definition, directly
    with torch.no_grad():
        direct = (sample_log_likelihood(model(x), y) - sample_log_likelihood(initial(x), y)).mean()
    assert one == pytest.approx(float(direct), rel=1e-9)


def test_users_without_test_samples_are_named():
    texts = [shakespeare.encode(t) for t in ("x" * 40, "y" * 4, "z" * 60)]  # "yyyy": no sample at w = 4
    data = FederatedText(["a", "b", "c"], texts, 4, shakespeare.VOCAB_SIZE)
    assert users_with_test_samples(data) == [0, 2]
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=0)
    with pytest.raises(FedsimError, match="users_with_test_samples"):
        user_statistic(model, model, data, 1)
