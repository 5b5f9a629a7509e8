"""The wrapped strategy stays the app's strategy, and nothing the wrapper does is silent.

Attacks and probes on :class:`fedsim.flower.UserLevelDP` around strategies fedsim did not write:
an app strategy that overrides `start()` (results file, best-model checkpoint) and
`configure_train` (a learning-rate schedule), its methods reached through the wrapper, per-node
messages, a round the strategy skips, a ClientApp whose every reply fails, a small population,
and the files of `out`. All run the real `start()` and ClientApp on fedsim's in-process Grid.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg, Result

from fedsim.errors import FedsimError
from fedsim.flower import UserLevelDP, user_dp_mod
from fedsim.privacy.accounting import epsilon
from fedsim.privacy.ledger import recompute_epsilon
from fedsim.runner.inprocess import InProcessGrid, task_identity

from .test_wrapper_attacks import _client, _direction, _dp, _model


class AppFedAvg(FedAvg):
    """What Flower's advanced-pytorch app's strategy does: it overrides `start()` to write a
    results file each round and save the best model, with a path set after construction, and
    `configure_train` to halve `lr` from round 2."""

    def set_save_path_and_run_dir(self, path, run_dir):
        self.save_path, self.run_dir = path, run_dir

    def configure_train(self, server_round, arrays, config, grid):
        if server_round == 2:
            config["lr"] = config["lr"] * 0.5
        return super().configure_train(server_round, arrays, config, grid)

    def start(self, grid, initial_arrays, num_rounds=3, timeout=3600, train_config=None, evaluate_config=None,
              evaluate_fn=None):  # fmt: skip
        self.best_so_far = -np.inf
        rounds = []
        arrays = initial_arrays
        for rnd in range(1, num_rounds + 1):
            replies = grid.send_and_receive(self.configure_train(rnd, arrays, train_config, grid), timeout=timeout)
            new, metrics = self.aggregate_train(rnd, replies)
            arrays = new if new is not None else arrays
            score = float(arrays["w"].numpy().ravel()[0])
            rounds.append({"round": rnd, "train": dict(metrics or {}), "score": score})
            if score > self.best_so_far:
                self.best_so_far = score
                np.save(self.save_path / f"best_round_{rnd}.npy", arrays["w"].numpy())
            (self.save_path / "results.json").write_text(json.dumps(rounds))
        result = Result()
        result.arrays = arrays
        return result


def _lr_client(got: dict, update=lambda p, w: 0 * w) -> ClientApp:
    """Node `p` records (round, lr, tag) of each train message and returns `x + update`."""
    app = ClientApp(mods=[user_dp_mod])

    @app.train()
    def train(msg: Message, context):
        p = int(context.node_config["partition-id"])
        cfg = msg.content["config"]
        got.setdefault(p, []).append((int(cfg["server-round"]), cfg.get("lr"), cfg.get("tag")))
        w = msg.content["arrays"]["w"].numpy()
        new = ArrayRecord({"w": Array((w + update(p, w)).astype(np.float32)), "step": msg.content["arrays"]["step"]})
        return Message(RecordDict({"arrays": new, "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    return app


def _wrap(strategy, **kw) -> UserLevelDP:
    args = dict(rounds=3, population=8, privacy={"mechanism": "none"}, sampling={"scheme": "min_sep", "min_sep": 1},
                key=3, side_statistics=True)  # fmt: skip
    args.update(kw)
    return UserLevelDP(strategy, **args)


def test_the_apps_own_start_runs_its_work_with_the_wrappers_rounds(tmp_path):
    """The app's start() writes its results file and best-model checkpoints, its configure_train
    halves lr in round 2 for every node, and its path is set on the wrapper after wrapping (as an
    app that wraps where the strategy is built does). The rounds are the wrapper's: node 0 sends
    1e30 in one coordinate and the model moves by c/K̄ = 1/8 exactly; the results file holds the
    wrapper's metrics (dp-epsilon), not FedAvg's."""
    got: dict = {}
    dp = _wrap(AppFedAvg(min_available_nodes=1, fraction_evaluate=0.0))
    dp.set_save_path_and_run_dir(tmp_path, "run-1")
    app = _lr_client(got, lambda p, w: 1e30 * _direction() if p == 0 else 0 * w)
    with task_identity():
        result = dp.start(InProcessGrid(app, 3), _model(), num_rounds=3, train_config=ConfigRecord({"lr": 0.1}))
    rounds = json.loads((tmp_path / "results.json").read_text())
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert all("dp-epsilon" in r["train"] and r["train"]["dp-server-clipped"] == 1 for r in rounds)
    assert [r["score"] for r in rounds] == pytest.approx([1 / 8, 2 / 8, 3 / 8], rel=1e-6)
    assert sorted(p.name for p in tmp_path.glob("best_round_*.npy")) == [f"best_round_{t}.npy" for t in (1, 2, 3)]
    assert dp.strategy.best_so_far == pytest.approx(3 / 8, rel=1e-6)  # the app's start() wrote its own state
    assert dp.strategy.save_path == tmp_path and dp.run_dir == "run-1"
    assert {p: [lr for _, lr, _ in v] for p, v in got.items()} == {p: [0.1, 0.05, 0.05] for p in range(3)}
    assert result.arrays["w"].numpy().ravel()[0] == pytest.approx(3 / 8, rel=1e-6)


def test_flowers_own_start_still_drives_a_plain_strategy():
    """FedAvg does not override start(): Flower's Strategy.start runs the wrapper's rounds."""
    dp = _wrap(FedAvg(min_available_nodes=1, fraction_evaluate=0.0))
    with task_identity():
        result = dp.start(InProcessGrid(_client(lambda p, w: 0.1 * _direction()), 3), _model(), num_rounds=2)
    assert list(result.train_metrics_clientapp) == [1, 2] and "dp-epsilon" in result.train_metrics_clientapp[1]
    assert result.arrays["w"].numpy().ravel()[0] == pytest.approx(2 * 3 * 0.1 / 8, rel=1e-6)


class Peeking(AppFedAvg):
    """An app start() that reads the nodes' replies (their own models) before aggregating."""

    def start(self, grid, initial_arrays, num_rounds=3, **kw):
        replies = grid.send_and_receive(self.configure_train(1, initial_arrays, ConfigRecord({"lr": 0.1}), grid))
        self.stolen = [m.content["arrays"]["w"].numpy() for m in replies]
        return Result()


