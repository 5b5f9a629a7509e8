"""A two-node Ray cluster on loopback (two raylets on one machine, via Ray's own
``ray.cluster_utils.Cluster``) runs a short fedsim simulation through ``sim.ray_address``.
Slow (starting two raylets takes a while): ``make test-slow`` or
``pytest -m slow tests/test_ray_cluster.py``."""

from __future__ import annotations

import json

import pytest

from fedsim.config import load_config

BASE = [
    "data.name='synthetic'",
    "data.num_clients=40",
    "model.name='logreg'",
    "rounds=3",
    "sampling.scheme='poisson'",
    "sampling.cohort_size=10",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "eval.every=0",
    "eval.max_users=4",
    "sim.num_workers=2",
]


@pytest.mark.slow
def test_simulation_on_a_two_node_ray_cluster(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    from fedsim.runner import run_experiment

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        cfg = load_config(
            None, BASE + ["sim.engine='ray'", "sim.client_cpus=1", f"sim.ray_address='{cluster.address}'"]
        )
        summary = run_experiment(cfg, tmp_path / "run", progress=False)
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert summary["rounds_completed"] == 3 and all(r["dropped_updates"] == 0 for r in rows)
        ray.init(address=cluster.address)
        assert sum(1 for n in ray.nodes() if n["Alive"]) == 2
        ray.shutdown()
        # The same config on the in-process engine gives the same model: the cluster changed nothing.
        same = run_experiment(load_config(None, BASE + ["sim.engine='inprocess'"]), tmp_path / "local", progress=False)
        assert same["model_sha256"] == summary["model_sha256"]
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_a_sweep_runs_on_a_two_node_ray_cluster(tmp_path):
    """The same sweep spec on a two-node loopback cluster (``fedsim sweep --address``): every trial
    finishes, and a trial gives the same model as on the local Ray."""
    from ray.cluster_utils import Cluster

    from fedsim.runner.sweep import run_sweep

    spec = tmp_path / "spec.toml"
    sets = ", ".join(repr(s).replace("'", '"') if "'" not in s else f'"{s}"' for s in BASE if "num_workers" not in s)
    spec.write_text(
        f"[sweep]\nname = 'cluster'\nset = [{sets}]\nseeds = [0, 1]\n\n[sweep.axes]\n'client.lr' = [0.5, 1.0]\n"
    )
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        remote = run_sweep(spec, tmp_path / "remote", address=cluster.address)
    finally:
        cluster.shutdown()
    assert remote["missing"] == [] and len(remote["trials"]) == 4
    local = run_sweep(spec, tmp_path / "local")
    assert {t["trial"]: t["model_sha256"] for t in remote["trials"]} == {
        t["trial"]: t["model_sha256"] for t in local["trials"]
    }


@pytest.mark.slow
def test_a_plugin_sweep_runs_on_a_ray_cluster_started_without_it(tmp_path):
    """``fedsim sweep --address`` with a config that names a plugin: the cluster's raylets were
    started without ``FEDSIM_PLUGINS``, so the trials import the plugin only because the sweep
    passes it to the Ray job (without that, every trial failed on the unknown model)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from ray.cluster_utils import Cluster

    folder = tmp_path / "mine"
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "plugin", folder)
    (folder / "sweep.toml").write_text(
        '[sweep]\nname = "plugin_cluster"\nconfig = "experiment.toml"\nmetric = "epsilon"\n'
        'seeds = [0, 1]\nset = ["rounds=2", "sim.engine=\'inprocess\'", "sim.num_workers=1"]\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "FEDSIM_PLUGINS"}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        r = subprocess.run(
            [sys.executable, "-m", "fedsim.cli", "sweep", str(folder / "sweep.toml"), "--out", str(tmp_path / "sw"),
             "--address", cluster.address],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        cluster.shutdown()
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert len(result["trials"]) == 2 and result["missing"] == []
