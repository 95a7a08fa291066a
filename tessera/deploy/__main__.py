"""``python -m tessera.deploy model.onnx out/m --name m``: an ONNX file as a C library folder
(see ``tessera.deploy.export_c``). ``--shape`` fixes symbolic input dimensions, once per
input in order (``--shape 1,3,224,224``)."""
from __future__ import annotations

import argparse
import sys

from tessera.deploy import export_c


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    >>> main(["--help"])  # doctest: +SKIP
    """
    p = argparse.ArgumentParser(prog="python -m tessera.deploy",
                                description="Export an ONNX model as a standalone C library.")
    p.add_argument("model", help="the .onnx file")
    p.add_argument("out_dir", help="the folder to write")
    p.add_argument("--name", default="model", help="the C prefix of every symbol")
    p.add_argument("--shape", action="append", default=None,
                   help="an input's shape, e.g. 1,3,224,224 (once per input, in order)")
    a = p.parse_args(argv)
    inputs = None
    if a.shape:
        import tessera
        inputs = tuple(tessera.zeros(*[int(s) for s in sh.split(",")]) for sh in a.shape)
    info = export_c(a.model, inputs, a.out_dir, name=a.name)
    print(f"wrote {info['folder']} ({len(info['files'])} files); build it with "
          f"make -C {info['folder']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