class Sending(AppFedAvg):
    """An app start() that sends its own message to a node."""

    def start(self, grid, initial_arrays, num_rounds=3, **kw):
        node = next(iter(grid.get_node_ids()))
        msg = Message(RecordDict({"arrays": initial_arrays}), dst_node_id=node, message_type=MessageType.TRAIN)
        grid.send_and_receive([msg])
        return Result()


class Replaying(AppFedAvg):
    """An app start() that sends the wrapper's train messages twice (two trainings per node)."""

    def start(self, grid, initial_arrays, num_rounds=3, **kw):
        msgs = list(self.configure_train(1, initial_arrays, ConfigRecord({"lr": 0.1}), grid))
        grid.send_and_receive(msgs)
        grid.send_and_receive(msgs)
        return Result()


class SendingFromConfigure(FedAvg):
    """A configure_train that reaches the nodes itself."""

    def configure_train(self, server_round, arrays, config, grid):
        msgs = list(super().configure_train(server_round, arrays, config, grid))
        grid.send_and_receive(msgs)
        return msgs


@pytest.mark.parametrize(
    "cls,match",
    [
        (Peeking, "sealed"),
        (Sending, "did not issue"),
        (Replaying, "did not issue"),
        (SendingFromConfigure, "did not issue"),
    ],
    ids=["read-replies", "own-message", "replay", "send-in-configure"],
)
def test_a_strategy_cannot_reach_the_nodes_or_their_replies_past_the_wrapper(cls, match):
    got: dict = {}
    dp = _wrap(cls(min_available_nodes=1, fraction_evaluate=0.0))
    with task_identity(), pytest.raises(FedsimError, match=match):
        dp.start(InProcessGrid(_lr_client(got), 3), _model(), num_rounds=1, train_config=ConfigRecord({"lr": 0.1}))
    assert not hasattr(dp.strategy, "stolen")
    assert all(len(v) <= 1 for v in got.values())  # no node trained twice, none on a message of the app's own


def test_attributes_are_forwarded_but_not_those_the_wrapper_replaces():
    inner = AppFedAvg(fraction_train=0.3, min_available_nodes=1)
    dp = _wrap(inner)
    assert dp.weighted_by_key == "num-examples" and dp.min_available_nodes == 1
    dp.run_dir = "set through the wrapper"  # the wrapper has no run_dir: the strategy gets it
    assert inner.run_dir == "set through the wrapper" and "run_dir" not in vars(dp)
    with pytest.raises(AttributeError, match="sampler"):
        _ = dp.fraction_train
    with pytest.raises(AttributeError, match="does not pass on"):
        dp.noise_multiplier = 0.0
    dp.cfg = dp.cfg  # the wrapper's own attributes stay the wrapper's
    assert "cfg" in vars(dp) and not hasattr(inner, "cfg")
    assert inner.fraction_train == 0.3


