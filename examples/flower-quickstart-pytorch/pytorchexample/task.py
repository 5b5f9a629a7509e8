"""pytorchexample: A Flower / PyTorch app."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')"""

    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


# --- fedsim: the only part swapped. Flower's original downloads CIFAR-10 from the Hugging Face
# Hub; this app must run offline, so each partition is synthetic CIFAR-shaped data instead: ten
# fixed class patterns (3x32x32) plus Gaussian noise, seeded by the partition id. Same shapes,
# same batch format ({"img", "label"}), same 80/20 split per node.
class _Synthetic(torch.utils.data.Dataset):
    def __init__(self, seed: int, n: int):
        g = torch.Generator().manual_seed(seed)
        patterns = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(12345))
        self.label = torch.randint(0, 10, (n,), generator=g)
        self.img = patterns[self.label] + 2.0 * torch.randn(n, 3, 32, 32, generator=g)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return {"img": self.img[i], "label": self.label[i]}


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Load partition data (synthetic, 60 examples per partition: 48 train, 12 test)."""
    train = _Synthetic(1000 + 2 * partition_id, 48)
    test = _Synthetic(1001 + 2 * partition_id, 12)
    trainloader = DataLoader(train, batch_size=batch_size, shuffle=True)
    testloader = DataLoader(test, batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """Load test set and return dataloader (synthetic, 500 examples)."""
    return DataLoader(_Synthetic(7, 500), batch_size=128)
# --- end of the swapped part


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    avg_trainloss = running_loss / (epochs * len(trainloader))
    return avg_trainloss


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    accuracy = correct / len(testloader.dataset)
    loss = loss / len(testloader)
    return loss, accuracy
