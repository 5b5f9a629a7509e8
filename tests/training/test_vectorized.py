"""Vectorized multi-user training (torch.func.vmap over stacked per-user parameters) against
sequential training user by user: same clipped-update sum and per-user results up to float
rounding, for users with different sample counts, several epochs and a ragged last batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.config import load_config
from fedsim.data.synthetic import SyntheticClassification
from fedsim.errors import FedsimError
from fedsim.models import make_model
from fedsim.training import LocalTraining, train_users
from fedsim.vectorized import train_users_vectorized, vectorizable


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


def test_only_models_without_recurrent_layers_are_vectorized():
    assert vectorizable(make_model("logreg", {"in_features": 4, "num_classes": 3}))
    assert not vectorizable(make_model("shakespeare_lstm_small", 96))
    assert not vectorizable(make_model("so_tag_logreg", {"in_features": 10000, "out_features": 500}))  # > 2M


def test_vectorize_on_refuses_what_it_cannot_do():
    from fedsim.run import resolve_vectorize

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
