"""Fault injection for tests: a Flower mod that corrupts the train replies of chosen nodes.

``make_faulty_client_app({partition_id: kind})`` returns fedsim's ClientApp with a
mod that, on the SuperNode whose ``partition-id`` is listed, replaces the reply's
update with a fault of that kind:

- ``nan``:   the update with NaN and Inf entries
- ``shape``: the update truncated by one entry
- ``huge``:  the update rescaled to L2 norm 1e6
- ``error``: an exception inside the ClientApp (Flower turns it into an error reply)
- ``users``: a reply that claims other user ids than the ones assigned
- ``dtype``: the update as int32
- ``noarrays``: a reply without the arrays record
- ``slow``:  in round :data:`SLOW_ROUND` only, the reply comes :data:`SLOW_SECONDS` late
  (past a short ``sim.round_timeout``)

Used by the tests to check that the server drops, counts or re-clips each kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedsim import protocol
from fedsim.clients.client_app import evaluate, train

FAULT_KINDS = ("nan", "shape", "huge", "error", "users", "dtype", "noarrays", "slow")
SLOW_ROUND = 1
SLOW_SECONDS = 50.0


def _corrupt(reply: Message, kind: str, source: Message) -> Message:
    if kind == "users":
        m = reply.content.metric_records[protocol.METRICS]
        ids = m["user_ids"]
        assert isinstance(ids, list)
        m["user_ids"] = [int(u) + 100_000 for u in ids]
        return reply
    if kind == "noarrays":
        return Message(
            content=RecordDict({protocol.METRICS: reply.content.metric_records[protocol.METRICS]}), reply_to=source
        )
    rec = reply.content.array_records[protocol.ARRAYS]
    v = np.array(rec[protocol.UPDATE_SUM].numpy(), dtype=np.float32)
    if kind == "dtype":
        reply.content[protocol.ARRAYS] = ArrayRecord({protocol.UPDATE_SUM: Array(v.astype(np.int32))})
        return reply
    if kind == "nan":
        v[0], v[-1] = np.nan, np.inf
    elif kind == "shape":
        v = v[:-1]
    elif kind == "huge":
        v = np.ones_like(v) * np.float32(1e6 / np.sqrt(v.size))
    reply.content[protocol.ARRAYS] = ArrayRecord({protocol.UPDATE_SUM: Array(v)})
    return reply


def make_fault_mod(faults: dict[int, str], rounds: set[int] | None = None) -> Callable:
    """A ClientApp mod injecting ``faults`` ({partition_id: kind}) into train replies, in the
    server rounds ``rounds`` only (1-based, as metrics rows number them; None: every round)."""
    for k in faults.values():
        if k not in FAULT_KINDS:
            raise ValueError(f"unknown fault {k!r}; allowed: {FAULT_KINDS}")

    def fault_mod(msg: Message, context: Context, call_next: Callable) -> Message:
        kind = faults.get(int(context.node_config.get("partition-id", -1)))
        if kind is None or msg.metadata.message_type != "train":
            return call_next(msg, context)
        # the message carries the 0-based round index t; rounds are counted as metrics rows count them
        t = msg.content.config_records[protocol.CONFIG]["round"]
        if rounds is not None and not (isinstance(t, int) and t + 1 in rounds):
            return call_next(msg, context)
        if kind == "error":
            raise RuntimeError("injected client fault")
        if kind == "slow":
            reply = call_next(msg, context)
            if msg.content.config_records[protocol.CONFIG]["round"] == SLOW_ROUND:
                time.sleep(SLOW_SECONDS)
            return reply
        return _corrupt(call_next(msg, context), kind, msg)

    return fault_mod


def make_faulty_client_app(faults: dict[int, str], rounds: set[int] | None = None) -> ClientApp:
    """fedsim's ClientApp with :func:`make_fault_mod` installed (``rounds`` as there)."""
    app = ClientApp(mods=[make_fault_mod(faults, rounds)])
    app.train()(train)
    app.evaluate()(evaluate)
    return app


#: Kinds of hostile *user data* (not node faults): one user's features scaled by 1e38, or one
#: user whose samples cannot be read (its training raises).
USER_FAULT_KINDS = ("huge_features", "raise")


class HostileUsers:
    """A dataset wrapper in which the users in ``faults`` ({user index: kind}) are hostile; every
    other user's data is the wrapped dataset's, unchanged."""

    def __init__(self, data, faults: dict[int, str]) -> None:
        for k in faults.values():
            if k not in USER_FAULT_KINDS:
                raise ValueError(f"unknown user fault {k!r}; allowed: {USER_FAULT_KINDS}")
        self._data = data
        self._faults = {int(u): k for u, k in faults.items()}

    def __getattr__(self, name):
        return getattr(self._data, name)

    def _sample(self, u, xy):
        kind = self._faults.get(int(u))
        if kind == "raise":
            raise RuntimeError(f"injected: user {u}'s data cannot be read")
        if kind == "huge_features":
            x, y = xy
            return x * 1e38, y
        return xy

    def train_samples(self, u, idx):
        kind = self._faults.get(int(u))
        if kind == "raise":
            raise RuntimeError(f"injected: user {u}'s data cannot be read")
        return self._sample(u, self._data.train_samples(u, idx))

    def test_samples(self, u, max_examples=None):
        return self._sample(u, self._data.test_samples(u, max_examples))


def make_hostile_user_app(faults: dict[int, str]) -> ClientApp:
    """fedsim's ClientApp whose workers see :class:`HostileUsers` data for ``faults`` (on every
    node): one user's data, not a node, is hostile."""
    from fedsim.clients import client_app as ca

    def hostile_data_mod(msg: Message, context: Context, call_next: Callable) -> Message:
        if msg.metadata.message_type in ("train", "evaluate"):
            task_json = str(msg.content[protocol.CONFIG]["task"])
            task, data, model = ca._worker(task_json, context.node_config)
            if not isinstance(data, HostileUsers):
                with ca._lock:
                    for key, value in list(ca._workers.items()):
                        if value[1] is data:
                            ca._workers[key] = (task, HostileUsers(data, faults), model)
        return call_next(msg, context)

    app = ClientApp(mods=[hostile_data_mod])
    app.train()(train)
    app.evaluate()(evaluate)
    return app
