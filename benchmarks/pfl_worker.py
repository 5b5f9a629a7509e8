"""One pfl-research simulation of a throughput workload, timed per round (run by throughput.py).

Runs inside pfl's own environment (``benchmarks/pfl_env.sh`` builds ``.venv-pfl``: pfl 0.6.0 pins
dp-accounting 0.5.1, so it never shares fedsim's). The workload comes from the file that
throughput.py exports with fedsim's data loaders: every user's training samples (the same ``m``
per user that fedsim and the floor train per round), the model's registry name, dimensions and seed
(built here by ``fedsim.models.make_model``, which needs only torch and pydantic), the loss, and
the DP and optimiser settings. pfl then does what fedsim's round does: sample ``K`` users, train
each locally with SGD, clip each update to ``c``, sum, add central Gaussian noise ``z·c`` (pfl's
``GaussianMechanism`` applied centrally), and step the server SGD.

Usage (one process)::

    PYTHONPATH=. .venv-pfl/bin/python benchmarks/pfl_worker.py WORKLOAD.pt

or with ``torchrun --nproc_per_node 2`` for pfl's own two-worker simulation (each worker trains
half the cohort; the aggregates are summed with ``torch.distributed``). Prints one JSON line:
``{"rounds": [seconds per round], "total_s", "peak_rss_mb"}`` (from rank 0).
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402
from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism  # noqa: E402

from fedsim.models import make_model  # noqa: E402


class Task(torch.nn.Module):
    """The fedsim model with the ``loss``/``metrics`` methods pfl's ``PyTorchModel`` calls."""

    def __init__(self, inner: torch.nn.Module, loss: str) -> None:
        super().__init__()
        self.inner, self.kind = inner, loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        self.eval() if eval else self.train()
        out = self(x)
        if self.kind == "nwp":  # the Stack Overflow next-word loss: flattened, padding ignored
            return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=0)
        return torch.nn.functional.cross_entropy(out, y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> dict:
        return {"loss": Weighted(float(self.loss(x, y, eval=True)) * len(x), len(x))}


class Stamps(TrainingProcessCallback):
    """Wall-clock time after every central iteration (the round)."""

    def __init__(self) -> None:
        self.marks = [time.perf_counter()]

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self.marks.append(time.perf_counter())
        return False, Metrics()


def main() -> None:
    torch.set_num_threads(1)
    blob = torch.load(sys.argv[1], weights_only=False)
    meta, users = blob["meta"], blob["users"]
    np.random.seed(0)
    torch.manual_seed(0)  # benchmark determinism only: pfl's own sampling and noise
    model = Task(make_model(meta["model"], meta["dims"], seed=meta["seed"]), meta["loss"])
    ids = [str(u) for u in range(len(users))]
    order = iter(np.random.default_rng(0).permutation(np.tile(np.arange(len(users)), 10_000)))

    def dataset(uid: str) -> Dataset:
        x, y = users[int(uid)]
        return Dataset(raw_data=[x, y], user_id=uid)

    def sampler() -> str:  # users from a shuffled long list: a cohort may repeat a user (fedsim's
        # "fixed" scheme never does); every W1/W2 user has the same sample count, so the work is the same
        return ids[int(next(order))]

    train = FederatedDataset(dataset, sampler)
    val = FederatedDataset(dataset, sampler)
    mech = CentrallyAppliedPrivacyMechanism(GaussianMechanism(meta["clip_norm"], meta["noise_multiplier"]))
    backend = SimulatedBackend(training_data=train, val_data=val, postprocessors=[mech])
    pfl_model = PyTorchModel(
        model=model,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(model.parameters(), lr=meta["server_lr"]),
    )
    stamps = Stamps()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=meta["rounds"],
            evaluation_frequency=meta["rounds"] + 1,
            train_cohort_size=meta["cohort"],
            val_cohort_size=0,
        ),
        backend=backend,
        model=pfl_model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=meta["lr"], local_num_epochs=1, local_batch_size=meta["batch_size"]
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=meta["batch_size"]),
        callbacks=[stamps],
    )
    if int(os.environ.get("RANK", 0)) == 0:
        rounds = [b - a for a, b in zip(stamps.marks, stamps.marks[1:])]
        rss = int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]) / 1024
        print(json.dumps({"rounds": rounds, "total_s": time.perf_counter() - T0, "peak_rss_mb": rss}))


if __name__ == "__main__":
    main()
