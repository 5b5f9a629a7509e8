"""tabularexample: the ServerApp."""

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedsim.flower import UserLevelDP
from tabularexample.task import IncomeClassifier

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    num_rounds: int = context.run_config["num-server-rounds"]
    arrays = ArrayRecord(IncomeClassifier().state_dict())
    strategy = UserLevelDP(FedAvg(), rounds=num_rounds, population=context.run_config["dp-population"], out=context.run_config["dp-out"], clipping="client",
                           privacy={"mechanism": "gaussian", "target_epsilon": 8.0}, sampling={"scheme": "poisson", "cohort_size": 5})  # fmt: skip
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=num_rounds)
    torch.save(result.arrays.to_torch_state_dict(), "final_model.pt")
