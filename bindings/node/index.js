'use strict';
/**
 * tessera-deploy: run a model exported by `tessera.deploy.export_c` from Node.js.
 *
 *   const tessera = require('tessera-deploy');
 *   const m = tessera.load('out/m/libm.so', 'out/m/m.weights');
 *   const [y] = m.run([x]);     // x: Float32Array (BigInt64Array for integer inputs)
 *   m.free();
 *
 * The library is called through koffi (a prebuilt FFI), so nothing is compiled at install
 * time. Every symbol of an exported library carries the model's name as a prefix; `load`
 * reads it from the file name (`lib<name>.so`) unless `{name}` is given.
 */
const path = require('path');
const koffi = require('koffi');

const MAX_RANK = 8; // the C API writes at most 8 dims per shape
const DTYPES = { 0: 'float32', 1: 'int64' };
const ARRAYS = { float32: Float32Array, int64: BigInt64Array };

const bound = new Map(); // resolved library path + name -> its functions, bound once

function modelName(libPath) {
  const base = path.basename(libPath);
  const m = /^lib(.+)\.(so|dylib)$/.exec(base) || /^(.+)\.dll$/.exec(base);
  if (!m) {
    throw new Error(`tessera-deploy: cannot tell the model's name from "${base}" ` +
      '(expected lib<name>.so); pass {name: ...}');
  }
  return m[1];
}

function bind(libPath, name) {
  const key = `${path.resolve(libPath)}\0${name}`;
  if (bound.has(key)) return bound.get(key);
  let lib;
  try {
    lib = koffi.load(libPath);
  } catch (e) {
    throw new Error(`tessera-deploy: cannot load the library ${libPath}: ${e.message}`);
  }
  const fn = (sym, ret, args, optional = false) => {
    try {
      return lib.func(`${name}_${sym}`, ret, args);
    } catch (e) {
      if (optional) return null;
      throw new Error(`tessera-deploy: ${libPath} has no function ${name}_${sym}; ` +
        `is it a library exported by tessera.deploy with name "${name}"?`);
    }
  };
  const api = {
    load: fn('load', 'void *', ['str']),
    lastError: fn('last_error', 'str', ['void *']),
    loadError: fn('load_error', 'str', []),
    numInputs: fn('num_inputs', 'int', []),
    numOutputs: fn('num_outputs', 'int', []),
    inputShape: fn('input_shape', 'int', ['int', 'int64_t *']),
    outputShape: fn('output_shape', 'int', ['int', 'int64_t *']),
    inputDtype: fn('input_dtype', 'int', ['int']),
    outputDtype: fn('output_dtype', 'int', ['int']),
    setNumThreads: fn('set_num_threads', 'int', ['void *', 'int']),
    run: fn('run', 'int', ['void *', 'void **', 'void **']),
    free: fn('free', 'void', ['void *']),
  };
  bound.set(key, api);
  return api;
}

function shapeOf(query, i) {
  const dims = new BigInt64Array(MAX_RANK);
  const rank = query(i, dims);
  if (rank < 0 || rank > MAX_RANK) throw new Error(`tessera-deploy: bad rank ${rank} for #${i}`);
  return Array.from(dims.subarray(0, rank), Number);
}

const numel = (shape) => shape.reduce((a, b) => a * b, 1);

// a model dropped without free() still releases its C memory when collected
const finalizer = new FinalizationRegistry(({ free, handle }) => free(handle));

class Model {
  constructor(api, handle, name) {
    this._api = api;
    this._handle = handle;
    this.name = name;
    const nIn = api.numInputs();
    const nOut = api.numOutputs();
    this.inputShapes = Array.from({ length: nIn }, (_, i) => shapeOf(api.inputShape, i));
    this.outputShapes = Array.from({ length: nOut }, (_, i) => shapeOf(api.outputShape, i));
    this.inputDtypes = Array.from({ length: nIn }, (_, i) => DTYPES[api.inputDtype(i)]);
    this.outputDtypes = Array.from({ length: nOut }, (_, i) => DTYPES[api.outputDtype(i)]);
    this._token = {};
    finalizer.register(this, { free: api.free, handle }, this._token);
  }

