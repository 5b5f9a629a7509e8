"""sim.cuda_graphs: where local steps are replayed from CUDA graphs (fedsim.training.step_graphs).

The graphs themselves run only on a CUDA device (tests/gpu checks them against eager steps
there); here: the setting reaches the workers, and nothing is captured where it must not be.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from helpers import text_users

from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.models import make_model
from fedsim.training.local import LocalTraining, local_delta
from fedsim.training.step_graphs import StepGraphs, graphs_for, sgd_step


def test_the_setting_reaches_what_a_worker_reads():
    from fedsim.protocol import Task
    from fedsim.runner.build import build_run

    base = ["data.name='shakespeare'", "model.name='shakespeare_lstm_small'", "rounds=2"]
    for setting, expected in (([], True), (["sim.cuda_graphs='off'"], False)):
        task = build_run(load_config(None, base + setting)).task
        assert task.local.cuda_graphs is expected
        assert Task.from_json(task.to_json()).local.cuda_graphs is expected
    with pytest.raises(FedsimError, match="cuda_graphs"):
        load_config(None, base + ["sim.cuda_graphs='on'"])


def test_nothing_is_captured_on_a_cpu():
    data = text_users(4, seed=1)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=0)
    assert graphs_for(model, data, 0.5, enabled=True) is None
    with pytest.raises(ValueError, match="CUDA device"):
        StepGraphs(model, lambda x, y: data.loss(model(x), y), lr=0.5)


def test_local_training_with_the_setting_on_a_cpu_is_eager_training():
    data = text_users(6, seed=1)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=0)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    spec = LocalTraining(epochs=1, batch_size=3, lr=0.5, max_examples=8, clip_norm=1.0)
    off = local_delta(model, x0, data, 2, 1, 5, spec)
    on = local_delta(model, x0, data, 2, 1, 5, dataclasses.replace(spec, cuda_graphs=True))
    assert torch.equal(off[0], on[0]) and off[1:] == on[1:]


def test_sgd_step_moves_each_parameter_by_minus_lr_times_its_gradient():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    frozen = torch.nn.Parameter(torch.ones(2))  # no gradient: left as is
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    before = [p.detach().clone() for p in lin.parameters()]
    grads = torch.autograd.grad(torch.nn.functional.mse_loss(lin(x), y), list(lin.parameters()))
    loss = sgd_step(list(lin.parameters()) + [frozen], lambda a, b: torch.nn.functional.mse_loss(lin(a), b), x, y, 0.25)
    for p, b, g in zip(lin.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - 0.25 * g)
    assert torch.equal(frozen.detach(), torch.ones(2)) and not loss.requires_grad


class _FakeCuda:
    """Just enough of ``torch.cuda`` for StepGraphs' control flow on the CPU: streams that are
    the CPU's order, a "capture" that runs its block eagerly, or raises where told to."""

    def __init__(self, capture_fails: bool) -> None:
        self.capture_fails, self.synchronized = capture_fails, 0

    class Stream:
        def __init__(self, *a, **k) -> None:
            pass

        def wait_stream(self, other) -> None:
            pass

    def install(self, monkeypatch) -> None:
        import contextlib

        import fedsim.training.step_graphs as sg

        fake = self

        class Graph:
            def replay(self) -> None:
                pass

        @contextlib.contextmanager
        def graph(g, capture_error_mode="global"):
            assert capture_error_mode == "thread_local"
            if fake.capture_fails:
                raise RuntimeError("operation not permitted when stream is capturing")
            yield

        def synchronize(device=None) -> None:
            fake.synchronized += 1

        monkeypatch.setattr(torch.cuda, "Stream", self.Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
        monkeypatch.setattr(sg, "_staged", lambda t: t)


def _on_cpu(model, loss_of, lr=0.5) -> StepGraphs:
    graphs = object.__new__(StepGraphs)  # the constructor refuses a CPU model
    graphs._setup(model, loss_of, lr, warmup=2)
    return graphs


def _flat(model) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def test_a_batch_that_fails_its_warm_up_fails_as_eagerly_and_leaves_the_graphs_on(monkeypatch):
    fake = _FakeCuda(capture_fails=False)
    fake.install(monkeypatch)
    data = text_users(4, seed=1)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=0)
    graphs = _on_cpu(model, lambda x, y: data.loss(model(x), y))
    before = _flat(model)
    xb, yb = data.train_samples(1, np.arange(3))
    bad = torch.full_like(xb, 10_000)  # a token id past the embedding: the eager step raises too
    with pytest.raises(IndexError):
        graphs.step(bad, yb)
    assert torch.equal(_flat(model), before)  # the warm-up left nothing behind
    assert graphs.failed is None and graphs.captured == 0 and fake.synchronized == 1
    graphs.step(xb, yb)  # the next user's batch is captured as usual
    assert graphs.captured == 1 and graphs.failed is None


def test_a_step_that_cannot_be_captured_runs_eagerly_from_then_on(monkeypatch):
    _FakeCuda(capture_fails=True).install(monkeypatch)
    data = text_users(4, seed=1)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=0)
    twin = make_model("shakespeare_lstm_small", data.model_dims(), seed=0)
    graphs = _on_cpu(model, lambda x, y: data.loss(model(x), y))
    xb, yb = data.train_samples(1, np.arange(3))
    with pytest.warns(UserWarning, match="capturing a local step failed"):
        loss = graphs.step(xb, yb)
    assert graphs.failed is not None and "stream is capturing" in graphs.failed and graphs.captured == 0
    # exactly one eager step from the state before: the warm-up steps were undone
    expected = sgd_step(list(twin.parameters()), lambda x, y: data.loss(twin(x), y), xb, yb, 0.5)
    assert torch.equal(_flat(model), _flat(twin)) and torch.equal(loss, expected)
    graphs.step(xb, yb)  # eager again, without another attempt or warning
    sgd_step(list(twin.parameters()), lambda x, y: data.loss(twin(x), y), xb, yb, 0.5)
    assert torch.equal(_flat(model), _flat(twin))
