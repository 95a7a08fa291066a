"""ONNX node tests of supported ops that tessera is known to fail, each with the reason."""
from __future__ import annotations

_RANDOM_MASK = ("Dropout in training mode draws a random mask; the expected output comes from "
                "NumPy's generator, which tessera's (Philox) does not reproduce")

EXPECTED_FAILURES: dict[str, str] = {
    "test_training_dropout": _RANDOM_MASK,
    "test_training_dropout_default": _RANDOM_MASK,
    "test_training_dropout_default_mask": _RANDOM_MASK,
    "test_training_dropout_mask": _RANDOM_MASK,
    "test_attention_4d_causal_fp16_expanded": (
        "float16: 2 of 192 outputs differ by one float16 ulp (rtol 1.2e-3 > 1e-3); tessera "
        "rounds the float32-accumulated softmax once, the reference rounds every step"),
}
