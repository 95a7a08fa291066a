"""``python -m tessera <command>``: small tools.

    python -m tessera opcov     print the op x rule coverage table of the registry
    python -m tessera info      versions, devices and the number of registered ops
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd = argv[0] if argv else "--help"
    import tessera
    from tessera.ops.registry import REGISTRY, coverage_table
    if cmd == "opcov":
        from tessera.onnx.converters import EXPORT  # needs no onnx package
        print(coverage_table(extra={"to_onnx": set(EXPORT)}))
        return 0
    if cmd == "info":
        import numpy as np

        from tessera.device import registered_devices
        print(f"tessera {tessera.__version__}, numpy {np.__version__}")
        print(f"devices: {', '.join(registered_devices())}")
        print(f"ops: {len(REGISTRY)} registered")
        return 0
    print(__doc__)
    return 0 if cmd in ("--help", "-h", "help") else 2


if __name__ == "__main__":
    sys.exit(main())
