"""The benchmark's workloads written in plain JAX (no flax/optax): the peer column.

Same shapes, layer sizes, losses and optimizers as ``bench.training`` (MLP + SGD momentum,
CNN + Adam, Transformer encoder layer + AdamW with PyTorch's defaults) and ResNet-18
inference (eval-mode batch norm). Each step is one ``jax.jit`` function with the
parameters and optimizer state donated, as a JAX user would write it. Weights are random
(the timing does not depend on their values).
"""
from __future__ import annotations

import math

import numpy as np


def _jax():
    import jax
    import jax.numpy as jnp
    from jax import lax
    return jax, jnp, lax


def _linear(rng, fan_in, fan_out):
    bound = 1 / math.sqrt(fan_in)
    return {"w": rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32),
            "b": rng.uniform(-bound, bound, fan_out).astype(np.float32)}


def _conv(rng, cin, cout, k, bias=True):
    bound = 1 / math.sqrt(cin * k * k)
    p = {"w": rng.uniform(-bound, bound, (cout, cin, k, k)).astype(np.float32)}
    if bias:
        p["b"] = rng.uniform(-bound, bound, cout).astype(np.float32)
    return p


def _conv2d(x, p, stride=1, padding=0):
    _, _, lax = _jax()
    y = lax.conv_general_dilated(x, p["w"], (stride, stride), [(padding, padding)] * 2,
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y + p["b"][None, :, None, None] if "b" in p else y


def _max_pool(x, k, stride, padding=0):
    jax, jnp, lax = _jax()
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, k, k), (1, 1, stride, stride),
                             [(0, 0), (0, 0), (padding, padding), (padding, padding)])


def _layer_norm(x, p, eps=1e-5):
    _, jnp, _ = _jax()
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * p["g"] + p["b"]


def _cross_entropy(logits, y):
    jax, jnp, _ = _jax()
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, y[:, None], 1).mean()


def _mlp(rng):
    params = [_linear(rng, 784, 1024), _linear(rng, 1024, 1024), _linear(rng, 1024, 10)]

    def forward(ps, x):
        jax, _, _ = _jax()
        for i, p in enumerate(ps):
            x = x @ p["w"] + p["b"]
            x = jax.nn.relu(x) if i < len(ps) - 1 else x
        return x
    data = (rng.standard_normal((256, 784), np.float32), rng.integers(0, 10, 256))
    return params, forward, _cross_entropy, data, ("sgd", 0.01)


def _cnn(rng):
    params = {"c1": _conv(rng, 1, 32, 3), "c2": _conv(rng, 32, 64, 3),
              "f1": _linear(rng, 64 * 14 * 14, 128), "f2": _linear(rng, 128, 10)}

    def forward(ps, x):
        jax, _, _ = _jax()
        x = jax.nn.relu(_conv2d(jax.nn.relu(_conv2d(x, ps["c1"], 1, 1)), ps["c2"], 1, 1))
        x = _max_pool(x, 2, 2).reshape(x.shape[0], -1)
        x = jax.nn.relu(x @ ps["f1"]["w"] + ps["f1"]["b"])
        return x @ ps["f2"]["w"] + ps["f2"]["b"]
    data = (rng.standard_normal((64, 1, 28, 28), np.float32), rng.integers(0, 10, 64))
    return params, forward, _cross_entropy, data, ("adam", 1e-3)


