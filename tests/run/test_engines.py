"""The in-process engine against Flower's Ray simulation engine: the same strategy and
ClientApp give bit-identical results for the same seed; ClientApp failures become error
replies that the strategy drops and counts."""

from __future__ import annotations

import json

import pytest

from fedsim.config import load_config

BASE = [
    "rounds=3",
    "sampling.scheme='poisson'",
    "privacy.mechanism='gaussian'",
    "privacy.noise_multiplier=1.0",
    "model.name='shakespeare_lstm_small'",
    "data.max_users=30",
    "sampling.cohort_size=8",
    "client.max_examples=16",
    "client.batch_size=8",
    "eval.every=1",
    "eval.max_users=8",
    "eval.max_examples_per_user=8",
    "sim.num_workers=2",
    "sim.client_cpus=1",
]
TIMING = {"seconds"}


def _rows(path):
    return [
        {k: v for k, v in json.loads(line).items() if k not in TIMING}
        for line in (path / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.mark.e2e
def test_inprocess_and_ray_engines_are_bit_identical(tmp_path, monkeypatch):
    import time

    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    from fedsim.runner import run_experiment

    scans = []  # Flower's scan for pushed messages: one call per node per scan
    original = InMemoryLinkState.get_message_ins
    monkeypatch.setattr(
        InMemoryLinkState, "get_message_ins", lambda self, *a, **k: scans.append(1) or original(self, *a, **k)
    )
    out = {}
    for engine in ("inprocess", "ray"):
        cfg = load_config(None, BASE + [f"sim.engine='{engine}'", "filter.name='doppler'", "server.optimizer='sgd'"])
        t0 = time.monotonic()
        out[engine] = (run_experiment(cfg, tmp_path / engine, progress=False), tmp_path / engine)
        seconds = time.monotonic() - t0
    # The scan runs when the strategy pushes (train and evaluate: 2 pushes a round) and otherwise
    # every 0.1 s (Flower's own wait), never in a tight loop while the workers train.
    assert 0 < len(scans) <= 2 * (seconds / 0.1 + 2 * 3 + 4)
    (a, pa), (b, pb) = out["inprocess"], out["ray"]
    assert a["engine"] == "inprocess" and b["engine"] == "ray"
    assert a["model_sha256"] == b["model_sha256"]
    assert _rows(pa) == _rows(pb)
    assert json.loads((pa / "ledger.json").read_text()) == json.loads((pb / "ledger.json").read_text())


def test_auto_engine_is_inprocess_for_one_worker_only():
    from fedsim.runner import resolve_engine

    assert resolve_engine(load_config(None, ["sim.num_workers=1"]), 1) == "inprocess"
    assert resolve_engine(load_config(None, ["sim.num_workers=2"]), 2) == "ray"
    assert resolve_engine(load_config(None, ["sim.engine='ray'"]), 1) == "ray"


def test_inprocess_grid_turns_exceptions_into_error_replies_and_drops_late_replies():
    import time

    from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from fedsim.runner.inprocess import InProcessGrid, task_identity

    app = ClientApp()

    @app.train()
    def train(msg, ctx):
        mode = msg.content["config"]["mode"]
        if mode == "raise":
            raise RuntimeError("client failure")
        if mode == "slow":
            time.sleep(0.3)
        return Message(RecordDict({"metrics": MetricRecord({"node": ctx.node_id})}), reply_to=msg)

    with task_identity():
        grid = InProcessGrid(app, 3)
        nodes = list(grid.get_node_ids())
        msgs = [
            Message(
                RecordDict({"config": ConfigRecord({"mode": m})}),
                dst_node_id=n,
                message_type=MessageType.TRAIN,
                group_id="g",
            )
            for n, m in zip(nodes, ("ok", "raise", "slow"))
        ]
        replies = list(grid.send_and_receive(msgs, timeout=0.2))
        ids = list(
            grid.push_messages(
                [
                    Message(
                        RecordDict({"config": ConfigRecord({"mode": "ok"})}),
                        dst_node_id=nodes[2],
                        message_type=MessageType.TRAIN,
                        group_id="h",
                    )
                ]
            )
        )
        pulled = list(grid.pull_messages(ids))
        assert len(pulled) == 1 and pulled[0].metadata.reply_to_message_id == ids[0]
        assert list(grid.pull_messages(ids)) == []  # each reply is delivered once
    assert len(replies) == 2  # the slow one came after the timeout
    ok, err = replies
    assert not ok.has_error() and ok.content["metrics"]["node"] == nodes[0] == ok.metadata.src_node_id
    assert err.has_error() and "client failure" in err.error.reason and err.metadata.src_node_id == nodes[1]


def test_account_every_skips_intermediate_epsilons_but_not_the_final_one(tmp_path):
    from fedsim.privacy.ledger import recompute_epsilon
    from fedsim.runner import run_experiment

    base = [
        "data.name='synthetic'",
        "data.num_clients=60",
        "model.name='logreg'",
        "rounds=5",
        "sampling.scheme='poisson'",
        "sampling.cohort_size=10",
        "privacy.mechanism='gaussian'",
        "privacy.noise_multiplier=1.0",
        "eval.every=0",
        "eval.max_users=5",
        "sim.num_workers=1",
    ]
    every = run_experiment(load_config(None, base), tmp_path / "a", progress=False)
    sparse = run_experiment(load_config(None, base + ["privacy.account_every=3"]), tmp_path / "b", progress=False)
    assert every["epsilon"] == sparse["epsilon"] and every["model_sha256"] == sparse["model_sha256"]
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epsilon"] is not None for r in rows] == [False, False, True, False, True]
    ledger = json.loads((tmp_path / "b" / "ledger.json").read_text())
    assert [e["epsilon"] is not None for e in ledger["entries"]] == [False, False, True, False, True]
    assert ledger["entries"][2]["epsilon"] == pytest.approx(recompute_epsilon(ledger, rounds=3), rel=1e-8)
    assert ledger["entries"][4]["epsilon"] == pytest.approx(recompute_epsilon(ledger), rel=1e-8)