  _live() {
    if (this._handle === null) throw new Error(`tessera-deploy: model ${this.name} was freed`);
    return this._handle;
  }

  /** Threads for later runs (>= 1). */
  setNumThreads(n) {
    if (!Number.isInteger(n) || n < 1) {
      throw new RangeError(`tessera-deploy: setNumThreads(${n}): expected an integer >= 1`);
    }
    const h = this._live();
    if (this._api.setNumThreads(h, n) !== 0) throw new Error(this._api.lastError(h));
  }

  /**
   * Run the model once. `inputs`: one typed array per input, C-contiguous, of the exported
   * shape (Float32Array, or BigInt64Array where `inputDtypes[i]` is 'int64'). Returns one
   * typed array per output (BigInt64Array where `outputDtypes[i]` is 'int64': integer and
   * bool outputs); `outputs` may supply them to avoid allocating.
   */
  run(inputs, outputs) {
    const h = this._live();
    if (!Array.isArray(inputs) || inputs.length !== this.inputShapes.length) {
      throw new TypeError(`tessera-deploy: ${this.name}.run expects an array of ` +
        `${this.inputShapes.length} input(s), got ${describe(inputs)}`);
    }
    inputs.forEach((x, i) => {
      const dtype = this.inputDtypes[i];
      const want = numel(this.inputShapes[i]);
      if (!(x instanceof ARRAYS[dtype]) || x.length !== want) {
        throw new TypeError(`tessera-deploy: ${this.name}.run input ${i} must be a ` +
          `${ARRAYS[dtype].name} of ${want} elements (shape [${this.inputShapes[i]}]), ` +
          `got ${describe(x)}`);
      }
    });
    const outs = outputs ||
      this.outputShapes.map((s, i) => new ARRAYS[this.outputDtypes[i]](numel(s)));
    if (!Array.isArray(outs) || outs.length !== this.outputShapes.length) {
      throw new TypeError(`tessera-deploy: ${this.name}.run expects ` +
        `${this.outputShapes.length} output array(s), got ${describe(outs)}`);
    }
    outs.forEach((y, i) => {
      const want = numel(this.outputShapes[i]);
      const kind = ARRAYS[this.outputDtypes[i]];
      if (!(y instanceof kind) || y.length !== want) {
        throw new TypeError(`tessera-deploy: ${this.name}.run output ${i} must be a ` +
          `${kind.name} of ${want} elements, got ${describe(y)}`);
      }
    });
    if (this._api.run(h, inputs, outs) !== 0) throw new Error(this._api.lastError(h));
    return outs;
  }

  /** Release the model's memory; later calls throw. Calling it twice is harmless. */
  free() {
    if (this._handle === null) return;
    finalizer.unregister(this._token);
    this._api.free(this._handle);
    this._handle = null;
  }
}

function describe(v) {
  if (v === null || v === undefined) return String(v);
  if (ArrayBuffer.isView(v)) return `a ${v.constructor.name} of ${v.length} elements`;
  if (Array.isArray(v)) return `an array of ${v.length}`;
  return typeof v;
}

/**
 * Load an exported model: `load('out/m/libm.so', 'out/m/m.weights')`. Throws with the
 * library's message when the weights file is missing, truncated, corrupt or another model's.
 */
function load(libPath, weightsPath, options = {}) {
  const name = options.name || modelName(libPath);
  const api = bind(libPath, name);
  const handle = api.load(weightsPath);
  if (!handle) throw new Error(api.loadError() || `tessera-deploy: ${name}_load failed`);
  return new Model(api, handle, name);
}

module.exports = { load, Model };
