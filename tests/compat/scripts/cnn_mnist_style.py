"""An ordinary PyTorch training script: a LeNet-style CNN on MNIST-shaped data.

It only ever says ``import torch``; the compat test runs it once with PyTorch and once with
tessera installed under that name. Data are synthetic (NumPy, seeded) so both runs see the
same batches; the initial weights come from the caller so both start from the same point.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * 6 * 6, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def make_data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    protos = rng.standard_normal((10, 1, 28, 28)).astype(np.float32)
    images = protos[labels] + 0.8 * rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    return torch.from_numpy(images), torch.from_numpy(labels)


def main(initial_state=None, steps=50):
    """Train for ``steps`` steps; returns (losses, initial state as NumPy arrays)."""
    torch.manual_seed(0)
    model = Net()
    if initial_state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in initial_state.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    x, y = make_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
    criterion = nn.CrossEntropyLoss()
    losses = []
    model.train()
    while len(losses) < steps:
        for xb, yb in loader:
            opt.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    return losses, start, acc
