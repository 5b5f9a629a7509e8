"""Flower's own ``examples/quickstart-pytorch`` app, which nobody here wrote, with MF-DP added by
the few lines its README shows, run the way a Flower user runs it: ``flwr run`` against a
simulation SuperLink with 10 simulated SuperNodes. Its ε must equal ``fedsim privacy`` for the
same settings (``dp.toml`` beside the app states them in fedsim's config format)."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.processes import Processes, flwr_run, free_port, kill_by_env, wait_healthy

from fedsim.privacy.ledger import recompute_epsilon

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "flower-quickstart-pytorch"
BIN = Path(sys.executable).parent


def _changed_lines(name: str) -> int:
    before = (APP / "upstream" / f"{name}.py.orig").read_text().splitlines()
    after = (APP / "pytorchexample" / f"{name}.py").read_text().splitlines()
    return sum(1 for ln in difflib.unified_diff(before, after, lineterm="", n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---")))  # fmt: skip


def test_the_app_gains_mf_dp_with_at_most_five_changed_lines():
    assert _changed_lines("server_app") <= 5
    assert _changed_lines("client_app") <= 3  # the client-side variant's mod: an import and the mods list


def _page_diffs() -> list[list[str]]:
    """The ``diff`` blocks of docs/flower.md, as lists of lines."""
    blocks, current = [], None
    for line in (ROOT / "docs" / "flower.md").read_text().splitlines():
        if line.startswith("```diff"):
            current = []
        elif line.startswith("```") and current is not None:
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_the_docs_page_shows_the_examples_change():
    """docs/flower.md's two diffs are the example's change: each removed line is in Flower's
    file and gone from the example, each added line is in the example (the server diff for
    server_app.py, the mod diff for client_app.py)."""
    diffs = _page_diffs()
    assert len(diffs) == 2
    for name, diff in zip(("server_app", "client_app"), diffs, strict=True):
        before = {ln.strip() for ln in (APP / "upstream" / f"{name}.py.orig").read_text().splitlines()}
        after = {ln.strip() for ln in (APP / "pytorchexample" / f"{name}.py").read_text().splitlines()}
        added = [ln[1:].strip() for ln in diff if ln.startswith("+")]
        removed = [ln[1:].strip() for ln in diff if ln.startswith("-")]
        assert added and all(a in after for a in added), (name, [a for a in added if a not in after])
        assert all(r in before and r not in after for r in removed), (name, removed)


@pytest.fixture
def superlink(tmp_path):
    home = tmp_path / "flwr_home"
    home.mkdir()
    (tmp_path / "logs").mkdir()
    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
        f"options.num-supernodes = 10\n"
    )
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    procs = Processes(env, tmp_path / "logs")
    procs.start(
        "superlink",
        [str(BIN / "flower-superlink"), "--simulation", "--insecure", "--disable-runtime-dependency-installation",
         "--host", "127.0.0.1", "--port", str(port)],
        tmp_path / "link",
    )  # fmt: skip
    wait_healthy(f"http://127.0.0.1:{port}/health", why=procs.log("superlink")[-3000:])
    try:
        yield env, tmp_path
    finally:
        procs.stop_all()
        kill_by_env("FLWR_HOME", str(home))


def _fedsim_privacy() -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "privacy", str(APP / "dp.toml"), "--population", "10", "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.deployment
@pytest.mark.parametrize("clipping", ["server", pytest.param("client", marks=pytest.mark.slow)])
def test_flwr_run_of_the_quickstart_app_with_mf_dp(superlink, clipping):
    env, tmp = superlink
    out = tmp / "dp-run"
    _, log = flwr_run(env, APP, "sim", f'num-server-rounds=6 dp-out="{out}" dp-clipping="{clipping}"', tmp, 600)
    ledger = json.loads((out / "ledger.json").read_text())
    assert [e["round"] for e in ledger["entries"]] == [1, 2, 3, 4, 5, 6]
    assert ledger["spec"]["neighboring_relation"] == "add_or_remove_one"
    expected = _fedsim_privacy()
    assert recompute_epsilon(ledger) == pytest.approx(expected["epsilon"], rel=1e-12)
    assert ledger["spec"]["noise_multiplier"] == pytest.approx(expected["noise_multiplier"], rel=1e-12)
    assert "fedsim user-level DP" in log and "ServerApp-side Evaluate Metrics" in log


@pytest.mark.slow
@pytest.mark.deployment
def test_the_quickstart_app_on_a_tls_deployment(tmp_path):
    """The same app on a Deployment Engine: a TLS SuperLink with SuperNode authentication and
    three registered SuperNodes (``partition-id`` i of 3 in their node config), client-side
    clipping through the mod; the ledger's ε equals ``fedsim privacy``."""
    from e2e.federation import CONN, Federation

    fed = Federation(tmp_path, nodes=3)
    try:
        fed.start_superlink()
        for i in range(3):
            fed.register(i)
            args = fed.node_args(i, tmp_path)
            args[args.index("--node-config") + 1] = f"partition-id={i} num-partitions=3"  # Flower's keys
            fed.procs.start(f"node-{i}", fed.supernode_cmd(args), tmp_path / f"node-{i}")
        fed.wait_online(3)
        out = tmp_path / "dp-run"
        flwr_run(fed.env, APP, CONN, f'num-server-rounds=6 dp-out="{out}" dp-clipping="client"', tmp_path, 900)
    finally:
        fed.close()
    ledger = json.loads((out / "ledger.json").read_text())
    assert [e["round"] for e in ledger["entries"]] == [1, 2, 3, 4, 5, 6]
    assert recompute_epsilon(ledger) == pytest.approx(_fedsim_privacy()["epsilon"], rel=1e-12)
