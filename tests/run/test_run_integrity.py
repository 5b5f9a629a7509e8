"""Run-folder integrity (issue: an edited config.toml lowered ε on resume; two runs interleaved one
folder) and the sane-input checks. Each test reproduces the reported input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from helpers import CrashAfter, run_cli

N, K = 24, 6
SMALL = [
    "sampling.scheme='poisson'",
    "privacy.mechanism='gaussian'",
    f"data.max_users={N}",
    f"sampling.cohort_size={K}",
    "client.max_examples=4",
    "eval.every=0",
    "eval.max_users=2",
    "eval.max_examples_per_user=2",
    "sim.num_workers=1",
    "sim.engine='inprocess'",
]


def _sets(items):
    out = []
    for s in items:
        out += ["--set", s]
    return out


def _eps(z: float, rounds: int) -> float:
    acc = PLDAccountant()
    acc.compose(
        dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(K / N, dp_event.GaussianDpEvent(z)), rounds)
    )
    return acc.get_epsilon(1 / N**1.1)


def test_an_edited_config_toml_cannot_change_the_noise_on_resume(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "run", "--quiet", "--out", str(out), *_sets(SMALL + ["rounds=3", "privacy.noise_multiplier=0.3"])
    )
    assert code == 0, err
    cfg = out / "config.toml"
    cfg.write_text(cfg.read_text().replace("noise_multiplier = 0.3", "noise_multiplier = 3.0"))
    code, _, err = run_cli(capsys, "run", "--resume", str(out), "--set", "rounds=5", "--force", "rounds")
    assert code == 2 and "privacy.noise_multiplier" in err and "cannot change on resume" in err
    assert len(err.strip().splitlines()) == 1
    # the same change by --set is refused too, even when forced
    cfg.write_text(cfg.read_text().replace("noise_multiplier = 3.0", "noise_multiplier = 0.3"))
    code, _, err = run_cli(
        capsys,
        "run",
        "--resume",
        str(out),
        "--set",
        "privacy.noise_multiplier=3.0",
        "--force",
        "privacy.noise_multiplier",
    )
    assert code == 2 and "cannot change on resume" in err
    # growing rounds of independent Gaussian noise is allowed with --force: ε is recomputed honestly
    code, _, err = run_cli(capsys, "run", "--resume", str(out), "--set", "rounds=5")
    assert code == 2 and "--force rounds" in err
    code, _, err = run_cli(capsys, "run", "--quiet", "--resume", str(out), "--set", "rounds=5", "--force", "rounds")
    assert code == 0, err
    ledger = json.loads((out / "ledger.json").read_text())
    assert len(ledger["entries"]) == 5 and ledger["spec"]["noise_multiplier"] == 0.3
    assert ledger["entries"][-1]["epsilon"] == pytest.approx(_eps(0.3, 5), rel=1e-8)


def test_rounds_cannot_change_for_matrix_factorization_noise(capsys, tmp_path):
    out = tmp_path / "mf"
    mf = [s for s in SMALL if "scheme" not in s and "mechanism" not in s and "cohort" not in s] + [
        "sampling.scheme='epochs'",
        "sampling.min_sep=2",
        "privacy.mechanism='blt'",
        "privacy.noise_multiplier=1.0",
        "rounds=2",
    ]
    code, _, err = run_cli(capsys, "run", "--quiet", "--out", str(out), *_sets(mf))
    assert code == 0, err
    code, _, err = run_cli(capsys, "run", "--resume", str(out), "--set", "rounds=4", "--force", "rounds")
    assert code == 2 and "matrix-factorization" in err


def test_a_tampered_checkpoint_config_is_refused(capsys, tmp_path):
    import torch

    out = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "run", "--quiet", "--out", str(out), *_sets(SMALL + ["rounds=2", "privacy.noise_multiplier=1.0"])
    )
    assert code == 0
    path = out / "checkpoint" / "checkpoint.pt"
    ck = torch.load(path, weights_only=False)
    ck["config"]["privacy"]["noise_multiplier"] = 9.0
    torch.save(ck, path)
    code, _, err = run_cli(capsys, "run", "--resume", str(out), "--set", "rounds=3", "--force", "rounds")
    assert code == 2 and "altered" in err


def test_resume_without_a_checkpoint_says_to_start_again(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "run", "--resume", str(tmp_path / "empty"))
    assert code == 2 and "no checkpoint yet" in err and "start the run again" in err


def test_a_second_process_on_the_same_run_folder_is_refused_at_once(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedsim.cli",
            "run",
            "--quiet",
            "--out",
            str(out),
            *_sets(SMALL + ["rounds=40", "privacy.noise_multiplier=1.0"]),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / ".fedsim.lock").exists() or not (out / ".fedsim.lock").read_text().strip():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        t0 = time.monotonic()
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "fedsim.cli",
                "run",
                "--quiet",
                "--out",
                str(out),
                *_sets(SMALL + ["rounds=40", "privacy.noise_multiplier=1.0"]),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - t0
        assert second.returncode == 2 and f"in use by process {first.pid}" in second.stderr, second.stderr
        assert took < 30  # refused before loading any data (a few seconds of interpreter start under load)
        assert first.wait(timeout=600) == 0
    finally:
        if first.poll() is None:
            first.kill()
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 40 and [json.loads(r)["round"] for r in rows] == list(range(1, 41))


def test_sane_privacy_inputs(capsys, tmp_path):
    code, _, err = run_cli(capsys, "privacy", "--population", "848", "--set", "privacy.delta=0.5")
    assert code == 2 and "privacy.delta" in err and "delta_reason" in err
    code, out, err = run_cli(
        capsys,
        "privacy",
        "--population",
        "848",
        "--json",
        "--set",
        "privacy.delta=0.5",
        "--set",
        "privacy.delta_reason='a worked example of a weak guarantee'",
    )
    assert code == 0 and json.loads(out)["delta"] == 0.5
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    code, _, err = run_cli(capsys, "privacy", str(empty), "--population", "100")
    assert code == 2 and "is empty" in err


def test_max_users_above_the_population_is_said(capsys):
    code, out, err = run_cli(capsys, "privacy", "--json", "--set", "data.max_users=100000")
    assert code == 0 and "data.max_users = 100000 exceeds the 848 users" in err


def test_the_default_can_be_shrunk(capsys, tmp_path):
    code, out, err = run_cli(capsys, "privacy", "--population", "10000", "--json")
    assert code == 0 and json.loads(out)["population"] == 10000
    code, out, err = run_cli(
        capsys,
        "run",
        "--quiet",
        "--out",
        str(tmp_path / "small"),
        "--set",
        "data.max_users=40",
        "--set",
        "rounds=3",
        "--set",
        "client.max_examples=4",
        "--set",
        "eval.every=0",
        "--set",
        "sim.num_workers=1",
        "--set",
        "sim.engine='inprocess'",
        "--set",
        "eval.max_users=4",
        "--set",
        "eval.max_examples_per_user=2",
    )
    assert code == 0, err
    summary = json.loads((tmp_path / "small" / "summary.json").read_text())
    assert summary["population"] == 40 and summary["cohort_size"] == pytest.approx(40 / 28)
    assert summary["neighboring_relation"] == "add_or_remove_one"
    assert Path(tmp_path / "small" / "ledger.json").exists()


def test_an_extended_run_that_fails_keeps_no_stale_summary_and_counts_all_wall_time(capsys, tmp_path):
    """A finished 2-round run resumed with ``rounds = 4`` that fails in round 3 must not leave the
    2-round summary (its smaller ε, read by ``fedsim report``) beside a 3-round ledger; the run
    resumed again to the end counts the wall time spent before its checkpoint."""
    import torch

    from fedsim.runner import run_experiment
    from fedsim.runner.resume import resume_config

    out = tmp_path / "grown"
    code, _, err = run_cli(
        capsys, "run", "--quiet", "--out", str(out), *_sets(SMALL + ["rounds=2", "privacy.noise_multiplier=1.0"])
    )
    assert code == 0, err
    old = json.loads((out / "summary.json").read_text())
    assert old["rounds_completed"] == 2
    cfg = resume_config(out, None, ["rounds=4"], ["rounds"])
    with pytest.raises(RuntimeError, match="crash after round 3"):
        run_experiment(cfg, out, progress=False, resume=True, callbacks=[CrashAfter(3)])
    assert not (out / "summary.json").exists(), "the 2-round summary outlived the extension"
    ledger = json.loads((out / "ledger.json").read_text())
    assert len(ledger["entries"]) == 3
    before = torch.load(out / "checkpoint" / "checkpoint.pt", weights_only=False)["wall_seconds"]
    assert before > old["wall_seconds"] * 0.5  # the first process's time is carried, not restarted
    time.sleep(0.3)
    summary = run_experiment(resume_config(out, None, [], []), out, progress=False, resume=True)
    assert summary["rounds_completed"] == 4
    assert summary["wall_seconds"] > before
    assert summary["epsilon"] == pytest.approx(_eps(1.0, 4), rel=1e-9) and summary["epsilon"] > old["epsilon"]
