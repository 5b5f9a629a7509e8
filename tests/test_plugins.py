"""Plugins (``plugins = [...]``, ``$FEDSIM_PLUGINS``): the model and dataset of
``examples/plugin/my_parts.py``, defined outside the package, run by the CLI from another folder,
in the processes fedsim starts (Ray workers, Tune trials), in an audit and across a resume; a
plugin that cannot be imported, or registers a name twice, is one line naming it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsim.privacy.ledger import recompute_epsilon

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugin"
FAST = ["--set", "sim.engine='inprocess'", "--set", "sim.num_workers=1"]


def _fedsim(cwd: Path, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "FEDSIM_PLUGINS"}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "fedsim.cli", *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def example(tmp_path):
    """A copy of the plugin example in a folder of its own (the config names ``my_parts.py``
    relative to itself); commands run from another folder."""
    folder = tmp_path / "mine"
    shutil.copytree(EXAMPLE, folder)
    (tmp_path / "elsewhere").mkdir()
    return folder, tmp_path / "elsewhere"


def test_the_cli_runs_a_plugins_model_and_dataset_and_resume_needs_the_plugin(example):
    folder, cwd = example
    priv = _fedsim(cwd, "privacy", str(folder / "experiment.toml"), "--json")
    assert priv.returncode == 0, priv.stderr
    assert json.loads(priv.stdout)["population"] == 40  # the plugin's dataset was loaded
    out = cwd / "run"
    run = _fedsim(cwd, "run", str(folder / "experiment.toml"), "--out", str(out), "--quiet", *FAST, "--set", "rounds=2")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_parameters"] == 12 * 16 + 16 + 16 * 4 + 4  # the plugin's MLP
    assert summary["epsilon"] == pytest.approx(recompute_epsilon(json.loads((out / "ledger.json").read_text())))
    (folder / "my_parts.py").rename(folder / "moved.py")
    refused = _fedsim(cwd, "run", "--resume", str(out), "--force", "rounds", "--set", "rounds=3")
    assert refused.returncode == 2
    assert f"plugin '{folder / 'my_parts.py'}'" in refused.stderr and "no such file" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_a_broken_plugin_and_a_name_registered_twice_are_one_line_errors(example):
    folder, cwd = example
    (folder / "broken.py").write_text("import no_such_module_anywhere\n")
    # other code registering the same names (a byte-identical copy is the same plugin, loaded once)
    (folder / "twice.py").write_text("# a modified copy\n" + (folder / "my_parts.py").read_text())
    for plugin, why in (("broken.py", "No module named 'no_such_module_anywhere'"), ("twice.py", "registered twice")):
        cfg = folder / f"with_{plugin}.toml"
        text = (folder / "experiment.toml").read_text().replace('["my_parts.py"]', f'["my_parts.py", "{plugin}"]')
        cfg.write_text(text)
        r = _fedsim(cwd, "privacy", str(cfg))
        assert r.returncode == 2 and why in r.stderr, r.stderr
        assert f"plugin '{folder / plugin}'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_fedsim_plugins_in_the_environment_registers_for_a_config_without_the_key(example):
    folder, cwd = example
    cfg = folder / "no_key.toml"
    cfg.write_text((folder / "experiment.toml").read_text().replace('plugins = ["my_parts.py"]', ""))
    assert _fedsim(cwd, "privacy", str(cfg)).returncode == 2  # blobs_plugin is unknown without it
    r = _fedsim(cwd, "privacy", str(cfg), "--json", env={"FEDSIM_PLUGINS": str(folder / "my_parts.py")})
    assert r.returncode == 0 and json.loads(r.stdout)["population"] == 40, r.stderr


def _rounds(out: Path) -> int:
    m = out / "metrics.jsonl"
    return len(m.read_text().splitlines()) if m.exists() else 0


@pytest.mark.slow
def test_on_ray_a_killed_plugin_run_resumes_bit_identically(example):
    """Two Ray workers (they import the plugin through ``$FEDSIM_PLUGINS``); SIGKILL after two
    rounds, resume: the final model equals an uninterrupted run's."""
    folder, cwd = example
    sets = ["--set", "rounds=6", "--set", "checkpoint.every=1"]
    straight = cwd / "straight"
    r = _fedsim(cwd, "run", str(folder / "experiment.toml"), "--out", str(straight), "--quiet", *sets)
    assert r.returncode == 0, r.stderr[-3000:]
    out = cwd / "killed"
    p = subprocess.Popen(
        [sys.executable, "-m", "fedsim.cli", "run", str(folder / "experiment.toml"), "--out", str(out), "--quiet", *sets],
        cwd=cwd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while _rounds(out) < 2:
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)
    assert _rounds(out) < 6
    r = _fedsim(cwd, "run", "--resume", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = (json.loads((d / "summary.json").read_text()) for d in (straight, out))
    assert a["model_sha256"] == b["model_sha256"]


@pytest.mark.slow
def test_a_plugin_in_a_sweep_trial_and_an_audit(example):
    folder, cwd = example
    spec = folder / "sweep.toml"
    spec.write_text(
        '[sweep]\nname = "plugin_sweep"\nconfig = "experiment.toml"\nmetric = "final_eval_accuracy"\n'
        'seeds = [0]\nset = ["rounds=2", "sim.engine=\'inprocess\'", "sim.num_workers=1"]\n'
        '[[sweep.arms]]\nname = "only"\nset = []\n'
    )
    r = _fedsim(cwd, "sweep", str(spec), "--out", str(cwd / "sweep"))
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((cwd / "sweep" / "sweep.json").read_text())
    assert len(result["trials"]) == 1 and not result["missing"]
    r = _fedsim(cwd, "audit", str(folder / "experiment.toml"), "--out", str(cwd / "audit"), "--canaries", "20",
                "--json", *FAST, "--set", "rounds=2")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["num_canaries"] == 20


_REQUIRE = r"""
import json, shutil, sys
from pathlib import Path
from fedsim import FedsimError, plugins
src, tmp = Path(sys.argv[1]), Path(sys.argv[2])
elsewhere = tmp / "elsewhere.py"
shutil.copy(src, elsewhere)
items = plugins.manifest([str(src)])
out = {"sha": items[0]["sha256"]}
plugins.load([str(elsewhere)], "the test")  # the same contents at another path
src.rename(tmp / "gone.py")  # the server's path does not exist here
plugins.require(items, "this SuperNode")  # satisfied by the copy: no second registration
out["same_contents"] = "ok"
for case, manifest in {
    "missing": [{"spec": str(tmp / "nowhere" / "x.py"), "sha256": "0" * 64}],
    "changed": [{"spec": str(tmp / "gone.py"), "sha256": "0" * 64}],
    "module": [{"spec": "no_such_plugin_module", "sha256": ""}],
}.items():
    try:
        plugins.require(manifest, "this SuperNode")
        out[case] = "loaded"
    except FedsimError as e:
        out[case] = str(e)
import fedsim.config  # the schema is built: a new plugin can no longer register
other = tmp / "late.py"
other.write_text((tmp / "gone.py").read_text().replace("_plugin", "_late"))
try:
    plugins.load([str(other)], "a config")
except FedsimError as e:
    out["late"] = str(e)
print(json.dumps(out))
"""


def test_a_node_loads_the_runs_plugins_or_says_how_to_provide_them(example, tmp_path):
    """:func:`fedsim.plugins.require`, on a node: the same file contents at another path are the
    same plugin; a missing file, a different file, an unimportable module and a plugin loaded after
    the schema was built are one-line errors that say how to provide it."""
    folder, _ = example
    env = {k: v for k, v in os.environ.items() if k != "FEDSIM_PLUGINS"}
    run = subprocess.run(
        [sys.executable, "-c", _REQUIRE, str(folder / "my_parts.py"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(out["sha"]) == 64 and out["same_contents"] == "ok"
    assert "is not on this SuperNode" in out["missing"] and "FEDSIM_PLUGINS" in out["missing"]
    assert "SHA-256 differs" in out["changed"]
    assert "'no_such_plugin_module'" in out["module"] and "failed to import" in out["module"]
    assert "was not loaded when this process started" in out["late"] and "FEDSIM_PLUGINS" in out["late"]
    for message in (out["missing"], out["changed"], out["module"], out["late"]):
        assert len(message.splitlines()) == 1


def test_a_shipped_experiment_named_by_name_loads_its_plugin(tmp_path):
    """``fedsim privacy paper_blobs`` (a shipped config whose plugin sits beside it) from another
    folder, and a shipped sweep named by name: the plugin is read from the file the name resolves
    to before the schema is built (it was skipped, and the run refused the late plugin)."""
    r = _fedsim(tmp_path, "privacy", "paper_blobs", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["population"] == 10000
    code = "from fedsim import plugins; plugins.of_sweep('sweeps/paper_doppler'); print(sorted(plugins.LOADED))"
    env = {k: v for k, v in os.environ.items() if k != "FEDSIM_PLUGINS"}
    s = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert s.returncode == 0 and "paper_parts.py" in s.stdout, s.stderr[-2000:]
