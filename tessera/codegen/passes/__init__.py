"""The code generator's passes, run in the graph pipeline's order (``tessera.graph.passes.
PIPELINE``) when generated kernels are on: ``decompose`` (rows-wise ops into reductions and
elementwise ops the loops can fuse) and ``outline`` (each fusion region into one ``fused``
node).
"""
