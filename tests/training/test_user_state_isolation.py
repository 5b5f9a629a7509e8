"""Attacks on the state a worker carries from one user to the next (issue 44, part 1).

A worker trains its users in turn on one model object. Each test is a neighbouring pair: user A's
data is replaced and nothing else; user B, trained right after A on the same worker, must send the
bit-identical clipped update. Before fedsim reset the model between users, a gradient-accumulation
hook moved B's update by 0.23 at c = 10 (A's sensitivity up to 3c while ε assumed c).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.data.synthetic import SyntheticClassification
from fedsim.training import local_updates
from fedsim.training.local import LocalTraining, train_one_user, train_users
from fedsim.training.vectorized import train_users_vectorized

A, B = 0, 1


class Relabelled(SyntheticClassification):
    """The synthetic population with user A's data replaced (features moved, labels shifted by
    one class): A's neighbour under replace-one."""

    def _user(self, u: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super()._user(u)
        return (x + 3.0, (y + 1) % self.k) if u == A else (x, y)


def _pair(samples: int = 6) -> tuple[SyntheticClassification, SyntheticClassification]:
    return SyntheticClassification(8, samples, 5, 3, seed=3), Relabelled(8, samples, 5, 3, seed=3)


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _accumulate(model, batches, loss, spec):
    """Gradient accumulation, one step every 4 batches, no flush at the end (a common pattern):
    a user with 6 batches leaves 2 batches of gradient on the parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    total, n = 0.0, 0
    for i, (x, y) in enumerate(batches, start=1):
        val = loss(model(x), y)
        val.backward()
        if i % 4 == 0:
            opt.step()
            for p in model.parameters():
                p.grad = None if p.grad is None else p.grad.zero_()
        total, n = total + float(val.detach()), n + 1
    return total / max(n, 1)


def _calibrate_then_freeze(model, batches, loss, spec):
    """Fine-tuning with frozen BatchNorm: one pass in train mode to calibrate the running
    statistics, then SGD in eval mode, where the forward reads those statistics."""
    batches = list(batches)
    with torch.no_grad():
        for x, _ in batches[:2]:
            model(x)
    model.eval()
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    for x, y in batches:
        opt.zero_grad()
        loss(model(x), y).backward()
        opt.step()
    return 0.0


def _remember_last_batch(model, batches, loss, spec):
    """Mix each batch with the previous one, kept on the model object (and left there)."""
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    for x, y in batches:
        prev = getattr(model, "_last_x", None)
        inp = x if prev is None else 0.5 * (x + prev[: len(x)])
        opt.zero_grad()
        loss(model(inp), y).backward()
        opt.step()
        model._last_x = x.detach()
    return 0.0


def _b_update(data, model_factory, spec) -> torch.Tensor:
    model = model_factory()
    x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    train_one_user(model, x0, data, A, 0, 7, spec)
    clipped, res = train_one_user(model, x0, data, B, 0, 7, spec)
    assert res.ok
    return clipped


@pytest.fixture
def hooks():
    names = {"acc4": _accumulate, "bn_freeze": _calibrate_then_freeze, "last_batch": _remember_last_batch}
    for n, f in names.items():
        local_updates.LOCAL_UPDATES.add(n, f)
    yield names
    for n in names:
        local_updates.LOCAL_UPDATES.pop(n)


def _linear():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 3))


def _bn():
    torch.manual_seed(0)
    return BatchNormNet()


@pytest.mark.parametrize(
    ("hook", "factory"), [("acc4", _linear), ("bn_freeze", _bn), ("last_batch", _linear)], ids=["grad", "bn", "attr"]
)
def test_a_neighbour_of_a_does_not_move_bs_update_through_a_hook(hooks, hook, factory):
    batch = 2 if hook == "bn_freeze" else 1  # BatchNorm in training mode needs two samples a batch
    spec = LocalTraining(epochs=1, batch_size=batch, lr=0.5, max_examples=6, clip_norm=10.0, local_update=hook)
    same, neighbour = _pair()
    # the neighbour differs in A's update (the attack has something to carry) ...
    m = factory()
    x0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    a0, _ = train_one_user(factory(), x0, same, A, 0, 7, spec)
    a1, r1 = train_one_user(factory(), x0, neighbour, A, 0, 7, spec)
    assert r1.ok and float((a0 - a1).norm()) > 1e-3
    # ... and B's update is bit-identical whichever A came before it on the same model object
    assert torch.equal(_b_update(same, factory, spec), _b_update(neighbour, factory, spec))


def test_bs_update_equals_its_update_alone(hooks):
    """Trained after A on a shared model, B sends what B sends on a fresh worker."""
    spec = LocalTraining(epochs=1, batch_size=1, lr=0.5, max_examples=6, clip_norm=10.0, local_update="acc4")
    data, _ = _pair()
    m = _linear()
    x0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    alone, _ = train_one_user(_linear(), x0, data, B, 0, 7, spec)
    assert torch.equal(_b_update(data, _linear, spec), alone)


def test_the_cohort_sum_moves_by_as_own_change_alone(hooks):
    """The sensitivity the accountant assumes: the sum over a cohort changes by exactly A's own
    clipped change (at most 2c in norm for a replacement), never more."""
    spec = LocalTraining(epochs=1, batch_size=1, lr=0.5, max_examples=6, clip_norm=10.0, local_update="acc4")
    same, neighbour = _pair()
    users = [A, B, 2, 3, 4]
    m = _linear()
    x0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    s0, _ = train_users(_linear(), x0, same, users, 0, 7, spec)
    s1, _ = train_users(_linear(), x0, neighbour, users, 0, 7, spec)
    a0, _ = train_one_user(_linear(), x0, same, A, 0, 7, spec)
    a1, _ = train_one_user(_linear(), x0, neighbour, A, 0, 7, spec)
    assert float(((s1 - s0) - (a1 - a0)).abs().max()) < 1e-5


class RunningCentre(nn.Module):
    """Inputs centred on a running mean that training updates and the forward reads (a
    streaming normaliser): a buffer the data writes in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 3)
        self.register_buffer("mean", torch.zeros(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.5).add_(x.mean(0), alpha=0.5)
        return self.fc(x - self.mean)


def test_fedsims_own_sgd_restores_buffers_between_users():
    """Without a hook: a model whose forward reads a buffer that training writes starts every
    user from the buffers the worker built, and in training mode."""
    spec = LocalTraining(epochs=1, batch_size=2, lr=0.5, max_examples=6, clip_norm=10.0)
    same, neighbour = _pair()

    def run(data):
        torch.manual_seed(0)
        model = RunningCentre()
        x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        train_one_user(model, x0, data, A, 0, 7, spec)
        model.eval()  # a mode left behind would carry over too
        return train_one_user(model, x0, data, B, 0, 7, spec)[0], model

    b0, m0 = run(same)
    b1, _ = run(neighbour)
    assert torch.equal(b0, b1)
    assert m0.training


def test_gradients_left_on_the_model_are_not_used(hooks):
    """A hook that accumulates into whatever ``.grad`` it finds gets None, not a leftover."""
    seen = []

    def look(model, batches, loss, spec):
        seen.append([p.grad for p in model.parameters()])
        return 0.0

    local_updates.LOCAL_UPDATES.add("look", look)
    try:
        spec = LocalTraining(epochs=1, batch_size=1, lr=0.5, max_examples=6, clip_norm=10.0, local_update="look")
        model = _linear()
        for p in model.parameters():
            p.grad = torch.ones_like(p)  # what a previous user could have left
        x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        train_one_user(model, x0, same := _pair()[0], A, 0, 7, spec)
        assert same is not None and seen and all(g is None for g in seen[0])
    finally:
        local_updates.LOCAL_UPDATES.pop("look")


def test_a_hook_is_never_vectorized(hooks):
    spec = LocalTraining(epochs=1, batch_size=1, lr=0.5, max_examples=6, clip_norm=10.0, local_update="acc4")
    data, _ = _pair()
    m = _linear()
    x0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    with pytest.raises(ValueError, match="never vectorized"):
        train_users_vectorized(m, x0, data, [A, B], 0, 7, spec)


def test_the_vectorized_path_starts_from_the_built_buffers():
    """Vectorized training after a user trained alone (its fallback) starts from the buffers the
    worker built, not from what that user left in them."""
    spec = LocalTraining(epochs=1, batch_size=2, lr=0.5, max_examples=6, clip_norm=10.0)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(5, 3)
            self.register_buffer("scale", torch.ones(1))

        def forward(self, x):
            return self.fc(x) * self.scale

    def run(dirty: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = Scaled()
        x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        train_users_vectorized(model, x0, _pair()[0], [A], 0, 7, spec)  # records the built state
        if dirty:
            model.scale.fill_(np.float32(7.0))  # what a user's training could leave behind
        return train_users_vectorized(model, x0, _pair()[0], [B, 2], 0, 7, spec)[0]

    assert torch.equal(run(False), run(True))


def test_settings_a_hook_changes_reach_no_other_user(hooks):
    """The `spec` a hook gets is its own copy: a learning-rate schedule written onto it (a frozen
    dataclass changed with object.__setattr__) does not reach the next user."""
    seen = []

    def decay(model, batches, loss, spec):
        seen.append(spec.lr)
        object.__setattr__(spec, "lr", spec.lr * 0.1)
        return 0.0

    local_updates.LOCAL_UPDATES.add("decay", decay)
    try:
        spec = LocalTraining(epochs=1, batch_size=1, lr=0.5, max_examples=6, clip_norm=10.0, local_update="decay")
        model = _linear()
        x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        train_users(model, x0, _pair()[0], [A, B, 2], 0, 7, spec)
        assert seen == [0.5] * 5 and spec.lr == 0.5  # two probe calls (hook_probe), then A, B and 2
    finally:
        local_updates.LOCAL_UPDATES.pop("decay")


def _momentum_across_calls():
    """A hook that keeps a running gradient average in its own closure: user A's gradients
    steer user B's steps. fedsim cannot reset a closure; its probe refuses the hook."""
    kept: dict[str, list[torch.Tensor]] = {}

    def hook(model, batches, loss, spec):
        for x, y in batches:
            model.zero_grad()
            loss(model(x), y).backward()
            with torch.no_grad():
                m = kept.setdefault("m", [torch.zeros_like(p) for p in model.parameters()])
                for p, mp in zip(model.parameters(), m):
                    mp.mul_(0.9).add_(p.grad)
                    p.sub_(spec.lr * mp)
        return 0.0

    return hook


def _global_optimizer():
    """A hook that builds its optimizer once, on the first model it sees."""
    kept: dict[str, torch.optim.Optimizer] = {}

    def hook(model, batches, loss, spec):
        opt = kept.setdefault("opt", torch.optim.Adam(model.parameters(), lr=spec.lr))
        for x, y in batches:
            opt.zero_grad()
            loss(model(x), y).backward()
            opt.step()
        return 0.0

    return hook


@pytest.mark.parametrize("make", [_momentum_across_calls, _global_optimizer], ids=["closure_momentum", "global_opt"])
def test_a_hook_that_keeps_state_between_calls_is_refused(make):
    name = f"stateful_{make.__name__}"
    local_updates.LOCAL_UPDATES.add(name, make())
    try:
        spec = LocalTraining(epochs=1, batch_size=2, lr=0.1, max_examples=6, clip_norm=10.0, local_update=name)
        model = _linear()
        x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        total, results = train_users(model, x0, _pair()[0], [A, B, 2], 0, 7, spec)
        assert all(r.failed and "keeps state between calls" in str(r.code_error) for r in results)
        assert float(total.abs().max()) == 0.0  # nobody's update was sent
    finally:
        local_updates.LOCAL_UPDATES.pop(name)


def test_an_honest_hook_with_dropout_passes_the_probe(hooks):
    """The probe seeds the hook's own randomness the same for both calls: dropout is no state."""

    def dropout_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.5), nn.Linear(8, 3))

    spec = LocalTraining(epochs=1, batch_size=2, lr=0.1, max_examples=6, clip_norm=10.0, local_update="acc4")
    model = dropout_model()
    x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    _, results = train_users(model, x0, _pair()[0], [A, B], 0, 7, spec)
    assert all(r.ok for r in results)
