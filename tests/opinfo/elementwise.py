"""Op-info entries: elementwise ops."""
import numpy as np

from tests.opinfo.core import OpInfo, Sample, binary_samples, make, register, unary_samples

F = (np.float32, np.float64)

register(
    OpInfo("add", lambda L, a, b: L.add(a, b), binary_samples()),
    OpInfo("add_alpha", lambda L, a, b: L.add(a, b, alpha=2), binary_samples(), covers=("add",)),
    OpInfo("sub", lambda L, a, b: a - b if hasattr(a, "shape") else L.sub(a, b),
           binary_samples()),
    OpInfo("mul", lambda L, a, b: a * b, binary_samples()),
    OpInfo("div", lambda L, a, b: a / b, binary_samples(rhs_low=0.5, rhs_high=2.0)),
    OpInfo("exp", lambda L, x: L.exp(x), unary_samples()),
    OpInfo("log", lambda L, x: x.log(), unary_samples(0.1, 3.0)),
    OpInfo("tanh", lambda L, x: x.tanh(), unary_samples()),
    OpInfo("sigmoid", lambda L, x: L.sigmoid(x), unary_samples()),
)
