"""``fedsim sweep`` on Ray Tune: the grid, up-front validation, the table, kill + resume (only the
unfinished trials run), and the privacy of selecting the best arm (Papernot & Steinke 2022)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from fedsim.errors import FedsimError
from fedsim.privacy.accounting import AccountingSpec
from fedsim.privacy.rng import PrivacyKey
from fedsim.privacy.selection import ORDERS, draw_trial_count, expected_trials, selection_epsilon
from fedsim.runner.sweep import check_trials, load_spec, read_base, run_sweep, trials

ROOT = Path(__file__).resolve().parents[2]

SPEC = """
[sweep]
name = "tiny"
set = ["data.name='synthetic'", "data.num_clients=40", "model.name='logreg'", "rounds=3",
       "sampling.scheme='poisson'", "sampling.cohort_size=10", "eval.every=0", "eval.max_users=8"]
seeds = [0, 1]

[[sweep.arms]]
name = "gauss"
set = ["privacy.mechanism='gaussian'", "privacy.noise_multiplier=1.0"]

[[sweep.arms]]
name = "none"
set = ["privacy.mechanism='none'"]

[sweep.axes]
"client.lr" = [0.5, 1.0]
"""


def _spec(tmp_path: Path, text: str = SPEC) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_the_grid_is_arms_times_axes_times_seeds(tmp_path):
    spec, base = load_spec(_spec(tmp_path))
    items = trials(spec)
    assert base is not None and base.name == "shakespeare_default.toml"  # no config: the bundled default
    assert len(items) == 2 * 2 * 2
    assert len({t["name"] for t in items}) == 8
    assert {t["arm"] for t in items} == {
        "gauss,client.lr=0.5",
        "gauss,client.lr=1.0",
        "none,client.lr=0.5",
        "none,client.lr=1.0",
    }
    one = next(t for t in items if t["name"] == "none,client.lr=1.0,seed=1")
    assert one["sets"][-3:] == ["privacy.mechanism='none'", "client.lr=1.0", "seed=1"]
    check_trials(read_base(base), spec, items)


def test_trial_names_are_exact_and_stay_one_folder(tmp_path):
    """Attack: a trial's name is its folder, and a folder holding ``summary.json`` is reused as
    finished. Two searched learning rates that agree to 4 digits once shared a name (the second
    trial took the first's results); a value with ``/`` or ``..`` must not reach another folder."""
    from fedsim.runner.sweep import _searched_trial

    a = _searched_trial({"params": {"client.lr": 0.123456}, "seed": 0, "set": []})
    b = _searched_trial({"params": {"client.lr": 0.123457}, "seed": 0, "set": []})
    assert a["name"] != b["name"] and a["sets"][-2] == "client.lr=0.123456"
    text = SPEC.replace('"client.lr" = [0.5, 1.0]', '"client.lr" = [0.5]\n"data.root" = ["../../x/..", "a%2Fb", "a/b"]')
    spec, _ = load_spec(_spec(tmp_path, text))
    names = [t["name"] for t in trials(spec)]
    assert len(set(names)) == len(names) == 2 * 3 * 2
    for name in names:
        folder = tmp_path / "trials" / name
        assert (
            "/" not in name
            and folder.parent == tmp_path / "trials"
            and folder.resolve().parent == (tmp_path / "trials").resolve()
        )
    assert any(t["sets"][-2] == "data.root='../../x/..'" for t in trials(spec))  # the value itself is unchanged


def test_a_trial_killed_mid_run_continues_from_its_checkpoint(tmp_path, monkeypatch):
    """A trial that died after round 2 of 3 (its checkpoint written) continues from it on resume,
    with the model an uninterrupted trial ends with; a folder whose checkpoint was written with
    another config, or that has none, starts again."""
    import fedsim.runner.runner as runner
    from fedsim.runner.callbacks import RunCallback
    from fedsim.runner.sweep import resumable, run_trial, trial_config

    spec, base = load_spec(_spec(tmp_path))
    raw = read_base(base)
    trial = next(t for t in trials(spec) if t["name"] == "gauss,client.lr=0.5,seed=1")
    cfg = trial_config(raw, trial["sets"])

    class Die(RunCallback):
        def on_round_end(self, row):
            if row["round"] == 2:
                raise RuntimeError("killed")

    killed = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="killed"):
        runner.run_experiment(cfg, killed / "trials" / trial["name"], progress=False, callbacks=[Die()])
    folder = killed / "trials" / trial["name"]
    assert not (folder / "summary.json").exists() and resumable(folder, cfg)
    assert not resumable(folder, trial_config(raw, [*trial["sets"], "client.lr=0.6"]))
    calls = []
    real = runner.run_experiment

    def spy(*args, **kwargs):
        calls.append(kwargs.get("resume"))
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_experiment", spy)
    common = {"trial": trial, "base_config": raw, "metric": "final_eval_accuracy"}
    resumed = run_trial({**common, "out": str(killed)})
    fresh = run_trial({**common, "out": str(tmp_path / "fresh")})
    assert calls == [True, False]
    assert resumed["model_sha256"] == fresh["model_sha256"] and resumed["epsilon"] == fresh["epsilon"]
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == 3