class _Final(FedAvg):
    def __init_subclass__(cls, **kw):
        raise TypeError("final class")


class _Routed(FedAvg):
    def __getattribute__(self, name):
        return object.__getattribute__(self, name)


def _patched() -> FedAvg:
    s = FedAvg()
    s.configure_train = lambda *a: []  # an instance attribute would shadow the wrapper's round
    return s


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: _wrap(FedAvg()), "already wrapped"),
        (lambda: object(), "Message-API strategy"),
        (_Final, "cannot run _Final.start"),
        (_Routed, "__getattribute__"),
        (_patched, "instance attribute 'configure_train'"),
    ],
    ids=["double", "not-a-strategy", "unsubclassable", "getattribute", "instance-method"],
)
def test_a_strategy_the_wrapper_cannot_keep_safe_is_refused_before_round_1(make, match):
    with pytest.raises(FedsimError, match=match) as err:
        _wrap(make())
    assert "\n" not in str(err.value)


class PerNode(FedAvg):
    """Each node gets its own tag and lr (`tag = 100 + node id − 1001`)."""

    def configure_train(self, server_round, arrays, config, grid):
        out = []
        for node in grid.get_node_ids():
            cfg = ConfigRecord({"server-round": server_round, "tag": 100 + node - 1001, "lr": 0.01 * (node - 1000)})
            out.append(Message(RecordDict({"arrays": arrays, "config": cfg}), dst_node_id=node,
                               message_type=MessageType.TRAIN))  # fmt: skip
        return out


def test_each_sampled_node_gets_the_message_the_strategy_made_for_it():
    """Three nodes, three distinct configs: each node trains on its own tag and lr, every round."""
    got: dict = {}
    dp = _wrap(PerNode(min_available_nodes=1, fraction_evaluate=0.0))
    with task_identity():
        dp.start(InProcessGrid(_lr_client(got), 3), _model(), num_rounds=2)
    assert got == {p: [(t, pytest.approx(0.01 * (p + 1)), 100 + p) for t in (1, 2)] for p in range(3)}


def test_only_the_sampled_nodes_train_each_on_its_own_message():
    """Keyed min_sep 2 over N = 8 with 6 nodes: the sampler's nodes (not the strategy's) train,
    each with its own tag."""
    got: dict = {}
    dp = _wrap(PerNode(min_available_nodes=1, fraction_evaluate=0.0), sampling={"scheme": "min_sep", "min_sep": 2})
    with task_identity():
        grid = InProcessGrid(_lr_client(got), 6)
        for t in (1, 2):
            msgs = list(dp.configure_train(t, _model(), ConfigRecord(), grid))
            assert all(m.content["config"]["tag"] == 100 + m.metadata.dst_node_id - 1001 for m in msgs)
            dp.aggregate_train(t, grid.send_and_receive(msgs))
    trained = {(p, t) for p, v in got.items() for t, _, tag in v if tag == 100 + p}
    assert sum(len(v) for v in got.values()) == len(trained)  # every node got its own tag
    assert 0 < len({p for p, _ in trained if _ == 1}) < 6  # the sampler chose a strict subset


def test_a_sampled_node_without_its_own_message_does_not_train_and_it_is_said(caplog):
    """The strategy addresses only nodes 1001 and 1002 with per-node messages; node 1003 is
    sampled too. It gets nobody else's message: it does not train, counts as missing, and a
    WARNING says so."""

    class TwoOfThree(PerNode):
        def configure_train(self, server_round, arrays, config, grid):
            return [
                m for m in super().configure_train(server_round, arrays, config, grid) if m.metadata.dst_node_id < 1003
            ]

    got: dict = {}
    dp = _wrap(TwoOfThree(min_available_nodes=1, fraction_evaluate=0.0))
    with task_identity(), caplog.at_level(logging.WARNING):
        result = dp.start(InProcessGrid(_lr_client(got), 3), _model(), num_rounds=1)
    assert sorted(got) == [0, 1] and got[0][0][2] == 100 and got[1][0][2] == 101
    assert result.train_metrics_clientapp[1]["dp-dropped-missing"] == 1
    assert "none for 1 of the 3 sampled nodes" in caplog.text


class SkipsRound2(FedAvg):
    def configure_train(self, server_round, arrays, config, grid):
        return [] if server_round == 2 else super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        self.aggregated = [*getattr(self, "aggregated", []), server_round]
        return super().aggregate_train(server_round, replies)


