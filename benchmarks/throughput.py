"""Simulation speed: fedsim's engines against a plain PyTorch loop (the "floor"), interleaved.

Workloads (issue 6):

- ``w2`` — overhead-bound: logistic regression (64 features, 10 classes) on 100 users with 18
  samples each (the size of sklearn's digits split 100 ways; here the ``synthetic`` dataset),
  50 users per round, batch 8, one epoch.
- ``w1`` — compute-bound: LEAF's character LSTM (``shakespeare_lstm``, ≈ 820k parameters),
  20 users per round × 64 windows of 80 characters, batch 8, one epoch, on the bundled
  Shakespeare users.
- ``so_lstm`` — the Stack Overflow next-word LSTM shape (``so_nwp_lstm``, V = 10,000,
  4,053,428 parameters) on generated tokens (``fedsim data synth stackoverflow``: 100 users,
  about 64 sentences each, 12,000 distinct words, written to a temporary folder), 10 users per
  round × 64 sentences of 20 tokens, batch 16, one epoch.

Every system trains exactly ``K`` users per round (``sampling.scheme = "fixed"``), so per-round
times compare the same work. The floors, Flower and pfl run with the C library's allocator
settings; fedsim's processes with ``sim.allocator = "tuned"`` (its default). Systems: ``floor`` (one thread, a plain loop: copy the global model, local SGD, clip, sum, add
Gaussian noise, step — the same users and DP steps as fedsim), ``floor-2proc`` (the same loop
on two processes, half the cohort each, sums sent through a pipe: what this loop takes on two
cores, against which the two-worker rows are read), ``fedsim-inprocess`` (one
worker, no Ray; vectorized where the model allows), ``fedsim-inprocess-seq`` (vectorization
off), ``fedsim-inprocess-batched`` (``vectorize = on``: LSTM users batched too, which ``auto``
does not do), ``fedsim-ray`` (two Ray workers). The floor computes no ε; fedsim runs with
``privacy.account_every`` past the last round (ε once, at the end), and
``fedsim-inprocess-eps-every-round`` shows the cost of ε after every round (RDP: the cohorts are fixed); ``flower``
(Flower 1.41's own ``FedAvg`` wrapped in ``DifferentialPrivacyServerSideFixedClipping``, a
quickstart-style ClientApp with one SuperNode per user, Ray with 2 actors; its rounds are timed
with the strategy's ``evaluate_fn`` hook). Each repetition runs every system once, in turn, so
machine load affects them alike; the ratio to the floor is computed within a repetition.

Usage::

    python benchmarks/throughput.py [--workloads w2 w1] [--rounds 20] [--reps 2] [--quick] [--json]
                                    [--device cpu|cuda] [--keep-going]

``--json`` prints rows ``{"system", "workload", "per_round_s", "total_s", "first_round_s",
"peak_rss_mb", "ratio_to_floor", "ratio_per_rep", "load_avg", "device"}`` (medians over
repetitions; ``ratio_per_rep``: the ratio to the floor in each repetition).

``--device cuda`` trains on the GPU: the floor moves its model and batches there, and fedsim's
rows add ``sim.client_gpus = 1`` and ``sim.device = 'cuda'``. Only ``floor`` and the in-process
rows (``fedsim-inprocess``, ``-seq``, ``-batched``) run there.
``--keep-going`` turns a system's failure into a row with its ``error`` and goes on with the
others (one call on a lent machine gives every row it can). ``benchmarks/gpu_rows.sh`` runs it
on such a machine.

pfl-research rows (``pfl``: one process; ``pfl-2workers``: pfl's own two-worker simulation under
``torchrun``) run in pfl's own environment (it pins ``dp-accounting`` 0.5.1): build it once with
``bash benchmarks/pfl_env.sh``. The workload is exported with fedsim's loaders (every user's ``m``
training samples, the same model from ``fedsim.models``) and trained by ``benchmarks/pfl_worker.py``:
``K`` users, local SGD, per-user clipping and central Gaussian noise (pfl's ``GaussianMechanism``
applied centrally), server SGD. pfl computes no ε here either.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = {
    "w2": [
        "data.name='synthetic'",
        "data.num_clients=100",
        "data.samples_per_user=18",
        "data.num_features=64",
        "data.num_classes=10",
        "model.name='logreg'",
        "sampling.cohort_size=50",
        "client.batch_size=8",
        "client.max_examples=18",
        "client.lr=0.1",
    ],
    "w1": [
        "data.name='shakespeare'",
        "model.name='shakespeare_lstm'",
        "sampling.cohort_size=20",
        "client.batch_size=8",
        "client.max_examples=64",
        "client.lr=1.0",
    ],
    "so_lstm": [
        "data.name='stackoverflow_nwp'",
        "data.root='{so_root}'",
        "data.vocab_size=10000",
        "data.seq_len=20",
        "model.name='so_nwp_lstm'",
        "sampling.cohort_size=10",
        "client.batch_size=16",
        "client.max_examples=64",
        "client.lr=0.5",
    ],
}
COMMON = [
    "sampling.scheme='fixed'",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "client.local_epochs=1",
    "client.clip_norm=1.0",
    "server.optimizer='sgd'",
    "server.lr=1.0",
    "eval.every=0",
    "eval.max_users=1",
    "eval.max_examples_per_user=1",
    "checkpoint.every=1000000",
    "privacy.account_every=1000000",
]
SYSTEMS = {
    "fedsim-inprocess": ["sim.engine='inprocess'", "sim.num_workers=1", "sim.vectorize='auto'"],
    "fedsim-inprocess-eps-every-round": [
        "sim.engine='inprocess'",
        "sim.num_workers=1",
        "sim.vectorize='auto'",
        "privacy.account_every=1",
    ],
    "fedsim-inprocess-seq": ["sim.engine='inprocess'", "sim.num_workers=1", "sim.vectorize='off'"],
    "fedsim-inprocess-batched": ["sim.engine='inprocess'", "sim.num_workers=1", "sim.vectorize='on'"],
    "fedsim-ray": ["sim.engine='ray'", "sim.num_workers=2", "sim.client_cpus=1", "sim.vectorize='auto'"],
}

#: ``--device cuda``: the systems that run there (the floor and the in-process engine: a GPU
#: machine's image has no Ray, and the two-process floor forks, which CUDA does not survive), and
#: what fedsim's rows add (each worker's users on the GPU). ``fedsim-inprocess`` (``vectorize =
#: auto``) is one of the other two fedsim rows, by its ``vectorized`` field.
GPU_SYSTEMS = ("floor", "fedsim-inprocess", "fedsim-inprocess-seq", "fedsim-inprocess-batched")
GPU_OVERRIDES = ["sim.client_gpus=1", "sim.device='cuda'"]

#: What both floors share: the run's config, data and model on one thread, and ``train``: copy
#: the global model, local SGD, clip, sum (user by user), for the users given. The SGD step is
#: ``p -= lr·grad`` on each parameter, as fedsim's clients do it: a ``torch.optim.SGD`` per user
#: (what earlier passes used) costs W2's floor about a third of its round in optimizer overhead
#: and imports ``torch._dynamo`` (1.5 s) in its first round.
_FLOOR_SETUP = r"""
import json, os, sys, time
import numpy as np, torch
torch.set_num_threads(1)
from fedsim.config import load_config
from fedsim.data import load_federated
from fedsim.models import make_model
from fedsim.seeding import derive_seed
cfg = load_config(None, json.loads(sys.argv[1]))
dev = torch.device(os.environ.get("BENCH_DEVICE", "cpu"))
data = load_federated(cfg.data)
model = make_model(cfg.model.name, data.model_dims(), seed=derive_seed(cfg.seed, "model")).to(dev)
params = list(model.parameters())
x = torch.nn.utils.parameters_to_vector(params).detach().clone()
N, K, c, z = data.population, int(cfg.sampling.cohort_size), cfg.client.clip_norm, cfg.privacy.noise_multiplier
B, lr, m = cfg.client.batch_size, cfg.client.lr, cfg.client.max_examples

