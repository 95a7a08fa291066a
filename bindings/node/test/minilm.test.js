'use strict';
// MiniLM sentence embeddings from JavaScript, against the same model run by tessera in
// Python. The fixture (the exported library and the expected embeddings) is made by
// make_fixture.py with the Python given by $TESSERA_PYTHON (default: python3), or taken
// from $TESSERA_NODE_FIXTURE when that folder exists already.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync } = require('child_process');
const tessera = require('..');

function fixture() {
  let dir = process.env.TESSERA_NODE_FIXTURE;
  if (!dir || !fs.existsSync(path.join(dir, 'fixture.json'))) {
    dir = dir || fs.mkdtempSync(path.join(os.tmpdir(), 'tessera-node-'));
    const python = process.env.TESSERA_PYTHON || 'python3';
    execFileSync(python, [path.join(__dirname, 'make_fixture.py'), dir], { stdio: 'inherit' });
  }
  const meta = JSON.parse(fs.readFileSync(path.join(dir, 'fixture.json'), 'utf8'));
  const read = (key, Type) => {
    const buf = fs.readFileSync(path.join(dir, `${key}.bin`));
    return new Type(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
  };
  return {
    ...meta,
    dir,
    ids: read('input_ids', BigInt64Array),
    mask: read('attention_mask', BigInt64Array),
    expected: read('expected', Float32Array),
  };
}

const fx = fixture();

test('embeddings equal Python within 1e-5', () => {
  const m = tessera.load(fx.lib, fx.weights);
  assert.deepStrictEqual(m.inputShapes, [fx.shapes.input_ids, fx.shapes.attention_mask]);
  assert.deepStrictEqual(m.inputDtypes, ['int64', 'int64']);
  assert.deepStrictEqual(m.outputShapes, [fx.shapes.expected]);
  const [emb] = m.run([fx.ids, fx.mask]);
  let worst = 0;
  for (let i = 0; i < emb.length; i++) worst = Math.max(worst, Math.abs(emb[i] - fx.expected[i]));
  assert.ok(worst <= 1e-5, `max |js - python| = ${worst}`);
  m.free();
});

test('threads and reuse of output arrays give the same answer', () => {
  const m = tessera.load(fx.lib, fx.weights);
  const [one] = m.run([fx.ids, fx.mask]);
  m.setNumThreads(2);
  const out = [new Float32Array(one.length)];
  const [two] = m.run([fx.ids, fx.mask], out);
  assert.strictEqual(two, out[0]);
  for (let i = 0; i < one.length; i++) assert.ok(Math.abs(one[i] - two[i]) <= 1e-6);
  assert.throws(() => m.setNumThreads(0), RangeError);
  m.free();
});

test('two models from one library run independently', () => {
  const a = tessera.load(fx.lib, fx.weights);
  const b = tessera.load(fx.lib, fx.weights);
  const [ya] = a.run([fx.ids, fx.mask]);
  b.free();
  const [ya2] = a.run([fx.ids, fx.mask]);
  assert.deepStrictEqual(ya2, ya);
  a.free();
});

test('bad weights files are JS exceptions naming the problem', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tessera-node-bad-'));
  assert.throws(() => tessera.load(fx.lib, path.join(dir, 'missing.weights')), /missing\.weights/);
  const full = fs.readFileSync(fx.weights);
  const truncated = path.join(dir, 'truncated.weights');
  fs.writeFileSync(truncated, full.subarray(0, full.length >> 1));
  assert.throws(() => tessera.load(fx.lib, truncated), Error);
  const flipped = Buffer.from(full);
  flipped[flipped.length - 5] ^= 0x40;
  const corrupt = path.join(dir, 'corrupt.weights');
  fs.writeFileSync(corrupt, flipped);
  assert.throws(() => tessera.load(fx.lib, corrupt), /checksum|corrupt/i);
});

test('wrong inputs and use after free are exceptions, not crashes', () => {
  const m = tessera.load(fx.lib, fx.weights);
  assert.throws(() => m.run([fx.ids]), TypeError);
  assert.throws(() => m.run([new Float32Array(fx.ids.length), fx.mask]), /BigInt64Array/);
  assert.throws(() => m.run([fx.ids.subarray(1), fx.mask]), TypeError);
  assert.throws(() => m.run('x'), TypeError);
  m.free();
  m.free();
  assert.throws(() => m.run([fx.ids, fx.mask]), /freed/);
});

test('a file that is not an exported library is refused with its name', () => {
  assert.throws(() => tessera.load(path.join(fx.dir, 'libnothing.so'), fx.weights),
    /libnothing\.so/);
  assert.throws(() => tessera.load('/tmp/model.bin', fx.weights), /lib<name>\.so/);
});
