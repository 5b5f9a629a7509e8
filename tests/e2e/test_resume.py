"""Crash and resume: SIGKILL `fedsim run` after round 3 of 6, resume, compare bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsim.errors import FedsimError

pytestmark = pytest.mark.e2e

SETTINGS = [
    "rounds=6",
    "sampling.scheme='poisson'",
    "privacy.mechanism='gaussian'",
    "data.max_users=24",
    "sampling.cohort_size=6",
    "client.max_examples=8",
    "eval.every=2",
    "eval.max_users=6",
    "eval.max_examples_per_user=4",
    "sim.num_workers=2",
    "privacy.noise_multiplier=1.0",
    "checkpoint.every=1",
]


#: Extra settings per variant: every stateful piece must resume bit-identically. The Gaussian variant
#: runs on Ray (two workers); the others on the in-process engine, which gives the same numbers
#: (tests/run/test_engines.py) without starting Ray three more times.
INPROCESS = "sim.num_workers=1"
VARIANTS = {
    "gaussian": [],
    # adaptive clip norm + its count-noise stream, DiSK's d_{t-1}, AdamBC moments and φ, filter trace
    "adaptive-disk-adambc": [
        "clipping.adaptive=true",
        "clipping.count_stddev=2.0",
        "filter.name='disk'",
        "server.optimizer='adambc'",
        "filter.trace_coordinates=8",
        INPROCESS,
    ],
    # client error-feedback states, BLT MF noise buffers (epochs), DOPPLER history
    "ef-blt-doppler": [
        "client.error_feedback='client'",
        "sampling.scheme='epochs'",
        "sampling.min_sep=3",
        "sampling.cohort_size=8",
        "privacy.mechanism='blt'",
        "filter.name='doppler'",
        "server.optimizer='sgd'",
        INPROCESS,
    ],
    # banded MF noise (its ring of the last b − 1 rows) under keyed min_sep with Poisson thinning
    "banded-min-sep": [
        "sampling.scheme='min_sep'",
        "sampling.min_sep=3",
        "sampling.poisson_within_group=true",
        "sampling.cohort_size=6",
        "privacy.mechanism='banded'",
        "privacy.bands=3",
        INPROCESS,
    ],
}


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedsim.cli", "run", "--quiet", *args]


def _sets(variant: str = "gaussian") -> list[str]:
    out = []
    for s in SETTINGS + VARIANTS[variant]:
        out += ["--set", s]
    return out


def _rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sigkill_then_resume_is_bit_identical(tmp_path, variant):
    crashed, clean = tmp_path / "crashed", tmp_path / "clean"
    proc = subprocess.Popen(
        _cmd(*_sets(variant), "--out", str(crashed)),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if (crashed / "metrics.jsonl").exists() and len(_rows(crashed)) >= 3:
                break
            if proc.poll() is not None:
                pytest.fail(f"run ended before round 3: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
        else:
            pytest.fail("run did not reach round 3 in time")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (crashed / "summary.json").exists()
    assert len(_rows(crashed)) < 6

    r = subprocess.run(_cmd("--resume", str(crashed)), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(_cmd(*_sets(variant), "--out", str(clean)), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    a, b = json.loads((crashed / "summary.json").read_text()), json.loads((clean / "summary.json").read_text())
    assert a["model_sha256"] == b["model_sha256"]
    assert a["rounds_completed"] == b["rounds_completed"] == 6
    assert _strip(_rows(crashed)) == _strip(_rows(clean))
    la, lb = json.loads((crashed / "ledger.json").read_text()), json.loads((clean / "ledger.json").read_text())
    assert la == lb
    if (clean / "filter_trace.npz").exists():
        import numpy as np

        ta, tb = np.load(crashed / "filter_trace.npz"), np.load(clean / "filter_trace.npz")
        assert all(np.array_equal(ta[k], tb[k]) for k in ("index", "before", "after"))
        assert ta["before"].shape[0] == 6


def test_resume_refuses_privacy_relevant_changes(tmp_path):
    from fedsim.config import load_config
    from fedsim.runner.resume import check_resume

    stored = load_config(None, SETTINGS)
    with pytest.raises(FedsimError, match="client.clip_norm"):
        check_resume(stored, load_config(None, SETTINGS + ["client.clip_norm=2.0"]), [], "--set")
    with pytest.raises(FedsimError, match="cannot change"):
        check_resume(
            stored,
            load_config(None, SETTINGS + ["privacy.noise_multiplier=0.5"]),
            ["privacy.noise_multiplier"],
            "--set",
        )
    check_resume(stored, load_config(None, SETTINGS + ["sim.num_workers=1"]), ["sim.num_workers"], "--set")