def test_a_skipped_round_trains_nobody_and_uses_no_noise_row(tmp_path):
    """Flower rounds 1–3, the strategy skips round 2: nobody trains in it, the strategy does not
    aggregate it, the model does not move, and round 3 adds noise row 2 — the same models as an
    uninterrupted 2-round run. The ledger has 2 entries and a note about round 2; its ε,
    recompute_epsilon's and dp-accounting's for 2 rounds agree, and a resume after the skip
    continues bit for bit."""
    kw = dict(privacy={"mechanism": "blt", "noise_multiplier": 1.0}, sampling={"scheme": "min_sep", "min_sep": 2},
              rounds=3, population=8)  # fmt: skip
    got: dict = {}
    app = _lr_client(got, lambda p, w: 0.1 * _direction())

    def run(dp, rounds, start=None):
        seen: dict = {}
        with task_identity():
            dp.start(InProcessGrid(app, 4), start or _model(), num_rounds=rounds,
                     evaluate_fn=lambda r, a: seen.__setitem__(r, a["w"].numpy().copy()))  # fmt: skip
        return seen

    straight = run(_wrap(FedAvg(min_available_nodes=1, fraction_evaluate=0.0), **kw), 2)
    got.clear()
    skipping = _wrap(SkipsRound2(min_available_nodes=1, fraction_evaluate=0.0), **kw, out=tmp_path / "a")
    seen = run(skipping, 3)
    assert {t for v in got.values() for t, _, _ in v} == {1, 3}
    assert skipping.strategy.aggregated == [1, 3]
    assert np.array_equal(seen[2], seen[1]) and np.array_equal(seen[1], straight[1])
    assert np.array_equal(seen[3], straight[2])
    ledger = json.loads((tmp_path / "a" / "ledger.json").read_text())
    assert len(ledger["entries"]) == 2 and any("Flower round 2 (after 1 noise rounds)" in n for n in ledger["notes"])
    eps2 = epsilon(skipping.spec, 2)
    assert skipping.epsilon == recompute_epsilon(ledger) == eps2 > 0

    part = _wrap(SkipsRound2(min_available_nodes=1, fraction_evaluate=0.0), **kw, out=tmp_path / "b")
    run(part, 2)
    resumed = _wrap(SkipsRound2(min_available_nodes=1, fraction_evaluate=0.0), **kw, out=tmp_path / "b", resume=True)
    assert resumed.rounds_done == 1 and resumed.skipped == [(2, 1)]
    after = run(resumed, 1, resumed.resume_arrays())
    assert np.array_equal(after[1], seen[3])
    resumed_ledger = json.loads((tmp_path / "b" / "ledger.json").read_text())
    assert recompute_epsilon(resumed_ledger) == eps2 and resumed_ledger["notes"] == ledger["notes"]


def test_a_round_whose_every_reply_failed_stops_the_run_before_publishing(tmp_path):
    """Every node's ClientApp raises: the run stops with one line and publishes nothing (the
    model a pure-noise step would give never reaches the strategy or evaluate_fn, and no
    checkpoint or ledger entry is written)."""

    def update(p, w):
        raise RuntimeError("broken ClientApp")

    published: list = []  # Poisson with K̄ = N = 8 below: q = 1, all three nodes are sampled
    dp = _dp(privacy={"mechanism": "gaussian", "noise_multiplier": 1.0}, sampling={"scheme": "poisson", "cohort_size": 8},
             out=tmp_path)  # fmt: skip
    with (
        task_identity(),
        pytest.raises(FedsimError, match=r"round 1: no sampled node's update could be used \(client_error 3\)"),
    ):
        dp.start(InProcessGrid(_client(update), 3, node_config=None), _model(), num_rounds=1,
                 evaluate_fn=lambda r, a: published.append(r))  # fmt: skip
    assert published == [0] and dp.rounds_done == 0 and dp.last_arrays is None
    assert not (tmp_path / "ledger.json").exists() and not (tmp_path / "checkpoint").exists()


def test_dropped_replies_get_a_warning_line_with_reasons(caplog):
    def update(p, w):
        if p == 0:
            raise RuntimeError("node 0 fails")
        return (np.nan if p == 1 else 0.1) * _direction()

    with task_identity(), caplog.at_level(logging.WARNING):
        _dp(side_statistics=False).start(InProcessGrid(_client(update), 3), _model(), num_rounds=1)
    assert "round 1: replies dropped (client_error 1, nonfinite 1)" in caplog.text


