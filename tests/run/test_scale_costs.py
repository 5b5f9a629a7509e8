"""Per-round costs that must not grow with the population or the rounds (issue 46): the
checkpoint hashes the population once per run, and its time is part of the round's ``seconds``."""

from __future__ import annotations

import json
import time

import fedsim.runner.callbacks as callbacks
from fedsim.config import DEFAULT_EXPERIMENT, load_config
from fedsim.runner import run_experiment

from .test_run_integrity import SMALL as INTEGRITY_SMALL
from .test_run_integrity import N

SMALL = [*INTEGRITY_SMALL, "rounds=4", "checkpoint.every=1"]


def test_the_population_is_hashed_once_per_run_not_per_checkpoint(tmp_path, monkeypatch):
    calls = []
    real = callbacks.population_sha256

    def counting(names):
        calls.append(len(names))
        return real(names)

    monkeypatch.setattr(callbacks, "population_sha256", counting)
    run_experiment(load_config(DEFAULT_EXPERIMENT, SMALL), tmp_path / "run", progress=False)
    assert calls == [N]  # four checkpoints, one digest
    # the digest written is the population's: a resume checks it against the users it runs on
    cfg = load_config(DEFAULT_EXPERIMENT, [s if s != "rounds=4" else "rounds=5" for s in SMALL])
    run_experiment(cfg, tmp_path / "run", progress=False, resume=True)
    assert calls == [N, N, N]  # the resume check, then once for the resumed run


def test_a_rounds_seconds_include_its_checkpoint(tmp_path, monkeypatch):
    real = callbacks.save_checkpoint
    pause = 0.3

    def slow_save(folder, state):
        time.sleep(pause)
        return real(folder, state)

    monkeypatch.setattr(callbacks, "save_checkpoint", slow_save)
    run_experiment(load_config(DEFAULT_EXPERIMENT, SMALL), tmp_path / "run", progress=False)
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["seconds"] >= pause for r in rows)
