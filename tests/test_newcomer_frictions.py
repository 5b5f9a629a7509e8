"""The newcomer review's failing cases (issue 35), each as a user met it: a command that was
silently wrong, unclear or slow, and what it says or does now."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_cli

from fedsim.config import load_config
from fedsim.errors import FedsimError

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "data.name='synthetic'",
    "data.num_clients=12",
    "model.name='logreg'",
    "sampling.scheme='poisson'",
    "sampling.cohort_size=4",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "rounds=2",
    "eval.every=0",
    "sim.engine='inprocess'",
    "sim.num_workers=1",
]


def _sets(items):
    return [a for s in items for a in ("--set", s)]


def test_a_typo_in_a_sweep_metric_is_refused_with_the_likely_name(tmp_path):
    from fedsim.runner.sweep import load_spec

    spec = tmp_path / "spec.toml"
    spec.write_text('[sweep]\nmetric = "final_eval_acuracy"\n')
    with pytest.raises(FedsimError, match="did you mean 'final_eval_accuracy'"):
        load_spec(spec)


def test_sweep_set_overrides_every_trial_after_the_spec(tmp_path):
    from fedsim.runner.sweep import load_spec

    spec = tmp_path / "spec.toml"
    spec.write_text('[sweep]\nset = ["rounds=10"]\n')
    loaded, _ = load_spec(spec, ["rounds=2"])
    assert loaded.set == ["rounds=10", "rounds=2"]


def test_data_synth_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    run = tmp_path / "a-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    code, _, err = run_cli(capsys, "data", "synth", "stackoverflow", "--out", str(run), "--users", "4")
    assert code == 2 and "is not empty" in err
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


def test_an_invalid_force_key_is_refused_even_when_nothing_changed():
    from fedsim.runner.resume import check_resume

    cfg = load_config(None, SMALL)
    for key, why in (
        ("privacy.noise_multiplier", "cannot change on resume"),
        ("sim.num_wrokers", "no such config key"),
    ):
        with pytest.raises(FedsimError, match=why):
            check_resume(cfg, cfg, [key], "the command line")


def test_resuming_with_another_experiment_names_the_key_that_cannot_change_first():
    """Another experiment's config differs in `name` (forceable) and in keys that never change:
    the message names one of those, not `--force name`, which would only lead to a second refusal."""
    from fedsim.runner.resume import check_resume

    stored = load_config(None, SMALL + ["name='mine'"])
    other = load_config(None, SMALL + ["name='theirs'", "privacy.noise_multiplier=2.0"])
    with pytest.raises(FedsimError) as e:
        check_resume(stored, other, [], "the command line")
    assert "privacy.noise_multiplier" in str(e.value) and "--force name" not in str(e.value)


def test_audit_lists_every_attack_it_knows(capsys):
    code, _, err = run_cli(capsys, "audit", "--attack", "membership")
    assert code == 2 and "allowed are gradient, one-run, canary, user-inference" in err


def test_a_folder_with_rows_and_no_checkpoint_gets_one_consistent_advice(tmp_path):
    from fedsim.runner import run_experiment
    from fedsim.runner.resume import load_stored_config

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1}\n')
    with pytest.raises(FedsimError, match="1 round.s. ran but none was checkpointed.*Remove the folder"):
        load_stored_config(out)
    with pytest.raises(FedsimError, match="remove it first .it has no checkpoint"):
        run_experiment(load_config(None, SMALL), out, progress=False)


def test_a_finished_run_leaves_no_lock_file_and_a_failed_start_no_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(capsys, "run", "--out", str(out), "--quiet", *_sets(SMALL))
    assert code == 0 and not (out / ".fedsim.lock").exists()
    assert f"run folder: {out} (plots and a table: fedsim report {out})" in stdout  # done: names the next step
    bad = tmp_path / "never"
    code, _, err = run_cli(capsys, "run", "--out", str(bad), *_sets(SMALL + ["sampling.cohort_size=40"]))
    assert code == 2 and not bad.exists()


def test_privacy_reports_the_factorization_s_sensitivity(capsys):
    code, stdout, _ = run_cli(capsys, "privacy", "--json", "--population", "848")
    report = json.loads(stdout)
    assert code == 0 and report["mechanism"] == "blt"
    assert report["sensitivity_in_c"] == pytest.approx(4.0669, abs=1e-3) and report["sensitivity_exact"] is True


def test_the_progress_line_says_mf_noise_is_accounted_for_the_whole_run(tmp_path, capsys):
    from fedsim.runner import run_experiment

    cfg = load_config(
        None,
        [s for s in SMALL if "scheme" not in s and "mechanism" not in s and "cohort" not in s]
        + ["privacy.mechanism='banded'", "sampling.scheme='min_sep'", "sampling.min_sep=2"],
    )
    run_experiment(cfg, tmp_path / "run", progress=True)
    printed = capsys.readouterr()
    assert "(add/remove one user; MF noise: the whole run's ε from round 1)" in printed.out + printed.err


def test_help_and_version_answer_without_importing_torch():
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from fedsim.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print(time.perf_counter() - t, file=sys.stderr)\n"
    )
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout and "experiments" in r.stdout and "factorize" in r.stdout
    v = subprocess.run([sys.executable, "-m", "fedsim.cli", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert v.stdout.startswith("fedsim ") and time.perf_counter() - t0 < 60


def test_far_more_ray_workers_than_cpus_is_refused_before_anything_starts():
    """--set sim.num_workers=1000 on 2 CPUs never finished round 1 (Ray was told it had 1000 CPUs)."""
    import os

    from fedsim.runner.build import MAX_WORKERS_PER_CPU, num_workers

    cpus = len(os.sched_getaffinity(0))
    too_many = MAX_WORKERS_PER_CPU * cpus + 1
    with pytest.raises(FedsimError, match=f"sim.num_workers = {too_many}: .*Lower sim.num_workers"):
        num_workers(load_config(None, [f"sim.num_workers={too_many}", "sim.engine='ray'"]))
    assert num_workers(load_config(None, [f"sim.num_workers={too_many}", "sim.engine='inprocess'"])) == too_many
    assert (
        num_workers(load_config(None, [f"sim.num_workers={MAX_WORKERS_PER_CPU * cpus}"])) == MAX_WORKERS_PER_CPU * cpus
    )


def test_json_changes_what_data_and_factorize_print(capsys):
    """--json made no difference on data describe/show/stats and factorize (both printed JSON)."""
    args = ("data", "describe", *_sets(["data.name='synthetic'", "data.num_clients=6", "model.name='logreg'"]))
    code, text, _ = run_cli(capsys, *args)
    assert code == 0 and "population: 6" in text and not text.lstrip().startswith("{")
    code, out, _ = run_cli(capsys, *args, "--json")
    assert code == 0 and json.loads(out)["population"] == 6
    fargs = ("factorize", "--mechanism", "banded", "--rounds", "8", "--scheme", "min_sep", "--min-sep", "4")
    code, text, _ = run_cli(capsys, *fargs)
    assert code == 0 and "sensitivity: 1.41421" in text
    code, out, _ = run_cli(capsys, *fargs, "--json")
    assert json.loads(out)["sensitivity"] == pytest.approx(2**0.5)


def test_every_argument_shows_its_help_text():
    """Typer 0.20 with click ≥ 8.3 printed blank help for every positional argument (CONFIG,
    SPEC, RUN_DIRS, NAME); the CLI restores it."""
    import typer.main

    from fedsim.cli import app

    root = typer.main.get_command(app)
    missing = []
    for group_name, group in [("", root), *((n, c) for n, c in root.commands.items() if hasattr(c, "commands"))]:
        for name, cmd in getattr(group, "commands", {}).items():
            for p in cmd.params:
                if p.param_type_name == "argument" and not getattr(p, "help", None):
                    missing.append(f"{group_name} {name} {p.name}".strip())
    assert not missing, missing
    r = subprocess.run([sys.executable, "-m", "fedsim.cli", "run", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert "Experiment TOML" in r.stdout
