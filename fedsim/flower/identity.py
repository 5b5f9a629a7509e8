"""Which user each Flower node is: the identities the cohort sampler keys on.

A keyed scheme decides a user's rounds from ``PRF(key, identity)`` alone, so adding or removing a
node changes no other node's rounds. The identity is either the Flower node id (``node``: stable
while the SuperLink runs) or what the node reports in a census (``census``: its ``user-id`` or
``partition-id``, see :mod:`fedsim.flower.mod`), stable across SuperLink restarts. Two connected
nodes that claim one identity stop the run: the user would be trained, and counted, twice.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedsim.errors import FedsimError
from fedsim.flower.mod import CENSUS_RECORD, KEY_CENSUS

#: Seconds a census of new nodes may take.
CENSUS_TIMEOUT = 120.0


class Census:
    """Node id → identity, learned as nodes appear.

    Parameters
    ----------
    source : ``node`` (the node id is the identity) or ``census`` (ask each new node once).
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.identities: dict[int, str] = {}

    def _ask(self, grid: Grid, nodes: list[int]) -> dict[int, str]:
        msgs = [
            Message(
                RecordDict({"config": ConfigRecord({KEY_CENSUS: 1})}), dst_node_id=n, message_type=MessageType.TRAIN
            )
            for n in nodes
        ]
        found: dict[int, str] = {}
        for reply in grid.send_and_receive(msgs, timeout=CENSUS_TIMEOUT):
            node = reply.metadata.src_node_id
            rec = reply.content.config_records.get(CENSUS_RECORD) if reply.has_content() else None
            if reply.has_error() or rec is None or not isinstance(rec.get("identity"), str):
                why = reply.error.reason if reply.has_error() else "no identity record"
                raise FedsimError(
                    f"node {node} did not report an identity ({why}); identity='census' needs "
                    f"ClientApp(mods=[fedsim.flower.user_dp_mod]) and a partition-id or user-id in the node config"
                )
            found[node] = str(rec["identity"])
        silent = sorted(set(nodes) - set(found))
        if silent:
            raise FedsimError(f"nodes {silent} did not answer the census within {CENSUS_TIMEOUT:.0f} s")
        return found

    def update(self, grid: Grid, connected: list[int], population: int) -> dict[str, int]:
        """Identity → node id of the ``connected`` nodes (new ones asked first, under ``census``).

        Raises :class:`FedsimError` when two connected nodes claim one identity, or when more
        distinct identities are connected than the ``population`` the guarantee is stated for."""
        new = [n for n in connected if n not in self.identities]
        if new:
            self.identities.update({n: f"node:{n}" for n in new} if self.source == "node" else self._ask(grid, new))
        out: dict[str, int] = {}
        for node in sorted(connected):
            ident = self.identities[node]
            if ident in out:
                raise FedsimError(
                    f"nodes {out[ident]} and {node} both claim the user {ident!r}; each user must be held by one node"
                )
            out[ident] = node
        if len(out) > population:
            raise FedsimError(
                f"{len(out)} users (nodes) are connected, but the guarantee is stated for population = "
                f"{population}; raise population (ε changes) or connect fewer nodes"
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"source": self.source, "identities": dict(self.identities)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["source"] != self.source:
            raise FedsimError(f"the checkpoint keyed users on {state['source']!r}, not {self.source!r}")
        if self.source == "census":  # node ids change across SuperLink restarts; identities do not
            self.identities = {}
        else:
            self.identities = {int(k): str(v) for k, v in state["identities"].items()}
