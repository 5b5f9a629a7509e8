"""The fedsim ClientApp (Flower Message API).

A worker process builds its data handle and one model object once per task
(cached at module level) and reuses them for every message. A train message
names the users this node must train; the reply carries the sum of their clipped
updates (clipping happens here, per user, in fedsim's own code), their count and
per-user metrics. Individual updates are never logged or persisted.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim import plugins, protocol, records
from fedsim.data import spec_from_json
from fedsim.deploy.nodes import node_data, node_selection
from fedsim.models import make_model
from fedsim.training.allocator import tune_allocator
from fedsim.training.isolation import remember_pristine
from fedsim.training.local import evaluate_users, train_users, train_users_ef
from fedsim.training.vectorized import train_users_vectorized


class _DropActorShutdownNotice(logging.Filter):
    """Flower logs a WARNING ("Manually terminating ClientAppActor") in every Ray worker when
    the simulation shuts its workers down: the normal end of a run, nothing to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Manually terminating" not in record.getMessage()


logging.getLogger("flwr").addFilter(_DropActorShutdownNotice())

app = ClientApp()

_lock = threading.Lock()
_workers: dict[str, tuple] = {}


def _worker(task_json: str, node_config: dict | None = None) -> tuple:
    """(task, data, model) for this task, built once per process. With a deployment node
    config (``data-root``, ``user-shard``), ``data`` is this node's users, indexed locally."""
    # Only the keys that select data count; in fedsim's own simulation Flower's partition keys
    # differ per virtual node, select nothing and must not defeat the cache.
    node_config = node_selection(node_config or {}, bool(json.loads(task_json).get("deployed", False)))
    key = task_json + json.dumps({k: str(v) for k, v in node_config.items()}, sort_keys=True)
    with _lock:
        if key not in _workers:
            raw = json.loads(task_json)
            if raw.get("plugins"):  # the run's own parts register before its data spec is read
                plugins.require(raw["plugins"], "this SuperNode" if raw.get("deployed") else "this worker")
            task = protocol.Task.from_json(task_json)
            torch.set_num_threads(max(1, task.threads))
            if task.allocator == "tuned":
                tune_allocator()
            data = node_data(task.data, node_config)
            if task.view is not None:  # an audit's population: canary users added, held-out users removed
                from fedsim.attacks.population import AuditView

                data = AuditView.from_json(task.view).apply(data)
            model = make_model(
                task.model, data.model_dims(), seed=task.model_seed, dp_layers=task.example_dp is not None
            )
            if task.use_gpu and torch.cuda.is_available():
                model = model.to("cuda")
            remember_pristine(model)  # before any user's data: what every user's training starts from
            _workers.clear()  # one task per process at a time
            _workers[key] = (task, data, model)
        return _workers[key]


def _array(msg: Message, key: str, record: str = protocol.ARRAYS) -> torch.Tensor:
    """The flat float32 array ``key`` of the message's ArrayRecord ``record``, as a tensor."""
    return torch.from_numpy(np.array(records.need_array(msg.content.array_records.get(record), key), dtype=np.float32))


