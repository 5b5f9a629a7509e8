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
    assert "one-run audit: 100 gradient canaries" in out and "every-model" in out and "final-model" in out
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


def _text_cli_args(dataset: str, tmp_path) -> list[str]:
    """`fedsim audit` arguments of a tiny non-private text run: Shakespeare (the goals table's small
    model) or the generated Stack Overflow fixture."""
    if dataset == "shakespeare":
        sets = [*BASE, "rounds=2", "data.max_users=40"]
        args = []
    else:
        from fedsim.data.stackoverflow.synthetic import generate

        generate(tmp_path / "so", users=40, per_user=10, vocab=150, seed=0)
        args = ["experiments/stackoverflow_nwp_fixture.toml"]
        sets = [f"data.root='{tmp_path / 'so'}'", "data.max_users=40", "sim.engine='inprocess'", "eval.every=0"]
        sets += ["privacy.delta=1e-5"]
    for o in [*sets, "privacy.mechanism='none'", "sampling.scheme='poisson'", "sampling.cohort_size=10"]:
        args += ["--set", o]
    return args


@pytest.mark.parametrize(("dataset", "size"), [("shakespeare", "20"), ("so_fixture", "3")])
def test_cli_one_run_text_canaries(dataset, size, tmp_path, capsys):
    """`fedsim audit --attack one-run --canary-kind text` on both text tasks: the printed bounds are
    the report's, and the report's are `one_run_bound` of the saved scores and coins."""
    from helpers import run_cli

    out_dir = tmp_path / "a"
    args = ["audit", *_text_cli_args(dataset, tmp_path), "--attack", "one-run", "--canary-kind", "text"]
    args += ["--canaries", "20", "--repetitions", "4", "--canary-size", size, "--secret-length", "4"]
    code, out, err = run_cli(capsys, *args, "--out", str(out_dir))
    assert code == 0, err
    rep = json.loads((out_dir / "one_run_audit.json").read_text())
    assert rep["kind"] == "text-one-run-audit" and rep["num_canaries"] == 20 and rep["repetitions"] == 4
    assert f"one-run audit: 20 text canaries ({rep['num_included']} included)" in out
    scores = np.load(out_dir / "one_run_scores.npz")
    for b in rep["bounds"]:
        again = one_run_bound(scores["scores"], scores["included"], rep["delta"], method=b["method"])
        assert b["epsilon"] == pytest.approx(again.epsilon, abs=1e-12)
        assert f"final-model      {b['method']:<3}  ε ≥ {b['epsilon']:.3f}" in out
    assert str(out_dir / "one_run_audit.json") in out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--attack", "one-run", "--canary-kind", "words"], "allowed are gradient and text"),
        (["--attack", "one-run", "--canary-kind", "text", "--repetitions", "1,4"], "one --repetitions level"),
        (["--attack", "one-run", "--repetitions", "4"], "need --canary-kind text"),
        (["--attack", "canary", "--canary-kind", "text"], "apply to --attack one-run only"),
        (["--canary-directions", "orthogonal"], "apply to --attack one-run only"),
        (["--attack", "one-run", "--canary-directions", "diagonal"], "allowed are random, orthogonal"),
        (["--attack", "one-run", "--canary-kind", "text", "--canary-directions", "orthogonal"], "gradient canaries"),
    ],
)
def test_cli_one_run_canary_kind_refused(extra, needle, tmp_path, capsys):
    """Wrong canary-kind options are refused in one line before anything trains."""
    from helpers import run_cli

    code, _, err = run_cli(capsys, "audit", *extra, "--out", str(tmp_path / "x"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_orthogonal_canaries_are_signed_distinct_coordinates():
    """Orthogonal canaries: each is ±e_j for its own keyed coordinate j, so the directions are
    orthonormal; `project` and `update_sum` agree with the explicit directions; m > d is refused."""
    import torch

    from fedsim.errors import FedsimError

    c = OneRunCanaries(300, 7, "orthogonal")
    c.bind(first_id=1000, dim=500)
    u = torch.stack([c.direction(k) for k in range(300)])
    assert torch.equal(u @ u.T, torch.eye(300, dtype=torch.float64))
    assert set(u.abs().sum(dim=1).tolist()) == {1.0} and 0.3 < float((u.sum(dim=1) > 0).double().mean()) < 0.7
    v = torch.randn(500, dtype=torch.float64)
    assert np.allclose(c.project(v), (u @ v).numpy(), rtol=0, atol=1e-12)
    again = OneRunCanaries(300, 7, "orthogonal")
    again.bind(first_id=1000, dim=500)
    assert np.array_equal(again.project(v), c.project(v))
    users = [1000 + j for j in range(0, c.count, 3)]
    total = c.update_sum(users, 0, 2.0, 500).double()
    expect = 2.0 * u[[int(c.index[j - 1000]) for j in users]].sum(dim=0)
    assert torch.allclose(total, expect, atol=1e-6)
    with pytest.raises(FedsimError, match="at least as many parameters"):
        OneRunCanaries(600, 7, "orthogonal").bind(first_id=0, dim=500)


def test_orthogonal_audit_run(tmp_path):
    """A one-run audit with orthogonal canaries on a generated logistic-regression task, every user
    in every round: the bounds are `one_run_bound` of the saved scores, excluded canaries never
    take part, and the every-model score is the exact Gaussian likelihood ratio's statistic
    (the sum over rounds of the whitened projections, up to a monotone map)."""
    m = 400
    over = [
        "data.name='synthetic'",
        "data.num_clients=10",
        "data.num_features=99",
        "model.name='logreg'",
        "rounds=3",
        "eval.every=0",
        "sim.engine='inprocess'",
        "privacy.mechanism='gaussian'",
        "privacy.delta=1e-5",
        "privacy.noise_multiplier=1.0",
        "sampling.scheme='poisson'",
    ]
    cfg = load_config(None, over)
    pop = 10 + int(inclusion_bits(5, m).sum())
    cfg = load_config(None, [*over, f"sampling.cohort_size={pop}"])
    rep = run_one_run_audit(cfg, tmp_path / "o", m, progress=False, seed=5, directions="orthogonal")
    assert rep["directions"] == "orthogonal" and rep["dimension"] == 1000 and rep["population"] == pop
    assert rep["canary_participations"] == {"mean_included": 3.0, "excluded_total": 0}
    s = np.load(tmp_path / "o" / "one_run_scores.npz")
    for b in rep["bounds"]:
        key = b["adversary"].replace("-", "_")
        assert b["epsilon"] == pytest.approx(
            one_run_bound(s[key], s["included"], rep["delta"], method=b["method"]).epsilon
        )
    # z = 1, three rounds, every user every round: each canary's view is the Gaussian mechanism
    # with μ = √3, so the every-model score separates in from out with AUC Φ(μ/√2) (sd ≈ 0.015 at m = 400)
    from scipy.stats import norm

    auc = roc_auc(s["every_model"][s["included"]], s["every_model"][~s["included"]])
    assert abs(auc - norm.cdf(math.sqrt(3.0) / math.sqrt(2.0))) < 0.06, auc
    every = {b["method"]: b["epsilon"] for b in rep["bounds"] if b["adversary"] == "every-model"}
    assert 0.0 < every["snj"] < every["fdp"] <= rep["ledger_epsilon"], (every, rep["ledger_epsilon"])
