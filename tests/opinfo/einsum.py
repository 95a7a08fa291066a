"""Op-info entry: einsum (the full equation table lives in tests/einsum; these samples run
it through the generic harness: torch values and gradients, gradcheck, meta, strided
inputs, and graph mode against eager)."""
from tests.opinfo.core import OpInfo, Sample, make, register

SAMPLES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 2, 4)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("i,j->ij", [(2,), (3,)]),
    ("ij,j->i", [(3, 4), (1,)]),
    ("...ij,...jk", [(2, 1, 2, 3), (3, 3, 2)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 2)]),
    ("ij,jk->ik", [(0, 3), (3, 2)]),
    ("ij->", [(2, 3)]),
]


def _samples(rng, dtype):
    for eq, shapes in SAMPLES:
        yield Sample((eq, *[make(rng, s, dtype) for s in shapes]))


register(
    OpInfo("einsum", lambda L, eq, *ops: L.einsum(eq, *ops), _samples, atol=1e-4, rtol=1e-4),
)
