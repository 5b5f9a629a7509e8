"""The fedsim ClientApp (Flower Message API).

A worker process builds its data handle and one model object once per task
(cached at module level) and reuses them for every message. A train message
names the users this node must train; the reply carries the sum of their clipped
updates (clipping happens here, per user, in fedsim's own code), their count and
per-user metrics. Individual updates are never logged or persisted.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim import protocol
from fedsim.data import load_federated
from fedsim.models import make_model
from fedsim.training import evaluate_users, train_users, train_users_ef

app = ClientApp()

_lock = threading.Lock()
_workers: dict[str, tuple] = {}


def _worker(task_json: str) -> tuple:
    """(task, data, model) for this task, built once per process."""
    with _lock:
        if task_json not in _workers:
            task = protocol.Task.from_json(task_json)
            torch.set_num_threads(max(1, task.threads))
            data = load_federated(task.data)
            model = make_model(task.model, data.model_dims(), seed=task.model_seed,
                               dp_layers=task.example_dp is not None)
            if task.use_gpu and torch.cuda.is_available():
                model = model.to("cuda")
            _workers.clear()  # one task per process at a time
            _workers[task_json] = (task, data, model)
        return _workers[task_json]


def _params(msg: Message) -> torch.Tensor:
    return torch.from_numpy(np.array(msg.content[protocol.ARRAYS][protocol.PARAMS].numpy(), dtype=np.float32))


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = msg.content[protocol.CONFIG]
    task, data, model = _worker(str(cfg["task"]))
    users = [int(u) for u in cfg["user_ids"]]
    x0 = _params(msg)
    local = task.local
    if "clip_norm" in cfg:  # this round's c_t (adaptive clipping moves it)
        local = replace(local, clip_norm=float(cfg["clip_norm"]))
    d_prev = None
    if task.disk is not None:  # DiSK: the server sent its previous step d_{t−1}
        d_prev = torch.from_numpy(np.array(msg.content[protocol.ARRAYS][protocol.DIRECTION].numpy(),
                                           dtype=np.float32))
    arrays = {}
    records = {}
    if task.error_feedback == "none":
        total, results = train_users(model, x0, data, users, int(cfg["round"]), task.seed, local,
                                     task.disk, d_prev, task.example_dp)
    else:
        states = None
        if task.error_feedback == "client":
            rec = msg.content.array_records[protocol.CLIENT_STATE]
            states = {u: torch.from_numpy(np.array(rec[protocol.state_key(u)].numpy(), dtype=np.float32))
                      for u in users}
        total, results, extra = train_users_ef(model, x0, data, users, int(cfg["round"]), task.seed, local,
                                               task.error_feedback, task.ef_clip, states, task.disk, d_prev,
                                               task.example_dp)
        if task.error_feedback == "client":
            records[protocol.CLIENT_STATE] = ArrayRecord(
                {protocol.state_key(u): Array(e.numpy()) for u, e in extra.items()})
        else:
            arrays[protocol.RESIDUAL_SUM] = Array(extra.numpy())
    metrics = MetricRecord({
        "num_users": len(users),
        "user_ids": users,
        "user_loss": [float(r.loss) for r in results],
        "user_examples": [int(r.num_examples) for r in results],
        "num_clipped": int(sum(r.clipped for r in results)),
    })
    content = RecordDict({
        protocol.ARRAYS: ArrayRecord({protocol.UPDATE_SUM: Array(total.numpy()), **arrays}),
        protocol.METRICS: metrics,
        **records,
    })
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    cfg = msg.content[protocol.CONFIG]
    task, data, model = _worker(str(cfg["task"]))
    users = [int(u) for u in cfg["user_ids"]]
    sums = evaluate_users(model, _params(msg), data, users, int(cfg["max_examples"]))
    metrics = MetricRecord({k: float(v) for k, v in sums.items()})
    return Message(content=RecordDict({protocol.METRICS: metrics}), reply_to=msg)
