"""Passes over fx graphs, at PyTorch's import paths (``tessera.fx.passes.shape_prop``)."""
