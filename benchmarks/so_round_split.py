"""One Stack Overflow round at the paper's shape, split into its phases (issue 46, the SO shape).

Generates a Stack Overflow folder with fedsim's own generator (`fedsim data synth stackoverflow`,
generated text in TFF's layout, no network) in a temporary folder, then runs real rounds through
`run_experiment` with the in-process engine: the 4.05M-parameter `so_nwp_lstm` (vocabulary
10,000), `--users` users a round (167 in the paper), BLT noise with 4 buffers (or banded or
Gaussian), checkpoints every round and evaluation of a seeded `eval.max_users` subset every
round. fedsim's code is not changed: the functions that do each phase are wrapped, inside this
process, with CPU timers (`time.thread_time` of the thread that runs them, so the noise rows
drawn in the background thread count too), and each round's CPU is `time.process_time` (all the
process's threads; the machine is shared, so wall time is not used). A phase's time is its
own: a timed function called inside another counts for its own phase only.

Phases: `training` (the users' local updates: `train_users` and its variants), `client
messaging` (the ClientApp's decoding and encoding of the messages around them, and the
in-process grid), `dispatch` (the strategy's `configure_train`: sampling and the train
messages), `aggregation` (`aggregate_train`: screening, re-clipping and summing the replies),
`noise` (the noise row: the keyed Gaussian draw, the mechanism's stream step and adding it:
`_xi`, `NoiseMechanism.row`, `DPServer.noisy_mean`, `prefetch_noise`; fedsim draws round t's
`ξ_t` ahead, in a background thread, while round t − 1 ends, and the benchmark counts that draw
in round t, the round it serves), `server update`
(`DPServer.step` besides the noise: the optimizer), `accounting` (the ledger's ε),
`evaluation` (`configure_evaluate`, `evaluate_users`, `aggregate_evaluate`), `checkpoint`
(`Checkpointer.save`) and `other` (the round's process CPU that no timed function took:
metrics rows, progress, Python's garbage collector).

Round 1 carries the warm-up (allocator, first model load) and is reported apart; the steady
round is the mean of rounds 2 onwards. The 2,048-round projection multiplies the steady round
(training and client messaging scaled linearly to 167 users, and evaluation to 2,000 evaluated
users, where fewer ran) and, as a second figure, evaluates every 100 rounds as
`experiments/stackoverflow_nwp_mf.toml` does.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/so_round_split.py [--users 167] [--rounds 3] [--json PATH]
    OMP_NUM_THREADS=1 python benchmarks/so_round_split.py --quick    # 8 users, 2 rounds: a smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAPER_USERS = 167
PAPER_ROUNDS = 2048
PAPER_EVAL_EVERY = 100
PAPER_EVAL_USERS = 2000
PHASES = (
    "training",
    "client messaging",
    "dispatch",
    "aggregation",
    "noise",
    "server update",
    "accounting",
    "evaluation",
    "checkpoint",
    "other",
)
#: phases whose work grows with the users trained in a round (scaled to 167 in the projection)
PER_USER = ("training", "client messaging")


class PhaseClock:
    """Exclusive CPU time per phase, over all threads: each thread keeps a stack of the timed
    calls it is in; time is charged to the innermost one."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._local = threading.local()

    def _charge(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.totals[phase] += seconds

    def wrap(self, phase: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = getattr(self._local, "stack", None)
            if stack is None:
                stack = self._local.stack = []
            now = time.thread_time()
            if stack:
                outer = stack[-1]
                self._charge(outer[0], now - outer[1])
            stack.append([phase, now])
            try:
                return fn(*args, **kwargs)
            finally:
                now = time.thread_time()
                inner = stack.pop()
                self._charge(inner[0], now - inner[1])
                if stack:
                    stack[-1][1] = now

        return timed

    def patch(self, owner: Any, name: str, phase: str) -> None:
        setattr(owner, name, self.wrap(phase, getattr(owner, name)))

    def per_row(self, fn: Any) -> Any:
        """Wrap `_xi(key, j, ...)` to also keep each row j's own draw CPU in `self.rows[j]` (the
        draw calls no other timed function, so its thread CPU is its own)."""
        self.rows: dict[int, float] = defaultdict(float)

        @functools.wraps(fn)
        def timed(key: Any, j: int, *args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(key, j, *args, **kwargs)
            finally:
                dt = time.thread_time() - t0
                with self._lock:
                    self.rows[int(j)] += dt

        return timed

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.totals)


def instrument(clock: PhaseClock, marks: list[tuple[float, dict[str, float]]]) -> None:
    """Wrap the functions that do each phase (module attributes and methods, looked up at call
    time by their callers), and mark the process CPU at the start and at each round's end."""
    import fedsim.clients.client_app as client_app
    import fedsim.privacy.noise as noise
    from fedsim.privacy.accounting import EpsilonCurve
    from fedsim.privacy.ledger import Ledger
    from fedsim.runner.callbacks import Checkpointer, MetricsFile
    from fedsim.runner.inprocess import InProcessGrid
    from fedsim.server.step import DPServer
    from fedsim.strategies.user_dp import UserLevelDPStrategy

    for name in ("train_users", "train_users_vectorized", "train_users_ef"):
        clock.patch(client_app, name, "training")
    clock.patch(client_app, "evaluate_users", "evaluation")
    clock.patch(InProcessGrid, "send_and_receive", "client messaging")
    clock.patch(UserLevelDPStrategy, "configure_train", "dispatch")
    clock.patch(UserLevelDPStrategy, "aggregate_train", "aggregation")
    clock.patch(UserLevelDPStrategy, "configure_evaluate", "evaluation")
    clock.patch(UserLevelDPStrategy, "aggregate_evaluate", "evaluation")
    clock.patch(DPServer, "step", "server update")
    for name in ("noisy_mean", "prefetch_noise"):
        clock.patch(DPServer, name, "noise")
    noise._xi = clock.wrap("noise draw", clock.per_row(noise._xi))
    clock.patch(noise.NoiseMechanism, "row", "noise")
    clock.patch(Ledger, "record_round", "accounting")
    clock.patch(Ledger, "prefetch", "accounting")
    clock.patch(EpsilonCurve, "_compute", "accounting")
    clock.patch(Checkpointer, "save", "checkpoint")

    start, end = Checkpointer.on_start, MetricsFile.on_round_end

    def on_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = start(self, *args, **kwargs)
        marks.append((time.process_time(), clock.snapshot()))
        return out

    def on_round_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = end(self, *args, **kwargs)
        marks.append((time.process_time(), clock.snapshot()))
        return out

    Checkpointer.on_start = on_start
    MetricsFile.on_round_end = on_round_end


def config_text(args: argparse.Namespace, root: Path, population: int) -> str:
    """The experiment: experiments/stackoverflow_nwp_mf.toml's keys at `args`' size."""
    noise = {
        "blt": 'mechanism = "blt"\nbuffers = 4',
        "banded": 'mechanism = "banded"\nbands = 8',
        "gaussian": 'mechanism = "gaussian"',
    }[args.mechanism]
    return f"""name = "so_round_split"
seed = 0
rounds = {args.rounds}

[data]
name = "stackoverflow_nwp"
root = "{root}"
vocab_size = 10000
seq_len = 20
num_oov_buckets = 1
max_elements_per_user = 256

[model]
name = "so_nwp_lstm"

[client]
local_epochs = 1
batch_size = 16
lr = 0.5
clip_norm = 1.0
max_examples = 256

[sampling]
scheme = "single"
assignment = "shuffle"
cohort_size = {args.users}

[privacy]
{noise}
noise_multiplier = 0.341

[server]
optimizer = "momentum"
lr = 3.0
momentum = 0.9

[eval]
every = 1
max_users = {args.eval_users}
max_examples_per_user = 64

[sim]
engine = "inprocess"
num_workers = 1
client_cpus = 1
device = "cpu"

[checkpoint]
every = 1
"""


def synth(out: Path, users: int, per_user: float) -> float:
    """Generate the Stack Overflow folder; returns the generator's wall seconds."""
    t0 = time.perf_counter()
    cmd = [str(Path(sys.executable).with_name("fedsim")), "data", "synth", "stackoverflow", "--out", str(out)]
    cmd += ["--users", str(users), "--per-user", str(per_user), "--vocab", "12000"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def split(marks: list[tuple[float, dict[str, float]]], drawn: dict[int, float]) -> list[dict[str, Any]]:
    """Per-round CPU seconds of each phase from consecutive marks. Round i's noise row draws
    `ξ_{i−1}`, which fedsim computes ahead, in a background thread, while the round before ends:
    each draw is moved from the window it ran in to the round it serves (`drawn[j]`)."""
    rows = []
    for i in range(1, len(marks)):
        (c0, p0), (c1, p1) = marks[i - 1], marks[i]
        phases = {ph: p1.get(ph, 0.0) - p0.get(ph, 0.0) for ph in PHASES if ph != "other"}
        ran_here = p1.get("noise draw", 0.0) - p0.get("noise draw", 0.0)
        draw = drawn.get(i - 1, 0.0)
        phases["noise"] += draw
        total = c1 - c0 - ran_here + draw
        phases["other"] = total - sum(phases.values())
        rows.append({"round": i, "cpu_s": total, "phases": phases, "noise_draw_s": draw})
    return rows


def steady(rows: list[dict[str, Any]]) -> dict[str, Any]:
    use = rows[1:] or rows
    total = sum(r["cpu_s"] for r in use) / len(use)
    phases = {ph: sum(r["phases"][ph] for r in use) / len(use) for ph in PHASES}
    return {"rounds": [r["round"] for r in use], "cpu_s": total, "phases": phases}


def project(st: dict[str, Any], users: int, eval_users: int) -> dict[str, Any]:
    """2,048 rounds of 167 users, evaluated on 2,000, from the steady round: the per-user phases
    scaled linearly by 167/users and the evaluation by 2,000/eval_users where fewer ran."""
    scale, eval_scale = PAPER_USERS / users, PAPER_EVAL_USERS / eval_users
    ph = {k: v * (scale if k in PER_USER else 1.0) for k, v in st["phases"].items()}
    ph["evaluation"] *= eval_scale
    round_s = sum(ph.values())
    evals = math.ceil(PAPER_ROUNDS / PAPER_EVAL_EVERY) + 1  # every 100 rounds, and after the last
    sparse = PAPER_ROUNDS * (round_s - ph["evaluation"]) + evals * ph["evaluation"]
    return {
        "users_scale": scale,
        "eval_users_scale": eval_scale,
        "round_cpu_s_at_167": round_s,
        "phases_at_167": ph,
        "run_cpu_h_eval_every_round": PAPER_ROUNDS * round_s / 3600,
        "run_cpu_h_eval_every_100": sparse / 3600,
        "noise_share_at_167": ph["noise"] / round_s,
    }


def fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def report(result: dict[str, Any]) -> str:
    st, pr = result["steady"], result["projection"]
    lines = [
        f"SO shape: so_nwp_lstm (d = {result['params']:,}), {result['users']} users a round, "
        f"{result['mechanism']} noise, eval on {result['eval_users']} users, checkpoint every round",
        "",
        "| phase | round 1 CPU s | steady CPU s a round | share | at 167 users (2,000 evaluated) CPU s | share |",
        "|---|---|---|---|---|---|",
    ]
    r1 = result["rounds"][0]
    for ph in PHASES:
        lines.append(
            f"| {ph} | {fmt(r1['phases'][ph])} | {fmt(st['phases'][ph])} | {st['phases'][ph] / st['cpu_s']:.1%} "
            f"| {fmt(pr['phases_at_167'][ph])} | {pr['phases_at_167'][ph] / pr['round_cpu_s_at_167']:.1%} |"
        )
    lines.append(
        f"| **round** | {fmt(r1['cpu_s'])} | {fmt(st['cpu_s'])} | 100% | {fmt(pr['round_cpu_s_at_167'])} | 100% |"
    )
    lines += [
        "",
        f"noise share: {st['phases']['noise'] / st['cpu_s']:.2%} measured, {pr['noise_share_at_167']:.2%} at 167 users",
        f"2,048 rounds at 167 users: {pr['run_cpu_h_eval_every_round']:.1f} CPU-hours evaluating every round, "
        f"{pr['run_cpu_h_eval_every_100']:.1f} evaluating every 100 rounds",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=PAPER_USERS, help="users a round (default 167)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds to run (default 3)")
    ap.add_argument("--per-user", type=float, default=40.0, help="mean train examples a generated user (default 40)")
    ap.add_argument("--eval-users", type=int, default=2000, help="eval.max_users (default 2000, as the shipped config)")
    ap.add_argument("--mechanism", choices=("blt", "banded", "gaussian"), default="blt", help="noise (default blt)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 8 users, 2 rounds, 50 evaluated users")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the data and the run here (default: a temp dir)")
    ap.add_argument(
        "--json", type=Path, default=None, help="add the run's rows to this JSON file's runs (same command: replaced)"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.users, args.rounds, args.eval_users = 8, 2, 50
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for k in ("FLWR_TELEMETRY_ENABLED", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "0" if k == "FLWR_TELEMETRY_ENABLED" else "1")

    tmp = tempfile.TemporaryDirectory(prefix="so_round_split_") if args.workdir is None else None
    work = Path(tmp.name) if tmp is not None else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FLWR_HOME", str(work / "flwr"))
    os.environ.setdefault("RAY_TMPDIR", str(work / "ray"))
    population = max(args.users * args.rounds, args.eval_users) + args.users
    data = work / "data"
    synth_s = 0.0 if (data / "stackoverflow.sqlite").exists() else synth(data, population, args.per_user)
    (work / "so_round_split.toml").write_text(config_text(args, data, population))

    import torch

    torch.set_num_threads(1)
    from fedsim.config import load_config
    from fedsim.runner import run_experiment

    clock = PhaseClock()
    marks: list[tuple[float, dict[str, float]]] = []
    instrument(clock, marks)
    cfg = load_config(work / "so_round_split.toml", [])
    out = work / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.process_time()
    summary = run_experiment(cfg, out, progress=False)
    run_cpu = time.process_time() - t0
    rows = split(marks, dict(clock.rows))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ckpt = out / "checkpoint" / "checkpoint.pt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    params = int(state["server"]["params"].numel())
    for row, m in zip(rows, metrics):
        row["train_examples"] = m.get("train_examples")
        row["eval_examples"] = m.get("eval_examples")
        row["accepted_updates"] = m.get("accepted_updates")
    st = steady(rows)
    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "OMP_NUM_THREADS=1 python benchmarks/so_round_split.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
        "torch": torch.__version__,
        "model": "so_nwp_lstm",
        "params": params,
        "users": args.users,
        "rounds_run": args.rounds,
        "mechanism": args.mechanism,
        "eval_users": args.eval_users,
        "population": population,
        "per_user_mean_examples": args.per_user,
        "synth_wall_s": synth_s,
        "run_cpu_s": run_cpu,
        "checkpoint_bytes": ckpt.stat().st_size,
        "epsilon": summary.get("epsilon") if isinstance(summary, dict) else None,
        "rounds": rows,
        "steady": st,
        "projection": project(st, args.users, args.eval_users),
    }
    print(report(result))
    if args.json is not None:
        runs = json.loads(args.json.read_text())["runs"] if args.json.exists() else []
        runs = [r for r in runs if r["command"] != result["command"]] + [result]
        args.json.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
        print(f"added the run to {args.json} ({len(runs)} runs)")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
