"""tabularexample: the ClientApp (with fedsim's mod: the node clips its own update)."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsim.flower import user_dp_mod
from tabularexample.task import IncomeClassifier, evaluator, load_data, trainer

app = ClientApp(mods=[user_dp_mod])


@app.train()
def train(msg: Message, context: Context):
    train_loader, _ = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
    net = IncomeClassifier()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainer(net, train_loader)
    metrics = MetricRecord({"num-examples": len(train_loader)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    _, test_loader = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
    net = IncomeClassifier()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    loss, accuracy = evaluator(net, test_loader)
    metrics = MetricRecord({"loss": loss, "accuracy": accuracy, "num-examples": len(test_loader)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
