"""The strategy's reply guard on crafted Flower messages: duplicate replies, replies to a
previous round, replies from nodes that were sent nothing, missing nodes. Each is dropped
and counted; the sum (and so the model step) is exactly that of the valid replies; the
ledger is unaffected.

(The real transport never produces duplicates or another round's replies — Flower's Grid
collects replies by message id — so these cases are built directly as Flower messages.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict

from fedsim import protocol
from fedsim.privacy.accounting import AccountingSpec
from fedsim.privacy.ledger import Ledger
from fedsim.privacy.noise import zero_noise
from fedsim.privacy.participation import make_scheme
from fedsim.server.optim import make_optimizer
from fedsim.server.sampling import make_sampler
from fedsim.server.step import DPServer
from fedsim.strategies.user_dp import UserLevelDPStrategy

D, N, K = 6, 12, 6


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Outgoing Flower messages take their run and node ids from the running ServerApp's
    task identity; outside one, give them fixed values."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1, raising=False)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0, raising=False)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0, raising=False)


class _Nodes:
    """The one thing configure_train asks the Grid: which SuperNodes are connected."""

    def get_node_ids(self):
        return [11, 12, 13]


def _strategy() -> UserLevelDPStrategy:
    spec = AccountingSpec("gaussian", "fixed", N, K, 1.0, 1e-3)
    server = DPServer(
        torch.zeros(D),
        zero_noise(D, 0),
        make_optimizer("sgd", 1.0),
        Ledger(spec, 5),
        clip_norm=1.0,
        noise_multiplier=0.0,
        expected_cohort=K,
    )
    return UserLevelDPStrategy(
        server=server,
        sampler=make_sampler(make_scheme("fixed", N, K), 0),
        task_json="{}",
        train_costs=np.ones(N),
        rounds=5,
        eval_users=[],
        eval_costs=np.ones(N),
        eval_every=0,
        eval_max_examples=1,
        round_timeout=1.0,
    )


def _reply(node: int, users: list[int], update: np.ndarray | None, group: str) -> Message:
    md = Metadata(
        run_id=0,
        message_id=f"r{node}",
        src_node_id=node,
        dst_node_id=0,
        reply_to_message_id="m",
        group_id=group,
        created_at=0.0,
        ttl=60.0,
        message_type="train",
    )
    content = RecordDict(
        {
            protocol.METRICS: MetricRecord(
                {
                    "num_users": len(users),
                    "user_ids": users,
                    "user_loss": [0.0] * len(users),
                    "user_examples": [1] * len(users),
                    "num_clipped": 0,
                }
            )
        }
    )
    if update is not None:
        content[protocol.ARRAYS] = ArrayRecord({protocol.UPDATE_SUM: Array(update.astype(np.float32))})
    return Message(content, metadata=md)


def _configure(strategy: UserLevelDPStrategy, server_round: int) -> dict[int, list[int]]:
    msgs = list(strategy.configure_train(server_round, strategy._params_record(), None, _Nodes()))
    return {m.metadata.dst_node_id: [int(u) for u in m.content[protocol.CONFIG]["user_ids"]] for m in msgs}


def _vec(users: list[int], scale: float = 0.1) -> np.ndarray:
    return np.full(D, scale * len(users) / np.sqrt(D))  # norm 0.1·m ≤ m·c


def test_duplicate_stale_unassigned_and_missing_are_dropped():
    s = _strategy()
    assigned = _configure(s, 1)
    nodes = sorted(assigned)
    a, b, c = nodes
    good = [_reply(a, assigned[a], _vec(assigned[a]), "train-0"), _reply(b, assigned[b], _vec(assigned[b]), "train-0")]
    hostile = [
        _reply(a, assigned[a], _vec(assigned[a], 0.9), "train-0"),  # duplicate from node a
        _reply(99, [0], _vec([0]), "train-0"),  # a node that was sent nothing
    ]
    # node c does not answer at all
    s.aggregate_train(1, good + hostile)
    row = s._last_train
    assert row["drop_reasons"]["duplicate"] == 1
    assert row["drop_reasons"]["unexpected_users"] == 1
    assert row["drop_reasons"]["missing"] == 1
    assert row["accepted_updates"] == len(assigned[a]) + len(assigned[b])
    assert row["dropped_updates"] == len(assigned[c])  # duplicates/unassigned add no users
    # The step is exactly the valid replies' sum over the fixed K̄ (no noise, SGD lr 1).
    want = (_vec(assigned[a]) + _vec(assigned[b])).astype(np.float32) / K
    np.testing.assert_allclose(s.server.params.numpy(), want, rtol=1e-6)

    # Round 2: a reply to round 1's message is stale; the ledger counts rounds, not replies.
    eps_before = s.server.ledger.epsilon
    assigned2 = _configure(s, 2)
    n0 = sorted(assigned2)[0]
    s.aggregate_train(2, [_reply(n0, assigned2[n0], _vec(assigned2[n0]), "train-0")])
    row2 = s._last_train
    assert row2["drop_reasons"]["stale"] == 1
    assert row2["accepted_updates"] == 0
    np.testing.assert_allclose(s.server.params.numpy(), want, rtol=1e-6)  # nothing added
    assert s.server.ledger.rounds_recorded == 2 and s.server.ledger.epsilon > eps_before


def test_too_few_valid_replies_raise_before_any_step():
    from fedsim.errors import FedsimError

    s = _strategy()
    s.min_valid_replies = 2
    assigned = _configure(s, 1)
    a = sorted(assigned)[0]
    with pytest.raises(FedsimError, match="min_valid_replies"):
        s.aggregate_train(
            1,
            [
                _reply(a, assigned[a], _vec(assigned[a]), "train-0"),
                _reply(a, assigned[a], _vec(assigned[a]), "train-0"),
            ],
        )  # duplicate ≠ valid
    assert s.server.round == 0 and s.server.ledger.rounds_recorded == 0


def _sent_params(strategy: UserLevelDPStrategy) -> np.ndarray:
    return strategy._params_record()[protocol.PARAMS].numpy()


def test_the_params_record_is_built_once_per_state_and_never_stale():
    """The serialized model is reused until the parameters change: an optimizer step changes
    them in place, a resume replaces the tensor. A stale record would send every worker the
    previous round's model."""
    strategy = _strategy()
    first = strategy._params_record()
    assert strategy._params_record() is first  # the same state: serialized once
    np.testing.assert_array_equal(_sent_params(strategy), np.zeros(D))
    assigned = _configure(strategy, 1)
    replies = [_reply(n, u, _vec(u), "train-0") for n, u in assigned.items()]
    strategy.aggregate_train(1, replies)  # the server steps its parameters in place
    after = strategy._params_record()
    assert after is not first
    np.testing.assert_array_equal(_sent_params(strategy), strategy.server.params.numpy())
    assert not np.array_equal(_sent_params(strategy), np.zeros(D))
    strategy.server.params.add_(1.0)  # any in-place change, even outside a step
    np.testing.assert_array_equal(_sent_params(strategy), strategy.server.params.numpy())
    state = strategy.server.state_dict()
    state["params"] = torch.full((D,), 7.0)
    strategy.server.load_state_dict(state)  # a resume: a new tensor
    np.testing.assert_array_equal(_sent_params(strategy), np.full(D, 7.0))


def test_an_error_reply_from_the_superlink_is_counted_once_for_the_node_it_answers():
    """Flower answers for an unreachable node with an error reply whose source is the SuperLink
    (node id 1). It is the lost node's reply: one ``client_error`` for that node's users, no
    ``unexpected_users`` and no ``missing``."""
    from flwr.app import Error

    s = _strategy()
    assigned = _configure(s, 1)
    a, b, c = sorted(assigned)
    md = Metadata(
        run_id=0,
        message_id="e1",
        src_node_id=1,
        dst_node_id=0,
        reply_to_message_id="to-c",
        group_id="train-0",
        created_at=0.0,
        ttl=60.0,
        message_type="train",
    )
    lost = Message(Error(code=0, reason="node unavailable"), metadata=md)
    s._destinations = {"to-a": a, "to-b": b, "to-c": c}
    good = [_reply(n, assigned[n], _vec(assigned[n]), "train-0") for n in (a, b)]
    s.aggregate_train(1, good + [lost])
    row = s._last_train
    assert {k: v for k, v in row["drop_reasons"].items() if v} == {"client_error": 1}
    assert row["dropped_replies"] == 1 and row["dropped_updates"] == len(assigned[c])
