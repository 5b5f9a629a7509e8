"""Which users a deployed SuperNode holds, and the census that tells the server.

In deployment each SuperNode reads its own local data. Its ``--node-config`` says where and
which part:

- ``data-root`` — the node's data folder; it replaces ``data.root`` of the experiment (not
  needed for the bundled Shakespeare);
- ``user-shard`` — ``"i/n"``: the node holds shard ``i`` (0-based) of ``n`` contiguous,
  near-equal shards of the local dataset's users in their stable order. Absent: all of them
  (one node per silo, or each node's folder holds only its own users).

Flower's own convention also works: a node with ``partition-id`` and ``num-partitions`` in its
node config and no ``data-root`` or ``user-shard`` holds shard ``partition-id/num-partitions``
of the dataset. Every SuperNode that a *simulation* SuperLink starts (``flwr run`` against
``flower-superlink --simulation``) has these two keys, so any number of simulated SuperNodes
splits the users among them.

``data.max_users`` does not apply on a deployed node: the population is what the nodes hold.

The server's first message (a ``query``, the *census*) asks every node for its users' names
and sample counts. The server orders all users by name, numbers them ``0..N−1`` (the population
that is sampled and accounted), refuses a user held by two nodes (it would be counted twice
in the privacy analysis), and from then on sends each node the *local* indices of its users.
In simulation no node config is set, every worker sees the whole dataset and local = global.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedsim.data import DataOptions, FederatedData, data_spec, load_federated
from fedsim.data.base import UserCounts
from fedsim.errors import FedsimError

DATA_ROOT = "data-root"
USER_SHARD = "user-shard"
#: Flower's node config keys of a simulated SuperNode (and of Flower's examples' deployments).
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"


def node_selection(node_config: dict[str, Any], deployed: bool) -> dict[str, Any]:
    """The node config keys that select this node's users: ``data-root`` and ``user-shard``, and,
    in a deployment without either, Flower's ``partition-id``/``num-partitions`` as the shard
    ``"partition-id/num-partitions"``. In fedsim's own simulation (``deployed`` False) every
    worker serves the whole dataset, whatever Flower's partition keys say."""
    sel = {k: node_config[k] for k in (DATA_ROOT, USER_SHARD) if k in node_config}
    if deployed and not sel and PARTITION_ID in node_config and NUM_PARTITIONS in node_config:
        sel[USER_SHARD] = f"{int(node_config[PARTITION_ID])}/{int(node_config[NUM_PARTITIONS])}"
    return sel


def parse_shard(value: str) -> tuple[int, int]:
    """``"i/n"`` → ``(i, n)`` with ``0 ≤ i < n``."""
    try:
        i, n = (int(p) for p in str(value).split("/"))
    except ValueError:
        raise FedsimError(f"node config {USER_SHARD} = {value!r}: expected 'i/n', e.g. '0/3'") from None
    if not 0 <= i < n:
        raise FedsimError(f"node config {USER_SHARD} = {value!r}: needs 0 ≤ i < n")
    return i, n


def is_node_local(node_config: dict[str, Any]) -> bool:
    """Whether the node config names node-local data (deployment)."""
    return DATA_ROOT in node_config or USER_SHARD in node_config


