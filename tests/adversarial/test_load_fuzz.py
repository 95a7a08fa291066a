"""Fuzzing ``tessera.load`` over damaged and hostile checkpoints of every format it reads.

A seeded mutator damages a few valid checkpoints (tessera's format, tessera's format with
the checksum recomputed as an attacker would, PyTorch's zip format, PyTorch's legacy
format): truncations, bit flips, byte insertions, pickle opcode swaps, and zip member edits
(the archive rebuilt around a mutated pickle). The property: ``load`` returns, or raises
one of a small set of Python exceptions; using what it returned raises no other kind of
error either; and nothing kills the interpreter (one batch runs in a child process, whose
exit must not be a signal).

The suite runs a bounded number of examples per format. Set ``TESSERA_FUZZ_EXAMPLES`` to
run more (``TESSERA_FUZZ_EXAMPLES=20000 pytest tests/adversarial/test_load_fuzz.py``);
``TESSERA_FUZZ_SEED`` picks another seed.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import random
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import tessera
import tessera.serialization as ser
from tessera import nn

N = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "150"))
SEED = int(os.environ.get("TESSERA_FUZZ_SEED", "0"))
# what a damaged or hostile file may raise (PyTorch's types for the same failures)
EXPECTED = (pickle.UnpicklingError, RuntimeError, ValueError, EOFError, TypeError)


def _sample_object():
    base = tessera.arange(12.0).view(3, 4)
    return {"w": base, "col": base[:, 1], "e": tessera.ones(1).expand(3),
            "p": nn.Parameter(tessera.ones(2)), "i": tessera.arange(3),
            "meta": {"step": 3, "lr": 0.5, "names": ["a", "b"], "size": tessera.Size([2])}}


def _tessera_bytes() -> bytes:
    buf = io.BytesIO()
    m = nn.Module()
    m.register_parameter("q", nn.Parameter(tessera.zeros(2)))
    tessera.save({**_sample_object(), "module": m}, buf)
    return buf.getvalue()


def _torch_bytes() -> bytes:
    buf = io.BytesIO()
    tessera.save(_sample_object(), buf, format="torch")
    return buf.getvalue()


def _legacy_bytes() -> bytes | None:
    try:
        import torch
    except ImportError:
        return None
    buf = io.BytesIO()
    base = torch.arange(12.0).view(3, 4)
    torch.save({"w": base, "col": base[:, 1], "p": torch.nn.Parameter(torch.ones(2)),
                "meta": {"step": 3, "size": torch.Size([2])}}, buf,
               _use_new_zipfile_serialization=False)
    return buf.getvalue()


# ---- the mutator -------------------------------------------------------------------------

_OPCODES = [op.code.encode("latin1") for op in __import__("pickletools").opcodes]


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0 or not data:  # truncation
        return bytes(data[:rng.randrange(len(data) + 1)])
    if kind == 1:  # bit flips
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif kind == 2:  # byte insertions
        i = rng.randrange(len(data) + 1)
        data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    else:  # a byte becomes a pickle opcode
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.choice(_OPCODES)[0]
    return bytes(data)


def _rezip(data: bytes, rng: random.Random) -> bytes:
    """A zip member edit: the archive rebuilt with one member mutated, dropped or renamed."""
    src = zipfile.ZipFile(io.BytesIO(data))
    names = src.namelist()
    target = rng.choice([n for n in names if n.endswith("data.pkl")] + names)
    action = rng.randrange(3)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for name in names:
            body = src.read(name)
            if name == target:
                if action == 0:
                    body = _mutate_bytes(body, rng)
                elif action == 1:
                    continue
                else:
                    name = name + "x"
            dst.writestr(name, body)
    return out.getvalue()


def _resign(data: bytes, rng: random.Random) -> bytes:
    """Tessera's format with its pickled entry or structure mutated and the checksum
    recomputed: what an attacker (not a disk error) produces."""
    import safetensors.numpy
    (n,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8:8 + n])["__metadata__"]
    arrays = safetensors.numpy.load(data)
    if rng.random() < 0.5:
        meta["tessera.structure"] = _mutate_bytes(meta["tessera.structure"].encode(),
                                                  rng).decode("utf-8", "replace")
    else:
        arrays["__pickle__.0"] = np.frombuffer(
            _mutate_bytes(arrays["__pickle__.0"].tobytes(), rng) or b".", np.uint8)
    meta.pop(ser._native._DIGEST_KEY)
    meta[ser._native._DIGEST_KEY] = ser._digest(
        meta, [(k, ser._native._code(a), list(a.shape), ser._native._raw_bytes(a))
               for k, a in arrays.items()])
    return safetensors.numpy.save(arrays, metadata=meta)


def _examples(n: int, seed: int):
    rng = random.Random(seed)
    sources = [("tessera", _tessera_bytes()), ("torch", _torch_bytes())]
    legacy = _legacy_bytes()
    if legacy is not None:
        sources.append(("legacy", legacy))
    for i in range(n):
        name, data = sources[i % len(sources)]
        r = rng.random()
        if name == "torch" and r < 0.4:
            yield name, _rezip(data, rng)
        elif name == "tessera" and r < 0.4:
            yield name, _resign(data, rng)
        else:
            yield name, _mutate_bytes(data, rng)


def _use(obj, depth: int = 0) -> None:
    """Touch what was loaded the way a training script would."""
    if depth > 20:
        return
    if isinstance(obj, tessera.Tensor):
        if obj.dtype.is_floating_point and obj.device.type == "cpu":
            with np.errstate(all="ignore"):  # damaged numbers may overflow
                (obj + 1, obj * obj, obj.sum())
        return
    if isinstance(obj, dict):
        for v in list(obj.values()):
            _use(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _use(v, depth + 1)


def check(data: bytes) -> str:
    try:
        out = tessera.load(io.BytesIO(data))
    except EXPECTED as e:
        return type(e).__name__
    try:
        _use(out)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        return "use:" + type(e).__name__
    return "loaded"


@pytest.mark.parametrize("part", range(3))
def test_load_never_escapes_the_expected_errors(part):
    seen: dict[str, int] = {}
    for i, (name, data) in enumerate(_examples(N, SEED + part)):
        try:
            outcome = check(data)
        except Exception as e:  # noqa: BLE001 - the property under test
            raise AssertionError(f"{name} example {i} (seed {SEED + part}) raised "
                                 f"{type(e).__name__}: {e}") from e
        seen[outcome] = seen.get(outcome, 0) + 1
    assert sum(seen.values()) == N


def test_a_batch_in_a_child_never_dies_of_a_signal():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from tests.adversarial.test_load_fuzz import _examples, check; "
            f"[check(d) for _, d in _examples({max(N // 2, 30)}, {SEED + 100})]; "
            "print('done')")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True,
                         cwd=root, timeout=600)
    assert run.returncode == 0, f"child exit {run.returncode}: {run.stderr[-3000:]}"
    assert run.stdout.strip().endswith("done")
