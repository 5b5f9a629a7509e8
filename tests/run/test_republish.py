"""A round is published once: a crashed run never re-runs a published round whose inputs a
re-run might not reproduce.

The noise of round ``t`` is a function of the key and ``t``. A run that crashed after publishing
round ``t`` and re-ran it from an earlier checkpoint would publish round ``t`` twice with the
same noise. If a reply that was dropped the first time (a timeout, a node's error) arrives the
second time, the difference of the two published rows is that reply's users' contribution,
noise-free. The attack: a round with a node's error between two checkpoints, then a crash.
"""

from __future__ import annotations

import json

import pytest
from helpers import CrashAfter

import fedsim.runner.callbacks as callbacks_module
from fedsim.clients.faults import make_faulty_client_app
from fedsim.config import load_config
from fedsim.runner import run_experiment
from fedsim.runner.callbacks import MetricsFile

BASE = [
    "data.name='synthetic'",
    "data.num_clients=24",
    "model.name='logreg'",
    "sampling.scheme='fixed'",
    "sampling.cohort_size=6",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "clipping.adaptive=true",
    "clipping.count_stddev=2.0",
    "eval.every=0",
    "sim.engine='inprocess'",
    "sim.num_workers=2",
]


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _released(row):
    """A row without its timings (which differ between any two executions)."""
    return {k: v for k, v in row.items() if "seconds" not in k}


def test_a_round_with_a_dropped_reply_is_checkpointed_before_it_is_published_and_never_rerun(tmp_path, monkeypatch):
    saves: list[tuple[int, int]] = []  # (checkpointed round, rows in metrics.jsonl at that moment)
    real_save = callbacks_module.save_checkpoint
    out = tmp_path / "run"

    def recording_save(folder, state):
        path = out / "metrics.jsonl"
        saves.append((state["metrics_rows"], len(path.read_text().splitlines()) if path.exists() else 0))
        return real_save(folder, state)

    monkeypatch.setattr(callbacks_module, "save_checkpoint", recording_save)
    cfg = load_config(None, BASE + ["rounds=6", "checkpoint.every=1000"])
    faulty = make_faulty_client_app({0: "error"}, rounds={3})
    with pytest.raises(RuntimeError, match="crash after round 4"):
        run_experiment(cfg, out, progress=False, client_app=faulty, callbacks=[CrashAfter(4)])
    first = _rows(out)
    assert [r["round"] for r in first] == [1, 2, 3, 4]
    assert first[2]["dropped_replies"] == 1 and not any(r["dropped_replies"] for r in first[:2] + first[3:])
    # round 3 was checkpointed before its row existed anywhere; no other round was (every = 1000)
    assert saves == [(3, 2)]

    # The resumed run starts after round 3: round 3 is not re-run (its node is healthy now, so
    # a re-run would aggregate one more reply under the same noise). Round 4 is re-run, to the
    # row already published.
    monkeypatch.setattr(callbacks_module, "save_checkpoint", real_save)
    run_experiment(cfg, out, progress=False, resume=True)
    rows = _rows(out)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [_released(r) for r in rows[:4]] == [_released(r) for r in first]


def test_a_run_stopped_between_a_checkpoint_and_its_row_resumes_with_that_row(tmp_path, monkeypatch):
    """The checkpoint is written before the row: a run that stops in between has a checkpoint
    one row ahead of ``metrics.jsonl``. The checkpoint keeps the row; the resume writes it."""
    cfg = load_config(None, BASE + ["rounds=4", "checkpoint.every=1"])
    clean = tmp_path / "clean"
    run_experiment(cfg, clean, progress=False)

    real = MetricsFile.on_round_end

    def fails_at_round_2(self, row):
        if row["round"] == 2:
            raise RuntimeError("stopped before the row of round 2")
        real(self, row)

    monkeypatch.setattr(MetricsFile, "on_round_end", fails_at_round_2)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="stopped before the row"):
        run_experiment(cfg, out, progress=False)
    assert len(_rows(out)) == 1
    monkeypatch.setattr(MetricsFile, "on_round_end", real)
    run_experiment(cfg, out, progress=False, resume=True)
    assert [_released(r) for r in _rows(out)] == [_released(r) for r in _rows(clean)]


def test_a_failed_evaluation_reply_is_shown_and_checkpoints_its_round(tmp_path, monkeypatch):
    """The row of a round with a failed evaluation reply says so (it said eval_failed_users: 0
    over a part of the evaluation users) and the round is checkpointed before the row is written."""
    from flwr.clientapp import ClientApp

    from fedsim.clients.client_app import evaluate, train

    def failing_eval(msg, context, call_next):
        if msg.metadata.message_type == "evaluate" and int(context.node_config.get("partition-id", -1)) == 0:
            raise RuntimeError("injected evaluation fault")
        return call_next(msg, context)

    app = ClientApp(mods=[failing_eval])
    app.train()(train)
    app.evaluate()(evaluate)
    saves: list[int] = []
    real_save = callbacks_module.save_checkpoint
    monkeypatch.setattr(
        callbacks_module, "save_checkpoint", lambda f, s: (saves.append(s["metrics_rows"]), real_save(f, s))[1]
    )
    cfg = load_config(
        None, [b for b in BASE if b != "eval.every=0"] + ["eval.every=2", "rounds=3", "checkpoint.every=1000"]
    )
    out = tmp_path / "run"
    run_experiment(cfg, out, progress=False, client_app=app)
    rows = _rows(out)
    assert [r.get("eval_failed_replies") for r in rows] == [None, 1, 1]  # evaluated at rounds 2 and 3
    assert rows[1]["eval_accuracy"] is not None  # the other node's users were evaluated
    assert 2 in saves  # round 2 (not a multiple of checkpoint.every) was checkpointed
