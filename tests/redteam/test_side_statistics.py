"""Red team, finding 7: side statistics (exact cohort sizes, clipped fraction, train loss,
evaluation on users' data) were published outside ε without a word. Now every run says so, and
``privacy.publish_side_statistics = false`` publishes only DP outputs and configured constants."""

from __future__ import annotations

import json

from fedsim.config import load_config
from fedsim.reporting.metrics import SIDE_STATISTICS, is_side_statistic

SMALL = [
    "rounds=2",
    "sampling.scheme='poisson'",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "sampling.cohort_size=4",
    "data.max_users=24",
    "client.max_examples=4",
    "eval.every=1",
    "eval.max_users=4",
    "eval.max_examples_per_user=2",
    "sim.num_workers=1",
    "sim.engine='inprocess'",
]

#: What may be published without the switch: DP outputs (ε, c_t from the noisy count) and constants.
PUBLIC_ROW_KEYS = {
    "round",
    "epsilon",
    "seconds",
    "clip_norm",
    "client_evaluations_per_user",
    "unclipped_fraction_noisy",
}


def _run(tmp_path, capsys, extra):
    from fedsim.runner import run_experiment

    out = tmp_path / "run"
    summary = run_experiment(load_config(None, SMALL + extra), out, progress=True)
    printed = capsys.readouterr()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    ledger = json.loads((out / "ledger.json").read_text())
    return summary, rows, ledger, printed.out + printed.err


def test_default_runs_publish_side_statistics_and_say_they_are_outside_epsilon(tmp_path, capsys):
    summary, rows, ledger, printed = _run(tmp_path, capsys, [])
    assert summary["side_statistics"] == {
        "published": True,
        "covered_by_epsilon": False,
        "note": summary["side_statistics"]["note"],
    }
    assert "not covered by ε" in printed and "not covered by ε" in summary["side_statistics"]["note"]
    assert {"train_loss", "cohort_size", "clipped_fraction", "eval_accuracy"} <= set(rows[-1])
    assert all("cohort" in e for e in ledger["entries"])


def test_unpublished_side_statistics_leave_only_dp_outputs(tmp_path, capsys):
    summary, rows, ledger, printed = _run(tmp_path, capsys, ["privacy.publish_side_statistics=false"])
    for row in rows:
        assert set(row) <= PUBLIC_ROW_KEYS, set(row) - PUBLIC_ROW_KEYS
        assert not any(is_side_statistic(k) for k in row)
    assert all(set(e) == {"round", "epsilon"} for e in ledger["entries"])
    for key in ("final_eval_accuracy", "final_eval_metrics", "majority_baseline_accuracy", "examples_per_user"):
        assert summary[key] is None
    assert summary["side_statistics"]["published"] is False
    assert "train loss" not in printed and "eval acc" not in printed and "ε" in printed
    assert summary["rounds_completed"] == 2 and summary["epsilon"] != "inf"
    assert {"train_loss", "cohort_size", "accepted_updates"} <= set(SIDE_STATISTICS)