def test_a_small_population_is_warned_about_and_noted_in_the_ledger(tmp_path, caplog):
    """N = 10 with the default δ = 10^-1.1 = 0.079: a WARNING and a ledger note; N = 200: none."""
    with caplog.at_level(logging.WARNING):
        dp = _dp(population=10, privacy={"mechanism": "gaussian", "noise_multiplier": 1.0},
                 sampling={"scheme": "poisson", "cohort_size": 3}, out=tmp_path / "a")  # fmt: skip
    assert dp.spec.delta == pytest.approx(10**-1.1)
    assert "N = 10 users is small" in caplog.text and "delta = 0.0794" in caplog.text
    with task_identity():
        dp.start(InProcessGrid(_client(lambda p, w: 0.1 * _direction()), 3), _model(), num_rounds=1)
    notes = json.loads((tmp_path / "a" / "ledger.json").read_text())["notes"]
    assert any("N = 10 users is small" in n for n in notes)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _dp(population=200, privacy={"mechanism": "gaussian", "noise_multiplier": 1.0},
            sampling={"scheme": "poisson", "cohort_size": 3})  # fmt: skip
    assert "small" not in caplog.text


def test_a_delta_above_1_over_n_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        _dp(population=200, sampling={"scheme": "poisson", "cohort_size": 3},
            privacy={"mechanism": "gaussian", "noise_multiplier": 1.0, "delta": 0.01, "delta_reason": "a test"})  # fmt: skip
    assert "delta = 0.01 is not below 1/N = 0.005" in caplog.text


def test_the_out_folder_states_what_fedsim_privacy_states(tmp_path):
    """`fedsim privacy out/config.toml --population 8 --json` gives the ledger's ε, z and sensitivity_in_c
    (sens(C) of BLT, not 1), and config.toml holds only the wrapper's tables."""
    dp = _dp(rounds=4, population=8, privacy={"mechanism": "blt", "noise_multiplier": 1.0},
             sampling={"scheme": "min_sep", "min_sep": 2}, out=tmp_path)  # fmt: skip
    with task_identity():
        dp.start(InProcessGrid(_client(lambda p, w: 0.1 * _direction()), 4), _model(), num_rounds=4)
    out = subprocess.run([sys.executable, "-m", "fedsim.cli", "privacy", str(tmp_path / "config.toml"), "--population", "8",
                          "--json"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    report = json.loads(out.stdout)
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert ledger["sensitivity_in_c"] == report["sensitivity_in_c"] > 1.0
    assert ledger["sensitivity_exact"] == report["sensitivity_exact"]
    assert recompute_epsilon(ledger) == pytest.approx(report["epsilon"], rel=1e-12)
    assert ledger["spec"]["noise_multiplier"] == pytest.approx(report["noise_multiplier"], rel=1e-12)
    text = (tmp_path / "config.toml").read_text()
    assert "shakespeare" not in text.lower() and "lstm" not in text.lower()
    import tomllib

    assert set(tomllib.loads(text)) == {"name", "rounds", "client", "sampling", "privacy", "filter", "server"}


def test_the_checkpoint_keeps_the_published_model_once_and_a_resume_gets_it_exactly(tmp_path):
    """The checkpoint holds the published model's floats once (as the DP server's x), with its
    non-floating arrays and dtypes beside them: a resume gives back the very arrays, a float16
    array and an int64 buffer included, and its own state_dict (before any round) still holds
    the server's state."""
    app = ClientApp()

    @app.train()
    def train(msg, context):
        rec = msg.content["arrays"]
        new = ArrayRecord({"w": Array((rec["w"].numpy() + 0.1 * _direction()).astype(np.float32)),
                           "step": rec["step"], "h": Array((rec["h"].numpy() + 0.5).astype(np.float16))})  # fmt: skip
        return Message(RecordDict({"arrays": new, "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    model = _model()
    model["h"] = Array(np.ones((3, 2), np.float16))
    kw = dict(privacy={"mechanism": "blt", "noise_multiplier": 1.0}, sampling={"scheme": "min_sep", "min_sep": 2})
    dp = _dp(**kw, out=tmp_path)
    with task_identity():
        dp.start(InProcessGrid(app, 4), model, num_rounds=2)
    resumed = _dp(**kw, out=tmp_path, resume=True)
    got, want = resumed.resume_arrays(), dp.last_arrays
    assert list(got.keys()) == list(want.keys()) == ["w", "step", "h"]
    for k in want.keys():
        assert got[k].numpy().dtype == want[k].numpy().dtype and np.array_equal(got[k].numpy(), want[k].numpy())
    assert got["step"].numpy().tolist() == [7] and not np.array_equal(got["h"].numpy(), np.ones((3, 2)))
    state = resumed.state_dict()
    assert state["server"]["round"] == 2 and "last_arrays" not in state
    assert set(state["published"]) == {"names", "shapes", "dtypes", "floating", "fixed"}
