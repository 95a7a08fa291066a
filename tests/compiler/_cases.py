"""The models and training workloads every backend is checked on (small sizes)."""
from __future__ import annotations

import os

import tessera
import tessera.models as tm
from tessera import nn

F = nn.functional

# TVM compiles each graph with LLVM (cached on disk afterwards, but a fresh cache pays for
# every compile): by default the suite runs a subset of the TVM cases that still reaches
# every op family of the zoo (convolutions, batch norm, pooling, attention, embeddings,
# transposed convolution); TESSERA_TVM_FULL=1 runs them all.
TVM_FULL = os.environ.get("TESSERA_TVM_FULL") == "1"
TVM_CI_ZOO = ("lenet5", "resnet18", "gpt", "dcgan_generator")


def zoo() -> dict:
    """name -> (factory of a model in eval mode, factory of its inputs)."""
    def gpt():
        return tm.GPT(tm.GPTConfig(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16))

    def bert():
        return tm.BertModel(tm.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64,
                                          max_position_embeddings=16))
    img = (lambda: (tessera.randn(2, 3, 32, 32),))
    return {
        "lenet5": (tm.lenet5, lambda: (tessera.randn(2, 1, 28, 28),)),
        "resnet18": (lambda: tm.resnet18(num_classes=10), img),
        "mobilenet_v2": (lambda: tm.mobilenet_v2(num_classes=10), img),
        "vgg11_bn": (lambda: tm.vgg11_bn(num_classes=10), img),
        "vit_tiny": (lambda: tm.vit_tiny(num_classes=10, image_size=32, num_layers=2), img),
        "gpt": (gpt, lambda: (tessera.randint(0, 13, (2, 12)),)),
        "bert": (bert, lambda: (tessera.randint(0, 50, (2, 8)),)),
        "dcgan_generator": (lambda: tm.dcgan(nz=16, ngf=8, ndf=8, image_size=32)[0],
                            lambda: (tessera.randn(2, 16, 1, 1),)),
        "dcgan_discriminator": (lambda: tm.dcgan(nz=16, ngf=8, ndf=8, image_size=32)[1],
                                lambda: (tessera.randn(2, 1, 32, 32),)),
    }


def first_tensor(out):
    """The model's main output (GPT returns (logits, loss), BERT an output object)."""
    if isinstance(out, tuple):
        return out[0]
    return getattr(out, "last_hidden_state", out)


class Forward(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, *args):
        return first_tensor(self.model(*args))


def workload(name: str):
    """(model, optimizer, loss function, x, y) of the bench's training workloads, smaller."""
    tessera.manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                              nn.Linear(32, 10))
        x, y = tessera.randn(16, 64), tessera.randint(0, 10, (16,))
        opt = tessera.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss = nn.CrossEntropyLoss()
    elif name == "cnn":
        class CNN(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1 = nn.Conv2d(1, 4, 3, padding=1)
                self.c2 = nn.Conv2d(4, 8, 3, padding=1)
                self.f1 = nn.Linear(8 * 6 * 6, 16)
                self.f2 = nn.Linear(16, 10)

            def forward(self, t):
                t = F.relu(self.c2(F.relu(self.c1(t))))
                t = F.max_pool2d(t, 2).flatten(1)
                return self.f2(F.relu(self.f1(t)))
        model = CNN()
        x, y = tessera.randn(8, 1, 12, 12), tessera.randint(0, 10, (8,))
        opt = tessera.optim.Adam(model.parameters(), lr=1e-3)
        loss = nn.CrossEntropyLoss()
    else:
        model = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                           activation="gelu", batch_first=True)
        x, y = tessera.randn(4, 8, 32), tessera.randn(4, 8, 32)
        opt = tessera.optim.AdamW(model.parameters(), lr=1e-3)
        loss = nn.MSELoss()
    return model, opt, loss, x, y


class Train(nn.Graph):
    def __init__(self, model, opt, loss):
        super().__init__()
        self.model, self.loss = model, loss
        self.add_optimizer(opt)

    def build(self, x, y):
        out = self.loss(self.model(x), y)
        out.backward()
        return out
