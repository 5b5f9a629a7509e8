"""Deployment end to end: a real ``flower-superlink`` and three real ``flower-supernode``
processes on 127.0.0.1, TLS on every connection (certificates from ``fedsim deploy certs``),
SuperNode authentication with registered keys, each node with its own Stack Overflow fixture
folder (disjoint users). The fedsim app runs 3 rounds of user-level DP through ``flwr run``;
the run folder and ledger are checked, and ε is compared with a simulation of the same config
on the union of the nodes' data. Then an unregistered node, a plaintext node and a node that
trusts another CA are each refused. Every process is stopped and every port freed in the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from e2e.federation import CONN, ROOT, Federation
from e2e.processes import Processes
from fedsim.data.stackoverflow.synthetic import generate
from fedsim.deploy.certs import make_ca, make_node_key
from fedsim.privacy.ledger import recompute_epsilon

pytestmark = pytest.mark.deployment

NODES = 3
USERS_PER_NODE = 20
#: 3 rounds; tree aggregation (the fixture config's) needs a power of two, so √-factorization noise.
OVERRIDES = "rounds=3;privacy.mechanism='sqrt';eval.max_users=30"


def _wait_refused(procs: Processes, name: str, limit: float = 90.0) -> tuple[int | None, float]:
    p, _ = procs.procs[name]
    t0 = time.monotonic()
    try:
        rc = p.wait(limit)
    except subprocess.TimeoutExpired:
        rc = None
    return rc, time.monotonic() - t0


@pytest.fixture
def federation(tmp_path):
    fed = Federation(tmp_path, nodes=NODES)
    make_node_key(fed.certs, "rogue")  # a well-formed key pair that is never registered
    (tmp_path / "other").mkdir()
    make_ca(tmp_path / "other", common_name="someone else's CA")
    try:
        yield fed
    finally:
        fed.close()


@pytest.mark.slow  # over 30 s in the default suite (CI time); make test-slow runs it
def test_tls_authenticated_federation_runs_fedsim_and_refuses_strangers(federation):
    fed = federation
    env, tmp = fed.env, fed.tmp
    t_start = time.monotonic()
    # Each node holds its own users; the simulation gets their union (identical users and data).
    folders = [
        generate(tmp / "data" / f"node-{i}", users=USERS_PER_NODE, per_user=12, first_id=USERS_PER_NODE * i)
        for i in range(NODES)
    ]
    union = generate(tmp / "data" / "all", users=USERS_PER_NODE * NODES, per_user=12)

    fed.start_superlink()
    # Plaintext HTTP to the SuperLink is not served.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{fed.link_port}/health", timeout=3)

    for i in range(NODES):
        fed.register(i)
    for i in range(NODES):
        fed.start_node(i, folders[i])
    fed.wait_online(NODES, limit=120)

    run_dir = tmp / "deployed-run"
    t_run = time.monotonic()
    _, run_log = fed.run(
        f'config="experiments/stackoverflow_nwp_fixture.toml" '
        f'set="data.root=\'{union}\';{OVERRIDES}" out-dir="{run_dir}" min-nodes={NODES} census-timeout=120'
    )
    run_seconds = time.monotonic() - t_run
    (tmp.parent / "flwr_run_stdout.log").write_text(run_log)

    # The run folder is the simulation's: config, metrics, ledger, summary, checkpoint.
    for name in ("config.toml", "metrics.jsonl", "ledger.json", "summary.json", "checkpoint/checkpoint.pt"):
        assert (run_dir / name).exists(), name
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    # keyed 'single' buckets (docs/algorithms.md §2): sizes vary around K̄ = N/⌈N/8⌉; every sampled user trains
    assert all(r["dropped_updates"] == 0 and r["accepted_updates"] == r["cohort_size"] for r in rows)
    assert sum(r["cohort_size"] for r in rows) > 0
    dep = json.loads((run_dir / "summary.json").read_text())
    assert dep["population"] == USERS_PER_NODE * NODES and dep["rounds_completed"] == 3
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert dep["epsilon"] == pytest.approx(recompute_epsilon(ledger), rel=1e-12)

    # The same config in simulation, on the union of the nodes' data: the same ε.
    sim_dir = tmp / "simulated-run"
    sim = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedsim.cli",
            "run",
            str(ROOT / "experiments/stackoverflow_nwp_fixture.toml"),
            "--set",
            f"data.root='{union}'",
            *[a for o in OVERRIDES.split(";") for a in ("--set", o)],
            "--out",
            str(sim_dir),
            "--quiet",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert sim.returncode == 0, sim.stderr[-3000:]
    simulated = json.loads((sim_dir / "summary.json").read_text())
    assert dep["epsilon"] == simulated["epsilon"] and dep["delta"] == simulated["delta"]
    assert dep["population"] == simulated["population"] and dep["num_parameters"] == simulated["num_parameters"]
    assert json.loads((sim_dir / "ledger.json").read_text())["spec"] == ledger["spec"]
    # Final metrics within the noise: both runs start from the same model (config seed) and
    # differ only in the secret noise/sampling seed; 3 noisy rounds move the loss little.
    d, s = dep["final_eval_metrics"], simulated["final_eval_metrics"]
    assert abs(d["eval_loss"] - s["eval_loss"]) < 0.25, (d, s)
    print(
        f"\ndeployment: flwr run {run_seconds:.1f} s, whole happy path {time.monotonic() - t_start:.1f} s; "
        f"eval_loss deployed {d['eval_loss']:.4f} vs simulated {s['eval_loss']:.4f}; ε {dep['epsilon']:.4f}"
    )

    _check_refusals(fed)


def _check_refusals(fed: Federation) -> None:
    """An unregistered key, a plaintext node and a node that trusts another CA are refused."""
    certs, procs, tmp = fed.certs, fed.procs, fed.tmp
    # Refusals. (a) a node whose key was never registered.
    procs.start(
        "rogue",
        fed.supernode_cmd(
            [
                "--root-certificates",
                str(certs / "ca.pem"),
                "--auth-supernode-private-key",
                str(certs / "rogue"),
                "--max-retries",
                "3",
            ],
        ),
        tmp / "rogue",
    )
    rc, secs = _wait_refused(procs, "rogue")
    assert rc not in (None, 0) and "Failed to activate SuperNode" in procs.log("rogue"), procs.log("rogue")[-2000:]
    procs.stop("rogue")
    # (b) a plaintext node against the TLS SuperLink.
    procs.start("plaintext", fed.supernode_cmd(["--insecure", "--max-retries", "3"]), tmp / "plain")
    rc, secs = _wait_refused(procs, "plaintext")
    assert rc not in (None, 0), procs.log("plaintext")[-2000:]
    assert "Giving up reconnection" in procs.log("plaintext") or "retrying" in procs.log("plaintext")
    procs.stop("plaintext")
    # (c) a node that trusts another CA: the TLS handshake fails.
    procs.start(
        "wrong_ca",
        fed.supernode_cmd(
            [
                "--root-certificates",
                str(tmp / "other" / "ca.pem"),
                "--auth-supernode-private-key",
                str(certs / "node-0"),
                "--max-retries",
                "3",
            ],
        ),
        tmp / "wrong",
    )
    rc, secs = _wait_refused(procs, "wrong_ca")
    assert rc not in (None, 0) and "CERTIFICATE_VERIFY_FAILED" in procs.log("wrong_ca"), procs.log("wrong_ca")[-2000:]
    procs.stop("wrong_ca")
    ls = fed.flwr("supernode", "list", CONN, "--format", "json")
    assert len(json.loads(ls.stdout)["nodes"]) == NODES  # no stranger got in
