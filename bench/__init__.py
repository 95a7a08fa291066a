"""Side-by-side benchmarks: tessera and its peers in one run, printed as ratios."""

# an instruction-set cap (python -m bench --max-isa avx2) goes into the environment before
# any framework loads its kernels, here and in every child process
from bench.isa import apply_cap  # noqa: E402

apply_cap()

# tessera first, as a script should import it: it sets OpenBLAS's worker spin before NumPy
# loads OpenBLAS (tessera/_runtime/blas_env.py). The peers' child processes import it too, unused.
import tessera  # noqa: E402,F401
