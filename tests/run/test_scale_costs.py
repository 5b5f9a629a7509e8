"""Per-round costs that must not grow with the population or the rounds (issue 46): the
checkpoint hashes the population once per run, and its time is part of the round's ``seconds``."""

from __future__ import annotations

import json
import time

import pytest
from helpers import CrashAfter

import fedsim.runner.callbacks as callbacks
from fedsim.config import DEFAULT_EXPERIMENT, load_config
from fedsim.privacy.noise import TABLE_PREFIX
from fedsim.runner import run_experiment

from .test_run_integrity import SMALL as INTEGRITY_SMALL
from .test_run_integrity import N

SMALL = [*INTEGRITY_SMALL, "rounds=4", "checkpoint.every=1"]


@pytest.mark.slow  # 20-40 s of runs with resumes; make test-slow
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


@pytest.mark.slow  # 20-40 s of runs with resumes; make test-slow
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


DENSE = [
    *INTEGRITY_SMALL[2:],
    "rounds=6",
    "privacy.mechanism='dense'",
    "sampling.scheme='epochs'",
    "sampling.min_sep=2",
    "checkpoint.every=2",
    "privacy.noise_memory_mib=1",  # Z's 6 rows of the model do not fit: the noise table is used
]


class TableWatch(CrashAfter):
    """Records, after every round, where noise tables are in the run folder (and may crash)."""

    def __init__(self, r: int = 0) -> None:
        super().__init__(r)
        self.seen: list[list[str]] = []

    def on_start(self, run, out, resumed):
        self.out = out

    def on_round_end(self, row):
        self.seen.append(sorted(str(p.relative_to(self.out)) for p in self.out.rglob(TABLE_PREFIX + "*")))
        super().on_round_end(row)


def _tables(out):
    return list(out.rglob(TABLE_PREFIX + "*"))


@pytest.mark.slow  # three short dense-MF runs: about 50 s on a loaded 2-core machine
def test_the_noise_table_lives_only_in_checkpoint_while_the_run_runs_and_a_resume_is_bit_identical(tmp_path):
    whole = TableWatch()
    a = run_experiment(load_config(DEFAULT_EXPERIMENT, DENSE), tmp_path / "a", progress=False, callbacks=[whole])
    assert len(whole.seen) == 6 and all(len(s) == 1 and s[0].startswith("checkpoint/") for s in whole.seen)
    assert any("table in the run's checkpoint/" in note for note in a["notes"])  # said in the header
    table = tmp_path / "a" / whole.seen[0][0]
    assert not table.exists() and not _tables(tmp_path)  # deleted at the end
    crash = TableWatch(3)
    with pytest.raises(RuntimeError, match="crash after round 3"):
        run_experiment(load_config(DEFAULT_EXPERIMENT, DENSE), tmp_path / "b", progress=False, callbacks=[crash])
    assert len(crash.seen) == 3 and not _tables(tmp_path)  # deleted when the run fails too
    b = run_experiment(load_config(DEFAULT_EXPERIMENT, DENSE), tmp_path / "b", progress=False, resume=True)
    assert b["model_sha256"] == a["model_sha256"] and b["epsilon"] == a["epsilon"]
    assert not _tables(tmp_path)
