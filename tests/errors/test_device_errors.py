"""Device errors: mixing devices in one op, unknown devices, data access on meta."""
from __future__ import annotations

import pytest

from tests.errors._check import raises_like_torch

CASES = [
    ("cpu-plus-meta", lambda L: L.ones(2) + L.ones(2, device="meta"), ("add", "cpu", "meta")),
    ("meta-times-cpu", lambda L: L.mul(L.ones(2, device="meta"), L.ones(2)),
     ("mul", "cpu", "meta")),
    ("where-mixed", lambda L: L.where(L.ones(2) > 0, L.ones(2, device="meta"), L.ones(2)),
     ("where", "cpu", "meta")),
    ("unknown-device-factory", lambda L: L.zeros(2, device="nodevice"), ("nodevice",)),
    ("unknown-device-to", lambda L: L.zeros(2).to("nodevice:0"), ("nodevice",)),
    ("bad-device-index", lambda L: L.zeros(2, device="cpu:x"), ("cpu:x",)),
    ("to-dtype-string", lambda L: L.zeros(2).to("float32"), ("float32",)),
    ("meta-item", lambda L: L.ones((), device="meta").item(), ("item", "meta")),
    ("meta-numpy", lambda L: L.ones(2, device="meta").numpy(), ("meta", "numpy")),
    ("meta-tolist", lambda L: L.ones(2, device="meta").tolist(), ("meta",)),
    ("meta-to-cpu", lambda L: L.ones(2, device="meta").cpu(), ("meta",)),
    ("meta-nonzero", lambda L: L.ones(2, device="meta").nonzero(), ("nonzero",)),
    ("meta-bool-mask", lambda L: L.ones(2, device="meta")[L.ones(2, device="meta") > 0],
     ()),
    ("meta-float", lambda L: float(L.ones((), device="meta")), ("meta",)),
    ("cat-mixed", lambda L: L.cat([L.ones(2), L.ones(2, device="meta")]), ("cat",)),
    ("copy_-meta-into-cpu", lambda L: L.ones(2).copy_(L.ones(2, device="meta")), ()),
]


@pytest.mark.parametrize("fn,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_device_errors(fn, needles):
    raises_like_torch(fn, *needles)
