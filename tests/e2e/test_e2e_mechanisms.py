"""A short real simulation (Flower on Ray) for every MF mechanism; ε from dp-accounting."""

from __future__ import annotations

import json
import math

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant

from fedsim.config import load_config

pytestmark = pytest.mark.e2e

BASE = [
    "rounds=4",
    "data.max_users=24",
    "client.max_examples=8",
    "eval.every=0",
    "eval.max_users=4",
    "eval.max_examples_per_user=4",
    "sim.num_workers=2",
    "privacy.noise_multiplier=2.0",
    "sampling.scheme='epochs'",
    "sampling.min_sep=2",
    "sampling.max_participations=2",
    "sampling.assignment='keyed'",  # K̄ = 24/2 = 12 derived; group sizes vary, every user in one group
]


@pytest.mark.parametrize(
    "mechanism,extra",
    [
        ("identity", []),
        ("tree", []),
        ("sqrt", []),
        ("dense", []),
        ("dpmf_plus", ["privacy.tau=2"]),
        ("banded", ["sampling.scheme='min_sep'", "privacy.bands=2"]),
        ("blt", ["privacy.buffers=2"]),
    ],
)
def test_mechanism_runs_three_rounds(tmp_path, mechanism, extra):
    from fedsim.runner import prepare, run_experiment

    cfg = load_config(None, BASE + [f"privacy.mechanism='{mechanism}'"] + extra)
    prep = prepare(cfg)
    summary = run_experiment(cfg, tmp_path / mechanism, progress=False)
    assert summary["rounds_completed"] == 4 and summary["mechanism"] == mechanism
    assert summary["sensitivity"] == pytest.approx(prep.plan.sens)
    assert summary["sensitivity"] >= 1.0 - 1e-9  # k = 2 participations of unit-norm-ish columns
    acc = PLDAccountant()
    acc.compose(dp_event.GaussianDpEvent(2.0))
    rows = [json.loads(x) for x in (tmp_path / mechanism / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for r in rows:  # MF: one Gaussian mechanism for the whole run
        assert r["epsilon"] == pytest.approx(acc.get_epsilon(summary["delta"]), rel=1e-9)
        assert r["dropped_updates"] == 0 and r["accepted_updates"] == r["cohort_size"]
    # each cycle of b = 2 rounds trains every one of the 24 users exactly once (keyed groups)
    assert rows[0]["cohort_size"] + rows[1]["cohort_size"] == 24 == rows[2]["cohort_size"] + rows[3]["cohort_size"]
    assert rows[0]["cohort_size"] == rows[2]["cohort_size"]
    assert math.isfinite(summary["final_eval_accuracy"])
