"""Reductions and movements in an exported library, each built with -Werror and run through
the C driver (one thread and two) against tessera eager and PyTorch; and the prelude's
exponentials on NaN under UBSan."""
from __future__ import annotations

import shutil

import pytest

import tessera
from tests.deploy.test_export import cycles
from tests.deploy.test_index_rules import Fns

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

NAN, INF = float("nan"), float("inf")


def test_exponentials_of_nan_under_ubsan(tmp_path):
    """A NaN's bits reach the power-of-two step of every exponential: its shift must be
    defined (the inputs are zeros: 0 / 0 is the NaN)."""
    def nan(x):
        return x / x
    model = Fns(lambda t, F, x: nan(x).exp(),
                lambda t, F, x: nan(x).expm1(),
                lambda t, F, x: nan(x).sigmoid(),
                lambda t, F, x: nan(x).tanh(),
                lambda t, F, x: F.gelu(nan(x)),
                lambda t, F, x: nan(x).double().exp().float(),
                lambda t, F, x: nan(x).double().expm1().float(),
                lambda t, F, x: nan(x).double().sigmoid().float()).eval()   # (8 outputs)
    cycles(tmp_path, {"nanexp": (model, (tessera.randn(3, 8),))}, 2)
