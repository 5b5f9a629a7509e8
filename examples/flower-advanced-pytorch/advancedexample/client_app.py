"""advancedexample: the ClientApp. Each node keeps its own classification head between rounds
(in `context.state`) and trains the rest of the model with the federation."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from advancedexample.task import Net, load_data
from advancedexample.task import test as test_fn
from advancedexample.task import train as train_fn

app = ClientApp()
HEAD = "classification-head"


def _model(msg: Message, context: Context) -> Net:
    """The received model, with this node's own head if it has trained before."""
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    if HEAD in context.state:
        net.fc2.load_state_dict(context.state[HEAD].to_torch_state_dict(), strict=True)
    return net


@app.train()
def train(msg: Message, context: Context):
    net = _model(msg, context)
    trainloader, _ = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
    loss = train_fn(
        net, trainloader, context.run_config["local-epochs"], msg.content["config"]["lr"], torch.device("cpu")
    )
    context.state[HEAD] = ArrayRecord(net.fc2.state_dict())
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(trainloader.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    net = _model(msg, context)
    _, testloader = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
    loss, acc = test_fn(net, testloader, torch.device("cpu"))
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(testloader.dataset)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
