"""The message protocol between the strategy and the ClientApp (no Flower imports).

Train message (server → node), content records:
  ``arrays``  ArrayRecord  ``params``: the global model, one flat float32 array;
                           ``direction``: DiSK only, the previous server step ``d_{t−1}``
  ``config``  ConfigRecord ``task`` (JSON :class:`Task`), ``round`` (0-based),
                           ``user_ids`` (the users this node must train),
                           ``clip_norm`` (this round's ``c_t``)
  ``client_state`` ArrayRecord  client error feedback only: ``e_<user>`` per user
Train reply (node → server):
  ``arrays``  ArrayRecord  ``update_sum``: Σ clip(Δ_i, c) over those users, flat float32;
                           ``residual_sum``: server error feedback only, Σ(Δ_i − clip(Δ_i, c₁))
  ``client_state`` ArrayRecord  client error feedback only: the users' new ``e_<user>``
  ``failure``  ConfigRecord only when a user's code raised and ``Task.record_statistics``:
                           ``traceback``, the first one (its last `TRACEBACK_CHARS` characters)
  ``metrics`` MetricRecord ``num_users``, ``user_ids``, ``num_clipped``, ``failed_users``,
                           ``nonfinite_users``, ``code_failed_users`` (failed users whose model,
                           loss or hook raised, not their data's reads); ``user_loss`` and ``user_examples`` only
                           when ``Task.record_statistics`` (never under example-level DP with
                           ``privacy.silo_statistics = "withhold"``)
Evaluate message: ``params``, ``task``, ``user_ids``, ``max_examples``;
reply ``metrics``: ``loss_sum``/``loss_count``, ``correct``/``count``, ``examples`` and any
dataset-specific ``<name>_correct``/``<name>_count`` pairs (summed by the server).
Query message (deployment, the census; :mod:`fedsim.deploy.nodes`): ``config`` ``data`` (the
JSON data spec); reply ``config`` ``names``, ``dims`` (JSON), ``task`` and ``metrics``
``num_train``, ``num_test`` of the node's users. In deployment ``user_ids`` in train and
evaluate messages are the node's *local* user indices.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from fedsim.data import DataOptions, spec_from_json, spec_to_json
from fedsim.training.example_dp import ExampleDP
from fedsim.training.local import DiskClient, LocalTraining

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
PARAMS = "params"
DIRECTION = "direction"
RESIDUAL_SUM = "residual_sum"
CLIENT_STATE = "client_state"
FAILURE = "failure"
#: the most characters of a failing user's traceback that a reply carries.
TRACEBACK_CHARS = 8000


def state_key(user: int) -> str:
    """Key of user ``user``'s error state in the ``client_state`` record."""
    return f"e_{int(user)}"


UPDATE_SUM = "update_sum"


@dataclass(frozen=True)
class Task:
    """What a worker needs to build (once) and to train users: data, model, hyperparameters."""

    data: DataOptions
    model: str
    model_seed: int
    seed: int
    local: LocalTraining
    threads: int = 1
    use_gpu: bool = False
    disk: DiskClient | None = None
    error_feedback: str = "none"
    ef_clip: float = 0.0
    example_dp: ExampleDP | None = None
    vectorize: bool = False
    #: an audit's change of the population (:class:`fedsim.attacks.population.AuditView`, JSON),
    #: applied by every worker to the loaded data; None for an ordinary run.
    view: str | None = None
    #: ``sim.allocator``: ``tuned`` (the worker calls :func:`fedsim.training.allocator.tune_allocator`) or ``system``.
    allocator: str = "tuned"
    #: whether replies may carry statistics of the users' records outside any DP noise (training
    #: loss, examples taken) and evaluation may run: False under example-level DP unless
    #: ``privacy.silo_statistics = "send"`` (:attr:`fedsim.config.Config.sends_silo_statistics`).
    record_statistics: bool = True
    #: the run executes on a Deployment Engine: a node selects its users from its node config
    #: (:func:`fedsim.deploy.nodes.node_selection`), Flower's partition keys included.
    deployed: bool = False
    #: the run's plugins (:func:`fedsim.plugins.manifest`: each spec and a file's SHA-256), which a
    #: worker or node loads before it builds the data and the model; left out of the JSON when empty
    plugins: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> str:
        d = asdict(self)
        d["data"] = json.loads(spec_to_json(self.data))
        if not self.plugins:
            del d["plugins"]  # a run without plugins sends the task it always sent
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> Task:
        d = json.loads(s)
        disk = DiskClient(**d["disk"]) if d.get("disk") else None
        return cls(
            spec_from_json(json.dumps(d["data"])),
            d["model"],
            int(d["model_seed"]),
            int(d["seed"]),
            LocalTraining(**d["local"]),
            int(d.get("threads", 1)),
            bool(d.get("use_gpu", False)),
            disk,
            str(d.get("error_feedback", "none")),
            float(d.get("ef_clip", 0.0)),
            ExampleDP(**d["example_dp"]) if d.get("example_dp") else None,
            bool(d.get("vectorize", False)),
            d.get("view"),
            str(d.get("allocator", "tuned")),
            bool(d.get("record_statistics", True)),
            bool(d.get("deployed", False)),
            [{"spec": str(p["spec"]), "sha256": str(p.get("sha256", ""))} for p in d.get("plugins", [])],
        )
