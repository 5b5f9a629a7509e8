"""Screening one round's replies when each Flower node is one user.

Every reply the wrapper did not ask for this round, and every second reply of a node, counts for
nothing; a reply that carries an error, or a model that does not have the broadcast model's
layout, drops its node's update. A node asked but silent is ``missing``. The reasons are those
of fedsim's own runs (:data:`fedsim.server.aggregation.DROP_REASONS`). What remains are the nodes'
model updates ``Δ_i = y_i − x_t``, which :class:`fedsim.server.aggregation.UpdateAggregator` validates,
clips to ``c`` and sums — the same code as fedsim's own runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Message

from fedsim.flower.arrays import Layout
from fedsim.server.aggregation import UpdateAggregator


def screen_and_sum(
    replies: Iterable[Message],
    sent: dict[str, int],
    layout: Layout,
    x_t: np.ndarray,
    aggregator: UpdateAggregator,
) -> set[int]:
    """Add one round's valid updates to ``aggregator`` and count every drop; returns the nodes
    whose update was accepted.

    Parameters
    ----------
    replies : the round's replies, as Flower's grid returned them.
    sent : message id → destination node, of the train messages this round sent.
    layout : the broadcast model's layout (a reply must have it).
    x_t : the broadcast model, flat float32.
    aggregator : the round's running sum (clip bound ``c``, one user per reply).
    """
    seen: set[int] = set()
    accepted: set[int] = set()
    for msg in replies:
        asked = sent.get(msg.metadata.reply_to_message_id)
        node = asked if msg.has_error() and asked is not None else msg.metadata.src_node_id
        if asked is None or asked != node:  # not an answer to this round's message to that node
            aggregator.drop("stale" if node in sent.values() else "unexpected_users", 0)
            continue
        if node in seen:
            aggregator.drop("duplicate", 0)
            continue
        seen.add(node)
        if msg.has_error():
            aggregator.drop("client_error", 1)
            continue
        records = list(msg.content.array_records.values()) if msg.has_content() else []
        y = layout.flatten(records[0]) if len(records) == 1 else None
        if y is None:
            aggregator.drop("shape" if records else "missing", 1)
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            delta = y - x_t
        if aggregator.add(delta, 1) is None:
            accepted.add(node)
    for _ in set(sent.values()) - seen:
        aggregator.drop("missing", 1)
    return accepted
