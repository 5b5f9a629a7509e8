"""experiments/so_lstm_regime.py: the GPU regime's driver (issue 38) picks each arm's lr on the
tuning seed only, pairs the arms on the evaluation seeds, and runs end to end on the CPU."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from helpers import experiment_script
from scipy import stats


@pytest.fixture(scope="module")
def regime():
    return experiment_script("so_lstm_regime")


def _row(fam: str, lr: float, seed: int, loss: float, rc: int = 0) -> dict:
    return {"family": fam, "lr": lr, "seed": seed, "loss": loss, "acc": 0.1, "rc": rc, "epsilon": 8.0, "delta": 1e-4}


def test_chosen_lr_is_the_tuning_seeds_best_and_a_failed_or_diverged_trial_never_wins(regime):
    lrs = regime.FAMILIES["dpsgd"][1]
    rows = [_row("dpsgd", lrs[0], 0, 8.6), _row("dpsgd", lrs[1], 0, 8.5), _row("dpsgd", lrs[2], 0, math.nan)]
    rows.append({"family": "dpsgd", "lr": lrs[3], "seed": 0, "rc": 1})  # crashed: no loss
    rows.append(_row("dpsgd", lrs[0], 1, 1.0))  # an evaluation seed never tunes
    assert regime.chosen_lrs(rows) == {"dpsgd": lrs[1]}
    # a family whose every trial failed has no lr, so stage 2 skips it
    assert "adam" not in regime.chosen_lrs([{"family": "adam", "lr": 0.01, "seed": 0, "rc": 1}])


def test_table_pairs_the_evaluation_seeds_with_an_independent_t_interval(regime, tmp_path, capsys):
    base_lr, treat_lr = regime.FAMILIES["adam"][1][1], regime.FAMILIES["adambc"][1][0]
    deltas = [-0.011, -0.008, -0.013, -0.009, -0.012]
    rows = [_row("adam", lr, 0, 8.6 + 0.1 * i) for i, lr in enumerate(regime.FAMILIES["adam"][1])]
    rows[1]["loss"] = 8.4  # base_lr wins on seed 0
    rows += [_row("adambc", lr, 0, 8.7 - 0.1 * (lr == treat_lr)) for lr in regime.FAMILIES["adambc"][1]]
    for s, d in enumerate(deltas, start=1):
        rows += [_row("adam", base_lr, s, 8.5 + 0.01 * s), _row("adambc", treat_lr, s, 8.5 + 0.01 * s + d)]
    rows.append({"family": "adam", "lr": base_lr, "seed": 9, "rc": -9, "error": "killed at the deadline"})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    regime.main(["table", str(tmp_path), "--json", str(tmp_path / "t.json")])
    report = json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))
    (c,) = [c for c in report["comparisons"] if c["treatment"] == "adambc"]
    assert c["lr"] == {"adam": base_lr, "adambc": treat_lr}
    assert c["eval_seeds"] == [1, 2, 3, 4, 5]  # the tuning seed and the killed trial are out
    mean, sd = statistics.fmean(deltas), statistics.stdev(deltas)
    half = stats.t.ppf(0.975, len(deltas) - 1) * sd / math.sqrt(len(deltas))
    assert c["loss"]["mean"] == pytest.approx(mean, abs=1e-12)
    assert (c["loss"]["low"], c["loss"]["high"]) == pytest.approx((mean - half, mean + half), abs=1e-12)
    assert c["verdict"] == "reproduced"
    assert "| DP-AdamBC (002)" in capsys.readouterr().out


@pytest.mark.slow
def test_the_driver_runs_both_stages_on_the_cpu(regime, tmp_path: Path):
    """Two arms, one round each, the small LSTM: stage 1 over each grid on seed 0, stage 2 at the
    chosen lrs on seeds 1 and 2, every trial a `fedsim run` process with its own ε."""
    out = tmp_path / "out"
    regime.main(
        ["run", "--out", str(out), "--data", str(tmp_path / "so"), "--users", "120", "--device", "cpu"]
        + ["--parallel", "2", "--eval-seeds", "1", "2", "--families", "dpsgd", "adambc"]
        + ["--set", "rounds=1", "--set", "model.name='so_nwp_lstm_small'", "--set", "sampling.min_sep=10"]
    )
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all(r["rc"] == 0 and math.isfinite(r["loss"]) for r in rows), rows
    assert (
        sorted((r["stage"], r["family"]) for r in rows if r["stage"] == 2) == [(2, "adambc")] * 2 + [(2, "dpsgd")] * 2
    )
    assert len([r for r in rows if r["stage"] == 1]) == len(regime.FAMILIES["dpsgd"][1]) + len(
        regime.FAMILIES["adambc"][1]
    )
    chosen = json.loads((out / "driver.json").read_text(encoding="utf-8"))["chosen_lr"]
    assert {r["lr"] for r in rows if r["stage"] == 2 and r["family"] == "dpsgd"} == {chosen["dpsgd"]}
    assert len({round(r["epsilon"], 6) for r in rows}) == 1  # the server step does not change ε
