"""The built wheel, as a new user installs it: a fresh venv (torch pinned first, then the wheel
with the lock file's versions), and ``fedsim`` run from a folder outside the repository on the
shipped experiments. Before, ``fedsim run`` and ``fedsim privacy`` failed there ("config file not
found: …/site-packages/experiments/shakespeare_default.toml") and the wheel put generic
``clients`` and ``strategies`` packages at the top of site-packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"


def _run(cmd, cwd, env=None, timeout=900):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_the_wheel_runs_fedsim_outside_the_repository(tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)], ROOT)
    (wheel,) = dist.glob("fedsim-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"fedsim"}, tops
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"fedsim/experiments/shakespeare_default.toml", "fedsim/clients/client_app.py"} <= names
    # a shipped config's plugin ships beside it (paper_blobs.toml names paper_parts.py)
    assert {"fedsim/experiments/paper_blobs.toml", "fedsim/experiments/paper_parts.py"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, TORCH], tmp_path)
    _run(
        [*pip, "-c", str(ROOT / "requirements/lock.txt"), "-c", str(ROOT / "requirements/torch.txt"), str(wheel)],
        tmp_path,
    )

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {
        "PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
    }
    fedsim = str(venv / "bin" / "fedsim")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _run([fedsim, "--version"], work, env).strip() == f"fedsim {version}"
    listed = json.loads(_run([fedsim, "experiments", "--json"], work, env))
    assert "shakespeare_default" in {e["name"] for e in listed} and "sweeps/filter_ablation" in {
        e["name"] for e in listed
    }
    site = next((venv / "lib").glob("python3.*/site-packages"))
    assert not (site / "clients").exists() and not (site / "strategies").exists()

    privacy = json.loads(_run([fedsim, "privacy", "--json"], work, env))
    assert privacy["population"] == 848 and privacy["epsilon"] <= 8.0
    banded = json.loads(_run([fedsim, "privacy", "shakespeare_banded", "--json"], work, env))
    assert banded["mechanism"] == "banded"
    paper = json.loads(_run([fedsim, "privacy", "paper_blobs", "--json"], work, env))  # its plugin, from the wheel
    assert paper["population"] == 10000
    sets = ["rounds=2", "data.max_users=60", "sampling.min_sep=2", "eval.max_users=6", "sim.num_workers=1"]
    _run([fedsim, "run", "--out", "run", *[a for s in sets for a in ("--set", s)]], work, env)
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["population"] == 60
    _run([fedsim, "deploy", "certs", "--out", "certs", "--host", "localhost", "--nodes", "1"], work, env)
    assert (work / "certs" / "ca.pem").exists()

    # the Flower wrapper from the wheel, in a user's own script: out= writes checkpoint.pt before
    # each model leaves and noise.pt (BLT's state) behind it; a resume continues the run
    (work / "my_app.py").write_text(WRAPPER_SCRIPT)
    _run([str(venv / "bin" / "python"), "my_app.py"], work, env)
    assert json.loads((work / "dp-run" / "ledger.json").read_text())["entries"][-1]["round"] == 3
    assert (work / "dp-run" / "checkpoint" / "noise.pt").exists()


WRAPPER_SCRIPT = """
import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fedsim.flower import UserLevelDP, user_dp_mod
from fedsim.runner.inprocess import InProcessGrid, task_identity

app = ClientApp(mods=[user_dp_mod])


@app.train()
def train(msg, context):
    w = msg.content["arrays"]["w"].numpy() + 0.1
    content = RecordDict({"arrays": ArrayRecord({"w": Array(w)}), "metrics": MetricRecord({"num-examples": 1})})
    return Message(content, reply_to=msg)


def wrapper(resume):
    return UserLevelDP(FedAvg(fraction_evaluate=0.0), rounds=3, population=8, key=1, out="dp-run", resume=resume,
                       privacy={"mechanism": "blt", "noise_multiplier": 1.0},
                       sampling={"scheme": "min_sep", "min_sep": 2})


with task_identity():
    first = wrapper(False)
    first.start(InProcessGrid(app, 4), ArrayRecord({"w": Array(np.zeros(16, np.float32))}), num_rounds=2)
    again = wrapper(True)
    assert again.rounds_done == 2
    again.start(InProcessGrid(app, 4), again.resume_arrays(), num_rounds=1)
"""