class NodeView:
    """The users ``keep`` of ``data``, re-indexed ``0..len(keep)−1`` (everything else delegates)."""

    def __init__(self, data: FederatedData, keep: list[int]) -> None:
        self.data = data
        self.keep = np.asarray(keep, dtype=np.int64)
        self.task = data.task
        self.vocab_size = data.vocab_size
        self.names = [data.names[int(u)] for u in self.keep]

    @property
    def population(self) -> int:
        return len(self.keep)

    def num_train(self, u: int) -> int:
        return self.data.num_train(int(self.keep[u]))

    def num_test(self, u: int) -> int:
        return self.data.num_test(int(self.keep[u]))

    def examples_per_user(self) -> np.ndarray:
        return self.data.examples_per_user()[self.keep]

    def model_dims(self) -> dict[str, int]:
        return self.data.model_dims()

    def train_samples(self, u: int, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.train_samples(int(self.keep[u]), idx)

    def test_samples(self, u: int, max_examples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.test_samples(int(self.keep[u]), max_examples)

    @property
    def softmax_ignore_index(self) -> int | None:
        return getattr(self.data, "softmax_ignore_index", None)

    def prepare_train(self, u: int) -> None:
        """Read user ``u``'s train rows ahead where the underlying dataset can."""
        prepare = getattr(self.data, "prepare_train", None)
        if prepare is not None:
            prepare(int(self.keep[u]))

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.data.loss(out, y)

    def eval_sums(self, out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        return self.data.eval_sums(out, y)

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> tuple[int, float] | None:
        return None


def node_data(spec: DataOptions, node_config: dict[str, Any]) -> FederatedData:
    """The users this node holds: ``spec`` with the node's ``data-root``, restricted to its
    ``user-shard``. Without node config: the whole dataset (simulation)."""
    if not is_node_local(node_config):
        return load_federated(spec)
    changes: dict[str, Any] = {"max_users": None}  # a node serves all the users it holds (or its shard)
    if DATA_ROOT in node_config and "root" in type(spec).model_fields:
        changes["root"] = str(node_config[DATA_ROOT])
    spec = data_spec(spec.name, **{**spec.model_dump(exclude={"name"}), **changes})
    data = load_federated(spec)
    keep = list(range(data.population))
    if USER_SHARD in node_config:
        i, n = parse_shard(str(node_config[USER_SHARD]))
        keep = [int(u) for u in np.array_split(np.arange(data.population), n)[i]]
    return NodeView(data, keep)


@dataclass
class CensusData(UserCounts):
    """The server's view of a deployed population: no samples, only what scheduling,
    accounting and the model need (names, counts, model dimensions)."""

    names: list[str]
    _num_train: np.ndarray
    _num_test: np.ndarray
    dims: dict[str, int]
    task: str

    @property
    def vocab_size(self) -> int:
        return int(next(iter(self.dims.values())))

    def model_dims(self) -> dict[str, int]:
        return dict(self.dims)

    def majority_baseline(self, users: list[int], max_examples: int | None = None) -> None:
        return None


def merge_census(replies: dict[int, dict[str, Any]]) -> tuple[CensusData, dict[int, tuple[int, int]]]:
    """Combine the nodes' census replies (``{node_id: {"names", "num_train", "num_test",
    "dims", "task"}}``) into the population and ``owners``: global user → (node, local index)."""
    rows: list[tuple[str, int, int, int, int]] = []
    dims: dict[str, int] | None = None
    task = None
    for node, r in sorted(replies.items()):
        if dims is None:
            dims, task = dict(r["dims"]), str(r["task"])
        elif dict(r["dims"]) != dims:
            raise FedsimError(
                f"node {node} reports model dimensions {r['dims']} but another node {dims}: "
                f"the nodes hold different datasets or settings"
            )
        for i, (name, ntr, nte) in enumerate(zip(r["names"], r["num_train"], r["num_test"])):
            rows.append((str(name), int(node), i, int(ntr), int(nte)))
    if dims is None or not rows:
        raise FedsimError("no SuperNode reported any user; check each node's data-root and user-shard")
    rows.sort()
    held = [(a, b) for a, b in zip(rows, rows[1:]) if a[0] == b[0]]
    if held:
        a, b = held[0]

        def described(n: int) -> str:
            selection = replies[n].get("selection")
            return f"node {n}" + (f" ({selection})" if selection else "")

        raise FedsimError(
            f"{len(held)} user(s), {a[0]!r} the first, are held by {described(a[1])} and {described(b[1])}; give each node "
            f'a disjoint user-shard (node config user-shard = "i/n", or Flower\'s partition-id and num-partitions), '
            f"or its own data-root: a user counted twice would break the privacy accounting"
        )
    data = CensusData(
        [r[0] for r in rows],
        np.array([r[3] for r in rows], dtype=np.int64),
        np.array([r[4] for r in rows], dtype=np.int64),
        dims,
        str(task),
    )
    owners = {g: (r[1], r[2]) for g, r in enumerate(rows)}
    return data, owners
