"""tabularexample: an income classifier on local synthetic tabular data."""

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 14
ROWS_PER_NODE = 400


class IncomeClassifier(nn.Module):
    """An MLP from 14 features to P(income > 50k): 128 and 64 hidden units, ReLU, sigmoid."""

    def __init__(self, input_dim: int = FEATURES):
        super().__init__()
        self.layer1 = nn.Linear(input_dim, 128)
        self.layer2 = nn.Linear(128, 64)
        self.output = nn.Linear(64, 1)

    def forward(self, x):
        x = torch.relu(self.layer1(x))
        x = torch.relu(self.layer2(x))
        return torch.sigmoid(self.output(x))


def load_data(partition_id: int, num_partitions: int):
    """This node's rows, instead of the Adult census download: standardised features (each node's
    shifted a little), labels from one fixed logistic rule; 80% train, 20% test."""
    w = np.random.default_rng(0).normal(0.0, 1.0, FEATURES)
    rng = np.random.default_rng(500 + partition_id)
    x = rng.normal(0.3 * (partition_id / max(num_partitions - 1, 1) - 0.5), 1.0, (ROWS_PER_NODE, FEATURES))
    y = (rng.random(ROWS_PER_NODE) < 1.0 / (1.0 + np.exp(-(x @ w)))).astype(np.float32)
    x, y = torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y).unsqueeze(1)
    n = int(0.8 * ROWS_PER_NODE)
    return (
        DataLoader(TensorDataset(x[:n], y[:n]), batch_size=32, shuffle=True),
        DataLoader(TensorDataset(x[n:], y[n:]), batch_size=32),
    )


def trainer(model, train_loader, num_epochs=1):
    """Adam (lr 0.001) on the binary cross-entropy."""
    criterion = nn.BCELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    model.train()
    for _ in range(num_epochs):
        for xb, yb in train_loader:
            optimizer.zero_grad()
            criterion(model(xb), yb).backward()
            optimizer.step()


def evaluator(model, test_loader):
    """Mean loss and accuracy."""
    criterion = nn.BCELoss(reduction="sum")
    model.eval()
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for xb, yb in test_loader:
            out = model(xb)
            loss += criterion(out, yb).item()
            correct += ((out > 0.5).float() == yb).sum().item()
            n += len(yb)
    return loss / n, correct / n