def _transformer(rng, d=256, heads=4, ff=1024):
    params = {"qkv": _linear(rng, d, 3 * d), "out": _linear(rng, d, d),
              "ff1": _linear(rng, d, ff), "ff2": _linear(rng, ff, d),
              "n1": {"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)},
              "n2": {"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)}}

    def forward(ps, x):  # PyTorch's TransformerEncoderLayer, post-norm, batch first
        jax, jnp, _ = _jax()
        b, t, _ = x.shape
        qkv = (x @ ps["qkv"]["w"] + ps["qkv"]["b"]).reshape(b, t, 3, heads, d // heads)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), -1)
        a = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = _layer_norm(x + a @ ps["out"]["w"] + ps["out"]["b"], ps["n1"])
        h = jax.nn.gelu(x @ ps["ff1"]["w"] + ps["ff1"]["b"], approximate=False)
        return _layer_norm(x + h @ ps["ff2"]["w"] + ps["ff2"]["b"], ps["n2"])

    def mse(out, y):
        return ((out - y) ** 2).mean()
    data = (rng.standard_normal((16, 128, d), np.float32),
            rng.standard_normal((16, 128, d), np.float32))
    return params, forward, mse, data, ("adamw", 1e-4)


def _update(kind, lr):
    """(init(params) -> state, step(params, grads, state) -> (params, state)) with
    PyTorch's defaults (momentum 0.9; betas 0.9/0.999, eps 1e-8; AdamW decay 0.01)."""
    jax, jnp, _ = _jax()
    tm = jax.tree_util.tree_map
    if kind == "sgd":
        def init(p):
            return tm(jnp.zeros_like, p)

        def step(p, g, buf):
            buf = tm(lambda b, gi: 0.9 * b + gi, buf, g)
            return tm(lambda pi, b: pi - lr * b, p, buf), buf
        return init, step
    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.01 if kind == "adamw" else 0.0

    def init(p):
        return tm(jnp.zeros_like, p), tm(jnp.zeros_like, p), jnp.zeros((), jnp.float32)

    def step(p, g, state):
        m, v, t = state
        t = t + 1
        m = tm(lambda mi, gi: b1 * mi + (1 - b1) * gi, m, g)
        v = tm(lambda vi, gi: b2 * vi + (1 - b2) * gi * gi, v, g)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def upd(pi, mi, vi):
            pi = pi * (1 - lr * wd)
            return pi - lr * (mi / c1) / (jnp.sqrt(vi / c2) + eps)
        return tm(upd, p, m, v), (m, v, t)
    return init, step


def train_step(name: str):
    """A zero-argument callable running one jitted training step of workload ``name``."""
    jax, jnp, _ = _jax()
    rng = np.random.default_rng(0)
    params, forward, loss_fn, (x, y), (kind, lr) = {"mlp": _mlp, "cnn": _cnn,
                                                     "transformer": _transformer}[name](rng)
    init, update = _update(kind, lr)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    state = [params, init(params)]
    x, y = jnp.asarray(x), jnp.asarray(y)

    @jax.jit
    def step(p, s, x, y):
        loss, grads = jax.value_and_grad(lambda q: loss_fn(forward(q, x), y))(p)
        p, s = update(p, grads, s)
        return p, s, loss

    def run():
        state[0], state[1], loss = step(state[0], state[1], x, y)
        return loss.block_until_ready()
    return run


def resnet18_infer(batch: int):
    """A zero-argument callable running jitted ResNet-18 inference on (batch, 3, 224, 224)."""
    jax, jnp, _ = _jax()
    rng = np.random.default_rng(0)

    def bn(c):  # eval mode with running mean 0, var 1: a per-channel scale and shift
        return {"s": np.full(c, 1 / math.sqrt(1 + 1e-5), np.float32),
                "t": np.zeros(c, np.float32)}
    params = {"stem": _conv(rng, 3, 64, 7, bias=False), "bn": bn(64), "layers": [],
              "fc": _linear(rng, 512, 1000)}
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for b in range(2):
            s = stride if b == 0 else 1
            blk = {"c1": _conv(rng, cin, cout, 3, False), "b1": bn(cout),
                   "c2": _conv(rng, cout, cout, 3, False), "b2": bn(cout)}
            if s != 1 or cin != cout:
                blk["down"], blk["bd"] = _conv(rng, cin, cout, 1, False), bn(cout)
            params["layers"].append((blk, s))
            cin = cout
    strides = [s for _, s in params["layers"]]
    params["layers"] = [blk for blk, _ in params["layers"]]
    params = jax.tree_util.tree_map(jnp.asarray, params)

    def affine(x, p):
        return x * p["s"][None, :, None, None] + p["t"][None, :, None, None]

    @jax.jit
    def forward(ps, x):
        relu = jax.nn.relu
        x = relu(affine(_conv2d(x, ps["stem"], 2, 3), ps["bn"]))
        x = _max_pool(x, 3, 2, 1)
        for blk, s in zip(ps["layers"], strides):
            h = relu(affine(_conv2d(x, blk["c1"], s, 1), blk["b1"]))
            h = affine(_conv2d(h, blk["c2"], 1, 1), blk["b2"])
            sc = affine(_conv2d(x, blk["down"], s, 0), blk["bd"]) if "down" in blk else x
            x = relu(h + sc)
        return x.mean((2, 3)) @ ps["fc"]["w"] + ps["fc"]["b"]
    x = jnp.asarray(rng.standard_normal((batch, 3, 224, 224), np.float32))
    return lambda: forward(params, x).block_until_ready()
