"""The GPU path against the CPU's: what a run on a CUDA device promises, checked on one.

Skipped where torch sees no CUDA device (CI has none; ``benchmarks/gpu_rows.sh`` runs this file
on a lent GPU machine). ``FEDSIM_GPU_TEST_DEVICE=cpu`` runs the same checks with the CPU as the
"device", to check the tests themselves where no GPU is.

- The noise: every mechanism's rows are generated on the CPU and moved, so the independent
  Gaussian rows are bit-identical on the GPU, and correlated rows (mixed on the device) agree
  to float32 rounding.
- Training: LSTM users batched on the GPU (one vmapped step-by-step LSTM) give the same sum of
  clipped deltas as training them one at a time there, and as the CPU.
- A run: the in-process engine with ``sim.client_gpus = 1`` and ``vectorize = on`` trains the
  LSTM users batched on the GPU, and its ε is the CPU run's to the last digit.
- CUDA graphs (``sim.cuda_graphs``): replayed steps equal eager steps, are queued without
  waiting, survive another thread's copies during a capture and stay behind when the model is
  copied; a batch that fails its eager warm-up fails alone (graphs stay on), and a step that
  cannot be captured runs eagerly from the state before the attempt.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from helpers import text_users

DEVICE = os.environ.get("FEDSIM_GPU_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(),
    reason="needs a CUDA device (FEDSIM_GPU_TEST_DEVICE=cpu checks the logic)",
)


#: a 3-round in-process run of the small character LSTM on the bundled plays
SMALL_RUN = [
    "data.name='shakespeare'",
    "model.name='shakespeare_lstm_small'",
    "rounds=3",
    "sampling.cohort_size=4",
    "client.batch_size=4",
    "client.max_examples=8",
    "eval.every=0",
    "sim.engine='inprocess'",
    "sim.num_workers=1",
]


def test_independent_noise_rows_are_the_cpus_bit_for_bit():
    from fedsim.privacy.noise import gaussian_noise

    cpu, dev = gaussian_noise(1001, seed=5, device="cpu"), gaussian_noise(1001, seed=5, device=DEVICE)
    for t in range(3):
        a, b = cpu.row(t), dev.row(t)
        assert b.device.type == torch.device(DEVICE).type
        assert torch.equal(a, b.cpu())


@pytest.mark.parametrize("mech", ["banded", "bsr", "blt"])
def test_correlated_noise_rows_agree_with_the_cpus(mech):
    from fedsim.privacy.mechanisms import make_noise, plan_mf
    from fedsim.privacy.participation import make_scheme

    n = 12
    scheme = (
        make_scheme("min_sep", 60, None, min_sep=3, rounds=n)
        if mech != "bsr"
        else make_scheme("single", 60, 5, rounds=n)
    )
    plan = plan_mf(mech, scheme, n)
    cpu, dev = make_noise(mech, 513, 9, "cpu", plan), make_noise(mech, 513, 9, DEVICE, plan)
    for t in range(n):
        a, b = cpu.row(t), dev.row(t).cpu()
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        assert float(a.norm()) > 1.0  # rows of real noise, not zeros


@pytest.fixture
def fallbacks(monkeypatch):
    """The chunks whose batched pass raised and were trained one user at a time instead. That
    fallback isolates a user whose data breaks the batch, and its results are the sequential
    path's, so an equality test cannot see it: a device bug in the batched pass (the clip's
    scales were once made on the CPU for rows on the GPU) hid behind it. Tests of batching on
    the device assert this list stays empty."""
    from fedsim.training.vectorized import _VectorizedPass

    seen: list[list[int]] = []
    original = _VectorizedPass.train_sequentially

    def recording(self, chunk):
        seen.append(list(chunk))
        return original(self, chunk)

    monkeypatch.setattr(_VectorizedPass, "train_sequentially", recording)
    return seen


def test_lstm_users_batched_on_the_device_equal_sequential_and_the_cpu(fallbacks):
    from fedsim.models import make_model
    from fedsim.training.local import LocalTraining, train_users
    from fedsim.training.vectorized import train_users_vectorized

    data = text_users(12, seed=2)
    spec = LocalTraining(epochs=2, batch_size=3, lr=0.5, max_examples=8, clip_norm=0.05)
    users = [7, 0, 11, 4, 2, 9, 5]
    cpu_model = make_model("shakespeare_lstm_small", data.model_dims(), seed=3)
    x0 = torch.nn.utils.parameters_to_vector(cpu_model.parameters()).detach().clone()
    cpu_total, _ = train_users(cpu_model, x0, data, users, round_index=2, seed=11, spec=spec)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=3).to(DEVICE)
    seq_total, seq_res = train_users(model, x0, data, users, round_index=2, seed=11, spec=spec)
    vec_total, vec_res = train_users_vectorized(model, x0, data, users, round_index=2, seed=11, spec=spec)
    assert fallbacks == []  # batched on the device, not retrained one by one after a failure
    assert next(model.parameters()).device.type == torch.device(DEVICE).type  # it trained there
    assert vec_total.device.type == seq_total.device.type == "cpu"  # updates come back on the CPU
    torch.testing.assert_close(vec_total, seq_total, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(seq_total.cpu(), cpu_total, rtol=1e-4, atol=1e-6)
    assert float(cpu_total.norm()) > 0.05  # users moved, and were clipped
    for a, b in zip(seq_res, vec_res):
        assert (a.user, a.num_examples, a.clipped) == (b.user, b.num_examples, b.clipped)


def test_an_inprocess_run_on_the_device_matches_the_cpus_epsilon(tmp_path, fallbacks):
    from fedsim.config import load_config
    from fedsim.runner import run_experiment

    common = list(SMALL_RUN)
    on_device = ["sim.client_gpus=1", f"sim.device='{DEVICE}'"] if DEVICE == "cuda" else []
    batched = ["sim.vectorize='on'"]  # the LSTM users batched on the device, end to end
    gpu = run_experiment(load_config(None, common + on_device + batched), str(tmp_path / "dev"), progress=False)
    cpu = run_experiment(load_config(None, common + ["sim.device='cpu'"]), str(tmp_path / "cpu"), progress=False)
    assert gpu.get("vectorized") is True and fallbacks == []
    assert gpu["epsilon"] == cpu["epsilon"]
    rows = [json.loads(line) for line in (tmp_path / "dev" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(np.isfinite(r["train_loss"]) for r in rows)


needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs exist on a CUDA device only")


@needs_cuda
def test_local_steps_replayed_from_cuda_graphs_equal_eager_steps():
    import copy
    import dataclasses

    from fedsim.models import make_model
    from fedsim.training.local import LocalTraining, train_users
    from fedsim.training.step_graphs import graphs_for

    data = text_users(12, seed=2)
    # batch 3 over at most 8 samples: batches of 3, 3 and 2 (users with fewer samples give
    # other shapes), so several graphs are captured and replayed in turn
    spec = LocalTraining(epochs=2, batch_size=3, lr=0.5, max_examples=8, clip_norm=0.05, cuda_graphs=False)
    users = [7, 0, 11, 4, 2, 9, 5]
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=3).to(DEVICE)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    eager, eager_res = train_users(model, x0, data, users, round_index=2, seed=11, spec=spec)
    graphed_spec = dataclasses.replace(spec, cuda_graphs=True)
    graphed, graphed_res = train_users(model, x0, data, users, round_index=2, seed=11, spec=graphed_spec)
    graphs = graphs_for(model, data, spec.lr, enabled=True)
    assert graphs is not None and graphs.failed is None
    assert graphs.captured >= 2  # it did replay graphs, of more than one shape
    again, _ = train_users(model, x0, data, users, round_index=2, seed=11, spec=graphed_spec)  # replays only
    assert graphs_for(model, data, spec.lr, enabled=True) is graphs
    twin = copy.deepcopy(model)  # as the step-by-step LSTM's twin is made: the graphs stay behind
    assert graphs_for(twin, data, spec.lr, enabled=True) is not graphs
    torch.testing.assert_close(graphed, eager, rtol=1e-6, atol=1e-7)
    assert torch.equal(again, graphed)
    assert float(eager.norm()) > 0.05
    for a, b in zip(eager_res, graphed_res):
        assert (a.user, a.num_examples, a.clipped) == (b.user, b.num_examples, b.clipped)
        assert a.loss == pytest.approx(b.loss, rel=1e-6)


@needs_cuda
def test_a_graphed_step_is_queued_without_waiting_for_the_device():
    from fedsim.models import make_model
    from fedsim.training.step_graphs import StepGraphs

    data = text_users(4, seed=2)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=3).to(DEVICE)
    graphs = StepGraphs(model, lambda x, y: data.loss(model(x), y), lr=0.5)
    xb, yb = data.train_samples(1, np.arange(3))
    graphs.step(xb, yb)  # captured
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of queued device work
    loss = graphs.step(xb, yb)
    # the host got here before the device finished: the batch's copies and the replay were queued
    assert not torch.cuda.current_stream().query()
    assert np.isfinite(float(loss))


@needs_cuda
def test_an_inprocess_lstm_run_on_the_device_with_graphs_matches_eager_steps(tmp_path):
    from fedsim.config import load_config
    from fedsim.runner import run_experiment

    common = SMALL_RUN + ["sim.client_gpus=1", "sim.device='cuda'"]
    graphed = run_experiment(load_config(None, common), str(tmp_path / "graphs"), progress=False)
    eager = run_experiment(
        load_config(None, common + ["sim.cuda_graphs='off'"]), str(tmp_path / "eager"), progress=False
    )
    assert graphed["epsilon"] == eager["epsilon"]
    rows = {
        k: [json.loads(line) for line in (tmp_path / k / "metrics.jsonl").read_text().splitlines()]
        for k in ("graphs", "eager")
    }
    assert len(rows["graphs"]) == 3
    for a, b in zip(rows["graphs"], rows["eager"]):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)


@needs_cuda
def test_capturing_while_another_thread_copies_to_the_device_works():
    # a run prepares the next round's noise in a background thread, copying it to the device
    # while training captures a new batch shape
    import threading

    from fedsim.models import make_model
    from fedsim.training.step_graphs import StepGraphs

    data = text_users(6, seed=2)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=3).to(DEVICE)
    graphs = StepGraphs(model, lambda x, y: data.loss(model(x), y), lr=0.5)
    stop, errors = threading.Event(), []

    def copying() -> None:
        try:
            while not stop.is_set():
                torch.randn(4096).to(DEVICE).sum().item()
        except Exception as e:  # pragma: no cover - what the test is for
            errors.append(e)

    worker = threading.Thread(target=copying)
    worker.start()
    try:
        for rows in (1, 2, 3, 4, 5):  # five shapes, five captures
            xb, yb = data.train_samples(1, np.arange(rows))
            float(graphs.step(xb, yb))
    finally:
        stop.set()
        worker.join()
    assert not errors and graphs.failed is None and graphs.captured == 5


def _flat(model) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


@needs_cuda
def test_a_batch_failing_its_warm_up_on_the_device_fails_its_user_and_keeps_the_graphs_on():
    # one user's bad batch must not turn graphs off for the worker's other users
    import copy

    from fedsim.models import make_model
    from fedsim.training.step_graphs import StepGraphs, sgd_step

    data = text_users(4, seed=2)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=3).to(DEVICE)
    twin = copy.deepcopy(model)
    graphs = StepGraphs(model, lambda x, y: data.loss(model(x), y), lr=0.5)
    xb, yb = data.train_samples(1, np.arange(3))
    before = _flat(model)
    with pytest.raises(RuntimeError):  # float token ids: the embedding refuses them, eagerly too
        graphs.step(xb.float(), yb)
    assert torch.equal(_flat(model), before)  # the warm-up steps on the side stream were undone
    assert graphs.failed is None and graphs.captured == 0
    graphs.step(xb, yb)  # the next batch is captured and replayed as usual
    assert graphs.failed is None and graphs.captured == 1
    sgd_step(list(twin.parameters()), lambda x, y: data.loss(twin(x), y), xb.to(DEVICE), yb.to(DEVICE), 0.5)
    torch.testing.assert_close(_flat(model), _flat(twin), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(_flat(model), before)


@needs_cuda
def test_a_step_that_cannot_be_captured_on_the_device_runs_eagerly_from_then_on():
    # a loss that reads a value back to the host cannot be captured: the worker warns once and
    # trains eagerly, from the state before the attempt, and the device stays usable
    import copy
    import warnings

    from fedsim.models import make_model
    from fedsim.training.step_graphs import StepGraphs, sgd_step

    data = text_users(4, seed=2)
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=3).to(DEVICE)
    twin = copy.deepcopy(model)

    def checked(net):
        def loss_of(x, y):
            loss = data.loss(net(x), y)
            if not bool(torch.isfinite(loss).item()):  # a read-back: not allowed while capturing
                raise FloatingPointError("the loss is not finite")
            return loss

        return loss_of

    graphs = StepGraphs(model, checked(model), lr=0.5)
    xb, yb = data.train_samples(1, np.arange(3))
    xd, yd = xb.to(DEVICE), yb.to(DEVICE)
    with pytest.warns(UserWarning, match="capturing a local step failed"):
        loss = graphs.step(xb, yb)
    assert graphs.failed is not None and graphs.captured == 0
    expected = sgd_step(list(twin.parameters()), checked(twin), xd, yd, 0.5)
    torch.testing.assert_close(_flat(model), _flat(twin), rtol=1e-6, atol=1e-7)  # one step, not three
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second attempt, no second warning
        graphs.step(xb, yb)
    sgd_step(list(twin.parameters()), checked(twin), xd, yd, 0.5)
    torch.testing.assert_close(_flat(model), _flat(twin), rtol=1e-6, atol=1e-7)
    # the failed capture left the device usable: a capturable step on the same model is captured
    fresh = StepGraphs(model, lambda x, y: data.loss(model(x), y), lr=0.5)
    fresh.step(xb, yb)
    assert fresh.failed is None and fresh.captured == 1
