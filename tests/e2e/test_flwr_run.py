"""``flwr run`` as a Flower user runs an app: against a simulation SuperLink started by hand,
with Flower's default number of simulated SuperNodes (2) and with an explicit
``options.num-supernodes``.

This door failed 3 of 3 times before (``KeyError: 'fedsim.privacy.mechanisms'``: the ServerApp
imported fedsim in its own thread while the ClientApp imported it in the main thread), and with
two simulated SuperNodes every user was held by both (simulated nodes carry no ``user-shard``;
their ``partition-id`` now selects one).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.federation import flower_env, remove_ray_tmp
from e2e.processes import Processes, free_port, kill_by_env, wait_healthy
from fedsim.privacy.ledger import recompute_epsilon

pytestmark = pytest.mark.deployment

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SET = "rounds=2;eval.max_users=8;eval.max_examples_per_user=4;client.max_examples=16"


@pytest.fixture
def simulation_superlink(tmp_path):
    env = flower_env(tmp_path)
    home = Path(env["FLWR_HOME"])
    (tmp_path / "logs").mkdir()
    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\ninsecure = true\n\n'
        f'[superlink.sim3]\naddress = "127.0.0.1:{port}"\ninsecure = true\noptions.num-supernodes = 3\n'
    )
    procs = Processes(env, tmp_path / "logs")
    procs.start(
        "superlink",
        [
            str(BIN / "flower-superlink"),
            "--simulation",
            "--insecure",
            "--disable-runtime-dependency-installation",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        tmp_path / "link",
    )
    wait_healthy(f"http://127.0.0.1:{port}/health", why=procs.log("superlink")[-3000:])
    try:
        yield env, tmp_path, procs
    finally:
        procs.stop_all()
        kill_by_env("FLWR_HOME", str(home))  # the ServerApp and simulation processes leave its session
        remove_ray_tmp(env)


def _flwr(env, *args, timeout=600.0):
    return subprocess.run(
        [str(BIN / "flwr"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


# each takes about 34 s on the loaded 2-core machine: the default suite keeps the 2-node run (one
# `flwr run` door per CI), make test-slow runs the 3-node one too
@pytest.mark.parametrize("connection,nodes", [("sim", 2), pytest.param("sim3", 3, marks=pytest.mark.slow)])
def test_flwr_run_against_a_simulation_superlink(simulation_superlink, connection, nodes):
    env, tmp, procs = simulation_superlink
    out = tmp / f"run-{connection}"
    run = _flwr(env, "run", str(ROOT), connection, "--stream", "--run-config", f'set="{SET}" out-dir="{out}"')
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    run_id = re.search(r"Successfully started run (\d+)", log).group(1)
    info = _flwr(env, "ls", connection, "--run-id", run_id, "--format", "json", timeout=60)
    assert json.loads(info.stdout)["runs"][0]["status"] == "finished:completed", log[-6000:]
    assert f"{nodes} SuperNodes" in log  # the header counts the nodes of the census
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["population"] == 848  # every user, held once
    assert summary["engine"] == "deployment"
    assert summary["epsilon"] == pytest.approx(recompute_epsilon(json.loads((out / "ledger.json").read_text())))


@pytest.mark.slow
def test_a_deployed_run_resumes_on_the_deployment_engine_after_a_superlink_kill(simulation_superlink):
    """8 simulated SuperNodes; the SuperLink (and the ServerApp under it) is SIGKILLed once two
    rounds are published; a new SuperLink and ``flwr run … resume=true`` finish the run there, and
    the ledger recomputes to the printed ε. A simulation resume of the folder is refused."""
    env, tmp, procs = simulation_superlink
    home = Path(env["FLWR_HOME"])
    port = re.search(r"127\.0\.0\.1:(\d+)", (home / "config.toml").read_text()).group(1)
    (home / "config.toml").write_text(
        (home / "config.toml").read_text()
        + f'\n[superlink.sim8]\naddress = "127.0.0.1:{port}"\ninsecure = true\noptions.num-supernodes = 8\n'
    )
    out = tmp / "run-resumed"
    first = subprocess.Popen(
        [str(BIN / "flwr"), "run", str(ROOT), "sim8", "--stream", "--run-config",
         f'set="{SET.replace("rounds=2", "rounds=6")}" out-dir="{out}"'],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while not (out / "metrics.jsonl").exists() or len((out / "metrics.jsonl").read_text().splitlines()) < 2:
        assert time.monotonic() < deadline and first.poll() is None, procs.log("superlink")[-3000:]
        time.sleep(0.5)
    procs.stop("superlink", timeout=0.0)  # SIGTERM then SIGKILL to the SuperLink's whole session
    assert kill_by_env("FLWR_HOME", str(home))  # and the ServerApp, which runs outside that session
    first.kill()
    rows_before = len((out / "metrics.jsonl").read_text().splitlines())
    assert rows_before < 6
    # a simulation resume of the deployed folder is refused, and touches nothing
    refused = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "run", "--resume", str(out)], env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "ran on a Deployment Engine" in refused.stderr, refused.stderr
    procs.start(
        "superlink",
        [str(BIN / "flower-superlink"), "--simulation", "--insecure", "--disable-runtime-dependency-installation",
         "--host", "127.0.0.1", "--port", port],
        tmp / "link2",
    )  # fmt: skip
    wait_healthy(f"http://127.0.0.1:{port}/health", why=procs.log("superlink")[-3000:])
    run = _flwr(env, "run", str(ROOT), "sim8", "--stream", "--run-config", f'resume=true out-dir="{out}"')
    log = run.stdout + run.stderr
    started = re.search(r"Successfully started run (\d+)", log)
    assert started, log[-4000:]
    run_id = started.group(1)
    info = _flwr(env, "ls", "sim8", "--run-id", run_id, "--format", "json", timeout=60)
    assert json.loads(info.stdout)["runs"][0]["status"] == "finished:completed", log[-6000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    summary = json.loads((out / "summary.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    assert summary["engine"] == "deployment" and summary["rounds_completed"] == 6
    assert summary["epsilon"] == pytest.approx(recompute_epsilon(ledger), rel=1e-12)
    assert [e["round"] for e in ledger["entries"]] == [1, 2, 3, 4, 5, 6]