def test_a_broken_trial_stops_the_sweep_before_it_starts(tmp_path):
    spec, base = load_spec(_spec(tmp_path, SPEC.replace('"privacy.noise_multiplier=1.0"', '"privacy.bands=3"')))
    with pytest.raises(FedsimError, match="privacy.bands"):
        check_trials(read_base(base), spec, trials(spec))
    with pytest.raises(FedsimError, match="sweep.seeds"):
        load_spec(_spec(tmp_path, SPEC.replace("seeds = [0, 1]", "seeds = 'zero'")))


def _env() -> dict[str, str]:
    import tempfile

    env = dict(os.environ)
    # Ray's socket paths must stay short (AF_UNIX): not under pytest's long tmp_path
    env.update(RAY_TMPDIR=tempfile.mkdtemp(prefix="rs", dir="/tmp"), OMP_NUM_THREADS="1")
    return env


def _sweep_json(spec: Path, *args: str) -> dict[str, Any]:
    """``fedsim sweep SPEC ARGS --json`` in a fresh process; its sweep.json."""
    r = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "sweep", str(spec), *args, "--json"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return dict(json.loads(r.stdout))


def _summaries(out: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime for p in (out / "trials").glob("*/summary.json")}


@pytest.mark.slow  # over 30 s in the default suite (CI time); make test-slow runs it
@pytest.mark.e2e
def test_sweep_kill_and_resume_finishes_only_the_missing_trials(tmp_path):
    spec, out = _spec(tmp_path), tmp_path / "sweep"
    cmd = [sys.executable, "-m", "fedsim.cli", "sweep", str(spec)]
    first = subprocess.Popen(
        [*cmd, "--out", str(out)],
        cwd=ROOT,
        env=_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while len(_summaries(out)) < 3 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.3)
    assert first.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
    os.killpg(first.pid, signal.SIGKILL)  # the sweep and every trial it started
    first.wait()
    done = _summaries(out)
    assert 3 <= len(done) < 8, done
    result = _sweep_json(spec, "--resume", str(out))
    after = _summaries(out)
    assert len(after) == 8
    assert all(after[name] == mtime for name, mtime in done.items())  # finished trials never recomputed
    assert result["missing"] == [] and len(result["trials"]) == 8
    # every real trial (the no-noise arm too) ran under the accounting spec the plan gives its arm
    assert result["not_as_planned"] == [] and "not as planned" not in result["selection"]["note"]
    table = {a["arm"]: a for a in result["arms"]}
    assert table["gauss,client.lr=0.5"]["seeds"] == 2 and math.isfinite(table["gauss,client.lr=0.5"]["epsilon"])
    assert table["none,client.lr=0.5"]["epsilon"] == "inf"
    assert result["selection"]["accounted"] is False and "not accounted" in result["selection"]["note"]
    assert (out / "table.md").read_text().count("\n") == 2 + 4 and (out / "table.csv").exists()
    # a trial's folder is an ordinary run folder: its ε is the ledger's
    ledger = json.loads((out / "trials" / "gauss,client.lr=0.5,seed=0" / "ledger.json").read_text())
    assert ledger["entries"][-1]["epsilon"] == pytest.approx(table["gauss,client.lr=0.5"]["epsilon"])
    # fedsim report draws the sweep: accuracy against ε over the arms, and the arms' curves
    r = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "report", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0 and "| gauss,client.lr=0.5 | 2/2 |" in r.stdout, r.stderr[-2000:]
    assert "selection: selection not accounted" in r.stdout
    assert (out / "accuracy_vs_epsilon.png").stat().st_size > 0 and (out / "arms.png").stat().st_size > 0
    # --json: the sweep folder as one JSON line (it printed nothing before)
    r = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "report", "--json", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (line,) = r.stdout.strip().splitlines()
    doc = json.loads(line)
    assert doc["sweep"] == str(out) and doc["selection_line"].startswith("selection not accounted")
    assert {a["arm"] for a in doc["arms"]} == set(table)


