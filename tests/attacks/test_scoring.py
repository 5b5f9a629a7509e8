"""Log-perplexity of secrets under a model, reference candidates, the canary report; and a real
memorisation check: a model trained on a canary user's text ranks its secret first."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.attacks.canaries import make_canary_set, with_canary_users
from fedsim.attacks.scoring import canary_report, reference_candidates, sequence_log_perplexity
from fedsim.data import FederatedText, shakespeare
from fedsim.data.stackoverflow.dataset import SOSettings, StackOverflowFederated
from fedsim.data.stackoverflow.synthetic import generate
from fedsim.errors import FedsimError
from fedsim.models import make_model

C = 7  # classes of the hand-set models
WINDOW = 10


class LastToken(nn.Module):
    """Hand-set char model: the next token's logits are ``table[last token of the window]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table)
        self.lengths: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lengths.append(x.shape[1])
        return self.table[x[:, -1]]


class FirstToken(LastToken):
    """Hand-set char model whose prediction depends on the window's *first* token."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lengths.append(x.shape[1])
        return self.table[x[:, 0]]


class Tokenwise(LastToken):
    """Hand-set nwp model: position ``t`` predicts with logits ``table[x_t]`` (``[B, T, C]``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x]


def bits(table: torch.Tensor, prev: int, cur: int) -> float:
    return -float(torch.log_softmax(table[prev].double(), dim=0)[cur]) / math.log(2)


@pytest.fixture
def table() -> torch.Tensor:
    return torch.randn(C, C, generator=torch.Generator().manual_seed(0)) * 2


# --------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("task,cls", [("char", LastToken), ("nwp", Tokenwise)])
def test_log_perplexity_is_the_closed_form_sum_of_bits(table, task, cls):
    rng = np.random.default_rng(1)
    seqs = rng.integers(0, C, size=(50, 5))
    ctx = [3, 1, 4]
    got = sequence_log_perplexity(cls(table), task, seqs, ctx)
    want = [sum(bits(table, p, c) for p, c in zip([ctx[-1], *s[:-1]], s)) for s in seqs.tolist()]
    assert got.dtype == np.float64 and got.shape == (50,)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    one = sequence_log_perplexity(cls(table), task, seqs[7], ctx)
    np.testing.assert_allclose(one, [want[7]], rtol=1e-6)
    small = sequence_log_perplexity(cls(table), task, seqs, ctx, batch_size=3)
    np.testing.assert_allclose(small, got, rtol=1e-9)


def test_char_windows_are_the_last_w_tokens(table):
    rng = np.random.default_rng(2)
    seqs = rng.integers(0, C, size=(40, 6))
    ctx, w = [5, 2, 6, 0], 5
    model = FirstToken(table)
    got = sequence_log_perplexity(model, "char", seqs, ctx, window=w)
    want = []
    for s in seqs.tolist():
        full = ctx + s
        want.append(sum(bits(table, full[max(0, len(ctx) + i - w)], s[i]) for i in range(len(s))))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert model.lengths == [min(len(ctx) + i, w) for i in range(6)]  # one batch per position


