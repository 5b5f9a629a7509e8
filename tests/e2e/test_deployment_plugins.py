"""A plugin's model and dataset in deployment, on real SuperLink and SuperNode processes.

The ServerApp loads the plugin from ``$FEDSIM_PLUGINS`` (set for the SuperLink, which starts it);
the census and every task carry the run's plugin manifest, so each SuperNode loads the plugin
before it builds the data and the model: node 0 from the path the server recorded (its
environment names no plugin), node 1 from a copy at another path that its ``$FEDSIM_PLUGINS``
names (the same file contents, so the same plugin)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from e2e.federation import Federation
from fedsim.privacy.ledger import recompute_epsilon

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugin"


@pytest.mark.slow
def test_supernodes_load_the_runs_plugin_and_train_its_model(tmp_path):
    server_copy, node_copy = tmp_path / "server-side", tmp_path / "node-1-side"
    shutil.copytree(EXAMPLE, server_copy)
    shutil.copytree(EXAMPLE, node_copy)
    plugin = server_copy / "my_parts.py"
    fed = Federation(tmp_path / "fed", nodes=2)
    try:
        fed.env["FEDSIM_PLUGINS"] = str(plugin)  # the SuperLink's environment, which its ServerApp inherits
        fed.start_superlink()
        nodes_env = {0: {"FEDSIM_PLUGINS": ""}, 1: {"FEDSIM_PLUGINS": str(node_copy / "my_parts.py")}}
        for i in (0, 1):
            fed.register(i)
            fed.start_node(i, tmp_path / "unused", node_config=f'user-shard="{i}/2"', env=nodes_env[i])
        fed.wait_online(2)
        out = tmp_path / "run"
        run_config = f'config="{server_copy / "experiment.toml"}" set="rounds=2" out-dir="{out}"'
        fed.run(run_config, timeout=600)
    finally:
        fed.close()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_parameters"] == 12 * 16 + 16 + 16 * 4 + 4  # the plugin's MLP, trained on the nodes
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:  # every node trains and evaluates: none fails to read the plugin's data spec
        assert r["dropped_replies"] == 0 and r["accepted_updates"] == r["cohort_size"], r
        assert r.get("eval_failed_replies", 0) == 0, r
    assert summary["epsilon"] == pytest.approx(recompute_epsilon(json.loads((out / "ledger.json").read_text())))