def _rdp(event: dp_event.DpEvent) -> list[float]:
    acc = RdpAccountant(orders=list(ORDERS))
    acc.compose(event)
    return list(acc.rdp)


def test_poisson_selection_matches_the_theorem_computed_independently():
    spec = AccountingSpec("gaussian", "poisson", 1000, 50, 1.2, 1e-5)
    rounds, mu, delta = 40, 8.0, 1e-5
    got = selection_epsilon([(spec, rounds)], delta, "poisson", mu)
    event = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(1.2)), rounds)
    rdp = _rdp(event)
    from dp_accounting.pld import PLDAccountant

    pld = PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(event)
    want = [r + mu * pld.get_delta(math.log1p(1 / (lam - 1))) + math.log(mu) / (lam - 1) for lam, r in zip(ORDERS, rdp)]
    assert got["epsilon"] == pytest.approx(compute_epsilon(list(ORDERS), want, delta)[0], rel=1e-9)
    assert got["trial_epsilon"] == pytest.approx(compute_epsilon(list(ORDERS), rdp, delta)[0], rel=1e-9)
    assert got["epsilon"] > got["trial_epsilon"]  # selecting costs privacy


def test_truncated_negative_binomial_selection_and_trial_counts():
    spec = AccountingSpec("gaussian", "poisson", 1000, 50, 1.2, 1e-5)
    gamma = 0.1
    got = selection_epsilon([(spec, 40)], 1e-5, "truncated_negative_binomial", eta=0.0, gamma=gamma)
    rdp = _rdp(spec.run_event(40))
    extra = min((1 - 1 / lh) * e + math.log(1 / gamma) / lh for lh, e in zip(ORDERS, rdp))
    ek = (1 / gamma - 1) / math.log(1 / gamma)
    want = [r + extra + math.log(ek) / (lam - 1) for lam, r in zip(ORDERS, rdp)]
    assert got["epsilon"] == pytest.approx(compute_epsilon(list(ORDERS), want, 1e-5)[0], rel=1e-9)
    assert expected_trials("truncated_negative_binomial", 0, 0.0, gamma) == pytest.approx(ek)
    # K is drawn by inverse CDF from the keyed stream: its mean over many keys is E[K]
    draws = [draw_trial_count("poisson", 6.0, 0, 0.5, PrivacyKey.from_seed(s)) for s in range(400)]
    assert abs(sum(draws) / len(draws) - 6.0) < 5 * math.sqrt(6.0 / 400)
    logs = [draw_trial_count("truncated_negative_binomial", 0, 0.0, gamma, PrivacyKey.from_seed(s)) for s in range(400)]
    assert min(logs) >= 1 and abs(sum(logs) / len(logs) - ek) < 0.6


