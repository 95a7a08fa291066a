"""``python -m tessera.onnx <command>``: export, inspect, simplify and run ONNX models.

    export MODEL OUT --input-shape 1,3,32,32   MODEL is module:callable returning an
                                                nn.Module (e.g. tessera.models:resnet18)
    inspect FILE                                inputs, outputs, opset, ops, parameters
    simplify IN OUT                             tessera's graph passes, then export again
    run FILE [--input-shape ...] [--check]      run in tessera (random inputs); --check
                                                compares with onnxruntime

A file that is missing, truncated, not ONNX or of an unsupported opset gives a one-line
error and exit status 1.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import sys

import numpy as np


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: '{text}' (use e.g. 1,3,224,224)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tessera.onnx",
                                description="ONNX export, inspection, simplification, runs")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="export a tessera model to ONNX")
    e.add_argument("model", help="module:callable returning an nn.Module, e.g. "
                                 "tessera.models:resnet18")
    e.add_argument("out", help="the .onnx file to write")
    e.add_argument("--input-shape", type=_shape, action="append", required=True,
                   help="shape of one input (repeat for several inputs)")
    e.add_argument("--int-inputs", action="store_true", help="int64 inputs (token ids)")
    e.add_argument("--opset", type=int, default=17)
    e.add_argument("--dynamic-batch", action="store_true", help="make dim 0 dynamic")
    i = sub.add_parser("inspect", help="print inputs, outputs, opset, op histogram, "
                                       "parameter count")
    i.add_argument("file")
    s = sub.add_parser("simplify", help="simplify a model with tessera's graph passes")
    s.add_argument("input")
    s.add_argument("output")
    s.add_argument("--input-shape", type=_shape, action="append",
                   help="static shape for an input with symbolic dims (in order)")
    r = sub.add_parser("run", help="run a model in tessera on random inputs")
    r.add_argument("file")
    r.add_argument("--input-shape", type=_shape, action="append",
                   help="static shape for an input with symbolic dims (in order)")
    r.add_argument("--check", action="store_true", help="compare with onnxruntime")
    r.add_argument("--compiled", action="store_true", help="use the compiled executor")
    return p


def _load_proto(path: str):
    from tessera.onnx.importer import _proto
    return _proto(path)


def _dims(v) -> str:
    t = v.type.tensor_type
    dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
            for d in t.shape.dim]
    import onnx
    return f"{onnx.TensorProto.DataType.Name(t.elem_type).lower()}[{', '.join(dims)}]"


def cmd_inspect(args) -> int:
    from tessera.onnx.importer import opset_of
    proto = _load_proto(args.file)
    g = proto.graph
    inits = {t.name for t in g.initializer}
    print(f"{args.file}: opset {opset_of(proto)}, ir_version {proto.ir_version}, "
          f"producer {proto.producer_name or '-'}")
    print("inputs:")
    for v in g.input:
        if v.name not in inits:
            print(f"  {v.name}: {_dims(v)}")
    print("outputs:")
    for v in g.output:
        print(f"  {v.name}: {_dims(v)}")
    hist = collections.Counter(n.op_type for n in g.node)
    print(f"nodes: {len(g.node)}")
    for op, k in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {op:<24} {k}")
    count = sum(int(np.prod(t.dims)) for t in g.initializer)
    print(f"parameters: {count:,} in {len(g.initializer)} initializers")
    return 0


def cmd_export(args) -> int:
    import tessera
    import tessera.onnx
    mod, _, attr = args.model.partition(":")
    if not attr:
        raise ValueError(f"MODEL must be module:callable, got '{args.model}'")
    model = getattr(importlib.import_module(mod), attr)()
    rng = np.random.default_rng(0)
    inputs = []
    for shape in args.input_shape:
        if args.int_inputs:
            inputs.append(tessera.tensor(rng.integers(0, 100, shape)))
        else:
            inputs.append(tessera.tensor(rng.standard_normal(shape), dtype=tessera.float32))
    axes = {f"input{k}": {0: "batch"} for k in range(len(inputs))} if args.dynamic_batch \
        else None
    proto = tessera.onnx.export(model, tuple(inputs), args.out, opset_version=args.opset,
                                dynamic_axes=axes)
    print(f"wrote {args.out}: {len(proto.graph.node)} nodes, opset {args.opset}")
    return 0


def cmd_simplify(args) -> int:
    from tessera.onnx.simplifier import simplify
    before = _load_proto(args.input)
    after = simplify(before, args.output, input_shapes=args.input_shape)
    print(f"{args.input}: {len(before.graph.node)} nodes -> {args.output}: "
          f"{len(after.graph.node)} nodes")
    return 0


def cmd_run(args) -> int:
    import tessera
    from tessera.onnx.importer import load
    proto = _load_proto(args.file)
    m = load(proto, args.input_shape)
    rng = np.random.default_rng(0)
    arrays = []
    for v in m.graph.inputs:
        if v.dtype.is_floating_point:
            arrays.append(rng.standard_normal(v.shape).astype(v.dtype.np))
        else:
            arrays.append(rng.integers(0, 2, v.shape).astype(v.dtype.np))
    outs = m.run(*[tessera.tensor(a) for a in arrays], compiled=args.compiled)
    for name, o in zip(m.output_names, outs):
        print(f"{name}: {o.dtype.name}{list(o.shape)}")
    if args.check:
        import onnxruntime as ort
        s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        want = s.run(None, dict(zip(m.input_names, arrays)))
        err = max(float(np.abs(o.numpy().astype(np.float64) - w).max()) if o.numel() else 0.0
                  for o, w in zip(outs, want))
        print(f"max |tessera - onnxruntime| = {err:.3g}")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"export": cmd_export, "inspect": cmd_inspect, "simplify": cmd_simplify,
                "run": cmd_run}[args.cmd](args)
    except (OSError, ValueError, RuntimeError, NotImplementedError, ImportError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
