"""Op-info entry for ``fused``: a region of elementwise ops run as one op (graphs make them;
``tests/codegen`` tests the generated C kernels against this reference)."""

from tests.opinfo.core import OpInfo, Sample, make, register


def _chain(L, x, y):
    return L.sigmoid(L.nn.functional.gelu(x * y + 1.5)) * x - L.tanh(y)


def _fused(L, x, y):
    if L.__name__ != "tessera":
        return _chain(L, x, y)
    from tessera._dispatch import dispatch
    from tessera.graph.trace import trace
    from tessera.ops.registry import REGISTRY
    g, _ = trace(lambda a, b: _chain(L, a, b), x.detach(), y.detach())
    return dispatch(REGISTRY["fused"], x, y, body=str(g))


def _samples(rng, dt):
    for sx, sy in [((), ()), ((5,), (5,)), ((3, 4), (4,)), ((2, 3, 4), (3, 1)), ((0, 3), (3,))]:
        yield Sample((make(rng, sx, dt), make(rng, sy, dt)))


register(OpInfo("fused", _fused, _samples, differentiable=False, gradcheck=False))