@pytest.mark.parametrize("eta", [-0.9, -0.5, 0.0, 0.5, 2.0])
def test_truncated_negative_binomial_pmf_for_every_eta(eta):
    """The pmf against its product form ``(1−γ)^k/(γ^−η − 1)·∏_{l<k}(l+η)/(l+1)`` (the logarithmic
    distribution at η = 0). For η ∈ (−1, 0) a lost sign once made every probability negative and
    the draw 100,001 trials."""
    from fedsim.privacy.selection import _tnb_pmf

    gamma, ks = 0.1, range(1, 4000)
    pmf = [_tnb_pmf(k, eta, gamma) for k in ks]
    if eta == 0:
        want = [(1 - gamma) ** k / (k * math.log(1 / gamma)) for k in ks]
    else:
        want, prod = [], 1.0
        for k in ks:
            prod *= (k - 1 + eta) / k
            want.append((1 - gamma) ** k / (gamma**-eta - 1) * prod)
    assert pmf == pytest.approx(want, rel=1e-9, abs=1e-300)
    assert sum(pmf) == pytest.approx(1.0, abs=1e-9)
    mean = expected_trials("truncated_negative_binomial", 0, eta, gamma)
    assert sum(k * p for k, p in zip(ks, pmf)) == pytest.approx(mean, rel=1e-9)
    draws = [
        draw_trial_count("truncated_negative_binomial", 0, eta, gamma, PrivacyKey.from_seed(s)) for s in range(300)
    ]
    assert min(draws) >= 1 and max(draws) < 200 and abs(sum(draws) / len(draws) - mean) < 0.25 * mean


@pytest.mark.parametrize("shape", [math.inf, 0.0, 1.0, 2.5])
def test_selection_equals_dp_accountings_repeat_and_select(shape):
    """dp-accounting's own ``RepeatAndSelectDpEvent`` (its RDP accountant implements the same two
    theorems, written independently) gives the same ε for one arm: Poisson (shape ∞, with δ̂ from
    the RDP curve, as dp-accounting takes it) and the truncated negative binomial for η = shape ≥ 0
    (dp-accounting maps the mean back to γ by bisection, to 1e-9)."""
    from dp_accounting import dp_event as ev
    from dp_accounting.rdp.rdp_privacy_accountant import _gamma_truncated_negative_binomial

    spec = AccountingSpec("gaussian", "poisson", 1000, 50, 1.1, 1e-5, accountant="rdp")
    rounds, delta = 30, 1e-6
    if shape == math.inf:
        mean = 6.0
        ours = selection_epsilon([(spec, rounds)], delta, "poisson", mean)
    else:
        gamma = 0.05
        mean = expected_trials("truncated_negative_binomial", 0, shape, gamma)
        assert _gamma_truncated_negative_binomial(shape, mean) == pytest.approx(gamma, rel=1e-8)
        ours = selection_epsilon([(spec, rounds)], delta, "truncated_negative_binomial", eta=shape, gamma=gamma)
    theirs = RdpAccountant(orders=list(ORDERS))
    theirs.compose(ev.RepeatAndSelectDpEvent(spec.run_event(rounds), mean, shape))
    want = theirs.get_epsilon(delta)
    assert ours["epsilon"] == pytest.approx(want, rel=1e-6)


def test_a_no_noise_arm_makes_the_selection_unbounded():
    good = AccountingSpec("gaussian", "poisson", 1000, 50, 1.2, 1e-5)
    none = AccountingSpec("none", "poisson", 1000, 50, 0.0, 1e-5)
    assert selection_epsilon([(good, 10), (none, 10)], 1e-5)["epsilon"] == math.inf


