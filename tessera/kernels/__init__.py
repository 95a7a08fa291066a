"""Hand-written CPU kernels and the C infrastructure under every op.

This layer sits below the ops: it imports NumPy, ctypes and the runtime settings only, and
knows nothing of tensors, dispatch or graphs. It holds

* ``cc``: the system C compiler and the content-addressed disk cache of the libraries it
  builds (generated graph kernels go through it too);
* ``threadpool``: the kernel threads (``fork_join``, ``split_call``);
* ``csource``: the hand-written C, real files in ``c/`` (package data), read once each;
* ``prelude``: the C math every kernel includes;
* ``elementwise``: eager elementwise ops rendered from an op's ``to_c`` rule;
* ``window`` (im2col/col2im, depthwise convolution, max pooling), ``conv`` (the convolution
  drivers and BLAS), ``direct_conv``, ``winograd``/``winograd4``, ``bmm`` (batched matrix
  products), ``optim`` (fused optimizer updates);
* ``gemm``: tessera's own float32 matrix product (no BLAS underneath), with pre-packed
  weights and a fused bias/activation/residual epilogue, for dependency-free C libraries
  and under the float32 convolutions on AVX-512 (``conv_gemm.c``);
* ``attention``: fused scaled dot-product attention, forward and backward, that never
  writes the L x S scores (online softmax; dropout masks regenerated from their seed).
* ``int8``, ``binary``: the INT8 products of quantized inference and the bit-packed
  xnor-popcount products of binary networks, each with its NumPy reference.
* ``nchwc``: blocked-layout (N, C/B, H, W, B) inference convolutions and pooling, as MLAS
  runs a convolutional trunk: direct convolutions over register tiles with bias,
  activation and residual in registers, depthwise ones vectorised across a block.

``TESSERA_CODEGEN=0`` turns every compiled kernel off; the ops then run their NumPy kernels.

>>> isinstance(enabled(), bool)
True
"""
from __future__ import annotations

import os

__all__ = ["enabled"]


def enabled() -> bool:
    """Whether C kernels may be compiled: ``TESSERA_CODEGEN`` is not 0 and a C compiler is
    present."""
    if os.environ.get("TESSERA_CODEGEN", "1") in ("0", "", "false", "off"):
        return False
    from tessera.kernels.cc import compiler
    return compiler() is not None
