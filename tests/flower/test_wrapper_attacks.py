"""Attacks on :class:`fedsim.flower.UserLevelDP`, driven through Flower's own ``Strategy.start``
and a real ``ClientApp`` (with :func:`fedsim.flower.user_dp_mod`) on fedsim's in-process Grid.

Each test is an attack a node (or a replaying network) could make, or a property an attacker
would probe: replies twice, stale replies, NaN/inf/huge updates, silent and failing nodes, a node
claiming another's identity, a new node displacing others' rounds, and the noise itself.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from fedsim.errors import FedsimError
from fedsim.flower import UserLevelDP, noise_std_of_mean, user_dp_mod
from fedsim.runner.inprocess import InProcessGrid, task_identity

D = 64  # parameters of the toy model


def _model(d: int = D) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros((d // 4, 4), np.float32)), "step": Array(np.array([7], np.int64))})


def _client(update, log: list | None = None) -> ClientApp:
    """A ClientApp whose node ``p`` (its partition id) returns ``x + update(p, x)``."""
    app = ClientApp(mods=[user_dp_mod])

    @app.train()
    def train(msg: Message, context):
        p = int(context.node_config["partition-id"])
        if log is not None:
            log.append(p)
        rec = msg.content["arrays"]
        w = rec["w"].numpy()
        new = ArrayRecord({"w": Array((w + update(p, w)).astype(np.float32)), "step": Array(np.array([99], np.int64))})
        return Message(
            RecordDict({"arrays": new, "metrics": MetricRecord({"num-examples": 1000 * (p + 1)})}), reply_to=msg
        )

    return app


def _dp(**kw) -> UserLevelDP:
    args = dict(
        rounds=4,
        population=8,
        clip_norm=1.0,
        privacy={"mechanism": "none"},
        sampling={"scheme": "min_sep", "min_sep": 1},
        key=3,
        side_statistics=True,
    )
    args.update(kw)
    return UserLevelDP(FedAvg(min_available_nodes=1, fraction_evaluate=0.0), **args)


def _run(dp: UserLevelDP, app: ClientApp, nodes: int, rounds: int = 1, timeout: float = 3600, configs=None):
    seen: dict[int, np.ndarray] = {}

    def record(rnd, arrays):
        seen[rnd] = arrays["w"].numpy().ravel().astype(np.float64)

    with task_identity():
        result = dp.start(InProcessGrid(app, nodes, node_config=configs), _model(), num_rounds=rounds,
                          timeout=timeout, evaluate_fn=record)  # fmt: skip
    return result, seen


def _direction(d: int = D) -> np.ndarray:
    e = np.zeros((d // 4, 4), np.float32)
    e.flat[0] = 1.0
    return e


def test_a_huge_update_moves_the_model_by_at_most_c_over_the_fixed_denominator():
    """Node 0 sends 1e30 in one coordinate, the others nothing; z = 0. Every node is in the one
    group (min_sep 1), so K̄ = N = 8 although only 3 nodes exist: the step is c/K̄ exactly, and
    the weights the nodes claimed (1000·(p+1) examples) count for nothing."""
    dp = _dp()
    result, seen = _run(dp, _client(lambda p, w: 1e30 * _direction() if p == 0 else 0 * w), nodes=3)
    step = seen[1] - seen[0]
    assert np.linalg.norm(step) == pytest.approx(1.0 / 8, rel=1e-6)
    assert result.train_metrics_clientapp[1]["dp-server-clipped"] == 1
    assert result.arrays["step"].numpy().tolist() == [7]  # integer buffers stay the broadcast ones


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_update_is_dropped_and_counted(bad):
    dp = _dp(clipping="server")
    good = 0.1 * _direction()
    result, seen = _run(dp, _client(lambda p, w: bad * _direction() if p == 1 else good), nodes=3)
    m = result.train_metrics_clientapp[1]
    assert m["dp-dropped-nonfinite"] == 1 and m["dp-accepted"] == 2
    assert np.allclose(seen[1] - seen[0], 2 * good.ravel() / 8, atol=1e-7)  # two nodes' updates over K̄ = 8


def test_with_client_clipping_the_node_clips_and_a_non_finite_update_becomes_zero():
    dp = _dp(clipping="client")
    result, seen = _run(dp, _client(lambda p, w: (np.nan if p == 1 else 5.0) * _direction()), nodes=3)
    m = result.train_metrics_clientapp[1]
    assert m["dp-accepted"] == 3 and m["dp-server-clipped"] == 0  # the mod clipped: nothing left to clip
    assert np.linalg.norm(seen[1] - seen[0]) == pytest.approx(2.0 / 8, rel=1e-6)


def test_failing_and_silent_nodes_contribute_zero_and_the_denominator_does_not_move():
    def update(p, w):
        if p == 0:
            raise RuntimeError("node 0 fails")
        if p == 1:
            time.sleep(1.5)  # past the round timeout: its reply is never received
        return 0.5 * _direction()

    dp = _dp()
    result, seen = _run(dp, _client(update), nodes=4, timeout=1.0)
    m = result.train_metrics_clientapp[1]
    assert m["dp-dropped-client_error"] == 1 and m["dp-dropped-missing"] == 1 and m["dp-accepted"] == 2
    assert np.allclose(seen[1] - seen[0], 2 * 0.5 * _direction().ravel() / 8, atol=1e-7)


def test_duplicate_and_stale_replies_count_for_nothing():
    """A replayed reply (the same node twice) and last round's reply replayed into this round
    are dropped; only the first reply of each node this round is summed."""
    dp = _dp()
    app = _client(lambda p, w: 0.25 * _direction())
    grid = InProcessGrid(app, 3)
    with task_identity():
        msgs = list(dp.configure_train(1, _model(), ConfigRecord(), grid))
        old = list(grid.send_and_receive(msgs))
        dp.aggregate_train(1, old)
        x1 = dp.last_arrays
        msgs = list(dp.configure_train(2, x1, ConfigRecord(), grid))
        new = list(grid.send_and_receive(msgs))
        _, metrics = dp.aggregate_train(2, new + [new[0], new[0]] + old)
    assert metrics["dp-accepted"] == 3
    assert metrics["dp-dropped-duplicate"] == 2 and metrics["dp-dropped-stale"] == 3
    step = dp.last_arrays["w"].numpy() - x1["w"].numpy()
    assert np.allclose(step, 3 * 0.25 * _direction() / 8, atol=1e-7)


def test_two_nodes_claiming_one_user_stop_the_run_before_any_training():
    log: list[int] = []
    dp = _dp(identity="census")
    configs = [{"partition-id": i} for i in (0, 1, 1)]  # the third node claims node 2's... user 1
    with pytest.raises(FedsimError, match="both claim the user 'partition-id=1'"):
        _run(dp, _client(lambda p, w: 0 * w, log), nodes=3, configs=configs)
    assert log == []


def test_census_needs_the_mod_and_says_so():
    app = ClientApp()

    @app.train()
    def train(msg, context):
        return Message(RecordDict({"arrays": msg.content["arrays"]}), reply_to=msg)

    with pytest.raises(FedsimError, match="user_dp_mod"):
        _run(_dp(identity="census"), app, nodes=2)


def test_more_nodes_than_the_stated_population_are_refused():
    with pytest.raises(FedsimError, match="population = 2"):
        _run(_dp(population=2, sampling={"scheme": "poisson", "cohort_size": 1}), _client(lambda p, w: 0 * w), nodes=3)


def _schedule(nodes: int, identity: str) -> dict[int, list[int]]:
    log: list[int] = []
    rounds: dict[int, list[int]] = {}
    dp = _dp(rounds=6, population=12, sampling={"scheme": "min_sep", "min_sep": 3}, identity=identity)
    app = _client(lambda p, w: 0 * w, log)
    grid = InProcessGrid(app, nodes)
    x = _model()
    with task_identity():
        for t in range(1, 7):
            before = len(log)
            msgs = list(dp.configure_train(t, x, ConfigRecord(), grid))
            dp.aggregate_train(t, grid.send_and_receive(msgs))
            x = dp.last_arrays
            for p in log[before:]:
                rounds.setdefault(p, []).append(t)
    return rounds


@pytest.mark.parametrize("identity", ["census", "node"])
def test_a_new_node_changes_no_other_nodes_rounds(identity):
    """Neighbouring federations: 8 nodes, then the same 8 and one more. Under keyed min_sep
    assignment every common node trains in exactly the same rounds, and each at most twice,
    3 rounds apart."""
    small, large = _schedule(8, identity), _schedule(9, identity)
    assert {p: small.get(p, []) for p in range(8)} == {p: large.get(p, []) for p in range(8)}
    for rounds in large.values():
        assert len(rounds) <= 2 and all(b - a >= 3 for a, b in zip(rounds, rounds[1:]))
    assert sum(map(len, large.values())) >= 12  # every node trains: the schedule is not empty


def test_a_resume_never_reuses_a_noise_row(tmp_path):
    """State saved after round 2 (before its model left), then a fresh wrapper resumes it: the
    third round adds noise row 3, so rounds 1–3 equal an uninterrupted run bit for bit."""
    kw = dict(privacy={"mechanism": "blt", "noise_multiplier": 1.0}, sampling={"scheme": "min_sep", "min_sep": 2},
              rounds=3, population=8)  # fmt: skip
    app = _client(lambda p, w: 0.1 * _direction())
    _, straight = _run(_dp(**kw), app, nodes=4, rounds=3)
    _run(_dp(**kw, out=tmp_path / "a"), app, nodes=4, rounds=2)
    with pytest.raises(FedsimError, match="already holds a run"):
        _dp(**kw, out=tmp_path / "a")
    with pytest.raises(FedsimError, match="other privacy settings"):
        _dp(**{**kw, "clip_norm": 2.0}, out=tmp_path / "a", resume=True)
    resumed = _dp(**kw, out=tmp_path / "a", resume=True)
    assert resumed.rounds_done == 2
    seen: dict[int, np.ndarray] = {}

    def record(rnd, arrays):
        seen[rnd] = arrays["w"].numpy().ravel().astype(np.float64)

    with task_identity():
        resumed.start(InProcessGrid(app, 4), resumed.resume_arrays(), num_rounds=1, evaluate_fn=record)
    assert np.array_equal(seen[0], straight[2]) and np.array_equal(seen[1], straight[3])
    with pytest.raises(FedsimError, match="covers 3 rounds"):
        with task_identity():
            resumed.start(InProcessGrid(app, 4), resumed.resume_arrays(), num_rounds=1)


def test_the_noise_added_has_the_mechanisms_variance_and_correlation():
    """Clients return the broadcast model unchanged, so the model moves by noise alone:
    ``x_{t+1} − x_t = (c·z·sens/K̄)·(C⁻¹Z)_t``. Over d = 40,000 coordinates the empirical
    covariance of the steps of rounds s and t must be within 4.5 standard errors of
    ``(c·z·sens/K̄)²·(C⁻¹C⁻ᵀ)[s, t]`` for all 21 pairs (C materialised and inverted here, with
    numpy, apart from the noise stream's BLT recurrence). Under the null, the chance that any of
    the 21 falls outside is below 2·10⁻⁴; the key is fixed, so the test is deterministic. The
    test also checks that it can tell: independent noise of the same variances would be
    rejected."""
    n, d = 6, 40_000
    dp = UserLevelDP(FedAvg(min_available_nodes=1), rounds=n, population=8, clip_norm=0.5, key=11,
                     privacy={"mechanism": "blt", "noise_multiplier": 2.0},
                     sampling={"scheme": "min_sep", "min_sep": 2})  # fmt: skip
    seen: dict[int, np.ndarray] = {}

    def record(rnd, arrays):
        seen[rnd] = arrays["w"].numpy().ravel().astype(np.float64)

    with task_identity():
        dp.start(InProcessGrid(_client(lambda p, w: 0 * w), 6), _model(d), num_rounds=n, evaluate_fn=record)
    steps = np.stack([seen[t + 1] - seen[t] for t in range(n)])  # n × d
    C = dp._prep.plan.strategy.materialize()
    Minv = np.linalg.inv(C)
    s = 0.5 * 2.0 * dp._prep.plan.sens / dp.spec.cohort_size
    assert noise_std_of_mean(dp) == pytest.approx(s, rel=1e-12)
    sigma = s**2 * Minv @ Minv.T
    est = steps @ steps.T / d
    se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / d)
    z = np.abs(est - sigma) / se
    assert z[np.tril_indices(n)].max() < 4.5, np.round(z, 2)
    independent = np.diag(np.diag(sigma))
    assert (np.abs(est - independent) / se).max() > 10  # the correlation is detectable


@pytest.mark.parametrize(
    "stage",
    [
        {"filter": {"name": "doppler"}},
        {"filter": {"name": "ema"}, "optimizer": {"optimizer": "adambc", "lr": 0.01}},
        {"filter": {"name": "disk", "mode": "lookahead"}},
    ],
    ids=["doppler", "ema+adambc", "disk-lookahead"],
)
def test_filter_and_optimizer_stages_are_post_processing(stage):
    """The same noise and sampling with a filter / DP-AdamBC between the noise and FedAvg: the
    model differs, ε does not (the ledger is the noise's, whatever follows it)."""
    kw = dict(privacy={"mechanism": "blt", "noise_multiplier": 1.0}, sampling={"scheme": "min_sep", "min_sep": 2},
              rounds=3, population=8)  # fmt: skip
    app = _client(lambda p, w: 0.1 * _direction())
    plain = _dp(**kw)
    _, a = _run(plain, app, nodes=4, rounds=3)
    staged = _dp(**kw, **stage)
    _, b = _run(staged, app, nodes=4, rounds=3)
    assert not np.array_equal(a[3], b[3])
    assert staged.server.ledger.to_json()["entries"] == plain.server.ledger.to_json()["entries"]
    assert staged.epsilon == plain.epsilon > 0


def test_disk_lookahead_sends_the_nodes_the_look_ahead_point():
    """Round 2's nodes get ``y = x_1 + γ·(x_1 − x_0)``, not ``x_1``, and their updates are taken
    from ``y``."""
    got: dict[int, np.ndarray] = {}
    app = ClientApp(mods=[user_dp_mod])

    @app.train()
    def train(msg, context):
        w = msg.content["arrays"]["w"].numpy()
        got[int(msg.content["config"]["server-round"])] = w.copy()
        new = ArrayRecord(
            {"w": Array((w + 0.1 * _direction()).astype(np.float32)), "step": msg.content["arrays"]["step"]}
        )
        return Message(RecordDict({"arrays": new, "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    dp = _dp(filter={"name": "disk", "mode": "lookahead"})
    _, seen = _run(dp, app, nodes=2, rounds=2)  # FedAvg waits for min_train_nodes = 2
    gamma = dp.server.filter.gamma
    x0, x1 = seen[0].reshape(-1, 4), seen[1].reshape(-1, 4)
    assert np.allclose(got[2], x1 + gamma * (x1 - x0), atol=1e-6) and np.allclose(got[1], x0)
    assert not np.allclose(got[2], x1)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"sampling": {"scheme": "fixed", "cohort_size": 2}}, "fixed"),
        ({"filter": {"name": "disk"}}, "two_point"),
        (
            {"privacy": {"mechanism": "blt", "noise_multiplier": 1.0}, "sampling": {"scheme": "poisson"}},
            "bounded participation",
        ),
        ({"identity": "ip-address"}, "identity must be"),
        ({"privacy": {"mechanism": "gaussian", "noise_multiplier": 1.0, "population": 9}}, "population once"),
    ],
)
def test_combinations_without_a_guarantee_are_refused_before_round_1(kw, match):
    with pytest.raises(FedsimError, match=match):
        _dp(**kw)
