"""Two more of Flower's example apps with fedsim's user-level DP, run the way a Flower user runs
them (`flwr run` against a simulation SuperLink with 10 simulated SuperNodes), each with its
data swapped for local synthetic data:

- `examples/flower-advanced-pytorch`: a FedAvg subclass that overrides `start()` (results file,
  best-model checkpoints, a metrics log) and `configure_train` (a learning-rate schedule), wrapped
  where it is built, its save path set through the wrapper afterwards; nodes keep their own
  classification heads; banded MF noise under keyed `min_sep`.
- `examples/flower-tabular`: plain FedAvg, Gaussian noise under Poisson sampling, nodes clipping
  through `user_dp_mod`.

Each run must finish `finished:completed` with a ledger whose ε equals `fedsim privacy` for the
app's `dp.toml`; the advanced app's own `start()` must have written its files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.processes import flwr_run

from fedsim.checkpoint import load_checkpoint
from fedsim.noise_file import NOISE_NAME
from fedsim.privacy.ledger import recompute_epsilon

from .test_quickstart_app import superlink  # noqa: F401  (the simulation SuperLink fixture)

ROOT = Path(__file__).resolve().parents[2]


def _fedsim_privacy(app: Path) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "privacy", str(app / "dp.toml"), "--population", "10", "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _check_ledger(out: Path, app: Path, rounds: int) -> dict:
    ledger = json.loads((out / "ledger.json").read_text())
    assert [e["round"] for e in ledger["entries"]] == list(range(1, rounds + 1))
    expected = _fedsim_privacy(app)
    assert recompute_epsilon(ledger) == pytest.approx(expected["epsilon"], rel=1e-12)
    assert ledger["spec"]["noise_multiplier"] == pytest.approx(expected["noise_multiplier"], rel=1e-12)
    assert ledger["sensitivity_in_c"] == pytest.approx(expected["sensitivity_in_c"], rel=1e-12)
    assert any("N = 10 users is small" in n for n in ledger["notes"])
    return ledger


@pytest.mark.slow
@pytest.mark.deployment
def test_flwr_run_of_the_advanced_app_keeps_its_own_start(superlink):  # noqa: F811
    env, tmp = superlink
    app, out = ROOT / "examples" / "flower-advanced-pytorch", tmp / "dp-run"
    _, log = flwr_run(env, app, "sim", f'num-server-rounds=6 dp-out="{out}"', tmp, 900)
    _check_ledger(out, app, 6)
    # banded noise: the stream's state is written behind the checkpoint, and is on disk at the end
    assert load_checkpoint(out / "checkpoint")["server"]["noise"]["next_round"] == 6
    assert load_checkpoint(out / "checkpoint", NOISE_NAME)["next_round"] == 6
    [results] = list(tmp.rglob("outputs/*/*/results.json"))  # the app's own start() wrote it
    rows = json.loads(results.read_text())
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all("dp-epsilon" in r["train_metrics"] and "accuracy" in r["evaluate_metrics_serverapp"] for r in rows)
    assert len((results.parent / "metrics.jsonl").read_text().splitlines()) == 6
    assert list(results.parent.glob("model_state_acc_*_round_*.pth"))  # its best-model checkpoints
    assert (results.parent / "final_model.pt").exists()
    assert "fedsim user-level DP" in log and "Learning rate halved" in log


@pytest.mark.slow
@pytest.mark.deployment
def test_flwr_run_of_the_tabular_app_with_client_clipping(superlink):  # noqa: F811
    env, tmp = superlink
    app, out = ROOT / "examples" / "flower-tabular", tmp / "dp-run"
    _, log = flwr_run(env, app, "sim", f'num-server-rounds=5 dp-out="{out}"', tmp, 900)
    ledger = _check_ledger(out, app, 5)
    assert ledger["spec"]["scheme"] == "poisson" and ledger["spec"]["mechanism"] == "gaussian"
    assert "fedsim user-level DP" in log


@pytest.mark.parametrize(
    "name,changed", [("flower-advanced-pytorch", 6), ("flower-tabular", 7)], ids=["advanced", "tabular"]
)
def test_each_readme_shows_the_apps_change_for_privacy(name, changed):
    """Every line a README's diffs add is in the app's code, and the diffs change `changed` lines
    in all (the wrapper where the strategy is built, its import, and the tabular app's mod)."""
    app = ROOT / "examples" / name
    code = {ln.strip() for p in app.rglob("*.py") for ln in p.read_text().splitlines()}
    lines, inside = [], False
    for ln in (app / "README.md").read_text().splitlines():
        if ln.startswith("```"):
            inside = ln.startswith("```diff")
        elif inside and ln[:1] in "+-":
            lines.append(ln)
    assert len(lines) == changed
    added = [ln[1:].strip() for ln in lines if ln.startswith("+")]
    assert all(a in code for a in added), [a for a in added if a not in code]
    assert all(ln[1:].strip() not in code for ln in lines if ln.startswith("-"))