def test_private_selection_draws_k_random_arms_with_fresh_seeds(tmp_path):
    from fedsim.runner.sweep import random_trials

    text = SPEC + "\n[sweep.private_selection]\ndistribution = 'poisson'\nmean = 5.0\n"
    spec, _ = load_spec(_spec(tmp_path, text))
    a, b = random_trials(spec, trials(spec)), random_trials(spec, trials(spec))
    assert a == b  # K, the arms and the seeds come from the keyed stream of the spec's seed
    k = draw_trial_count("poisson", 5.0, 0, 0.5, PrivacyKey.from_seed(0).derive("private-selection").derive("count"))
    assert len(a) == k and len({t["name"] for t in a}) == k
    arms = {t["arm"] for t in trials(spec)}
    assert all(t["arm"] in arms and t["sets"][-1] == f"seed={t['seed']}" for t in a)


def _selection_spec(
    tmp_path: Path, mean: float = 5.0, second_arm: tuple[str, ...] = ("privacy.noise_multiplier=0.8",)
) -> Path:
    """SPEC with private selection and a second Gaussian arm (``second_arm``: its extra overrides)."""
    sets = json.dumps(["privacy.mechanism='gaussian'", "privacy.noise_multiplier=1.0", *second_arm])
    text = SPEC.replace('name = "none"\nset = ["privacy.mechanism=\'none\'"]', f'name = "gauss2"\nset = {sets}')
    assert "gauss2" in text
    return _spec(tmp_path, text + f"\n[sweep.private_selection]\ndistribution = 'poisson'\nmean = {mean}\n")


def test_private_selection_prints_its_relation_and_covers_every_arm(tmp_path):
    from fedsim.privacy.accounting import AccountingSpec as Spec
    from fedsim.runner.sweep import selection_privacy

    spec, base = load_spec(_selection_spec(tmp_path))
    got = selection_privacy(spec, read_base(base), draws=4)
    assert got is not None and got["neighboring_relation"] == "add_or_remove_one"
    # the guarantee is over the random arm: the worst arm (z = 0.8) bounds it, drawn or not
    worst = Spec("gaussian", "poisson", 40, 10, 0.8, got["delta"])
    assert got["epsilon"] == pytest.approx(
        selection_epsilon([(worst, 3)], got["delta"], "poisson", 5.0)["epsilon"], rel=1e-12
    )
    assert set(got["specs"]) == {
        "gauss,client.lr=0.5",
        "gauss,client.lr=1.0",
        "gauss2,client.lr=0.5",
        "gauss2,client.lr=1.0",
    }


