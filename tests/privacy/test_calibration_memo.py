"""The calibrated z remembered across processes (fedsim.privacy.calibration_memo), the BLT
parameters remembered on disk, and `fedsim privacy` without the training stack.

The memo may only save time: a remembered z is used after ε at it is recomputed with
dp-accounting and found at most the target, so a planted z that would overshoot the target is
recomputed, and the printed ε is always a fresh dp-accounting number."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from fedsim.privacy import calibration_memo
from fedsim.privacy.accounting import AccountingSpec, _search_noise_multiplier, calibrate_noise_multiplier, epsilon

#: A cheap spec: MF noise over the run is one Gaussian event, accounted with RDP (milliseconds
#: a search; the PLD path differs only in the accountant the search calls).
SPEC = AccountingSpec(
    mechanism="blt",
    scheme="epochs",
    population=1000,
    cohort_size=50.0,
    noise_multiplier=0.0,
    delta=1e-4,
    accountant="rdp",
)
ROUNDS, TARGET = 40, 3.0


@pytest.fixture
def memo(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path))
    monkeypatch.delenv("FEDSIM_NO_CALIBRATION_MEMO", raising=False)
    key = calibration_memo.memo_key(SPEC.to_dict(), ROUNDS, TARGET)
    return key, calibration_memo._path(key)


def test_the_remembered_z_is_the_searched_z_bit_for_bit(memo):
    key, path = memo
    searched = _search_noise_multiplier(SPEC, ROUNDS, TARGET)
    first = calibrate_noise_multiplier(SPEC, ROUNDS, TARGET)
    assert first == searched and path.exists()
    assert json.loads(path.read_text())["noise_multiplier"] == searched
    second = calibrate_noise_multiplier(SPEC, ROUNDS, TARGET)  # from the file
    assert second == searched
    assert epsilon(replace(SPEC, noise_multiplier=second), ROUNDS) <= TARGET


def test_a_planted_z_that_overshoots_the_target_is_not_used(memo):
    """The attack: a memo file (stale, copied, or edited) holding a z half the calibrated one,
    which would give a larger ε than the target. It is detected by the fresh ε and recomputed."""
    key, path = memo
    honest = _search_noise_multiplier(SPEC, ROUNDS, TARGET)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "noise_multiplier": honest / 2}))
    assert epsilon(replace(SPEC, noise_multiplier=honest / 2), ROUNDS) > TARGET  # the plant would lie
    assert calibrate_noise_multiplier(SPEC, ROUNDS, TARGET) == honest
    assert json.loads(path.read_text())["noise_multiplier"] == honest  # and the file is corrected


@pytest.mark.parametrize("content", ["not json", json.dumps({"key": {"other": 1}, "noise_multiplier": 9.0}), "{}"])
def test_an_unreadable_or_foreign_memo_is_recomputed(memo, content):
    key, path = memo
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    assert calibration_memo.recall(key) is None
    assert calibrate_noise_multiplier(SPEC, ROUNDS, TARGET) == _search_noise_multiplier(SPEC, ROUNDS, TARGET)


def test_every_input_of_the_search_is_in_the_key():
    base = calibration_memo.memo_key(SPEC.to_dict(), ROUNDS, TARGET)
    variants = [
        calibration_memo.memo_key(replace(SPEC, delta=2e-4).to_dict(), ROUNDS, TARGET),
        calibration_memo.memo_key(replace(SPEC, population=1001).to_dict(), ROUNDS, TARGET),
        calibration_memo.memo_key(replace(SPEC, accountant="pld").to_dict(), ROUNDS, TARGET),
        calibration_memo.memo_key(SPEC.to_dict(), ROUNDS + 1, TARGET),
        calibration_memo.memo_key(SPEC.to_dict(), ROUNDS, TARGET + 1e-9),
    ]
    assert len({calibration_memo._path(k) for k in [base, *variants]}) == 6
    # z itself is not an input: the search ignores it
    assert calibration_memo.memo_key(replace(SPEC, noise_multiplier=5.0).to_dict(), ROUNDS, TARGET) == base
    assert base["dp_accounting"] and base["search"] == calibration_memo.SEARCH_VERSION


def test_the_memo_can_be_turned_off(memo, monkeypatch):
    key, path = memo
    monkeypatch.setenv("FEDSIM_NO_CALIBRATION_MEMO", "1")
    calibrate_noise_multiplier(SPEC, ROUNDS, TARGET)
    assert not path.exists()


def test_blt_parameters_are_remembered_exactly_and_a_foreign_file_is_recomputed(tmp_path, monkeypatch):
    from fedsim.privacy.factorizations import cache_dir
    from fedsim.privacy.mechanisms.blt import optimize_blt, remembered_blt

    monkeypatch.setenv("FEDSIM_CACHE", str(tmp_path))
    theta0, omega0, _ = optimize_blt(24, 2, max_participations=2, min_sep=12)
    theta1, omega1, info1 = remembered_blt(24, 2, 2, 12, "total")
    theta2, omega2, info2 = remembered_blt(24, 2, 2, 12, "total")
    assert (info1["cache"], info2["cache"]) == ("miss", "hit")
    for got in (theta1, theta2):
        np.testing.assert_array_equal(got, theta0)
    for got in (omega1, omega2):
        np.testing.assert_array_equal(got, omega0)
    (path,) = cache_dir().glob("blt-*.npz")
    with np.load(path) as data:
        info = json.loads(str(data["info"]))
    info["cache_key"] = "someone else's"
    np.savez(path, theta=theta0 / 2, omega=omega0, info=np.array(json.dumps(info)))
    theta3, _, info3 = remembered_blt(24, 2, 2, 12, "total")
    assert info3["cache"] == "miss"
    np.testing.assert_array_equal(theta3, theta0)


def test_fedsim_privacy_answers_without_torch_flower_ray_or_datasets_once_built(tmp_path):
    """The default experiment's `fedsim privacy` (its RDP accountant here, to keep the test
    short), in fresh interpreters sharing one cache: the first builds the corpus, calibrates
    and remembers; the second prints the same JSON (ε, z, sens(C), N) without importing the
    training stack (the import set pins the ≤ 2 s of CPU)."""
    import os
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from fedsim.cli import main\n"
        "try:\n"
        "    main(['privacy', '--json', '--set', 'privacy.accountant=rdp'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "heavy = sorted(m for m in ('torch', 'flwr', 'ray', 'datasets', 'flwr_datasets', 'pandas', 'matplotlib')\n"
        "    if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy}))\n"
    )
    env = dict(os.environ, FEDSIM_CACHE=str(tmp_path / "cache"))
    env.pop("FEDSIM_NO_CALIBRATION_MEMO", None)
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.strip().splitlines()
        runs.append((json.loads(lines[0]), json.loads(lines[-1])["heavy"]))
    (first, _), (second, heavy) = runs
    assert second == first
    assert heavy == []
    assert first["mechanism"] == "blt" and first["epsilon"] <= 8.0
