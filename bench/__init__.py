"""Side-by-side benchmarks: tessera and its peers in one run, printed as ratios."""
