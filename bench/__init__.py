"""Side-by-side benchmarks: tessera and its peers in one run, printed as ratios."""

# tessera first, as a script should import it: it sets OpenBLAS's worker spin before NumPy
# loads OpenBLAS (tessera/_runtime/blas_env.py). The peers' child processes import it too, unused.
import tessera  # noqa: E402,F401