def _params(msg: Message) -> torch.Tensor:
    return _array(msg, protocol.PARAMS)


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = records.config(msg, protocol.CONFIG)
    task, data, model = _worker(str(cfg["task"]), context.node_config)
    users = records.need_ints(cfg["user_ids"], "user_ids")
    round_index = records.need_int(cfg["round"], "round")
    x0 = _params(msg)
    local = task.local
    if "clip_norm" in cfg:  # this round's c_t (adaptive clipping moves it)
        local = replace(local, clip_norm=records.need_float(cfg["clip_norm"], "clip_norm"))
    d_prev = None
    if task.disk is not None:  # DiSK: the server sent its previous step d_{t−1}
        d_prev = _array(msg, protocol.DIRECTION)
    arrays = {}
    extra_records: dict[str, ArrayRecord | ConfigRecord] = {}
    if task.vectorize and task.error_feedback == "none" and task.disk is None and task.example_dp is None:
        total, results = train_users_vectorized(model, x0, data, users, round_index, task.seed, local)
    elif task.error_feedback == "none":
        total, results = train_users(
            model, x0, data, users, round_index, task.seed, local, task.disk, d_prev, task.example_dp
        )
    else:
        states = None
        if task.error_feedback == "client":
            states = {u: _array(msg, protocol.state_key(u), protocol.CLIENT_STATE) for u in users}
        total, results, extra = train_users_ef(
            model,
            x0,
            data,
            users,
            round_index,
            task.seed,
            local,
            task.error_feedback,
            task.ef_clip,
            states,
            task.disk,
            d_prev,
            task.example_dp,
        )
        if isinstance(extra, dict):  # client error feedback: the users' new states
            extra_records[protocol.CLIENT_STATE] = ArrayRecord(
                {protocol.state_key(u): Array(e.numpy()) for u, e in extra.items()}
            )
        else:  # server error feedback: the residual sum
            arrays[protocol.RESIDUAL_SUM] = Array(extra.numpy())
    metrics = MetricRecord(
        {
            "num_users": len(users),
            "user_ids": users,
            "num_clipped": int(sum(r.clipped for r in results)),
            # isolation: users that contributed zero because their training raised / was not finite
            "failed_users": int(sum(r.failed for r in results)),
            "nonfinite_users": int(sum(r.nonfinite for r in results)),
            # of those, users whose code (model, loss, hook) raised rather than their data's reads
            "code_failed_users": int(sum(r.code_error is not None for r in results)),
        }
    )
    if task.record_statistics:  # the loss and the examples taken are not covered by any DP noise
        metrics["user_loss"] = [float(r.loss) for r in results]
        metrics["user_examples"] = [int(r.num_examples) for r in results]
    first_error = next((r.code_error for r in results if r.code_error is not None), None)
    if first_error is not None and task.record_statistics:  # the server shows it, and stops if nobody trained
        extra_records[protocol.FAILURE] = ConfigRecord({"traceback": first_error[-protocol.TRACEBACK_CHARS :]})
    elif first_error is not None:  # a silo that withholds its records' statistics keeps the text here
        logging.getLogger("fedsim").warning("a user's local training raised in code:\n%s", first_error)
    content = RecordDict(
        {
            protocol.ARRAYS: ArrayRecord({protocol.UPDATE_SUM: Array(total.numpy()), **arrays}),
            protocol.METRICS: metrics,
            **extra_records,
        }
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    cfg = records.config(msg, protocol.CONFIG)
    task, data, model = _worker(str(cfg["task"]), context.node_config)
    if not task.record_statistics:
        raise PermissionError(
            "this task withholds statistics of the silos' records (privacy.silo_statistics = 'withhold'): "
            "no evaluation on them"
        )
    users = records.need_ints(cfg["user_ids"], "user_ids")
    sums = evaluate_users(model, _params(msg), data, users, records.need_int(cfg["max_examples"], "max_examples"))
    metrics = MetricRecord({k: float(v) for k, v in sums.items()})
    return Message(content=RecordDict({protocol.METRICS: metrics}), reply_to=msg)


@app.query()
def census(msg: Message, context: Context) -> Message:
    """Deployment: report this node's users (names, train and test sample counts) and the
    model dimensions of its data, for the data spec in the message."""
    cfg = records.config(msg, protocol.CONFIG)
    if "plugins" in cfg:  # the parts of the run's plugins, before the data spec is read
        plugins.require(json.loads(str(cfg["plugins"])), "this SuperNode")
    spec = spec_from_json(str(cfg["data"]))
    selection = node_selection(dict(context.node_config), deployed=True)
    data = node_data(spec, selection)
    metrics = MetricRecord(
        {
            "num_train": [int(data.num_train(u)) for u in range(data.population)],
            "num_test": [int(data.num_test(u)) for u in range(data.population)],
        }
    )
    cfg = ConfigRecord(
        {
            "names": [str(n) for n in data.names],
            "dims": json.dumps(data.model_dims()),
            "task": str(data.task),
            # what selects this node's users, so that an overlap names the settings to fix
            "selection": " ".join(f"{k}={v}" for k, v in sorted(selection.items())) or "all users of its data",
        }
    )
    return Message(content=RecordDict({protocol.METRICS: metrics, protocol.CONFIG: cfg}), reply_to=msg)
