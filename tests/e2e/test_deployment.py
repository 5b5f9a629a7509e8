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
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from e2e.processes import Processes
from e2e.processes import free_port as _free_port
from e2e.processes import port_free as _port_free
from fedsim.data.stackoverflow.synthetic import generate
from fedsim.deploy.certs import make_all, make_ca, make_node_key
from fedsim.privacy.ledger import recompute_epsilon

pytestmark = pytest.mark.deployment

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONN = "fedsim-test"
NODES = 3
USERS_PER_NODE = 20
#: 3 rounds; tree aggregation (the fixture config's) needs a power of two, so √-factorization noise.
OVERRIDES = "rounds=3;privacy.mechanism='sqrt';eval.max_users=30"


def _flwr(env: dict[str, str], *args: str, timeout: float = 120.0, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "flwr"), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


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
    certs = tmp_path / "certs"
    make_all(certs, ["localhost", "127.0.0.1"], nodes=NODES)
    make_node_key(certs, "rogue")  # a well-formed key pair that is never registered
    (tmp_path / "other").mkdir()
    make_ca(tmp_path / "other", common_name="someone else's CA")
    home = tmp_path / "flwr_home"
    home.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "FEDSIM_CACHE": str(tmp_path / "cache"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    link_port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONN}"\n\n[superlink.{CONN}]\n'
        f'address = "127.0.0.1:{link_port}"\nroot-certificates = "{certs / "ca.pem"}"\n'
    )
    procs = Processes(env, logs)
    node_ports = [_free_port() for _ in range(NODES + 3)]
    state = {
        "certs": certs,
        "env": env,
        "procs": procs,
        "link_port": link_port,
        "node_ports": node_ports,
        "tmp": tmp_path,
    }
    try:
        yield state
    finally:
        procs.stop_all()
        for port in [link_port] + node_ports:
            deadline = time.monotonic() + 20
            while not _port_free(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _port_free(port), f"port {port} still in use after shutdown"


def _supernode_cmd(state: dict, port: int, extra: list[str]) -> list[str]:
    return [
        str(BIN / "flower-supernode"),
        "--superlink",
        f"127.0.0.1:{state['link_port']}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]


def test_tls_authenticated_federation_runs_fedsim_and_refuses_strangers(federation):
    st = federation
    certs, env, procs, tmp = st["certs"], st["env"], st["procs"], st["tmp"]
    t_start = time.monotonic()
    # Each node holds its own users; the simulation gets their union (identical users and data).
    folders = [
        generate(tmp / "data" / f"node-{i}", users=USERS_PER_NODE, per_user=12, first_id=USERS_PER_NODE * i)
        for i in range(NODES)
    ]
    union = generate(tmp / "data" / "all", users=USERS_PER_NODE * NODES, per_user=12)

    procs.start(
        "superlink",
        [
            str(BIN / "flower-superlink"),
            "--ssl-ca-certfile",
            str(certs / "ca.pem"),
            "--ssl-certfile",
            str(certs / "server.pem"),
            "--ssl-keyfile",
            str(certs / "server.key"),
            "--enable-supernode-auth",
            "--disable-runtime-dependency-installation",
            "--isolation",
            "subprocess",
            "--host",
            "127.0.0.1",
            "--port",
            str(st["link_port"]),
        ],
        tmp / "link",
    )
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{st['link_port']}/health", context=ctx, timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, procs.log("superlink")[-3000:]
        time.sleep(0.3)
    # Plaintext HTTP to the SuperLink is not served.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{st['link_port']}/health", timeout=3)

    for i in range(NODES):
        reg = _flwr(env, "supernode", "register", str(certs / f"node-{i}.pub"), CONN, "--format", "json")
        assert reg.returncode == 0 and json.loads(reg.stdout)["success"], reg.stdout + reg.stderr
    for i in range(NODES):
        procs.start(
            f"node-{i}",
            _supernode_cmd(
                st,
                st["node_ports"][i],
                [
                    "--root-certificates",
                    str(certs / "ca.pem"),
                    "--auth-supernode-private-key",
                    str(certs / f"node-{i}"),
                    "--node-config",
                    f'data-root="{folders[i]}"',
                    "--ssl-certfile",
                    str(certs / f"node-{i}-tls.pem"),
                    "--ssl-keyfile",
                    str(certs / f"node-{i}-tls.key"),
                    "--ssl-ca-certfile",
                    str(certs / "ca.pem"),
                    "--max-retries",
                    "10",
                ],
            ),
            tmp / f"node-{i}",
        )
    deadline = time.monotonic() + 120
    while True:
        ls = _flwr(env, "supernode", "list", CONN, "--format", "json")
        online = [n for n in json.loads(ls.stdout)["nodes"] if n["status"] == "online"] if ls.returncode == 0 else []
        if len(online) == NODES:
            break
        assert time.monotonic() < deadline, f"{ls.stdout}\n{procs.log('node-0')[-2000:]}"
        time.sleep(1)

    run_dir = tmp / "deployed-run"
    t_run = time.monotonic()
    run = _flwr(
        env,
        "run",
        str(ROOT),
        CONN,
        "--stream",
        "--run-config",
        f'config="experiments/stackoverflow_nwp_fixture.toml" '
        f'set="data.root=\'{union}\';{OVERRIDES}" out-dir="{run_dir}" min-nodes={NODES} census-timeout=120',
        timeout=900,
    )
    run_seconds = time.monotonic() - t_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_id = re.search(r"Successfully started run (\d+)", run.stdout + run.stderr).group(1)
    info = _flwr(env, "ls", CONN, "--run-id", run_id, "--format", "json")
    status = json.loads(info.stdout)["runs"][0]["status"]
    (tmp.parent / "flwr_run_stdout.log").write_text(run.stdout + run.stderr)
    assert status == "finished:completed", run.stdout[-6000:]

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

    # Refusals. (a) a node whose key was never registered.
    spare = st["node_ports"][NODES:]
    procs.start(
        "rogue",
        _supernode_cmd(
            st,
            spare[0],
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
    procs.start("plaintext", _supernode_cmd(st, spare[1], ["--insecure", "--max-retries", "3"]), tmp / "plain")
    rc, secs = _wait_refused(procs, "plaintext")
    assert rc not in (None, 0), procs.log("plaintext")[-2000:]
    assert "Giving up reconnection" in procs.log("plaintext") or "retrying" in procs.log("plaintext")
    procs.stop("plaintext")
    # (c) a node that trusts another CA: the TLS handshake fails.
    procs.start(
        "wrong_ca",
        _supernode_cmd(
            st,
            spare[2],
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
    ls = _flwr(env, "supernode", "list", CONN, "--format", "json")
    assert len(json.loads(ls.stdout)["nodes"]) == NODES  # no stranger got in