def test_private_selection_refuses_arms_under_different_neighbouring_relations(tmp_path):
    """A fixed-cohort arm's ε is for replacing one user, a Poisson arm's for adding or removing one:
    the larger ε of the two holds for neither relation over the mixture, so no ε is printed."""
    from fedsim.runner.sweep import selection_privacy

    spec, base = load_spec(_selection_spec(tmp_path, second_arm=("sampling.scheme='fixed'",)))
    with pytest.raises(FedsimError, match="different neighbouring relations.*replace one user.*same sampling.scheme"):
        selection_privacy(spec, read_base(base))
    with pytest.raises(FedsimError, match="different neighbouring relations"):  # before Ray or any trial starts
        run_sweep(_selection_spec(tmp_path, second_arm=("sampling.scheme='fixed'",)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_trial_that_ran_under_another_accounting_spec_unaccounts_the_selection(tmp_path):
    """Attack: a finished trial folder whose ledger holds another spec (a folder copied in from a
    run with weaker noise) must not be reported as covered by the selection's ε."""
    from dataclasses import replace

    from fedsim.runner.sweep import selection_note, selection_privacy

    spec_path = _selection_spec(tmp_path)
    spec, base = load_spec(spec_path)
    spec = spec.model_copy(
        update={"private_selection": spec.private_selection.model_copy(update={"metric_is_private": True})}
    )
    privacy = selection_privacy(spec, read_base(base), draws=2)
    out = tmp_path / "sweep"
    rows = []
    for i, arm in enumerate(["gauss,client.lr=0.5", "gauss2,client.lr=1.0"]):
        name = f"trial{i:03d},{arm}"
        (out / "trials" / name).mkdir(parents=True)
        ran = privacy["specs"][arm]
        (out / "trials" / name / "ledger.json").write_text(json.dumps({"spec": ran.to_dict()}))
        rows.append({"trial": name, "arm": arm, "seed": i, "final_eval_accuracy": 0.1 * (i + 1)})
    good = selection_note(spec, [], rows, privacy, out)
    assert good["accounted"] is True and good["best_trial"] == "trial001,gauss2,client.lr=1.0"
    assert "for add/remove one user" in good["note"] and f"{good['epsilon']:.4g}" in good["note"]
    weaker = replace(privacy["specs"]["gauss2,client.lr=1.0"], noise_multiplier=0.3)
    (out / "trials" / rows[1]["trial"] / "ledger.json").write_text(json.dumps({"spec": weaker.to_dict()}))
    bad = selection_note(spec, [], rows, privacy, out)
    assert bad["accounted"] is False and rows[1]["trial"] in bad["note"] and "not accounted" in bad["note"]
    # a trial that did not finish: the best of the others is not the best of all K
    (out / "trials" / rows[1]["trial"] / "ledger.json").write_text(
        json.dumps({"spec": privacy["specs"][rows[1]["arm"]].to_dict()})
    )
    short = selection_note(spec, [], rows[:1], privacy, out, missing=[rows[1]["trial"]])
    assert short["accounted"] is False and "1 of the K = 2 trials did not finish" in short["note"]


def test_private_selection_refuses_asha(tmp_path):
    """ASHA stops a trial on the others' intermediate scores: the trials are no longer independent."""
    spec_path = _selection_spec(tmp_path)
    spec_path.write_text(spec_path.read_text().replace("seeds = [0, 1]", "seeds = [0, 1]\nscheduler = 'asha'"))
    with pytest.raises(FedsimError, match="asha.*independent, complete trials"):
        run_sweep(spec_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_k_zero_draws_run_nothing_and_release_nothing(tmp_path):
    """Poisson K can be 0 (probability e^−μ): the procedure's output is then ⊥, not an error."""
    key = PrivacyKey.from_seed(0).derive("private-selection").derive("count")
    assert draw_trial_count("poisson", 0.05, 0, 0.5, key) == 0
    result = run_sweep(_selection_spec(tmp_path, mean=0.05), tmp_path / "out")
    assert result["trials"] == [] and result["missing"] == []
    assert result["selection"]["draws"] == 0 and "releases nothing" in result["selection"]["note"]
    assert not (tmp_path / "out" / "tune").exists()  # no Ray, no Tune
    # the folder now holds a sweep: starting another there (not --resume) is refused, and a
    # folder with another sweep's trials too (their summaries would pass for this sweep's)
    with pytest.raises(FedsimError, match="already holds a sweep"):
        run_sweep(_selection_spec(tmp_path, mean=0.05), tmp_path / "out")
    (tmp_path / "other" / "trials" / "gauss,client.lr=0.5,seed=0").mkdir(parents=True)
    with pytest.raises(FedsimError, match="already holds a sweep"):
        run_sweep(_spec(tmp_path), tmp_path / "other")


def test_resume_refuses_an_edited_base_config_or_spec(tmp_path):
    """Attack: editing the base config (or the spec) between a kill and ``--resume`` would run the
    remaining trials, and compute the selection's ε, for another experiment than the finished
    trials ran. The sweep reads the base once; a resume with other files is refused before
    anything runs, and goes on once they are restored."""
    from fedsim.runner.sweep import PLAN_FILE, _keep_plan, sweep_plan

    (tmp_path / "base.toml").write_text("[client]\nlr = 0.5\n", encoding="utf-8")
    spec_path = _spec(tmp_path, SPEC.replace('name = "tiny"', 'name = "tiny"\nconfig = "base.toml"'))
    spec, base = load_spec(spec_path)
    out = tmp_path / "sweep"
    out.mkdir()
    _keep_plan(out, sweep_plan(spec, base, read_base(base), None), resume=False)
    assert json.loads((out / PLAN_FILE).read_text())["base_config"] == {"client": {"lr": 0.5}}
    (tmp_path / "base.toml").write_text("[client]\nlr = 0.7\n", encoding="utf-8")
    with pytest.raises(FedsimError, match=r"another base config .*base.toml.*Restore"):
        run_sweep(spec_path, out, resume=True)
    (tmp_path / "base.toml").write_text("[client]\nlr = 0.5\n", encoding="utf-8")
    spec_path.write_text(spec_path.read_text().replace("seeds = [0, 1]", "seeds = [0, 1, 2]"))
    with pytest.raises(FedsimError, match="another sweep spec"):
        run_sweep(spec_path, out, resume=True)
    spec_path.write_text(spec_path.read_text().replace("seeds = [0, 1, 2]", "seeds = [0, 1]"))
    _keep_plan(out, sweep_plan(*load_spec(spec_path), read_base(base), None), resume=True)  # restored: accepted
    with pytest.raises(FedsimError, match="--only"):
        _keep_plan(out, sweep_plan(*load_spec(spec_path), read_base(base), "seed=0"), resume=True)


@pytest.mark.e2e
def test_a_private_selection_sweep_accounts_its_real_trials(tmp_path):
    """K = 2 trials (seed 0, μ = 1.5) run for real: their ledgers hold the plan's accounting specs,
    so the selection is accounted (the metric declared private), with ε and its relation."""
    spec = _selection_spec(tmp_path, mean=1.5)
    spec.write_text(spec.read_text() + "metric_is_private = true\n")
    out = tmp_path / "sel"
    result = _sweep_json(spec, "--out", str(out))
    sel = result["selection"]
    assert len(result["trials"]) == sel["draws"] == 2 and result["missing"] == []
    assert sel["accounted"] is True and sel["best_trial"] in {t["trial"] for t in result["trials"]}
    assert sel["neighboring_relation"] == "add_or_remove_one" and "for add/remove one user" in sel["note"]
    assert sel["epsilon"] > sel["trial_epsilon"] > 0
    assert json.loads((out / "plan.json").read_text())["spec"]["private_selection"]["mean"] == 1.5
    r = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "report", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0 and f"selection: {sel['note']}" in r.stdout, r.stderr[-2000:]


@pytest.mark.e2e
def test_an_optuna_search_with_asha(tmp_path):
    text = (
        SPEC.split("[[sweep.arms]]")[0]
        .replace('"eval.every=0"', '"eval.every=1"')
        .replace(
            "seeds = [0, 1]",
            "seeds = [3]\nscheduler = 'asha'\n\n[sweep.search]\nnum_samples = 3\n"
            'space = {"client.lr" = {loguniform = [0.05, 2.0]}}\n',
        )
    )
    text = text.replace(
        '"eval.max_users=8"]', '"eval.max_users=8", "privacy.mechanism=\'gaussian\'", "privacy.noise_multiplier=1.0"]'
    )
    out = tmp_path / "search"
    result = _sweep_json(_spec(tmp_path, text), "--out", str(out))
    lrs = [float(t["arm"].split("=")[1]) for t in result["trials"]]
    assert 1 <= len(lrs) <= 3 and all(0.05 <= lr <= 2.0 for lr in lrs)
    assert len(list((out / "tune" / "tiny").glob("*"))) > 0