class Opaque(nn.Module):
    """Hides a model's class, so scoring takes the generic path."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@pytest.mark.parametrize("ctx_len,window", [(3, 6), (12, 6), (4, None), (1, 1)])
def test_the_char_lstm_fast_path_gives_the_generic_numbers(ctx_len, window):
    model = make_model("shakespeare_lstm_small", shakespeare.VOCAB_SIZE, seed=1)
    rng = np.random.default_rng(ctx_len)
    seqs = rng.integers(1, 4, size=(60, 5))  # a small alphabet: shared windows are deduplicated
    ctx = rng.integers(1, 96, size=ctx_len)
    fast = sequence_log_perplexity(model, "char", seqs, ctx, window=window, batch_size=7)
    slow = sequence_log_perplexity(Opaque(model), "char", seqs, ctx, window=window, batch_size=7)
    np.testing.assert_allclose(fast, slow, rtol=1e-5)


def test_scoring_restores_the_mode_and_checks_its_arguments(table):
    model = LastToken(table)
    model.train()
    sequence_log_perplexity(model, "char", [1, 2], [3])
    assert model.training
    with pytest.raises(FedsimError, match="context"):
        sequence_log_perplexity(model, "char", [1, 2], [])
    with pytest.raises(FedsimError, match="'tag'"):
        sequence_log_perplexity(model, "tag", [1, 2], [3])


# --------------------------------------------------------------------------- references
def tiny_text(users: int, seed: int = 0) -> FederatedText:
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(users):
        words = ("".join(rng.choice(list("abcdefgh"), size=int(rng.integers(2, 6)))) for _ in range(200))
        texts.append(shakespeare.encode(" ".join(words)[:300]))
    return FederatedText([f"u{u}" for u in range(users)], texts, WINDOW, shakespeare.VOCAB_SIZE)


def test_reference_candidates_come_from_the_secret_space():
    cs = make_canary_set(tiny_text(4), 1, secret_length=6, alphabet=[10, 20, 30])
    refs = reference_candidates(cs, 500, seed=5)
    assert refs.shape == (500, 6) and refs.dtype == np.int64 and set(np.unique(refs)) == {10, 20, 30}
    assert np.array_equal(refs, reference_candidates(cs, 500, seed=5))
    assert not np.array_equal(refs, reference_candidates(cs, 500, seed=6))
    with pytest.raises(FedsimError, match="≥ 1"):
        reference_candidates(cs, 0, seed=5)


# --------------------------------------------------------------------------- memorisation
def fit(model: nn.Module, data, users: list[int], steps: int, lr: float = 0.02, batch: int = 64) -> nn.Module:
    """Adam on the users' pooled train samples (a stand-in for federated training)."""
    xs, ys = zip(*(data.train_samples(u, np.arange(data.num_train(u))) for u in users))
    x, y = torch.cat(xs), torch.cat(ys)
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        i = torch.randint(len(y), (batch,), generator=g)
        opt.zero_grad()
        data.loss(model(x[i]), y[i]).backward()
        opt.step()
    return model


def test_a_model_trained_on_the_canary_user_exposes_its_secret():
    data = tiny_text(4)
    cs = make_canary_set(data, 1, repetitions=(16,), sizes=(200,), secret_length=6, seed=3)
    view = with_canary_users(data, cs)
    untrained = make_model("shakespeare_lstm_small", view.model_dims(), seed=0)
    trained = fit(make_model("shakespeare_lstm_small", view.model_dims(), seed=0), view, view.canary_users(), 300)
    n = 1000
    before = canary_report(untrained, cs, n_references=n, seed=1)
    after = canary_report(trained, cs, n_references=n, seed=1)
    b, a = before["canaries"][0], after["canaries"][0]
    assert a["log_perplexity"] < 0.25 * b["log_perplexity"]
    assert a["rank"] == 1 and a["exposure"] == pytest.approx(math.log2(n + 1))
    assert a["exposure"] > b["exposure"] + 3
    assert a["extrapolated_exposure"] > max(b["extrapolated_exposure"], a["exposure"])
    assert a["repetitions"] == 16 and a["size"] == 200 and a["num_train"] == cs.canaries[0].num_train
    direct = sequence_log_perplexity(trained, "char", cs.canaries[0].secret, cs.context, window=WINDOW)
    assert a["log_perplexity"] == pytest.approx(direct[0])
    assert after["unit"] == "bits" and after["by_level"][0]["canaries"] == 1


def test_nwp_report_covers_every_level_and_memorises(tmp_path):
    root = generate(tmp_path / "so", users=8, per_user=6, vocab=30, tags=3, seed=2)
    data = StackOverflowFederated(str(root), SOSettings("nwp", vocab_size=30, seq_len=10, max_elements_per_user=8))
    cs = make_canary_set(data, 4, repetitions=(1, 8), sizes=(3, None), secret_length=4, seed=0)
    view = with_canary_users(data, cs)
    model = make_model("so_nwp_lstm_small", view.model_dims(), seed=0)
    before = canary_report(model, cs, n_references=300, seed=0)
    fit(model, view, view.canary_users(), 150, lr=0.03, batch=16)
    after = canary_report(model, cs, n_references=300, seed=0)
    assert [(c["repetitions"], c["size"]) for c in after["canaries"]] == [(1, 3), (8, 3), (1, None), (8, None)]
    assert [(g["repetitions"], g["size"], g["canaries"]) for g in after["by_level"]] == [
        (1, 3, 1),
        (8, 3, 1),
        (1, None, 1),
        (8, None, 1),
    ]
    assert after["secret_space_bits"] == pytest.approx(4 * math.log2(30))
    for b, a in zip(before["canaries"], after["canaries"]):
        assert a["log_perplexity"] < b["log_perplexity"]
        if a["repetitions"] == 8:
            assert a["rank"] == 1
