"""Op-info entries of the sparse COO ops: densify, gather at the stored entries, and the
sparse-dense product, through PyTorch's public sparse API on both sides."""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, make, register

IDX = np.array([[0, 1, 1, 3, 0], [2, 0, 2, 1, 2]], np.int64)   # (0, 2) twice: uncoalesced


def _to_dense_samples(rng, dt):
    yield Sample((IDX, make(rng, (5,), dt)), grad_args=(1,))
    yield Sample((IDX, make(rng, (5, 2), dt)), grad_args=(1,), name="dense_dim")
    yield Sample((np.zeros((2, 0), np.int64), make(rng, (0,), dt)), grad_args=(1,),
                 name="empty")


def _to_dense(L, i, v):
    return L.sparse_coo_tensor(i, v, (4, 3) + tuple(v.shape[1:])).to_dense()


def _mm_samples(rng, dt):
    yield Sample((IDX, make(rng, (5,), dt), make(rng, (3, 4), dt)), grad_args=(1, 2))
    yield Sample((IDX[:, :1], make(rng, (1,), dt), make(rng, (3, 1), dt)), grad_args=(1, 2),
                 name="one_entry")


def _mm(L, i, v, d):
    return L.sparse.mm(L.sparse_coo_tensor(i, v, (4, 3)), d)


def _to_sparse_samples(rng, dt):
    x = make(rng, (3, 4), dt)
    x[x < 0] = 0
    yield Sample((x,), grad_args=(0,))
    yield Sample((np.zeros((2, 3), dt),), grad_args=(0,), name="all_zero")


register(
    OpInfo("sparse_coo_to_dense", _to_dense, _to_dense_samples),
    OpInfo("sparse_mm", _mm, _mm_samples),
    # which entries are stored depends on the data: no meta run, and no finite differences
    # (a perturbed zero becomes an entry)
    OpInfo("sparse_gather", lambda L, x: x.to_sparse().values(), _to_sparse_samples,
           meta=False, gradcheck=False),
)
