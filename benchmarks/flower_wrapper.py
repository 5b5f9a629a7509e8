"""Round time of :class:`fedsim.flower.UserLevelDP` against Flower's own
``DifferentialPrivacyServerSideFixedClipping``, on Flower's quickstart-pytorch app
(``examples/flower-quickstart-pytorch``: its CNN, 62,006 parameters, and its ClientApp).

Both wrap ``FedAvg`` and train all 10 nodes every round with the same clip norm. Flower's wrapper
adds independent Gaussian noise; fedsim's adds BLT correlated noise (min_sep 1: every node in
every round) from the keyed CSPRNG, and keeps the ledger. Both run on fedsim's in-process Grid,
which calls the same ClientApp (with its mods) directly, so the nodes' training is identical and
the difference is the strategies' own work. The two are timed in alternation, ``--repeats``
times each, in one process; the ratio of medians is reported, with the server-side time
(``aggregate_train``) apart. A round's time is the median over rounds 2..n of one run: round 1
also pays one-off start-up costs (building the noise stream, the first ε), reported apart.

    python benchmarks/flower_wrapper.py --rounds 5 --repeats 5 --out benchmarks/flower_wrapper_results.json
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


def _one(kind: str, rounds: int, nodes: int) -> tuple[float, float]:
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
    from pytorchexample.client_app import app
    from pytorchexample.task import Net

    from fedsim.flower import UserLevelDP
    from fedsim.runner.inprocess import InProcessGrid, task_identity

    fedavg = FedAvg(fraction_evaluate=0.0, min_available_nodes=nodes)
    if kind == "flower":
        strategy = DifferentialPrivacyServerSideFixedClipping(fedavg, 1.0, 1.0, nodes)
    else:
        strategy = UserLevelDP(fedavg, rounds=rounds, population=nodes, clip_norm=1.0,
                               privacy={"mechanism": "blt", "noise_multiplier": 1.0},
                               sampling={"scheme": "min_sep", "min_sep": 1})  # fmt: skip
    strategy = _timed(strategy)
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
        strategy.start(grid, ArrayRecord(Net().state_dict()), num_rounds=rounds,
                       train_config=ConfigRecord({"lr": 0.1}), evaluate_fn=clock)  # fmt: skip
    # steady state: rounds 2..n (round 1 pays one-off start-up: building the noise stream, the
    # first ε from dp-accounting)
    rt = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    st = [b - a for a, b in zip(server[1:], server[2:])]
    return statistics.median(rt), statistics.median(st)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(APP))
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    times: dict[str, list[tuple[float, float]]] = {"flower": [], "fedsim": []}
    _one("flower", 3, args.nodes), _one("fedsim", 3, args.nodes)  # warm-up: imports, first-call costs
    for _ in range(args.repeats):
        for kind in ("flower", "fedsim"):
            times[kind].append(_one(kind, args.rounds, args.nodes))
    med = {k: (statistics.median(t for t, _ in v), statistics.median(s for _, s in v)) for k, v in times.items()}
    result = {
        "nodes": args.nodes,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "parameters": 62006,
        "round_seconds": {k: m[0] for k, m in med.items()},
        "aggregate_seconds": {k: m[1] for k, m in med.items()},
        "ratio_round": med["fedsim"][0] / med["flower"][0],
        "ratio_aggregate": med["fedsim"][1] / med["flower"][1],
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
