"""Peak memory and wall time of a deployed fedsim run on one machine: a real ``flower-superlink``
(TLS, SuperNode authentication) and ``--nodes`` real ``flower-supernode``s, each with its own
generated Stack Overflow folder, through ``flwr run`` (the federation of ``tests/e2e/federation.py``).

Every 0.5 s it sums, over every process whose environment carries this federation's
``FLWR_HOME`` (SuperLink, ServerApp, SuperNodes, SuperExecs, ClientApp processes, the ``flwr``
CLI), the resident set size (``VmRSS``; shared library pages are counted once per process) and
the proportional set size (``Pss`` from ``smaps_rollup``; shared pages divided among their
users, so the sum is what the machine holds). It also counts the ClientApp processes started
and the largest one.

``--isolation subprocess`` (Flower's default): each SuperNode starts its own SuperExec, which starts
a ClientApp process per message. ``--isolation process``: the SuperNode starts none; a
``flower-superexec --runtime-api-address`` per node is started next to it (the
``superexec`` image's role), over TLS to the node's Runtime API.

``--repeat R`` runs ``flwr run`` R times on the same federation and counts the runs Flower reports
``finished:completed`` (the run folders are checked for ``summary.json``).

Usage::

    python benchmarks/deploy_memory.py --nodes 16 --rounds 6 --isolation subprocess
    python benchmarks/deploy_memory.py --nodes 16 --rounds 6 --isolation process
    python benchmarks/deploy_memory.py --nodes 3 --rounds 2 --repeat 5      # flwr run, 5 times

Results are appended to ``benchmarks/deploy_memory_results.json`` (``--no-save`` to skip).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from e2e.federation import CONN, Federation  # noqa: E402

from fedsim.data.stackoverflow.synthetic import generate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "deploy_memory_results.json"


def _kib(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


class Sampler:
    """Sums RSS and PSS of the processes whose environment has ``FLWR_HOME=home``, every ``every`` s."""

    def __init__(self, home: str, every: float = 0.5) -> None:
        self.wanted, self.every = f"FLWR_HOME={home}".encode(), every
        self.peak_rss = self.peak_pss = self.peak_procs = self.max_clientapp_rss = 0
        self.clientapps: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        rss = pss = n = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if self.wanted not in (entry / "environ").read_bytes().split(b"\0"):
                    continue
                r = _kib(entry / "status", "VmRSS:")
                pss += _kib(entry / "smaps_rollup", "Pss:")
                if b"flwr-clientapp" in (entry / "cmdline").read_bytes():
                    self.clientapps.add(int(entry.name))
                    self.max_clientapp_rss = max(self.max_clientapp_rss, r)
            except OSError:
                continue
            rss += r
            n += 1
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, n)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def stop(self) -> dict[str, float | int]:
        self._stop.set()
        self._thread.join()
        return {
            "peak_rss_gib": round(self.peak_rss / 2**20, 2),
            "peak_pss_gib": round(self.peak_pss / 2**20, 2),
            "peak_processes": self.peak_procs,
            "clientapp_processes": len(self.clientapps),
            "max_clientapp_rss_mib": round(self.max_clientapp_rss / 1024),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--users-per-node", type=int, default=8)
    ap.add_argument("--isolation", choices=("subprocess", "process"), default="subprocess")
    ap.add_argument("--repeat", type=int, default=1, help="flwr run this many times on the same federation")
    ap.add_argument("--label", default="", help="a note stored with the result (e.g. the commit or change)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fedsim-deploy-mem-"))
    fed = Federation(tmp, nodes=args.nodes)
    u = args.users_per_node
    roots = [generate(tmp / "data" / f"node-{i}", users=u, per_user=30, first_id=u * i) for i in range(args.nodes)]
    cohort = max(1, min(16, u * args.nodes // args.rounds))  # 'single' buckets: one per round at least
    overrides = (
        f"data.root='{roots[0]}';rounds={args.rounds};privacy.mechanism='sqrt';sampling.cohort_size={cohort};"
        "eval.max_users=16;eval.max_examples_per_user=4;client.max_examples=16"
    )
    result: dict = {"nodes": args.nodes, "rounds": args.rounds, "users": u * args.nodes, "isolation": args.isolation}
    runs = []
    try:
        t0 = time.monotonic()
        fed.start_superlink()
        for i in range(args.nodes):
            fed.register(i)
            fed.start_node(i, roots[i], isolation=args.isolation)
        fed.wait_online(args.nodes, limit=600)
        result["federation_start_s"] = round(time.monotonic() - t0, 1)
        for k in range(args.repeat):
            out = tmp / f"run-{k}"
            sampler = Sampler(fed.env["FLWR_HOME"])
            t = time.monotonic()
            conf = f'config="experiments/stackoverflow_nwp_fixture.toml" set="{overrides}" out-dir="{out}"'
            run = fed.flwr(
                "run", str(ROOT), CONN, "--stream", "--run-config", f"{conf} min-nodes={args.nodes}", timeout=3600
            )
            wall = time.monotonic() - t
            log = run.stdout + run.stderr
            started = re.search(r"Successfully started run (\d+)", log)
            status = fed.status(started.group(1)) if started else f"not started (exit {run.returncode})"
            done = status == "finished:completed" and (out / "summary.json").exists()
            runs.append({"wall_s": round(wall, 1), "status": status, "completed": done, **sampler.stop()})
            print(json.dumps(runs[-1]), flush=True)
            if not done:
                (tmp / f"run-{k}.log").write_text(log)
    finally:
        fed.close()
    result.update(
        runs=runs,
        completed=sum(r["completed"] for r in runs),
        label=args.label,
        machine=f"{platform.node()} {os.cpu_count()} CPUs",
        when=time.strftime("%Y-%m-%d %H:%M"),
        tmp=str(tmp),
    )
    print(json.dumps(result, indent=1))
    if not args.no_save:
        old = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
        RESULTS.write_text(json.dumps(old + [result], indent=1) + "\n")


if __name__ == "__main__":
    main()
