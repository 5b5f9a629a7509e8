"""The ``fedsim`` command: privacy without training, clean user errors, report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from helpers import run_cli


def test_privacy_json_matches_dp_accounting(capsys):
    code, out, _ = run_cli(
        capsys,
        "privacy",
        "--population",
        "1000",
        "--set",
        "rounds=50",
        "--set",
        "sampling.scheme='poisson'",
        "--set",
        "privacy.mechanism='gaussian'",
        "--set",
        "sampling.cohort_size=20",
        "--set",
        "privacy.noise_multiplier=0.9",
        "--json",
    )
    assert code == 0
    r = json.loads(out)
    assert set(r) >= {
        "epsilon",
        "delta",
        "noise_multiplier",
        "rounds",
        "sampling_rate",
        "population",
        "mechanism",
        "accountant",
    }
    assert r["population"] == 1000 and r["rounds"] == 50 and r["sampling_rate"] == pytest.approx(0.02)
    assert r["delta"] == pytest.approx(1000**-1.1) and r["mechanism"] == "gaussian"
    acc = PLDAccountant()
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.02, dp_event.GaussianDpEvent(0.9)), 50))
    assert r["epsilon"] == pytest.approx(acc.get_epsilon(1000**-1.1), rel=1e-9)


def test_privacy_fixed_scheme_uses_rdp_replace_one(capsys):
    code, out, _ = run_cli(
        capsys,
        "privacy",
        "--population",
        "500",
        "--set",
        "rounds=20",
        "--set",
        "privacy.mechanism='gaussian'",
        "--set",
        "sampling.scheme='fixed'",
        "--set",
        "sampling.cohort_size=25",
        "--set",
        "privacy.noise_multiplier=1.1",
        "--set",
        "privacy.delta=1e-5",
        "--json",
    )
    r = json.loads(out)
    assert code == 0 and r["accountant"] == "rdp" and r["neighboring_relation"] == "replace_one"
    assert r["sensitivity_in_c"] == 2.0  # replace-one: the sum moves by up to 2c
    from dp_accounting import NeighboringRelation

    acc = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    acc.compose(
        dp_event.SelfComposedDpEvent(
            dp_event.SampledWithoutReplacementDpEvent(500, 25, dp_event.GaussianDpEvent(1.1 / 2)), 20
        )
    )
    assert r["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_privacy_target_epsilon_calibrates(capsys):
    code, out, _ = run_cli(
        capsys,
        "privacy",
        "--population",
        "848",
        "--set",
        "rounds=30",
        "--set",
        "sampling.scheme='poisson'",
        "--set",
        "privacy.mechanism='gaussian'",
        "--set",
        "sampling.cohort_size=30",
        "--target-epsilon",
        "3",
        "--json",
    )
    r = json.loads(out)
    assert code == 0
    assert r["epsilon"] <= 3.0 and r["epsilon"] > 2.9
    assert r["noise_multiplier"] > 0


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--set", "client.lrr=1"], "client.lrr"),
        (["--set", "sampling.scheme='stratified'"], "sampling.scheme"),
        (["--set", "rounds=0"], "rounds"),
        (["--set", "sampling.cohort_size=5000"], "sampling.cohort_size"),
    ],
)
def test_bad_config_exits_2_with_message(capsys, args, needle):
    code, _, err = (
        run_cli(capsys, "privacy", "--population", "1000", *args, "--json")
        if needle != "sampling.cohort_size"
        else run_cli(capsys, "privacy", "--population", "1000", *args)
    )
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_missing_config_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "privacy", str(tmp_path / "nope.toml"), "--population", "10")
    assert code == 2 and "nope.toml" in err


def test_run_refuses_bad_config_without_starting(tmp_path):
    """A broken config never starts a run: no run folder, exit 2, no traceback."""
    out = tmp_path / "never"
    p = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "run", "--set", "server.optimizer='adamw'", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert "server.optimizer" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


def test_help_lists_commands(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for cmd in ("run", "privacy", "report", "data"):
        assert cmd in out


def test_report_command(capsys, tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    rows = [
        {
            "round": i,
            "epsilon": 0.1 * i,
            "train_loss": 3.0,
            "eval_accuracy": 0.2 + 0.01 * i,
            "eval_loss": 2.0,
            "dropped_updates": 0,
            "cohort_size": 5,
            "seconds": 1.0,
        }
        for i in (1, 2, 3)
    ]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "summary.json").write_text(
        json.dumps(
            {
                "name": "toy",
                "final_eval_accuracy": 0.23,
                "epsilon": 0.3,
                "delta": 1e-3,
                "noise_multiplier": 1.0,
                "mechanism": "gaussian",
                "rounds_completed": 3,
                "population": 10,
                "model_sha256": "x",
                "wall_seconds": 3.0,
            }
        )
    )
    code, out, _ = run_cli(capsys, "report", str(run), "--json")
    assert code == 0
    table = json.loads(out)
    assert table[0]["best_eval_accuracy"] == pytest.approx(0.23)
    assert (run / "plots" / "accuracy.png").exists() and (run / "plots" / "epsilon.png").exists()


def test_factorize_json_matches_closed_forms(capsys):
    import math

    n = 16
    code, out, _ = run_cli(capsys, "factorize", "--mechanism", "identity", "--rounds", str(n), "--json")
    r = json.loads(out)
    assert code == 0 and r["sensitivity"] == 1.0 and r["sensitivity_exact"] is True
    assert r["loss"] == pytest.approx(n * (n + 1) / 2, rel=1e-12)
    assert r["max_error"] == pytest.approx(n) and r["final_error"] == pytest.approx(n)

    # sqrt: C = S^{1/2} Toeplitz with r_k = binom(2k, k)/4^k, so B = S·C⁻¹ = C;
    # sens² = Σ r_k² (column 0), ‖B‖_F² = Σ_k (n − k) r_k², last row ‖B[n−1,:]‖² = Σ r_k².
    rk = [math.comb(2 * k, k) / 4**k for k in range(n)]
    s2 = sum(x * x for x in rk)
    code, out, _ = run_cli(capsys, "factorize", "--mechanism", "sqrt", "--rounds", str(n), "--json")
    r = json.loads(out)
    assert r["sensitivity"] == pytest.approx(math.sqrt(s2), rel=1e-12)
    assert r["loss"] == pytest.approx(s2 * sum((n - k) * rk[k] ** 2 for k in range(n)), rel=1e-10)
    assert r["final_error"] == pytest.approx(s2 * s2, rel=1e-10)

    # tree: sensitivity² = log₂ n + 1; the online estimator's last prefix sum uses one node.
    code, out, _ = run_cli(capsys, "factorize", "--mechanism", "tree", "--rounds", str(n), "--json")
    r = json.loads(out)
    assert r["sensitivity"] ** 2 == pytest.approx(math.log2(n) + 1, rel=1e-12)
    assert r["final_error"] == pytest.approx(math.log2(n) + 1, rel=1e-12)

    # identity under epochs (k = 4, b = 4): sens = √k exactly.
    code, out, _ = run_cli(
        capsys,
        "factorize",
        "--mechanism",
        "identity",
        "--rounds",
        str(n),
        "--scheme",
        "epochs",
        "--min-sep",
        "4",
        "--json",
    )
    r = json.loads(out)
    assert r["max_participations"] == 4 and r["sensitivity"] == pytest.approx(2.0)


def test_factorize_dense_device_flag(capsys):
    """--device runs the dense optimiser in torch (the GPU path with cuda); on the CPU it gives
    numpy's loss; an unusable device is a clear error, not a traceback."""
    code, out, _ = run_cli(capsys, "factorize", "--mechanism", "dense", "--rounds", "32", "--json")
    ref = json.loads(out)
    code2, out2, _ = run_cli(capsys, "factorize", "--mechanism", "dense", "--rounds", "32", "--device", "cpu", "--json")
    got = json.loads(out2)
    assert code == code2 == 0 and got["loss"] == pytest.approx(ref["loss"], rel=1e-10)
    # the same solve is on the disk cache now: a bad device is still refused, not skipped
    assert run_cli(capsys, "factorize", "--mechanism", "dense", "--rounds", "8", "--json")[0] == 0
    code3, _, err = run_cli(capsys, "factorize", "--mechanism", "dense", "--rounds", "8", "--device", "warp", "--json")
    assert code3 != 0 and "torch device" in err


