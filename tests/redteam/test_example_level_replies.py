"""Red team, issue 34 finding 3: under example-level DP each silo's reply carried the exact mean
training loss and the number of examples its Poisson batches took, and evaluation ran on its
held-out records, none of it covered by DP-SGD noise; ``publish_side_statistics = false`` did
not stop them being sent. If the server is outside a silo's trust boundary, each is a release.

The attack reads every message as it crosses the wire (a ClientApp mod on the real Message API).
"""

from __future__ import annotations

import json

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

from fedsim import protocol
from fedsim.clients.client_app import evaluate, train
from fedsim.config import load_config
from fedsim.errors import FedsimError
from fedsim.runner import run_experiment

BASE = [
    "data.name='synthetic'",
    "data.num_clients=12",
    "model.name='logreg'",
    "sampling.scheme='poisson'",
    "sampling.cohort_size=6",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "privacy.unit='example'",
    "privacy.example_noise_multiplier=1.0",
    "client.batch_size=8",
    "client.max_examples=16",
    "eval.every=1",
    "rounds=2",
    "sim.engine='inprocess'",
    "sim.num_workers=1",
]

#: what a silo's reply may carry without trusting the server: the update, the ids it was sent,
#: and counts that are functions of the DP-SGD output (clipped, non-finite) or of a failure
ALLOWED_METRICS = {"num_users", "user_ids", "num_clipped", "failed_users", "nonfinite_users", "code_failed_users"}


def _wiretap():
    seen: list[tuple[str, str, set[str]]] = []  # (direction, message type, metric keys)

    def mod(msg, context, call_next):
        seen.append(("down", msg.metadata.message_type, set()))
        reply = call_next(msg, context)
        metrics = reply.content.metric_records.get(protocol.METRICS) if not reply.has_error() else None
        seen.append(("up", msg.metadata.message_type, set(metrics.keys()) if metrics is not None else set()))
        return reply

    app = ClientApp(mods=[mod])
    app.train()(train)
    app.evaluate()(evaluate)
    return app, seen


def _run(tmp_path, extra, capsys):
    app, seen = _wiretap()
    out = tmp_path / "run"
    summary = run_experiment(load_config(None, BASE + extra), out, progress=True, client_app=app)
    printed = capsys.readouterr().out
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, rows, seen, printed


def test_silos_withhold_statistics_of_their_records_by_default(tmp_path, capsys):
    summary, rows, seen, printed = _run(tmp_path, [], capsys)
    ups = [keys for direction, kind, keys in seen if direction == "up"]
    assert ups and all(kind == "train" for _, kind, _ in seen), "no evaluation message may reach a silo"
    for keys in ups:
        assert keys <= ALLOWED_METRICS, keys - ALLOWED_METRICS
    assert all(r["train_loss"] is None and r["train_examples"] is None for r in rows)
    assert all(r["eval_accuracy"] is None for r in rows)
    assert summary["silo_statistics"]["sent_to_server"] is False
    assert summary["majority_baseline_accuracy"] is None
    assert "privacy.silo_statistics = 'withhold'" in printed


def test_a_config_that_trusts_the_server_sends_them_and_says_so(tmp_path, capsys):
    summary, rows, seen, printed = _run(tmp_path, ["privacy.silo_statistics='send'"], capsys)
    train_ups = [keys for direction, kind, keys in seen if direction == "up" and kind == "train"]
    assert all({"user_loss", "user_examples"} <= keys for keys in train_ups)
    assert any(kind == "evaluate" for _, kind, _ in seen)
    assert rows[-1]["train_loss"] is not None and rows[-1]["eval_accuracy"] is not None
    assert summary["silo_statistics"]["sent_to_server"] is True
    assert "privacy.silo_statistics = 'send'" in printed


def test_a_silo_refuses_an_evaluation_its_task_withholds():
    """A server that sends an evaluation message anyway gets an error reply, not the statistic."""
    from fedsim.runner import build_run

    run = build_run(load_config(None, BASE))
    from flwr.app import Context, Metadata

    md = Metadata(
        run_id=1,
        message_id="m",
        src_node_id=0,
        dst_node_id=1,
        reply_to_message_id="",
        group_id="evaluate-0",
        created_at=0.0,
        ttl=60.0,
        message_type="evaluate",
    )
    config = ConfigRecord({"task": run.task.to_json(), "user_ids": [0, 1], "max_examples": 4})
    msg = Message(RecordDict({protocol.CONFIG: config}), metadata=md)
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(PermissionError, match="withholds statistics"):
        evaluate(msg, ctx)


def test_silo_statistics_is_refused_under_user_level_dp():
    with pytest.raises(FedsimError, match="silo_statistics applies only with privacy.unit = 'example'"):
        load_config(None, [b for b in BASE if "example" not in b] + ["privacy.silo_statistics='send'"])