def train(users, x, gen):
    total = torch.zeros_like(x)
    for u in users:
        torch.nn.utils.vector_to_parameters(x.clone(), params)
        perm = torch.randperm(data.num_train(int(u)), generator=gen)[:m].numpy()
        for s in range(0, len(perm), B):
            xb, yb = data.train_samples(int(u), np.sort(perm[s:s + B]))
            for p in params:
                p.grad = None
            data.loss(model(xb.to(dev)), yb.to(dev)).backward()
            with torch.no_grad():  # plain SGD, as fedsim's clients step (no optimizer object)
                for p in params:
                    p.add_(p.grad, alpha=-lr)
        d = torch.nn.utils.parameters_to_vector(params).detach() - x
        total += d * min(1.0, c / (float(d.norm()) + 1e-12))
    return total

def sync():
    if dev.type == "cuda":  # a round ends when the device has finished it
        torch.cuda.synchronize(dev)

def report(rounds, t0):
    print(json.dumps({"rounds": rounds, "total_s": time.perf_counter() - t0,
                      "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                      "peak_rss_mb": int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024}))
"""

FLOOR = (
    _FLOOR_SETUP
    + r"""
rng = np.random.default_rng(0)
gen = torch.Generator().manual_seed(0)
t0 = time.perf_counter(); rounds = []
for t in range(cfg.rounds):
    ts = time.perf_counter()
    cohort = np.sort(rng.choice(N, size=K, replace=False))  # exactly K, as sampling.scheme = "fixed"
    total = train(cohort, x, gen)
    x = x + (total + torch.randn(x.shape, generator=gen).to(dev) * c * z) / K
    sync()
    rounds.append(time.perf_counter() - ts)
report(rounds, t0)
"""
)

#: The floor on two processes: the parent and one forked child each train half of the cohort
#: (longest first, as fedsim's scheduler), the child sends its sum of clipped deltas through a
#: pipe, the parent adds noise, steps, and sends the new model back: what this loop takes on two
#: cores (memory and cache contention between the two included).
FLOOR_2PROC = (
    _FLOOR_SETUP
    + r"""
import multiprocessing as mp

def child(conn):
    gen = torch.Generator().manual_seed(1)
    while (msg := conn.recv()) is not None:
        users, xb = msg
        conn.send(train(users, torch.from_numpy(xb), gen).numpy())

here, there = mp.get_context("fork").Pipe()
worker = mp.get_context("fork").Process(target=child, args=(there,))
worker.start()
rng = np.random.default_rng(0)
gen = torch.Generator().manual_seed(0)
t0 = time.perf_counter(); rounds = []
for t in range(cfg.rounds):
    ts = time.perf_counter()
    cohort = np.sort(rng.choice(N, size=K, replace=False))
    load, half = [0, 0], [[], []]
    for u in sorted(cohort, key=lambda u: -min(data.num_train(int(u)), m)):
        w = int(load[1] < load[0]); half[w].append(int(u)); load[w] += min(data.num_train(int(u)), m)
    here.send((half[1], x.numpy()))
    total = train(half[0], x, gen) + torch.from_numpy(here.recv())
    x = x + (total + torch.randn(x.shape, generator=gen) * c * z) / K
    rounds.append(time.perf_counter() - ts)
here.send(None); worker.join()
report(rounds, t0)
"""
)

FEDSIM = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from fedsim.config import load_config
from fedsim.runner import run_experiment
cfg = load_config(None, json.loads(sys.argv[1]))
s = run_experiment(cfg, sys.argv[2], progress=False)
rows = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
print(json.dumps({"rounds": [r["seconds"] for r in rows], "total_s": time.perf_counter() - t0,
                  "vectorized": s.get("vectorized"),
                  "peak_rss_mb": int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024}))
"""


FLOWER = r"""
import json, logging, os, resource, sys, time
t0 = time.perf_counter()
import numpy as np, torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from flwr.simulation import run_simulation
from fedsim.config import load_config
from fedsim.data import load_federated
from fedsim.models import make_model
from fedsim.seeding import derive_seed
cfg = load_config(None, json.loads(sys.argv[1]))
N, K = cfg.data.num_clients if cfg.data.name == "synthetic" else None, int(cfg.sampling.cohort_size)

def build():
    data = load_federated(cfg.data)
    return data, make_model(cfg.model.name, data.model_dims(), seed=derive_seed(cfg.seed, "model"))

client = ClientApp()

@client.train()
def train(msg: Message, ctx: Context) -> Message:
    torch.set_num_threads(1)
    data, model = build()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    u = int(ctx.node_config["partition-id"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg.client.lr)
    perm = torch.randperm(data.num_train(u))[: cfg.client.max_examples].numpy()
    for s in range(0, len(perm), cfg.client.batch_size):
        xb, yb = data.train_samples(u, np.sort(perm[s:s + cfg.client.batch_size]))
        opt.zero_grad(); data.loss(model(xb), yb).backward(); opt.step()
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                               "metrics": MetricRecord({"num-examples": len(perm)})}), reply_to=msg)

stamps = []
server = ServerApp()

@server.main()
def main(grid: Grid, ctx: Context) -> None:
    data, model = build()
    n = data.population
    fed = FedAvg(fraction_train=K / n, fraction_evaluate=0.0, min_train_nodes=K, min_available_nodes=n)
    dp = DifferentialPrivacyServerSideFixedClipping(fed, noise_multiplier=cfg.privacy.noise_multiplier,
                                                    clipping_norm=cfg.client.clip_norm, num_sampled_clients=K)
    stamps.append(time.perf_counter())
    dp.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=cfg.rounds,
             evaluate_fn=lambda r, a: stamps.append(time.perf_counter()) or None)

data, _ = build()
logging.getLogger("flwr").setLevel(logging.ERROR)
run_simulation(server_app=server, client_app=client, num_supernodes=data.population,
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"num_cpus": 2, "include_dashboard": False, "logging_level": logging.ERROR}})
# stamps[0]: start; evaluate_fn also runs once before round 1
marks = stamps[1:]
rounds = [b - a for a, b in zip(marks, marks[1:])]
print(json.dumps({"rounds": rounds, "total_s": time.perf_counter() - t0,
                  "peak_rss_mb": int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024}))
"""


#: exports a workload for pfl (benchmarks/pfl_worker.py): every user's m training samples (a fixed
#: random subset, the same count fedsim and the floor train per round), the model and DP settings.
EXPORT = r"""
import json, sys
import numpy as np, torch
from fedsim.config import load_config
from fedsim.data import load_federated
from fedsim.seeding import derive_seed
cfg = load_config(None, json.loads(sys.argv[1]))
data = load_federated(cfg.data)
rng = np.random.default_rng(0)
users = []
for u in range(data.population):
    idx = np.sort(rng.permutation(data.num_train(u))[: cfg.client.max_examples])
    users.append(tuple(t.clone() for t in data.train_samples(u, idx)))
meta = {"model": cfg.model.name, "dims": data.model_dims(), "seed": derive_seed(cfg.seed, "model"),
        "loss": "nwp" if cfg.data.name == "stackoverflow_nwp" else "ce", "rounds": cfg.rounds,
        "cohort": int(cfg.sampling.cohort_size), "lr": cfg.client.lr, "batch_size": cfg.client.batch_size,
        "clip_norm": cfg.client.clip_norm, "noise_multiplier": cfg.privacy.noise_multiplier,
        "server_lr": cfg.server.lr}
torch.save({"meta": meta, "users": users}, sys.argv[2])
print(json.dumps({"users": len(users)}))
"""
#: pfl-research rows: system name → worker processes (torchrun when more than one).
PFL_SYSTEMS = {"pfl": 1, "pfl-2workers": 2}
#: pfl's environment (benchmarks/pfl_env.sh builds it).
PFL_PYTHON = Path(__file__).resolve().parent.parent / ".venv-pfl" / "bin" / "python"


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of every benchmarked process: one BLAS thread, no telemetry, no network,
    plus ``extra``."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        **extra,
    }


def _run(code: str, overrides: list[str], out: str | None = None, device: str = "cpu") -> dict:
    env = bench_env(BENCH_DEVICE=device)
    args = [sys.executable, "-c", code, json.dumps(overrides)] + ([out] if out else [])
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall_s"] = time.perf_counter() - t0
    return res


def _run_pfl(workload_file: Path, workers: int) -> dict:
    """pfl-research on an exported workload: one process, or ``workers`` torchrun processes."""
    if not PFL_PYTHON.exists():
        raise SystemExit("pfl rows need pfl's own environment: run `bash benchmarks/pfl_env.sh` once")
    env = bench_env(PYTHONPATH=str(PFL_PYTHON.parents[2]))
    worker = str(Path(__file__).resolve().parent / "pfl_worker.py")
    if workers == 1:
        args = [str(PFL_PYTHON), worker, str(workload_file)]
    else:
        torchrun = str(PFL_PYTHON.parent / "torchrun")
        args = [torchrun, "--standalone", f"--nproc_per_node={workers}", worker, str(workload_file)]
    for attempt in range(2):  # pfl's torchrun workers once aborted at teardown ("terminate called
        # without an active exception") before printing; such a run is repeated once, and said
        t0 = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, text=True, env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode == 0 and lines:
            res = json.loads(lines[-1])
            res["wall_s"] = time.perf_counter() - t0
            res["attempts"] = attempt + 1
            return res
        print(f"pfl ({workers} workers) exited {proc.returncode}: {proc.stderr[-300:]}", file=sys.stderr)
    raise RuntimeError(proc.stderr[-3000:])


def _run_system(system: str, overrides: list[str], out: str, exported: Path, device: str) -> dict:
    """One run of ``system`` on the workload ``overrides``; fedsim's run folder is ``out``."""
    if system == "floor":
        return _run(FLOOR, overrides, device=device)
    if system == "floor-2proc":
        return _run(FLOOR_2PROC, overrides)
    if system == "flower":
        return _run(FLOWER, overrides)
    if system in PFL_SYSTEMS:
        return _run_pfl(exported, PFL_SYSTEMS[system])
    return _run(FEDSIM, overrides + SYSTEMS[system], out)


def _summarize(wl: str, per: dict[str, list[dict]], device: str) -> list[dict]:
    """One row per system of workload ``wl`` (medians over its repetitions; the ratio to the floor
    within each repetition; no ratio where the floor did not run)."""
    floor_round = [statistics.median(r["rounds"][1:] or r["rounds"]) for r in per.get("floor", [])]
    device_name = next((r["device_name"] for r in per.get("floor", []) if "device_name" in r), device)
    rows = []
    for system, results in per.items():
        pr = [statistics.median(r["rounds"][1:] or r["rounds"]) for r in results]
        ratio = [p / f for p, f in zip(pr, floor_round)] if floor_round else []
        rows.append(
            {
                "system": system,
                "workload": wl,
                "per_round_s": statistics.median(pr),
                "total_s": statistics.median(r["wall_s"] for r in results),
                "first_round_s": statistics.median(r["rounds"][0] for r in results),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
                "ratio_to_floor": statistics.median(ratio) if ratio else None,
                "ratio_per_rep": ratio,
                "vectorized": results[0].get("vectorized"),
                "load_avg": statistics.median(r["load_avg"] for r in results),
                "device": device_name,
            }
        )
    return rows


def _print(rows: list[dict]) -> None:
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:3s} {r['system']:22s} failed: {r['error'][-200:]}")
            continue
        print(
            f"{r['workload']:3s} {r['system']:22s} per round {r['per_round_s']:.4f} s  total {r['total_s']:.1f} s  "
            f"first {r['first_round_s']:.2f} s  ratio {r['ratio_to_floor'] if r['ratio_to_floor'] is None else round(r['ratio_to_floor'], 3)}"
            f"  rss {r['peak_rss_mb']:.0f} MB  load {r['load_avg']:.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["w2", "w1"], choices=list(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--systems", nargs="+", default=["floor", "floor-2proc", *SYSTEMS, "flower", *PFL_SYSTEMS])
    ap.add_argument("--quick", action="store_true", help="5 rounds, 1 repetition")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the users train: cuda runs the floor's model on the GPU and fedsim's workers with "
        f"sim.client_gpus = 1 (systems: {', '.join(GPU_SYSTEMS)})",
    )
    ap.add_argument(
        "--keep-going",
        action="store_true",
        help="a system that fails gets a row with its error instead of ending the benchmark",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rounds, reps = (5, 1) if args.quick else (args.rounds, args.reps)
    if args.device == "cuda":
        if args.systems == ap.get_default("systems"):
            args.systems = list(GPU_SYSTEMS)
        if other := [s for s in args.systems if s not in GPU_SYSTEMS]:
            ap.error(f"--device cuda runs only {', '.join(GPU_SYSTEMS)}; drop {', '.join(other)}")
    on_gpu = GPU_OVERRIDES if args.device == "cuda" else []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        so_root = Path(tmp) / "so"
        if "so_lstm" in args.workloads:
            from fedsim.data.stackoverflow.synthetic import generate

            so_root.mkdir()
            generate(so_root, users=100, per_user=64.0, vocab=12_000, tags=50, seed=0)
        for wl in args.workloads:
            base = [o.format(so_root=so_root) for o in WORKLOADS[wl]] + COMMON + [f"rounds={rounds}"]
            per: dict[str, list[dict]] = {s: [] for s in args.systems}
            exported = Path(tmp) / f"{wl}.pt"
            if any(s in PFL_SYSTEMS for s in args.systems):
                _run(EXPORT, base, str(exported))
            errors: dict[str, str] = {}
            for rep in range(reps):
                for system in args.systems:
                    if system in errors:
                        continue
                    try:
                        res = _run_system(
                            system, base + on_gpu, str(Path(tmp) / f"{wl}-{system}-{rep}"), exported, args.device
                        )
                    except RuntimeError as exc:
                        if not args.keep_going:
                            raise
                        errors[system] = str(exc)[-2000:]
                        print(f"{wl} {system} failed: {errors[system][-300:]}", file=sys.stderr)
                        continue
                    res["load_avg"] = os.getloadavg()[0]
                    per[system].append(res)
            rows += [{"system": s, "workload": wl, "device": args.device, "error": e} for s, e in errors.items()]
            rows += _summarize(wl, {s: r for s, r in per.items() if s not in errors}, args.device)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _print(rows)


if __name__ == "__main__":
    main()
