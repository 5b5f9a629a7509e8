"""The client side of `fedsim.flower.UserLevelDP`: one Flower mod, `user_dp_mod`.

Added to a ClientApp (`ClientApp(mods=[user_dp_mod])`) it does two things:

- **Clips on the node** (the client-side variant): for a train message that carries
  `KEY_CLIP_NORM` in its config record, the reply's model `y` is replaced by
  `x + clip(y − x, c)`, where `x` is the model the message carried. The raw update never
  leaves the node. A non-finite update becomes `x` (zero update), and the reply says so.
- **Answers the census** (stable identities): a train message whose config carries
  `KEY_CENSUS` (and no model) is answered, without calling the app,
  with the node's identity from its node config (a census rides on the train type because a
  Flower mod only sees message types the app registered): `user-id` if set (deployment: one user per
  node, named by the operator), else `partition-id` (Flower's simulation and most examples).
  The server keys a user's rounds on this identity, so they survive a SuperLink restart, and two
  nodes claiming one identity are refused.

The server never trusts the node: it re-clips every reply to `c` whatever the mod did.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from fedsim.flower.arrays import Layout
from fedsim.privacy.clipping import clip_vector

#: Config key of a train message that asks the node to clip its update to this L2 norm.
KEY_CLIP_NORM = "fedsim.clip-norm"
#: Config key of the census query message.
KEY_CENSUS = "fedsim.census"
#: Record names of the census reply.
CENSUS_RECORD = "fedsim.identity"
#: Metric key: 1 when the node replaced a non-finite update by zero.
KEY_NONFINITE = "fedsim.nonfinite"
#: Error code of a census reply from a node that has no identity to report.
NO_IDENTITY = 9701


def _config(msg: Message) -> ConfigRecord | None:
    records = list(msg.content.config_records.values()) if msg.has_content() else []
    return records[0] if len(records) == 1 else None


def node_identity(node_config: dict[str, Any]) -> str | None:
    """The identity a node reports: `user-id`, else `partition-id`, else None."""
    for key in ("user-id", "partition-id"):
        if key in node_config:
            return f"{key}={node_config[key]}"
    return None


def _census_reply(msg: Message, context: Context) -> Message:
    ident = node_identity(dict(context.node_config))
    if ident is None:
        return Message(
            Error(NO_IDENTITY, "the node config has neither user-id nor partition-id; set one with --node-config"),
            reply_to=msg,
        )
    return Message(RecordDict({CENSUS_RECORD: ConfigRecord({"identity": ident})}), reply_to=msg)


def _clip_reply(sent: ArrayRecord, x: np.ndarray, reply: Message, clip_norm: float) -> Message:
    """`reply` with its model `y` replaced by `x + clip(y − x, c)` (`x`: `sent` flat)."""
    arrays = list(reply.content.array_records.items()) if reply.has_content() else []
    if len(arrays) != 1:
        return reply  # nothing to clip; the server drops a reply without exactly one model
    name, record = arrays[0]
    layout = Layout.of(sent)
    y = layout.flatten(record)
    if y is None:
        return reply  # malformed: the server drops it
    delta = torch.from_numpy(y.astype(np.float64) - x.astype(np.float64))
    clipped, norm = clip_vector(delta, clip_norm, sent_as=torch.float32)  # non-finite → zeros
    reply.content[name] = layout.unflatten(torch.from_numpy(x).double().add_(clipped).float(), sent)
    if not np.isfinite(norm):
        for metrics in reply.content.metric_records.values():
            metrics[KEY_NONFINITE] = 1
    return reply


def user_dp_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A Flower client mod for `fedsim.flower.UserLevelDP` (see the module docstring).

    Place it last among the mods that touch the model (`ClientApp(mods=[..., user_dp_mod])`),
    so that it clips what is actually sent."""
    config = _config(msg)
    if msg.metadata.message_type == MessageType.TRAIN and config is not None and KEY_CENSUS in config:
        return _census_reply(msg, context)
    if msg.metadata.message_type != MessageType.TRAIN or config is None or KEY_CLIP_NORM not in config:
        return call_next(msg, context)
    sent = list(msg.content.array_records.values())
    if len(sent) != 1:
        return call_next(msg, context)
    x = Layout.of(sent[0]).flatten(sent[0])  # before the app runs: it could change the record
    reply = call_next(msg, context)
    if reply.has_error() or x is None:
        return reply
    return _clip_reply(sent[0], x, reply, float(config[KEY_CLIP_NORM]))  # type: ignore[arg-type]
