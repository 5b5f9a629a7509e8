"""What the GPU path could gain by overlapping work: users' local steps on a CUDA device, three ways.

The W1 and SO LSTM shapes (a character LSTM, batch 8 × 80 characters, 8 steps a user; the Stack
Overflow next-word LSTM, V = 10,000, batch 16 × 20 tokens, 4 steps a user), ``--users`` users a
round, each from the same starting model, timed per round (median of ``--rounds`` after a warm-up):

- ``blocking``: one user after another, each batch copied with a plain ``.to("cuda")`` (the
  floor's loop, and fedsim's eager steps): the host waits for the device at every copy, so a
  step costs the host's time plus the device's.
- ``queued``: the same, each batch copied from page-locked memory without waiting (``_queued``
  below; measured, and not adopted in fedsim): the host queues the next step while the device
  runs.
- ``streams``: every user on a CUDA stream of its own with its own model copy, their steps
  interleaved, so the device can run several users' small kernels at once.
- ``graphed``: one user after another, each step replayed from a CUDA graph
  (:class:`fedsim.training.step_graphs.StepGraphs`, what ``sim.cuda_graphs = "auto"`` does).

All three train the same users on the same batches; the sums of the users' deltas are compared
(``max_abs_diff`` against ``blocking``: 0 when each user's kernels are the same).

Usage (on a machine with a CUDA device)::

    python benchmarks/gpu_streams.py [--users 20] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Any

import torch

from fedsim.models import make_model
from fedsim.parameters import load_flat_
from fedsim.training.step_graphs import StepGraphs, sgd_step

LR = 0.1
SHAPES: dict[str, dict[str, Any]] = {
    "w1": {
        "model": "shakespeare_lstm",
        "dims": 80,
        "batch": 8,
        "seq": 80,
        "steps": 8,
        "classes": 80,
        "per_token": False,
    },
    "so_lstm": {
        "model": "so_nwp_lstm",
        "dims": {"num_classes": 10004},
        "batch": 16,
        "seq": 20,
        "steps": 4,
        "classes": 10004,
        "per_token": True,
    },
}


def _batches(shape: dict[str, Any], users: int, gen: torch.Generator) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    out = []
    for _ in range(users):
        mine = []
        for _ in range(shape["steps"]):
            x = torch.randint(1, shape["classes"], (shape["batch"], shape["seq"]), generator=gen)
            ysz = (shape["batch"], shape["seq"]) if shape["per_token"] else (shape["batch"],)
            mine.append((x, torch.randint(1, shape["classes"], ysz, generator=gen)))
        out.append(mine)
    return out


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _step(model: torch.nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> None:
    sgd_step(params, lambda a, b: _loss(model, a, b), x, y, LR)


def _queued(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``t`` copied to ``dev`` from page-locked memory, queued without waiting."""
    return t.pin_memory().to(dev, non_blocking=True)


def round_sequential(model, x0, batches, dev, queued: bool) -> torch.Tensor:
    params = list(model.parameters())
    total = torch.zeros_like(x0)
    for mine in batches:
        load_flat_(params, x0)
        for x, y in mine:
            xb, yb = (_queued(x, dev), _queued(y, dev)) if queued else (x.to(dev), y.to(dev))
            _step(model, params, xb, yb)
        total += torch.nn.utils.parameters_to_vector(params).detach() - x0
    torch.cuda.synchronize(dev)
    return total


def round_graphed(model, x0, batches, graphs: StepGraphs) -> torch.Tensor:
    params = list(model.parameters())
    total = torch.zeros_like(x0)
    for mine in batches:
        load_flat_(params, x0)
        for x, y in mine:
            graphs.step(x, y)
        total += torch.nn.utils.parameters_to_vector(params).detach() - x0
    torch.cuda.synchronize(x0.device)
    return total


def round_streams(models, x0, batches, dev, streams) -> torch.Tensor:
    main = torch.cuda.current_stream(dev)
    ready = main.record_event()
    plist = [list(m.parameters()) for m in models]
    for s, params in zip(streams, plist):
        s.wait_event(ready)
        with torch.cuda.stream(s):
            load_flat_(params, x0)
    for k in range(len(batches[0])):
        for u, (s, m) in enumerate(zip(streams, models)):
            with torch.cuda.stream(s):
                x, y = batches[u][k]
                _step(m, plist[u], _queued(x, dev), _queued(y, dev))
    total = torch.zeros_like(x0)
    for s, params in zip(streams, plist):
        with torch.cuda.stream(s):
            d = torch.nn.utils.parameters_to_vector(params) - x0
        main.wait_stream(s)
        d.record_stream(main)
        total += d
    torch.cuda.synchronize(dev)
    return total


def measure(name: str, users: int, rounds: int) -> dict[str, Any]:
    shape = SHAPES[name]
    dev = torch.device("cuda")
    model = make_model(shape["model"], shape["dims"], seed=0).to(dev)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    batches = _batches(shape, users, torch.Generator().manual_seed(1))
    models = [copy.deepcopy(model) for _ in range(users)]
    streams = [torch.cuda.Stream(dev) for _ in range(users)]
    graphs = StepGraphs(model, lambda a, b: _loss(model, a, b), LR)
    ways = {
        "blocking": lambda: round_sequential(model, x0, batches, dev, queued=False),
        "queued": lambda: round_sequential(model, x0, batches, dev, queued=True),
        "streams": lambda: round_streams(models, x0, batches, dev, streams),
        "graphed": lambda: round_graphed(model, x0, batches, graphs),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    sums: dict[str, torch.Tensor] = {}
    for k, f in ways.items():  # warm-up (cuDNN plans, the caching allocators)
        sums[k] = f()
    for _ in range(rounds):  # interleaved
        for k, f in ways.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "workload": name,
        "users": users,
        "steps_per_user": shape["steps"],
        "per_round_s": med,
        "ratio_to_blocking": {k: med[k] / med["blocking"] for k in med},
        "max_abs_diff": {k: float((sums[k] - sums["blocking"]).abs().max()) for k in sums},
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=20, help="users a round (default 20)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up (default 5)")
    ap.add_argument("--workloads", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--json", action="store_true", help="print one JSON list")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_streams.py needs a CUDA device")
    rows = [measure(w, args.users, args.rounds) for w in args.workloads]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(r["workload"], {k: round(v, 4) for k, v in r["per_round_s"].items()}, r["max_abs_diff"])


if __name__ == "__main__":
    main()
