"""Vectorized multi-user training (torch.func.vmap over stacked per-user parameters) against
sequential training user by user: same clipped-update sum and per-user results up to float
rounding, for users with different sample counts, several epochs and a ragged last batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import text_users

from fedsim.config import load_config
from fedsim.data.synthetic import SyntheticClassification
from fedsim.errors import FedsimError
from fedsim.models import make_model
from fedsim.training.local import LocalTraining, train_users
from fedsim.training.vectorized import recurrent, train_users_vectorized, vectorizable


class Ragged(SyntheticClassification):
    """Users with different sample counts (3 groups)."""

    def num_train(self, u: int) -> int:
        return [13, 20, 7][u % 3]

    def examples_per_user(self) -> np.ndarray:
        return np.array([self.num_train(u) for u in range(self.users)])


class RaggedNoBatchedLoss(Ragged):
    """A dataset without ``batched_loss``: the vectorized path vmaps its ``loss`` instead."""

    batched_loss = None


@pytest.mark.parametrize(
    "name,clip,batched", [("logreg", 0.05, True), ("logreg", 100.0, True), ("mlp", 0.5, True), ("mlp", 0.5, False)]
)
def test_vectorized_equals_sequential(name, clip, batched):
    torch.manual_seed(0)
    data = (Ragged if batched else RaggedNoBatchedLoss)(users=40, samples=20, features=12, classes=5, seed=3)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    else:
        model = make_model("logreg", data.model_dims(), seed=1)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=2, batch_size=4, lr=0.3, max_examples=16, clip_norm=clip)
    users = [3, 17, 5, 0, 38, 22, 9, 11, 30]
    seq_total, seq_res = train_users(model, x0, data, users, round_index=4, seed=7, spec=spec)
    vec_total, vec_res = train_users_vectorized(model, x0, data, users, round_index=4, seed=7, spec=spec)
    torch.testing.assert_close(vec_total, seq_total, rtol=1e-5, atol=1e-6)
    assert [r.user for r in vec_res] == users
    for a, b in zip(seq_res, vec_res):
        assert (a.num_examples, a.clipped) == (b.num_examples, b.clipped)
        assert a.loss == pytest.approx(b.loss, rel=1e-5) and a.norm == pytest.approx(b.norm, rel=1e-5)
    assert any(r.clipped for r in seq_res) == (clip < 1)


def _nwp_users(tmp_path):
    from fedsim.data import data_spec, load_federated
    from fedsim.data.stackoverflow.synthetic import generate

    root = generate(tmp_path / "so", users=12, per_user=10, vocab=40, tags=4, seed=5)
    return load_federated(data_spec("stackoverflow_nwp", root=str(root), vocab_size=30, seq_len=6, num_oov_buckets=1))


@pytest.mark.parametrize("name", ["shakespeare_lstm_small", "so_nwp_lstm_small"])
def test_lstm_users_vectorized_equal_sequential(name, tmp_path):
    """The batched recurrent path (every user's own LSTM weights, one vmapped StepwiseLSTM)
    against fused nn.LSTM training user by user: same sum of clipped deltas and per-user results."""
    data = text_users(12, seed=2) if name.startswith("shakespeare") else _nwp_users(tmp_path)
    model = make_model(name, data.model_dims(), seed=3)
    assert vectorizable(model) and recurrent(model)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=2, batch_size=3, lr=0.5, max_examples=8, clip_norm=0.05)
    users = [7, 0, 11, 4, 2, 9, 5]
    assert len({data.num_train(u) for u in users}) > 1  # several groups of equal sample counts
    seq_total, seq_res = train_users(model, x0, data, users, round_index=2, seed=11, spec=spec)
    vec_total, vec_res = train_users_vectorized(model, x0, data, users, round_index=2, seed=11, spec=spec)
    torch.testing.assert_close(vec_total, seq_total, rtol=1e-4, atol=1e-6)
    assert float(seq_total.norm()) > 0.05  # users moved, and were clipped
    for a, b in zip(seq_res, vec_res):
        assert (a.user, a.num_examples, a.clipped) == (b.user, b.num_examples, b.clipped)
        assert a.loss == pytest.approx(b.loss, rel=1e-5) and a.norm == pytest.approx(b.norm, rel=1e-4)
    # the model the worker keeps is still the fused one, with its starting parameters
    assert any(isinstance(m, torch.nn.LSTM) for m in model.modules())


def test_users_of_different_sizes_train_together_on_the_samples_their_plans_take(monkeypatch):
    """Users with more samples than ``max_examples`` share a step structure whatever their size:
    they train as one chunk (grouping them by their whole sample count left real users, whose
    counts all differ, one per chunk: nothing batched), and only the samples a user's plan takes
    are read (not all of a user's samples). Two epochs take different subsets, so the chunk's
    users load different numbers of samples and the rows are padded: still equal to sequential."""
    import fedsim.training.vectorized as vec

    data = text_users(12, seed=2)
    users = [7, 0, 11, 4, 2, 9, 5]
    assert len({data.num_train(u) for u in users}) == 3 and min(data.num_train(u) for u in users) > 8
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=3)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=2, batch_size=3, lr=0.5, max_examples=8, clip_norm=0.05)
    chunks, loaded = [], []
    train_chunk, train_samples = vec._VectorizedPass.train_chunk, data.train_samples

    def spy_chunk(self, chunk):
        chunks.append(list(chunk))
        return train_chunk(self, chunk)

    def spy_samples(u, idx):
        loaded.append(len(idx))
        return train_samples(u, idx)

    monkeypatch.setattr(vec._VectorizedPass, "train_chunk", spy_chunk)
    monkeypatch.setattr(data, "train_samples", spy_samples)
    vec_total, vec_res = train_users_vectorized(model, x0, data, users, round_index=2, seed=11, spec=spec)
    assert chunks == [users]  # one chunk: all seven users together
    assert len(loaded) == len(users) and all(8 <= k <= 16 for k in loaded) and len(set(loaded)) > 1
    monkeypatch.setattr(data, "train_samples", train_samples)
    seq_total, seq_res = train_users(model, x0, data, users, round_index=2, seed=11, spec=spec)
    torch.testing.assert_close(vec_total, seq_total, rtol=1e-4, atol=1e-6)
    for a, b in zip(seq_res, vec_res):
        assert (a.user, a.num_examples, a.clipped) == (b.user, b.num_examples, b.clipped)


def test_a_user_whose_data_returns_too_few_samples_is_trained_as_sequentially():
    """A dataset that returns fewer samples than asked for one user: the batched path must not
    train that user on its zero padding rows. The user is trained on its own, as the
    sequential path trains it, and the others stay batched and unchanged."""

    class ShortForOne(Ragged):
        def train_samples(self, u, idx):
            x, y = super().train_samples(u, idx)
            return (x[:-1], y[:-1]) if u == 17 and len(idx) > 1 else (x, y)

    data = ShortForOne(users=40, samples=20, features=12, classes=5, seed=3)
    model = make_model("logreg", data.model_dims(), seed=1)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=2, batch_size=4, lr=0.3, max_examples=16, clip_norm=100.0)
    users = [3, 17, 5, 0, 38, 22, 9, 11, 30]
    seq_total, seq_res = train_users(model, x0, data, users, round_index=4, seed=7, spec=spec)
    vec_total, vec_res = train_users_vectorized(model, x0, data, users, round_index=4, seed=7, spec=spec)
    torch.testing.assert_close(vec_total, seq_total, rtol=1e-5, atol=1e-6)
    for a, b in zip(seq_res, vec_res):
        assert (a.user, a.num_examples) == (b.user, b.num_examples)
        assert a.norm == pytest.approx(b.norm, rel=1e-5)


def test_which_models_are_vectorized():
    assert vectorizable(make_model("logreg", {"in_features": 4, "num_classes": 3}))
    assert vectorizable(make_model("shakespeare_lstm_small", 96))  # through its StepwiseLSTM twin
    assert not vectorizable(make_model("shakespeare_lstm_small", 96, dp_layers=True))  # Opacus's DPLSTM
    gru = torch.nn.Sequential(torch.nn.GRU(3, 4, batch_first=True))
    assert recurrent(gru) and not vectorizable(gru)
    from fedsim.runner import resolve_vectorize

    big = make_model("so_tag_logreg", {"in_features": 10000, "out_features": 500})  # 5M parameters
    n = sum(p.numel() for p in big.parameters())
    assert vectorizable(big)  # it can be, but 'auto' leaves it sequential: arithmetic dominates
    assert not resolve_vectorize(load_config(None, []), True, False, recurrent=False, num_params=n)
    assert resolve_vectorize(load_config(None, ["sim.vectorize='on'"]), True, False, recurrent=False, num_params=n)


def test_auto_trains_lstm_users_one_by_one_on_any_device(monkeypatch):
    """``auto`` leaves LSTM users to the fused kernel, one by one, on CPU and GPU workers alike
    (batched users measured slower on both); ``on`` batches them."""
    from fedsim.runner import resolve_vectorize

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for where in ([], ["sim.client_gpus=1", "sim.device='cuda'"], ["sim.client_gpus=0.5"]):
        assert not resolve_vectorize(load_config(None, where), model_ok=True, disk_client=False, recurrent=True)
        assert resolve_vectorize(load_config(None, where), model_ok=True, disk_client=False, recurrent=False)
        assert resolve_vectorize(load_config(None, [*where, "sim.vectorize='on'"]), True, False, recurrent=True)


def test_vectorize_on_refuses_what_it_cannot_do():
    from fedsim.runner import resolve_vectorize

    cfg = load_config(None, ["sim.vectorize='on'"])
    with pytest.raises(FedsimError, match="recurrent"):
        resolve_vectorize(cfg, model_ok=False, disk_client=False)
    assert resolve_vectorize(load_config(None, []), model_ok=True, disk_client=False)
    assert not resolve_vectorize(load_config(None, []), model_ok=True, disk_client=True)
    assert not resolve_vectorize(load_config(None, ["sim.vectorize='off'"]), model_ok=True, disk_client=False)


def test_batched_loss_is_each_users_mean_loss():
    data = Ragged(users=4, samples=6, features=3, classes=5, seed=0)
    g = torch.Generator().manual_seed(0)
    out = torch.randn(4, 6, 5, generator=g)
    y = torch.randint(0, 5, (4, 6), generator=g)
    per_user = torch.stack([data.loss(out[u], y[u]) for u in range(4)])
    torch.testing.assert_close(data.batched_loss(out, y), per_user, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "name,dims",
    [("logreg", {"in_features": 7, "num_classes": 4}), ("so_tag_logreg", {"in_features": 9, "out_features": 3})],
)
def test_a_models_batched_forward_is_its_forward_per_user(name, dims):
    """Linear models batch their own forward pass for vectorized training (no vmap): each user's
    slice must be that user's ``forward`` with its own parameters."""
    from torch.func import functional_call

    model = make_model(name, dims, seed=0)
    g = torch.Generator().manual_seed(4)
    U, B = 5, 3
    stacked = {k: torch.randn(U, *v.shape, generator=g) for k, v in model.named_parameters()}
    x = torch.randn(U, B, next(iter(dims.values())), generator=g)
    out = model.batched_forward(stacked, x)
    for u in range(U):
        alone = functional_call(model, {k: v[u] for k, v in stacked.items()}, (x[u],))
        torch.testing.assert_close(out[u], alone, rtol=1e-6, atol=1e-6)


def test_vectorized_training_uses_the_models_batched_forward(monkeypatch):
    from fedsim.models import LogReg

    calls = []
    original = LogReg.batched_forward
    monkeypatch.setattr(LogReg, "batched_forward", lambda self, p, x: calls.append(x.shape) or original(self, p, x))
    data = Ragged(users=10, samples=20, features=6, classes=3, seed=1)
    model = make_model("logreg", data.model_dims(), seed=1)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=1, batch_size=4, lr=0.3, max_examples=16, clip_norm=1.0)
    train_users_vectorized(model, x0, data, [0, 1, 2, 3, 4], round_index=0, seed=0, spec=spec)
    assert calls and all(len(s) == 3 for s in calls)  # (users, batch, features)


def test_a_reseeded_generator_draws_what_a_fresh_one_draws():
    """Vectorized training reseeds one generator per user instead of building one: each user's
    batches must be the ones its own fresh generator gives, whatever was drawn before."""
    from fedsim.seeding import make_generator, reseed

    g = torch.Generator()
    for u in range(30):
        torch.randn(u % 5 + 1, generator=g)  # leave state behind (including a cached normal)
        reseed(g, 7, "client", 3, u)
        fresh = make_generator(7, "client", 3, u)
        assert torch.equal(torch.randperm(20, generator=g), torch.randperm(20, generator=fresh))
        assert torch.equal(torch.randn(3, generator=g), torch.randn(3, generator=fresh))


def test_a_subclass_that_changes_forward_does_not_inherit_the_batched_forward():
    """Attack: a model registered as a subclass of ``LogReg`` with its own ``forward`` (a tanh on
    the inputs) inherits ``LogReg.batched_forward``, which computes the plain linear layer: used
    as is, vectorized training would train another model than the one configured. It goes
    through ``vmap`` of its own ``forward`` instead, and equals sequential training."""
    from fedsim.models import LogReg

    class TanhLogReg(LogReg):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(torch.tanh(3 * x))

    data = Ragged(users=12, samples=20, features=6, classes=3, seed=2)
    model = TanhLogReg(6, 3)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=1, batch_size=4, lr=0.5, max_examples=12, clip_norm=10.0)
    users = [0, 1, 2, 3, 4, 5]
    seq_total, _ = train_users(model, x0, data, users, round_index=1, seed=3, spec=spec)
    vec_total, _ = train_users_vectorized(model, x0, data, users, round_index=1, seed=3, spec=spec)
    torch.testing.assert_close(vec_total, seq_total, rtol=1e-5, atol=1e-6)
