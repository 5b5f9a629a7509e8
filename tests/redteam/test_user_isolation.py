"""Red team, findings 2 and 6: one user's data removed other users' updates or halted the run,
and a float64 reply could put NaN into the sum. The attacks, written to fail now."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedsim import protocol
from fedsim.clients.faults import HostileUsers, make_hostile_user_app
from fedsim.config import load_config
from fedsim.data.synthetic import SyntheticClassification
from fedsim.models import make_model
from fedsim.privacy.clipping import clip_vector
from fedsim.server.aggregation import UpdateAggregator
from fedsim.training.error_feedback import ClientStateStore
from fedsim.training.local import LocalTraining, train_users, train_users_ef
from fedsim.training.vectorized import train_users_vectorized

SPEC = LocalTraining(epochs=1, batch_size=4, lr=0.5, max_examples=8, clip_norm=1.0)
HUGE, RAISES, A, B = 0, 1, 2, 3


def _setup():
    data = SyntheticClassification(6, 8, 5, 3, seed=0)
    model = make_model("logreg", data.model_dims(), seed=0)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    return data, model, x0


def test_clip_of_a_nonfinite_vector_is_zero():
    for bad in (
        torch.tensor([1.0, float("nan")]),
        torch.tensor([float("inf"), 0.0]),
        torch.tensor([3e38, 3e38], dtype=torch.float32) * 10,
    ):
        out, norm = clip_vector(bad, 1.0)
        assert torch.equal(out, torch.zeros_like(bad)) and norm == float("inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("poison", ["nan", "inf", "-inf"])
def test_one_poisoned_entry_anywhere_zeroes_the_update(dtype, poison):
    """The finiteness test is the float64 norm alone (no entrywise pass): one NaN or ±inf at any
    position of a large vector — first, last, middle — still gives zeros and an infinite norm,
    and so does a float64 vector of finite entries whose sum of squares overflows."""
    from fedsim.training.local import isolated_clip

    n = 100_003
    for pos in (0, n // 2, n - 1):
        v = torch.randn(n, generator=torch.Generator().manual_seed(pos)).to(dtype)
        v[pos] = float(poison)
        out, norm = clip_vector(v, 1.0)
        assert norm == float("inf") and not out.any() and out.dtype == dtype
        out, norm, finite = isolated_clip(v, 1.0)
        assert not finite and norm == float("inf") and not out.any()
    huge = torch.full((4,), 1e200, dtype=torch.float64)  # every entry finite, ‖v‖² overflows
    assert clip_vector(huge, 1.0)[1] == float("inf")


def test_a_float64_update_that_overflows_the_float32_cast_is_zeroed():
    """Entries within float64 but beyond float32 after clipping (c above float32's max): the
    worker's float32 sum would hold inf, so the update is zeroed instead."""
    from fedsim.training.local import isolated_clip

    v = torch.tensor([1e39, -1e39], dtype=torch.float64)
    out, norm, finite = isolated_clip(v, 1e40)  # not clipped: ‖v‖ < c
    assert not finite and norm == float("inf") and not out.any()
    out, norm, finite = isolated_clip(v, 1.0)  # clipped to norm 1: fine in float32
    assert finite and torch.isfinite(out.to(torch.float32)).all()


def test_a_clipped_float64_update_stays_within_c_once_cast_to_the_float32_workers_sum():
    """A worker sums clipped updates in float32. A float64 delta clipped with float64's margin
    (about 1e-15) can round above ``c`` in that cast (each entry moves by up to 6e-8 of itself),
    so one user would weigh more than ``c`` in the sum. Both clipping paths use float32's margin
    for wider deltas: the cast's norm, in float64, is at most ``c`` for every vector."""
    from fedsim.training.local import isolated_clip, isolated_clip_rows

    g = torch.Generator().manual_seed(7)
    rows = torch.randn(400, 33, generator=g, dtype=torch.float64) * 5
    for c in (1.0, 0.1, 3.7):
        sent, _, _ = isolated_clip_rows(rows, c)
        for i in range(rows.shape[0]):
            alone, norm, ok = isolated_clip(rows[i], c)
            assert ok and norm > c
            assert _norm64(alone.to(torch.float32)) <= c
            assert _norm64(sent[i].to(torch.float32)) <= c
            # still a clip: the norm is c up to the margin, not some smaller vector
            assert _norm64(alone) >= c * (1 - 1e-6)
        # just below c in float64: not clipped by float64's rule, yet the cast can round it above c
        below = rows * torch.tensor([c * (1 - 1e-12) / _norm64(r) for r in rows], dtype=torch.float64).unsqueeze(1)
        sent, _, _ = isolated_clip_rows(below, c)
        for i in range(below.shape[0]):
            alone, norm, ok = isolated_clip(below[i], c)
            assert ok and norm <= c
            assert _norm64(alone.to(torch.float32)) <= c and _norm64(sent[i].to(torch.float32)) <= c


def _norm64(v: torch.Tensor) -> float:
    return float(np.linalg.norm(v.numpy().astype(np.float64)))


def test_rows_clipped_together_are_each_isolated():
    """Vectorized training clips its users' deltas as one batch (:func:`isolated_clip_rows`): a
    row that overflows the float32 cast, or holds a NaN, becomes zeros, and every other row is
    bit for bit what :func:`isolated_clip` gives it alone."""
    from fedsim.training.local import isolated_clip, isolated_clip_rows

    g = torch.Generator().manual_seed(1)
    rows = torch.randn(5, 6, generator=g, dtype=torch.float64) * 3
    rows[1] = torch.tensor([1e39, -1e39, 0, 0, 0, 0], dtype=torch.float64)  # over float32 after the cast
    rows[3, 2] = float("nan")
    for c in (1e40, 1.0):
        out, norms, finite = isolated_clip_rows(rows, c)
        for i in range(5):
            alone, norm, ok = isolated_clip(rows[i], c)
            assert torch.equal(out[i], alone) and norms[i] == norm and finite[i] == ok
        assert not finite[3] and not out[3].any()
        assert finite[1] == (c == 1.0)  # not clipped at c = 1e40: zeroed; clipped at 1: fine


@pytest.mark.parametrize("path", ["sequential", "vectorized"])
def test_a_hostile_user_leaves_the_other_users_contributions_unchanged(path):
    data, model, x0 = _setup()
    hostile = HostileUsers(data, {HUGE: "huge_features", RAISES: "raise"})
    if path == "sequential":
        total, res = train_users(model, x0, hostile, [HUGE, RAISES, A, B], 0, 0, SPEC)
        clean, _ = train_users(model, x0, data, [A, B], 0, 0, SPEC)
        assert torch.equal(total, clean)  # bit for bit
    else:
        total, res = train_users_vectorized(model, x0, hostile, [HUGE, RAISES, A, B], 0, 0, SPEC)
        clean, _ = train_users_vectorized(model, x0, data, [A, B], 0, 0, SPEC)
        torch.testing.assert_close(total, clean, rtol=1e-5, atol=1e-7)  # batching rounds, no more
    assert torch.isfinite(total).all() and total.dtype == torch.float32
    by = {r.user: r for r in res}
    assert by[HUGE].nonfinite and not by[HUGE].failed
    assert by[RAISES].failed and not by[RAISES].nonfinite
    assert by[A].ok and by[B].ok


def test_a_hostile_user_among_batched_lstm_users_changes_no_other_contribution():
    """The batched recurrent path (users' LSTMs under one vmap): a user whose data cannot be read
    and one whose tokens are not ids (floats: the embedding refuses them, which fails the whole
    batched chunk) contribute zero, and every other user's clipped update is what it is without
    them."""
    from fedsim.data.shakespeare import FederatedText

    rng = np.random.default_rng(0)
    data = FederatedText(
        [f"u{i}" for i in range(4)], [rng.integers(0, 20, 30).astype(np.uint8) for _ in range(4)], 8, 20
    )
    model = make_model("shakespeare_lstm_small", data.model_dims(), seed=0)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    hostile = HostileUsers(data, {HUGE: "huge_features", RAISES: "raise"})
    total, res = train_users_vectorized(model, x0, hostile, [HUGE, RAISES, A, B], 0, 0, SPEC)
    clean, _ = train_users_vectorized(model, x0, data, [A, B], 0, 0, SPEC)
    alone, _ = train_users(model, x0, data, [A, B], 0, 0, SPEC)
    torch.testing.assert_close(total, clean, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(total, alone, rtol=1e-4, atol=1e-6)
    assert float(total.norm()) > 0
    by = {r.user: r for r in res}
    assert by[HUGE].failed and by[RAISES].failed and by[A].ok and by[B].ok


def test_error_feedback_users_are_isolated_and_keep_their_state():
    data, model, x0 = _setup()
    hostile = HostileUsers(data, {HUGE: "huge_features", RAISES: "raise"})
    e = {u: torch.full((x0.numel(),), 0.01) for u in (HUGE, RAISES, A, B)}
    total, res, states = train_users_ef(model, x0, hostile, [HUGE, RAISES, A, B], 0, 0, SPEC, "client", 1.0, e)
    clean, _, clean_states = train_users_ef(
        model, x0, data, [A, B], 0, 0, SPEC, "client", 1.0, {u: e[u] for u in (A, B)}
    )
    assert torch.equal(total, clean)
    assert torch.equal(states[HUGE], e[HUGE]) and torch.equal(states[RAISES], e[RAISES])
    assert torch.equal(states[A], clean_states[A])
    total, _, residual = train_users_ef(model, x0, hostile, [HUGE, RAISES, A, B], 0, 0, SPEC, "server", 1.0)
    _, _, clean_residual = train_users_ef(model, x0, data, [A, B], 0, 0, SPEC, "server", 1.0)
    assert torch.equal(residual, clean_residual) and torch.isfinite(residual).all()


def test_a_float64_reply_that_overflows_float32_is_dropped_not_summed():
    agg = UpdateAggregator(4, clip_norm=1.0)
    assert agg.add(np.array([1e39, 0, 0, 0], dtype=np.float64), users=2) == "nonfinite"
    assert agg.add(np.array([0.5, 0, 0, 0], dtype=np.float64), users=1) is None
    assert torch.isfinite(agg.total).all() and agg.total.tolist() == [0.5, 0, 0, 0]
    assert agg.accepted_users == 1 and agg.dropped_users == 2
    store = ClientStateStore(4, 10, 1.0)
    assert not store.valid(np.array([1e39, 0, 0, 0]))
    assert store.valid(np.array([1.0, 0, 0, 0]))


def _reply(strategy, node, users, residual):
    content = RecordDict(
        {
            protocol.ARRAYS: ArrayRecord(
                {
                    protocol.UPDATE_SUM: Array(np.zeros(strategy.aggregator.dim, np.float32)),
                    protocol.RESIDUAL_SUM: Array(residual),
                }
            ),
            protocol.METRICS: MetricRecord(
                {
                    "user_ids": users,
                    "user_loss": [0.0] * len(users),
                    "user_examples": [1] * len(users),
                    "num_clipped": 0,
                }
            ),
        }
    )
    return content


def test_a_residual_sum_that_overflows_float32_is_bad_state():
    from fedsim.runner.inprocess import task_identity
    from fedsim.strategies.user_dp import UserLevelDPStrategy

    with task_identity():
        _check_residual(UserLevelDPStrategy)


def _check_residual(UserLevelDPStrategy):
    strategy = UserLevelDPStrategy.__new__(UserLevelDPStrategy)
    strategy.ef_mode = "server"
    strategy.aggregator = UpdateAggregator(3, clip_norm=1.0)
    msg = Message(
        _reply(strategy, 1, [0], np.array([1e39, 0, 0], dtype=np.float64)), dst_node_id=1, message_type="train"
    )
    assert strategy._extract_ef(msg, [0]) is None
    ok = Message(_reply(strategy, 1, [0], np.array([1.0, 0, 0], dtype=np.float64)), dst_node_id=1, message_type="train")
    assert strategy._extract_ef(ok, [0]).dtype == np.float32


@pytest.mark.e2e
def test_hostile_users_in_a_real_multi_worker_run(tmp_path):
    """3 Ray workers, every user in every round (fixed K = N = 9): one user's features ×1e38,
    one user whose data raises. Every reply is accepted, the other 7 users' updates count, the
    run completes with the default min_valid_replies."""
    from fedsim.runner import run_experiment

    cfg = load_config(
        None,
        [
            "rounds=2",
            "data.name='synthetic'",
            "model.name='logreg'",
            "data.num_clients=9",
            "data.samples_per_user=8",
            "data.num_features=5",
            "data.num_classes=3",
            "sampling.scheme='fixed'",
            "sampling.cohort_size=9",
            "privacy.mechanism='gaussian'",
            "privacy.noise_multiplier=1.0",
            "client.max_examples=8",
            "client.batch_size=4",
            "eval.every=1",
            "sim.num_workers=3",
            "sim.engine='ray'",
        ],
    )
    out = tmp_path / "run"
    summary = run_experiment(
        cfg, out, progress=False, client_app=make_hostile_user_app({HUGE: "huge_features", RAISES: "raise"})
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["rounds_completed"] == 2
    for r in rows:
        assert r["cohort_size"] == 9 and r["dropped_replies"] == 0 and r["dropped_updates"] == 0
        assert r["failed_users"] == 1 and r["nonfinite_users"] == 1
        assert r["accepted_updates"] == 9  # every reply accepted; the two hostile users sent zero
        assert np.isfinite(r["train_loss"]) and r["eval_failed_users"] == 2
        assert np.isfinite(r["eval_accuracy"])


class _ReadAhead:
    """A dataset that reads users' rows lazily (``prepare_train``, as Stack Overflow does),
    logging every read; user ``bad``'s rows cannot be read, ahead or not."""

    def __init__(self, data, bad: int | None = None) -> None:
        self._data, self.bad, self.log = data, bad, []

    def __getattr__(self, name):
        return getattr(self._data, name)

    def prepare_train(self, u):
        self.log.append(("ahead", u))
        if u == self.bad:
            raise RuntimeError(f"injected: user {u}'s rows cannot be read")

    def train_samples(self, u, idx):
        self.log.append(("read", u))
        if u == self.bad:
            raise RuntimeError(f"injected: user {u}'s rows cannot be read")
        return self._data.train_samples(u, idx)


def test_the_next_users_rows_are_read_ahead_while_this_users_steps_are_queued():
    data, model, x0 = _setup()
    ahead = _ReadAhead(data)
    total, res = train_users(model, x0, ahead, [A, HUGE, B], 0, 0, SPEC)
    plain, plain_res = train_users(model, x0, data, [A, HUGE, B], 0, 0, SPEC)
    assert torch.equal(total, plain) and res == plain_res  # reading ahead changes nothing
    log = ahead.log
    assert [u for kind, u in log if kind == "ahead"] == [HUGE, B]  # each next user, once
    for prev, nxt in ((A, HUGE), (HUGE, B)):
        i = log.index(("ahead", nxt))
        # after the previous user's last batch, before the next user's first
        assert log[i - 1] == ("read", prev) and log[i + 1] == ("read", nxt)


def test_a_next_user_whose_rows_cannot_be_read_ahead_fails_alone():
    """Reading the next user's rows happens inside this user's training: the next user's bad
    rows must not fail this user, only the next user itself."""
    data, model, x0 = _setup()
    total, res = train_users(model, x0, _ReadAhead(data, bad=RAISES), [A, RAISES, B], 0, 0, SPEC)
    clean, clean_res = train_users(model, x0, data, [A, B], 0, 0, SPEC)
    assert torch.equal(total, clean) and float(total.norm()) > 0
    by = {r.user: r for r in res}
    assert by[RAISES].failed and (by[A], by[B]) == tuple(clean_res)
