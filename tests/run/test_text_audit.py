"""The text audit end to end: a small real run with canary users and held-out users, attacked after
training (``fedsim audit --attack canary --attack user-inference``), and the audit population's
plumbing (accountant, workers, evaluation)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_cli

from fedsim.attacks.canaries import make_canary_set
from fedsim.attacks.population import AuditView
from fedsim.config import load_config
from fedsim.data import load_federated
from fedsim.protocol import Task
from fedsim.runner.build import build_run

SMALL = [
    "rounds=4",
    "data.max_users=60",
    "privacy.mechanism='gaussian'",
    "sampling.scheme='poisson'",
    "sampling.cohort_size=12",
    "privacy.noise_multiplier=1.0",
    "sim.num_workers=1",
    "eval.every=0",
]


def test_audit_view_round_trips_and_rebuilds_the_same_population():
    cfg = load_config(None, SMALL)
    base = load_federated(cfg.data)
    cs = make_canary_set(base, 4, repetitions=(1, 8), secret_length=6, seed=3, exclude=[0, 1, 2])
    view = AuditView(cs, held_out=(0, 1, 2))
    again = AuditView.from_json(view.to_json())
    a, b = view.apply(base), again.apply(base)
    assert list(a.names) == list(b.names) and a.population == base.population - 3 - 4 + 4
    for u in (0, a.population - 1):
        xa, ya = a.train_samples(u, np.arange(a.num_train(u)))
        xb, yb = b.train_samples(u, np.arange(b.num_train(u)))
        assert np.array_equal(xa.numpy(), xb.numpy()) and np.array_equal(ya.numpy(), yb.numpy())


def test_the_built_run_accounts_the_audit_population_and_evaluates_real_users_only():
    cfg = load_config(None, SMALL + ["eval.every=2"])
    base = load_federated(cfg.data)
    cs = make_canary_set(base, 4, repetitions=(1, 8), secret_length=6, seed=3, exclude=[5, 6])
    view = AuditView(cs, held_out=(5, 6))
    run = build_run(cfg, view=view)
    trained = view.apply(base)
    assert run.spec.population == trained.population == base.population - 2  # 4 donors out, 4 canaries in
    assert run.sampler is not None and len(run.eval_users) == len(trained.ordinary_users())
    assert max(run.eval_users) < trained.population - 4  # never a canary user
    names = set(trained.names)
    assert not {base.names[5], base.names[6]} & names  # held-out users are not in the population
    task = Task.from_json(run.task.to_json())
    assert task.view == view.to_json()  # what every worker applies


def test_canary_and_user_inference_audit_end_to_end(tmp_path, capsys):
    out = tmp_path / "audit"
    args = ["audit", "--attack", "canary", "--attack", "user-inference", "--out", str(out), "--canaries", "8"]
    args += ["--held-out", "8", "--references", "300", "--repetitions", "1,16", "--canary-size", "120,all", "--json"]
    for s in SMALL:
        args += ["--set", s]
    code, stdout, _ = run_cli(capsys, *args)
    assert code == 0
    rep = json.loads(stdout)
    assert rep == json.loads((out / "audit.json").read_text())
    assert rep["kind"] == "text-audit" and rep["neighboring_relation"] == "add_or_remove_one"
    ledger = json.loads((out / "run" / "ledger.json").read_text())
    assert rep["population"] == ledger["spec"]["population"] == 60 - 8  # 8 donors out, 8 canaries in
    canary = rep["canary"]
    cells = [(lv["repetitions"], lv["size"], lv["canaries"]) for lv in canary["by_level"]]
    assert len(canary["canaries"]) == 8 and cells == [(1, 120, 2), (16, 120, 2), (1, None, 2), (16, None, 2)]
    for c in canary["canaries"]:
        assert 1 <= c["rank"] <= 301 and 0 <= c["exposure"] <= np.log2(301) + 1e-9
    ui = rep["user_inference"]
    assert ui["held_in"] == ui["held_out"] == 8
    assert 0.0 <= ui["auc"]["low"] <= ui["auc"]["estimate"] <= ui["auc"]["high"] <= 1.0
    lb = ui["epsilon_lower_bound"]
    assert lb["confidence"] == pytest.approx(0.95)
    assert 0.0 <= lb["epsilon_lb"] <= float(rep["ledger_epsilon"])  # a DP run: the bound stays below ε
    assert (out / "canary_exposure.png").stat().st_size > 0 and (out / "user_inference_roc.png").stat().st_size > 0
    code, stdout, _ = run_cli(capsys, "report", str(out))
    assert code == 0 and "user inference: AUC" in stdout and "canaries r = 16, size 120" in stdout


@pytest.mark.parametrize("sizes", ["0,all", "40;80", "many"])
def test_bad_canary_sizes_are_refused_before_training(tmp_path, capsys, sizes):
    args = ["audit", "--attack", "canary", "--out", str(tmp_path / "a"), "--canary-size", sizes]
    code, _, err = run_cli(capsys, *args, "--set", "rounds=2")
    assert code == 2 and "--canary-size" in err and not (tmp_path / "a").exists()
