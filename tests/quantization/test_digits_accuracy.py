"""Static quantization of a small convolutional network on the digits dataset: post-training
INT8 within one point of float32 test accuracy, quantization-aware INT8 within 0.3."""
import numpy as np

import tessera
from tessera import nn
from tessera.ao import quantization as tq
from tessera.datasets.digits import Digits


def _arrays(train):
    ds = Digits(train=train)
    xs, ys = zip(*[ds[i] for i in range(len(ds))])
    x = np.stack([np.asarray(v._to_numpy() if hasattr(v, "_to_numpy") else v, np.float32)
                  for v in xs])
    return x.reshape(len(x), 1, 8, 8) / 16.0, np.array([int(y) for y in ys])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), \
            nn.ReLU()
        self.pool, self.flat = nn.MaxPool2d(2), nn.Flatten()
        self.fc1, self.relu2, self.fc2 = nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.pool(self.relu1(self.bn1(self.conv1(self.quant(x)))))
        return self.dequant(self.fc2(self.relu2(self.fc1(self.flat(x)))))


def _train(m, x, y, epochs):
    opt = tessera.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    m.train()
    for _ in range(epochs):
        idx = rng.permutation(len(x))
        for i in range(0, len(idx), 32):
            b = idx[i:i + 32]
            loss = nn.functional.cross_entropy(m(tessera.from_numpy(x[b])),
                                               tessera.from_numpy(y[b]))
            opt.zero_grad()
            loss.backward()
            opt.step()


def _accuracy(m, x, y):
    with tessera.no_grad():
        out = m(tessera.from_numpy(x))
    return float((out.argmax(1)._to_numpy() == y).mean()) * 100


FUSE = [["conv1", "bn1", "relu1"], ["fc1", "relu2"]]


def test_ptq_and_qat_int8_accuracy():
    xtr, ytr = _arrays(True)
    xte, yte = _arrays(False)
    tessera.manual_seed(0)
    model = Net()
    _train(model, xtr, ytr, 6)
    fp32 = _accuracy(model.eval(), xte, yte)

    ptq = tq.fuse_modules(model.eval(), FUSE)
    ptq.qconfig = tq.get_default_qconfig("x86")
    ptq = tq.prepare(ptq)
    with tessera.no_grad():
        ptq(tessera.from_numpy(xtr[:512]))
    int8 = tq.convert(ptq)
    assert type(int8.conv1).__name__ == "Conv2d" and "conv1.scale" in int8.state_dict()
    assert _accuracy(int8, xte, yte) >= fp32 - 1.0

    qat = tq.fuse_modules(model.eval(), FUSE).train()
    qat.qconfig = tq.get_default_qat_qconfig("x86")
    qat = tq.prepare_qat(qat)
    _train(qat, xtr, ytr, 2)
    assert _accuracy(tq.convert(qat.eval()), xte, yte) >= fp32 - 0.3
