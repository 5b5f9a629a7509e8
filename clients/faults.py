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

from clients.client_app import evaluate, train
from fedsim import protocol

FAULT_KINDS = ("nan", "shape", "huge", "error", "users", "dtype", "noarrays", "slow")
SLOW_ROUND = 1
SLOW_SECONDS = 50.0


def _corrupt(reply: Message, kind: str, source: Message) -> Message:
    if kind == "users":
        m = reply.content.metric_records[protocol.METRICS]
        m["user_ids"] = [int(u) + 100_000 for u in m["user_ids"]]
        return reply
    if kind == "noarrays":
        return Message(content=RecordDict({protocol.METRICS: reply.content.metric_records[protocol.METRICS]}),
                       reply_to=source)
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


def make_fault_mod(faults: dict[int, str]) -> Callable:
    """A ClientApp mod injecting ``faults`` ({partition_id: kind}) into train replies."""
    for k in faults.values():
        if k not in FAULT_KINDS:
            raise ValueError(f"unknown fault {k!r}; allowed: {FAULT_KINDS}")

    def fault_mod(msg: Message, context: Context, call_next: Callable) -> Message:
        kind = faults.get(int(context.node_config.get("partition-id", -1)))
        if kind is None or msg.metadata.message_type != "train":
            return call_next(msg, context)
        if kind == "error":
            raise RuntimeError("injected client fault")
        if kind == "slow":
            reply = call_next(msg, context)
            if int(msg.content[protocol.CONFIG]["round"]) == SLOW_ROUND:
                time.sleep(SLOW_SECONDS)
            return reply
        return _corrupt(call_next(msg, context), kind, msg)

    return fault_mod


def make_faulty_client_app(faults: dict[int, str]) -> ClientApp:
    """fedsim's ClientApp with :func:`make_fault_mod` installed."""
    app = ClientApp(mods=[make_fault_mod(faults)])
    app.train()(train)
    app.evaluate()(evaluate)
    return app
