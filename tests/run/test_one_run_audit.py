"""The one-run audit on real (in-process) runs: `fedsim.runner.audit.run_one_run_audit` and
`fedsim audit --attack one-run`. Canaries are included by keyed coins, excluded ones never take
part, the every-model statistic's decorrelation is the right one for MF noise (simulated, closed
form), and a server that adds a tenth of the accounted noise is caught."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import experiment_script

from fedsim.attacks.one_run import every_release_scores, one_run_bound, whitening
from fedsim.attacks.stats import roc_auc
from fedsim.config import load_config
from fedsim.runner.audit import OneRunCanaries, inclusion_bits, run_one_run_audit

# the goals table's small Shakespeare run (experiments/one_run_audit.py), 4 rounds instead of 10
BASE = [*experiment_script("one_run_audit").BASE, "rounds=4"]
EPOCHS = ["sampling.scheme='epochs'", "sampling.min_sep=1", "sampling.max_participations=4"]


def test_inclusion_is_keyed_and_fair():
    a, b = inclusion_bits(11, 4000), inclusion_bits(11, 4000)
    assert (a == b).all() and not (a == inclusion_bits(12, 4000)).all()
    assert abs(a.mean() - 0.5) < 4 * 0.5 / math.sqrt(4000)
    c = OneRunCanaries(50, 11)
    assert c.count == int(inclusion_bits(11, 50).sum()) and (c.index == np.flatnonzero(c.included)).all()


# --------------------------------------------------------------------------- the statistic
def _mf_releases(rng, C, m, inc, sigma, groups):
    """Projections of T noisy sums along m canary directions: canary k (group k mod groups)
    adds 1 in its group's rounds when included; the noise is σ·C⁻¹Z (independent across k)."""
    t = C.shape[0]
    M = np.linalg.inv(C)
    signal = np.zeros((m, t))
    for k in np.flatnonzero(inc):
        signal[k, (k % groups) :: groups] = 1.0
    return signal + sigma * rng.normal(size=(m, t)) @ M.T


def test_decorrelated_statistic_beats_raw_under_mf_noise():
    """Under correlated noise σ·C⁻¹Z, whitening by C is the likelihood ratio; treating the rounds
    as independent (raw) loses power. With C = I both statistics coincide."""
    rng = np.random.default_rng(0)
    t, groups, m = 12, 3, 4000
    # a banded lower-triangular C (decaying correlation), like the MF strategies
    C = np.eye(t) + np.diag(np.full(t - 1, 0.6), -1) + np.diag(np.full(t - 2, 0.3), -2)
    inc = rng.random(m) < 0.5
    sigma = 1.5
    proj = _mf_releases(rng, C, m, inc, sigma, groups)
    clip = np.ones(t)
    dec = every_release_scores(proj, clip, whitening(np.full(t, sigma), C), groups=groups)
    rv = (np.linalg.inv(C) ** 2).sum(axis=1)
    raw = every_release_scores(proj, clip, whitening(np.full(t, sigma), None, rv), groups=groups)
    auc_dec, auc_raw = roc_auc(dec[inc], dec[~inc]), roc_auc(raw[inc], raw[~inc])
    assert auc_dec > auc_raw + 0.02
    same = whitening(np.full(t, sigma))
    assert np.allclose(
        every_release_scores(proj, clip, same, groups=groups),
        every_release_scores(proj, clip, whitening(np.full(t, sigma), np.eye(t)), groups=groups),
    )


def test_full_participation_score_is_the_matched_filter():
    """rate = 1, one group: the score is ⟨y, a⟩ − ‖a‖²/2 with y = W·p and a = W·c (closed form)."""
    rng = np.random.default_rng(1)
    p = rng.normal(size=(5, 4))
    c = np.array([1.0, 0.5, 1.0, 2.0])
    w = rng.normal(size=(4, 4))
    a = w @ c
    assert np.allclose(every_release_scores(p, c, w), (p @ w.T) @ a - 0.5 * a @ a)


