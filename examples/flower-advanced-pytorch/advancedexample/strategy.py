"""advancedexample: FedAvg with its own start(): results file, best-model checkpoints, a metrics
log, and a learning-rate schedule in configure_train."""

import json
import time
from logging import INFO
from pathlib import Path

import torch
from flwr.app import ConfigRecord
from flwr.common import log
from flwr.serverapp.strategy import FedAvg, Result


class CustomFedAvg(FedAvg):
    """FedAvg whose `start()` also saves, after every round, `results.json` (the round's
    metrics), the global model whenever its central accuracy is the best so far, and a line
    per round in `metrics.jsonl` (where the upstream app logs to W&B). `configure_train` halves
    the learning rate from round `lr-decay-round` on."""

    lr_decay_round = 5

    def set_save_path_and_run_dir(self, path: Path, run_dir: str):
        self.save_path = path
        self.run_dir = run_dir

    def configure_train(self, server_round, arrays, config, grid):
        if server_round == self.lr_decay_round:
            config["lr"] = config["lr"] * 0.5
            log(INFO, "Learning rate halved to %f", config["lr"])
        return super().configure_train(server_round, arrays, config, grid)

    def _save_if_best(self, server_round, accuracy, arrays):
        if accuracy > self.best_acc_so_far:
            self.best_acc_so_far = accuracy
            name = f"model_state_acc_{accuracy:.4f}_round_{server_round}.pth"
            torch.save(arrays.to_torch_state_dict(), self.save_path / name)
            log(INFO, "New best global model (accuracy %.4f) saved as %s", accuracy, name)

    def _save_round(self, server_round, result):
        path = self.save_path / "results.json"
        rows = json.loads(path.read_text()) if path.exists() else []
        row = {
            "round": server_round,
            "train_metrics": dict(result.train_metrics_clientapp.get(server_round, {})),
            "evaluate_metrics_clientapp": dict(result.evaluate_metrics_clientapp.get(server_round, {})),
            "evaluate_metrics_serverapp": dict(result.evaluate_metrics_serverapp.get(server_round, {})),
        }
        path.write_text(json.dumps([*rows, row]), encoding="utf-8")
        with open(self.save_path / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(
                json.dumps({"step": server_round, **row["train_metrics"], **row["evaluate_metrics_serverapp"]}) + "\n"
            )

    def start(
        self,
        grid,
        initial_arrays,
        num_rounds=3,
        timeout=3600,
        train_config=None,
        evaluate_config=None,
        evaluate_fn=None,
    ):
        self.best_acc_so_far = 0.0
        log(INFO, "Starting %s (results in %s)", self.__class__.__name__, self.save_path)
        self.summary()
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()
        t0 = time.time()
        if evaluate_fn:
            res = evaluate_fn(0, initial_arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        arrays = initial_arrays
        for server_round in range(1, num_rounds + 1):
            log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
            replies = grid.send_and_receive(
                messages=self.configure_train(server_round, arrays, train_config, grid), timeout=timeout
            )
            new_arrays, train_metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                arrays = result.arrays = new_arrays
            if train_metrics is not None:
                result.train_metrics_clientapp[server_round] = train_metrics
            replies = grid.send_and_receive(
                messages=self.configure_evaluate(server_round, arrays, evaluate_config, grid), timeout=timeout
            )
            eval_metrics = self.aggregate_evaluate(server_round, replies)
            if eval_metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = eval_metrics
            if evaluate_fn:
                res = evaluate_fn(server_round, arrays)
                log(INFO, "Global evaluation: %s", res)
                if res is not None:
                    result.evaluate_metrics_serverapp[server_round] = res
                    self._save_if_best(server_round, res["accuracy"], arrays)
            self._save_round(server_round, result)
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t0)
        return result
