"""The error contract: every user-caused failure is one ``fedsim: error:`` line and exit status 2,
never a traceback — reproduced for each reported input, then fuzzed over the filesystem and
numeric extremes (hypothesis, derandomized: a fixed seed and a fixed budget)."""

from __future__ import annotations

import os
import stat
import time

import pytest
from helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: Inputs the fuzz tests tried (reported by the last test of this module).
TRIED: dict[str, int] = {"filesystem": 0, "numeric": 0}
FUZZ_FS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FUZZ_NUM = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _run(capsys, *args):
    return run_cli(capsys, *args)


def _one_line_error(code, err):
    assert code == 2, (code, err)
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and lines[0].startswith("fedsim: error:"), err
    assert "Traceback" not in err


def test_factorize_dense_20000_is_refused_in_under_5_seconds(capsys):
    t0 = time.perf_counter()
    code, _, err = _run(capsys, "factorize", "--mechanism", "dense", "--rounds", "20000", "--json")
    assert time.perf_counter() - t0 < 5.0
    _one_line_error(code, err)
    assert "blt" in err.lower() or "banded" in err.lower()
    code, _, err = _run(capsys, "factorize", "--mechanism", "dense", "--rounds", "10000000", "--json")
    _one_line_error(code, err)


@pytest.mark.parametrize("kind", ["binary", "directory", "devnull", "empty"])
def test_bad_config_files_give_one_line(capsys, tmp_path, kind):
    path = {"binary": tmp_path / "b.toml", "directory": tmp_path, "devnull": "/dev/null", "empty": tmp_path / "e.toml"}[
        kind
    ]
    if kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    if kind == "empty":
        path.write_text("")
    for cmd in (["privacy", str(path), "--population", "100"], ["run", str(path), "--out", str(tmp_path / "r")]):
        code, _, err = _run(capsys, *cmd)
        _one_line_error(code, err)


@pytest.mark.parametrize("kind", ["file", "devnull", "proc", "readonly"])
def test_bad_out_folders_are_refused_before_any_data_is_loaded(capsys, tmp_path, kind):
    if kind == "readonly" and os.geteuid() == 0:
        pytest.skip("root can write into read-only folders")
    target = {
        "file": tmp_path / "f",
        "devnull": "/dev/null",
        "proc": "/proc/fedsim-run",
        "readonly": tmp_path / "ro" / "run",
    }[kind]
    if kind == "file":
        target.write_text("x")
    if kind == "readonly":
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(stat.S_IRUSR | stat.S_IXUSR)
    t0 = time.perf_counter()
    code, _, err = _run(capsys, "run", "--out", str(target), "--set", "rounds=1")
    _one_line_error(code, err)
    assert time.perf_counter() - t0 < 15  # no data loading or calibration first (was ≈ 18 s)


def test_other_reported_inputs(capsys, tmp_path):
    code, _, err = _run(capsys, "data", "synth", "stackoverflow", "--out", str(tmp_path / "s"), "--per-user", "-3")
    _one_line_error(code, err)
    code, _, err = _run(capsys, "run", "--set", "client.lr=inf")
    _one_line_error(code, err)
    assert "client.lr" in err
    code, out, err = _run(capsys, "data", "experiments/shakespeare_default.toml", "--json")
    assert code == 0 and '"population": 848' in out
    code, _, err = _run(capsys, "report", str(tmp_path / "nothing-here"))
    _one_line_error(code, err)


def test_deploy_certs_with_a_bad_host_leaves_nothing_and_a_retry_works(capsys, tmp_path):
    out = tmp_path / "certs"
    code, _, err = _run(capsys, "deploy", "certs", "--out", str(out), "--host", "bad host!", "--nodes", "1")
    _one_line_error(code, err)
    assert not any(out.iterdir()) if out.exists() else True
    code, _, err = _run(capsys, "deploy", "certs", "--out", str(out), "--host", "localhost", "--nodes", "1")
    assert code == 0, err
    assert (out / "ca.pem").exists()


@FUZZ_FS
@given(
    st.sampled_from(
        [
            "binary",
            "empty",
            "directory",
            "dangling-symlink",
            "garbage-toml",
            "unknown-key",
            "wrong-type",
            "huge-number",
            "nan",
            "deep-table",
        ]
    ),
    st.sampled_from(["privacy", "run", "data"]),
    st.binary(min_size=0, max_size=64),
)
def test_fuzz_filesystem_inputs_keep_the_contract(capsys, tmp_path_factory, kind, command, blob):
    TRIED["filesystem"] += 1
    d = tmp_path_factory.mktemp("fs")
    cfg = d / "c.toml"
    contents = {
        "binary": b"\x00\xff" + blob,
        "empty": b"",
        "garbage-toml": b"[[[" + blob,
        "unknown-key": b"zz = 1\n",
        "wrong-type": b'rounds = "ten"\n',
        "huge-number": b"rounds = 99999999999999999999\n",
        "nan": b"[client]\nlr = nan\n",
        "deep-table": b"[a.b.c.d]\nx = 1\n",
    }
    if kind == "directory":
        cfg = d
    elif kind == "dangling-symlink":
        cfg.symlink_to(d / "missing.toml")
    else:
        cfg.write_bytes(contents[kind])
    args = {
        "privacy": ["privacy", str(cfg), "--population", "100"],
        "run": ["run", str(cfg), "--out", str(d / "run")],
        "data": ["data", "describe", str(cfg)],
    }[command]
    code, _, err = _run(capsys, *args)
    _one_line_error(code, err)
    assert not (d / "run" / "metrics.jsonl").exists()


NUMERIC_KEYS = [
    "rounds",
    "client.lr",
    "client.clip_norm",
    "client.batch_size",
    "sampling.cohort_size",
    "privacy.noise_multiplier",
    "privacy.target_epsilon",
    "privacy.delta",
    "server.lr",
    "seed",
    "data.max_users",
    "eval.every",
    "sim.round_timeout",
]
EXTREMES = ["inf", "-inf", "nan", "1e308", "-1", "0", "-0.0", str(2**63), str(2**64), "1e-320", "'9'", "[]", "{}"]


@FUZZ_NUM
@given(st.sampled_from(NUMERIC_KEYS), st.sampled_from(EXTREMES))
def test_fuzz_numeric_extremes_keep_the_contract(capsys, key, value):
    TRIED["numeric"] += 1
    code, out, err = _run(capsys, "privacy", "--population", "1000", "--json", "--set", f"{key}={value}")
    assert code in (0, 2), (key, value, code, err)
    assert "Traceback" not in err
    if code == 2:
        _one_line_error(code, err)


def test_zz_report_how_many_inputs_the_fuzzers_tried():
    """Runs last in this module: the fuzz budget was spent (prints the counts)."""
    print(f"fuzz inputs tried: {TRIED} (budgets {FUZZ_FS.max_examples} and {FUZZ_NUM.max_examples}, derandomized)")
    assert TRIED["filesystem"] >= 30 and TRIED["numeric"] >= 30