@pytest.mark.parametrize("mech", [["privacy.mechanism='dense'"], ["privacy.mechanism='banded'", "privacy.bands=4"]])
def test_privacy_refuses_what_a_run_refuses(capsys, mech):
    """Amplified MF (Poisson inside min_sep groups) holds only for a C with at most min_sep bands;
    ``fedsim privacy`` printed the amplified ε for a dense or 4-banded C that ``fedsim run``
    refuses. It now makes the run's checks and prints no ε."""
    sets = [
        "rounds=8",
        "sampling.scheme='min_sep'",
        "sampling.min_sep=2",
        "sampling.poisson_within_group=true",
        "sampling.cohort_size=10",
        "privacy.noise_multiplier=1.0",
        *mech,
    ]
    args = ["privacy", "--population", "60"]
    for s in sets:
        args += ["--set", s]
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and "ε =" not in out
    assert "min_sep" in err


def test_sweep_refuses_out_with_resume(capsys, tmp_path):
    """``--resume DIR`` finishes the sweep in DIR; an ``--out`` beside it was silently ignored."""
    spec = tmp_path / "s.toml"
    spec.write_text("[sweep]\nseeds = [0]\n")
    code, _, err = run_cli(capsys, "sweep", str(spec), "--resume", str(tmp_path / "a"), "--out", str(tmp_path / "b"))
    assert code == 2 and "drop --out" in err
