"""advancedexample: the model, local synthetic data, training and evaluation."""

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: Examples each node holds (80% train, 20% test), and in the server's test set.
EXAMPLES_PER_NODE = 240
SERVER_TEST_EXAMPLES = 500


class Net(nn.Module):
    """A small CNN for 28×28 grey images in 10 classes (Fashion-MNIST's shape)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def _images(labels: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """One noisy copy of its class's fixed pattern per label (the patterns are the same on every
    node and on the server)."""
    patterns = np.random.default_rng(0).normal(0.0, 1.0, (10, 1, 28, 28)).astype(np.float32)
    x = patterns[labels] + rng.normal(0.0, 1.5, (len(labels), 1, 28, 28)).astype(np.float32)
    return torch.from_numpy(x)


def load_data(partition_id: int, num_partitions: int):
    """This node's local data, instead of a Fashion-MNIST download: labels drawn with a
    Dirichlet(1.0) label skew per node (seed 42), images from `_images`; 80% train, 20% test."""
    skew = np.random.default_rng(42).dirichlet(np.ones(10), size=num_partitions)[partition_id]
    rng = np.random.default_rng(1000 + partition_id)
    labels = rng.choice(10, size=EXAMPLES_PER_NODE, p=skew)
    data = TensorDataset(_images(labels, rng), torch.from_numpy(labels).long())
    n_train = int(0.8 * EXAMPLES_PER_NODE)
    train, test = torch.utils.data.random_split(
        data, [n_train, EXAMPLES_PER_NODE - n_train], generator=torch.Generator().manual_seed(42)
    )
    return DataLoader(train, batch_size=32, shuffle=True), DataLoader(test, batch_size=32)


def server_test_data():
    """The server's centralised test set (balanced labels)."""
    rng = np.random.default_rng(7)
    labels = np.arange(SERVER_TEST_EXAMPLES) % 10
    return DataLoader(TensorDataset(_images(labels, rng), torch.from_numpy(labels).long()), batch_size=64)


def train(net, trainloader, epochs, lr, device):
    """Local SGD with momentum; returns the mean training loss."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
    return total / max(batches, 1)


def test(net, testloader, device):
    """Mean loss and accuracy on `testloader`."""
    net.to(device)
    net.eval()
    criterion = nn.CrossEntropyLoss(reduction="sum")
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in testloader:
            out = net(images.to(device))
            loss += criterion(out, labels.to(device)).item()
            correct += (out.argmax(1) == labels.to(device)).sum().item()
            n += len(labels)
    return loss / n, correct / n


def create_run_dir(config) -> tuple[Path, str]:
    """A fresh results folder `outputs/<date>/<time>` under the working directory, holding the
    run config as JSON."""
    run_dir = datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")
    save_path = Path.cwd() / "outputs" / run_dir
    save_path.mkdir(parents=True, exist_ok=False)
    (save_path / "run_config.json").write_text(json.dumps(dict(config)), encoding="utf-8")
    return save_path, run_dir
