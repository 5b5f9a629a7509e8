"""advancedexample: the ServerApp."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from advancedexample.strategy import CustomFedAvg
from advancedexample.task import Net, create_run_dir, server_test_data, test
from fedsim.flower import UserLevelDP

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    arrays = ArrayRecord(Net().state_dict())
    strategy = UserLevelDP(CustomFedAvg(fraction_train=cfg["fraction-train"], fraction_evaluate=cfg["fraction-evaluate"]),
                           rounds=cfg["num-server-rounds"], population=cfg["dp-population"], out=cfg["dp-out"],
                           privacy={"mechanism": "banded", "bands": 2, "target_epsilon": 8.0}, sampling={"scheme": "min_sep", "min_sep": 2},
                           optimizer={"optimizer": "sgd", "lr": 0.1})  # fmt: skip
    save_path, run_dir = create_run_dir(config=cfg)
    strategy.set_save_path_and_run_dir(save_path, run_dir)
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": 0.1}),
        num_rounds=cfg["num-server-rounds"],
        evaluate_fn=global_evaluate,
    )
    torch.save(result.arrays.to_torch_state_dict(), save_path / "final_model.pt")


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Central evaluation of the global model on the server's test set."""
    net = Net()
    net.load_state_dict(arrays.to_torch_state_dict())
    loss, accuracy = test(net, server_test_data(), torch.device("cpu"))
    return MetricRecord({"accuracy": accuracy, "loss": loss})
