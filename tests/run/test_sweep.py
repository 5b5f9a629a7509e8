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

import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from fedsim.errors import FedsimError
from fedsim.privacy.accounting import AccountingSpec
from fedsim.privacy.rng import PrivacyKey
from fedsim.privacy.selection import ORDERS, draw_trial_count, expected_trials, selection_epsilon
from fedsim.run.sweep import check_trials, load_spec, trials

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
    check_trials(base, spec, items)


def test_a_broken_trial_stops_the_sweep_before_it_starts(tmp_path):
    spec, base = load_spec(_spec(tmp_path, SPEC.replace('"privacy.noise_multiplier=1.0"', '"privacy.bands=3"')))
    with pytest.raises(FedsimError, match="privacy.bands"):
        check_trials(base, spec, trials(spec))
    with pytest.raises(FedsimError, match="sweep.seeds"):
        load_spec(_spec(tmp_path, SPEC.replace("seeds = [0, 1]", "seeds = 'zero'")))


def _env() -> dict[str, str]:
    import tempfile

    env = dict(os.environ)
    # Ray's socket paths must stay short (AF_UNIX): not under pytest's long tmp_path
    env.update(RAY_TMPDIR=tempfile.mkdtemp(prefix="rs", dir="/tmp"), OMP_NUM_THREADS="1")
    return env


def _summaries(out: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime for p in (out / "trials").glob("*/summary.json")}


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
    r = subprocess.run(
        [*cmd, "--resume", str(out), "--json"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    after = _summaries(out)
    assert len(after) == 8
    assert all(after[name] == mtime for name, mtime in done.items())  # finished trials never recomputed
    result = json.loads(r.stdout)
    assert result["missing"] == [] and len(result["trials"]) == 8
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
    assert r.returncode == 0 and "| gauss,client.lr=0.5 | 2 |" in r.stdout, r.stderr[-2000:]
    assert (out / "accuracy_vs_epsilon.png").stat().st_size > 0 and (out / "arms.png").stat().st_size > 0


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


def test_a_no_noise_arm_makes_the_selection_unbounded():
    good = AccountingSpec("gaussian", "poisson", 1000, 50, 1.2, 1e-5)
    none = AccountingSpec("none", "poisson", 1000, 50, 0.0, 1e-5)
    assert selection_epsilon([(good, 10), (none, 10)], 1e-5)["epsilon"] == math.inf


def test_private_selection_draws_k_random_arms_with_fresh_seeds(tmp_path):
    from fedsim.run.sweep import random_trials

    text = SPEC + "\n[sweep.private_selection]\ndistribution = 'poisson'\nmean = 5.0\n"
    spec, _ = load_spec(_spec(tmp_path, text))
    a, b = random_trials(spec, trials(spec)), random_trials(spec, trials(spec))
    assert a == b  # K, the arms and the seeds come from the keyed stream of the spec's seed
    k = draw_trial_count("poisson", 5.0, 0, 0.5, PrivacyKey.from_seed(0).derive("private-selection").derive("count"))
    assert len(a) == k and len({t["name"] for t in a}) == k
    arms = {t["arm"] for t in trials(spec)}
    assert all(t["arm"] in arms and t["sets"][-1] == f"seed={t['seed']}" for t in a)


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
    r = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "sweep", str(_spec(tmp_path, text)), "--out", str(out), "--json"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    lrs = [float(t["arm"].split("=")[1]) for t in result["trials"]]
    assert 1 <= len(lrs) <= 3 and all(0.05 <= lr <= 2.0 for lr in lrs)
    assert len(list((out / "tune" / "tiny").glob("*"))) > 0
