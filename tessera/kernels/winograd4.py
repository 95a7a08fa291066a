"""Winograd F(4x4, 3x3): the larger-tile variant of ``tessera.kernels.winograd`` (same
drivers' shape, same work items; its transforms, ``c/winograd4.h``, are compiled into the
libraries of the threaded convolution drivers of ``tessera.kernels.conv``).

Each 4x4 block of outputs takes 36 multiplies per (input, output) channel pair instead of
144 (F(2x2): 64 for the same 16 outputs): U = G g G^T (6x6 per filter), V = B^T d B per
6x6 input tile (tiles 4 apart), 36 GEMMs M[p] (O, tiles) = U[p] (O, C) @ V[p] (C, tiles),
Y = A^T M A (Lavin and Gray 2015, with the points 0, +-1, +-2). Both the GEMMs' flops and
V and M, the transforms' traffic, are 1.78x smaller than F(2x2)'s over the same outputs;
the price is rounding: the transforms weigh terms by up to 8 (A) and 1/24 (G), so float32
results carry a few times F(2x2)'s error (still ~1e-5 of the output's scale in float32).

The input transform goes row by row: each input row of a tile-row segment, zero-padded
into ``lin``, gives B^T along its columns for every tile (6 values a tile), stored by row
phase (input row 4t + k at h[jj][k % 4][t + k / 4]) so that the transform along the rows
is one long unit-stride loop over all the segment's tiles. M has no spare columns (F(2x2)
keeps one a tile row): its output transform is one loop over all tiles of an item too.

>>> import numpy as np
>>> from tessera.kernels import winograd
>>> x, w = np.ones((1, 1, 6, 6), np.float32), np.ones((1, 1, 3, 3), np.float32)
>>> y = np.empty((1, 1, 4, 4), np.float32)
>>> winograd._tiles(1, 1, 1, 4, 4).name if winograd.four(1, 1, 1, 4, 4) else "wino4"
'wino4'
>>> winograd.conv2d_winograd(x, w, None, (0, 0), y) if winograd.usable(np.float32) else y.fill(9)
>>> float(y[0, 0, 3, 3])
9.0
"""
from __future__ import annotations

import numpy as np

from tessera.kernels.winograd import Tiles

__all__ = ["F4"]

_G4 = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
# run by winograd's Python side (its _winograd and conv2d_weight_grad_winograd)
F4 = Tiles("wino4", 4, 0, _G4,
           lambda rb, th, tw, ow: (4 * tw + 4 + 24 * (th + 1) * tw + 15) // 16 * 16)
