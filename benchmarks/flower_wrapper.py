"""Round time of `fedsim.flower.UserLevelDP` against Flower's own
`DifferentialPrivacyServerSideFixedClipping`, on Flower's quickstart-pytorch app
(`examples/flower-quickstart-pytorch`: its ClientApp, data and CNN, 62,006 parameters), and on the
same app with the CNN's fully connected layers widened to about 1M and 11M parameters.

Both wrap `FedAvg` and train all 10 nodes every round with the same clip norm. Flower's wrapper
adds independent Gaussian noise and (unless `--no-accountant`) keeps its own RDP accountant
(`RdpAccountant`; fixed clipping accounts only `no-amplification` sampling). fedsim's adds BLT correlated noise
(min_sep 1: every node in every round) from the keyed CSPRNG and keeps the ledger; with
`out=` it also writes the ledger and the checkpoint (the resume state, with the noise stream's
position) before each round's model is returned, and the noise stream's state (`noise.pt`) in the
background after it, as docs/flower.md shows it used. Both run on fedsim's in-process Grid, which calls
the same ClientApp (with its mods) directly, so the nodes' training is identical and the
difference is the strategies' own work. For each size the three (Flower, fedsim, fedsim with
`out=`) are timed in alternation, `--repeats` times each, in one process; the ratios of medians
are reported, with the server-side time (`aggregate_train`) apart. A round's time is the median
over rounds 2..n of one run: round 1 also pays one-off start-up costs (building the noise
stream, the first ε), reported apart.

    python benchmarks/flower_wrapper.py --rounds 5 --repeats 5 --sizes 62k,1M,11M --out benchmarks/flower_wrapper_results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "flower-quickstart-pytorch"


def _timed(strategy):
    """Wrap ``strategy.aggregate_train`` to add its wall time to ``strategy.server_seconds``."""
    inner = strategy.aggregate_train
    strategy.server_seconds = 0.0

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            strategy.server_seconds += time.perf_counter() - t0

    strategy.aggregate_train = timed
    return strategy


#: The widths of the CNN's first fully connected layer for each size (62k is the app's own CNN).
WIDTHS = {"62k": None, "1M": 2050, "11M": 22600}


def _net(width: int | None):
    """The quickstart CNN, its first fully connected layer `width` wide (None: the app's own)."""
    from pytorchexample import task
    from torch import nn

    if width is None:
        return task.Net

    class Wide(task.Net):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(16 * 5 * 5, width)
            self.fc2 = nn.Linear(width, 84)

    return Wide


def _strategy(kind: str, rounds: int, nodes: int, accountant: bool, out: Path | None):
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

    from fedsim.flower import UserLevelDP

    fedavg = FedAvg(fraction_evaluate=0.0, min_available_nodes=nodes)
    if kind == "flower":
        acc = None
        if accountant:
            from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
            from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

            acc = RdpAccountant(PrivacyConfig(target_delta=1.0 / nodes**1.1, population_size=nodes,
                                              neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                              sampling_method=SamplingMethod.NO_AMPLIFICATION))  # fmt: skip
        return DifferentialPrivacyServerSideFixedClipping(fedavg, 1.0, 1.0, nodes, accountant=acc)
    return UserLevelDP(fedavg, rounds=rounds, population=nodes, clip_norm=1.0, out=out,
                       privacy={"mechanism": "blt", "noise_multiplier": 1.0},
                       sampling={"scheme": "min_sep", "min_sep": 1})  # fmt: skip


def _one(kind: str, rounds: int, nodes: int, width: int | None, accountant: bool = True) -> tuple[float, float]:
    import shutil
    import tempfile

    from flwr.app import ArrayRecord, ConfigRecord
    from pytorchexample import client_app

    from fedsim.runner.inprocess import InProcessGrid, task_identity

    net = _net(width)
    client_app.Net = net  # the ClientApp builds the model by this name
    folder = Path(tempfile.mkdtemp(prefix="flower-wrapper-")) if kind == "fedsim-out" else None
    strategy = _timed(_strategy("flower" if kind == "flower" else "fedsim", rounds, nodes, accountant, folder))
    app = client_app.app
    grid = InProcessGrid(app, nodes)
    run_config = {"local-epochs": 1, "batch-size": 32}
    for ctx in grid.contexts.values():
        ctx.run_config.update(run_config)
    stamps: list[float] = []
    server: list[float] = []

    def clock(rnd, arrays):  # called before round 1 and after every round
        stamps.append(time.perf_counter())
        server.append(strategy.server_seconds)

    with task_identity():
        strategy.start(grid, ArrayRecord(net().state_dict()), num_rounds=rounds,
                       train_config=ConfigRecord({"lr": 0.1}), evaluate_fn=clock)  # fmt: skip
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    # steady state: rounds 2..n (round 1 pays one-off start-up: building the noise stream, the
    # first ε from dp-accounting)
    rt = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    st = [b - a for a, b in zip(server[1:], server[2:])]
    return statistics.median(rt), statistics.median(st)


def _size(width: int | None) -> int:
    return sum(p.numel() for p in _net(width)().parameters())


def _checkpoint_mb(width: int | None, nodes: int) -> tuple[float, float]:
    """The sizes (MB) of one round's `checkpoint.pt` (written before the model is returned) and
    `noise.pt` (the noise stream's state, written behind it) at this model size."""
    import shutil
    import tempfile

    from flwr.app import ArrayRecord, ConfigRecord
    from pytorchexample import client_app

    from fedsim.runner.inprocess import InProcessGrid, task_identity

    client_app.Net = net = _net(width)
    folder = Path(tempfile.mkdtemp(prefix="flower-wrapper-ckpt-"))
    dp = _strategy("fedsim", 1, nodes, False, folder)
    grid = InProcessGrid(client_app.app, nodes)
    for ctx in grid.contexts.values():
        ctx.run_config.update({"local-epochs": 1, "batch-size": 32})
    with task_identity():
        dp.start(grid, ArrayRecord(net().state_dict()), num_rounds=1, train_config=ConfigRecord({"lr": 0.1}))
    files = [folder / "checkpoint" / name for name in ("checkpoint.pt", "noise.pt")]
    sizes = [f.stat().st_size / 1e6 if f.exists() else 0.0 for f in files]
    shutil.rmtree(folder, ignore_errors=True)
    return sizes[0], sizes[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--sizes", default="62k,1M,11M", help="comma-separated, of " + ", ".join(WIDTHS))
    ap.add_argument("--no-accountant", dest="accountant", action="store_false",
                    help="run Flower's wrapper without its RDP accountant")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(APP))
    import logging

    logging.getLogger("flwr").setLevel(logging.ERROR)
    kinds = ("flower", "fedsim", "fedsim-out")
    results = []
    for size in args.sizes.split(","):
        width = WIDTHS[size]
        for kind in kinds:  # warm-up: imports, first-call costs
            _one(kind, 3, args.nodes, width, args.accountant)
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        for _ in range(args.repeats):
            for kind in kinds:
                times[kind].append(_one(kind, args.rounds, args.nodes, width, args.accountant))
        med = {k: (statistics.median(t for t, _ in v), statistics.median(s for _, s in v)) for k, v in times.items()}
        row = {
            "size": size,
            "parameters": _size(width),
            "round_seconds": {k: m[0] for k, m in med.items()},
            "aggregate_seconds": {k: m[1] for k, m in med.items()},
            "ratio_round": med["fedsim"][0] / med["flower"][0],
            "ratio_round_out": med["fedsim-out"][0] / med["flower"][0],
            "ratio_aggregate": med["fedsim"][1] / med["flower"][1],
            "ratio_aggregate_out": med["fedsim-out"][1] / med["flower"][1],
        }
        row["checkpoint_mb"], row["noise_file_mb"] = _checkpoint_mb(width, args.nodes)
        print(json.dumps(row), flush=True)
        results.append(row)
    import flwr
    import torch

    result = {
        "nodes": args.nodes,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "flower": flwr.__version__,
        "flower_accountant": args.accountant,
        "torch_threads": torch.get_num_threads(),
        "sizes": results,
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