# --------------------------------------------------------------------------- real runs
def test_one_run_audit_report(tmp_path):
    cfg = load_config(None, BASE + EPOCHS + ["privacy.mechanism='identity'", "privacy.target_epsilon=4.0"])
    rep = run_one_run_audit(cfg, tmp_path / "a", 200, progress=False, seed=5)
    assert json.loads((tmp_path / "a" / "one_run_audit.json").read_text()) == rep
    inc = inclusion_bits(5, 200)
    assert rep["num_included"] == int(inc.sum()) and rep["population"] == 30 + int(inc.sum())
    assert rep["canary_participations"]["excluded_total"] == 0
    assert rep["canary_participations"]["mean_included"] == 4.0  # every round (min_sep = 1)
    advs = {(b["adversary"], b["method"]) for b in rep["bounds"]}
    assert advs == {(a, mth) for a in ("final-model", "every-model", "every-model-raw") for mth in ("snj", "fdp")}
    for b in rep["bounds"]:
        assert 0 <= b["epsilon"] <= rep["ledger_epsilon"]
        assert b["num_canaries"] == 200 and b["correct"] <= b["guesses"] and b["confidence"] == 0.95
    scores = np.load(tmp_path / "a" / "one_run_scores.npz")
    assert (scores["included"] == inc).all() and scores["every_model"].shape == (200,)
    # the report's bound is recomputed from the saved scores
    b = one_run_bound(scores["every_model"], inc, rep["delta"], method="fdp")
    got = next(x for x in rep["bounds"] if x["adversary"] == "every-model" and x["method"] == "fdp")
    assert got["epsilon"] == pytest.approx(b.epsilon, abs=1e-12)


def test_planted_bug_one_tenth_noise_is_caught(tmp_path, monkeypatch):
    """A server that adds one tenth of the accounted noise: ε_LB above the ledger's ε."""
    from fedsim.server.step import DPServer

    monkeypatch.setattr(
        DPServer, "noise_std", property(lambda s: 0.1 * s.clip_norm * s.noise_multiplier * s.noise.sensitivity)
    )
    cfg = load_config(None, BASE + EPOCHS + ["privacy.mechanism='identity'", "privacy.target_epsilon=1.0"])
    rep = run_one_run_audit(cfg, tmp_path / "bug", 1000, progress=False)
    every = {b["method"]: b["epsilon"] for b in rep["bounds"] if b["adversary"] == "every-model"}
    assert every["snj"] > rep["ledger_epsilon"] and every["fdp"] > rep["ledger_epsilon"], (every, rep["ledger_epsilon"])


@pytest.mark.slow
def test_cli_one_run(tmp_path, capsys):
    from helpers import run_cli

    args = ["audit", "--attack", "one-run", "--canaries", "100", "--out", str(tmp_path / "c")]
    for o in BASE + ["privacy.mechanism='gaussian'", "sampling.scheme='poisson'", "sampling.cohort_size=40"]:
        args += ["--set", o]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert "one-run audit: 100 canaries" in out and "every-model" in out and "final-model" in out
    assert "ceiling for m" in out and "guesses correct" in out
    code, _, err = run_cli(capsys, "audit", "--attack", "one-run", "--attack", "canary", "--out", str(tmp_path / "d"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "runs alone" in err


def test_text_one_run_audit_population_and_report(tmp_path):
    """Text canaries: an included canary replaces its donor; an excluded canary and its donor are
    both absent, so each coin adds or removes exactly one user."""
    from fedsim.runner.text_audit import run_text_one_run_audit

    cfg = load_config(None, [*BASE, "rounds=2", "data.max_users=40", "privacy.mechanism='none'"])
    rep = run_text_one_run_audit(cfg, tmp_path / "t", 20, seed=3, progress=False)
    inc = inclusion_bits(3, 20)
    assert rep["num_included"] == int(inc.sum())
    assert rep["population"] == 40 - 20 + int(inc.sum())
    scores = np.load(tmp_path / "t" / "one_run_scores.npz")
    assert (scores["included"] == inc).all()
    assert np.allclose(scores["scores"], scores["lp_initial"] - scores["lp_trained"])
    assert {b["method"] for b in rep["bounds"]} == {"snj", "fdp"}
    for b in rep["bounds"]:
        again = one_run_bound(scores["scores"], inc, rep["delta"], method=b["method"])
        assert b["epsilon"] == pytest.approx(again.epsilon, abs=1e-12) and b["num_canaries"] == 20
