// The JavaScript codec against the Go codec's frames (clients/js/js_test.go
// writes them to COURIER_GOLDEN).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { encodeFrame, decodeFrame, decodeMessage, MalformedError } from '../wire.js';

const golden = JSON.parse(readFileSync(process.env.COURIER_GOLDEN, 'utf8'));
const unhex = (s) => Uint8Array.from(Buffer.from(s, 'hex'));
const hex = (b) => Buffer.from(b).toString('hex');
const num = (s) => { const b = BigInt(s); return b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : b; };

test('decodes and encodes the Go codec frames byte for byte', () => {
  assert.ok(golden.frames.length >= 10);
  for (const g of golden.frames) {
    const bytes = unhex(g.hex);
    const f = decodeMessage(bytes);
    assert.equal(f.type, g.type);
    assert.equal(f.flags, g.flags);
    assert.equal(f.ref, num(g.ref), g.hex);
    assert.equal(f.attach, g.attach);
    assert.equal(f.aux, num(g.aux));
    assert.equal(f.name, g.name);
    assert.equal(f.key, g.key);
    assert.equal(f.tag, g.tag);
    assert.deepEqual(f.headers, g.headers ?? {});
    assert.equal(hex(f.body), g.body);
    assert.equal(hex(encodeFrame(f)), g.hex);
  }
});

test('accepts and refuses what the Go codec does', () => {
  let ok = 0;
  for (const v of golden.verdicts) {
    let f = null, err = null;
    try { f = decodeFrame(unhex(v.hex)); } catch (e) { err = e; }
    if (err && !(err instanceof MalformedError)) throw err;
    assert.equal(err === null, v.ok, `${v.hex}: Go says ok=${v.ok}, JS says ${err ? err.message : 'ok'}`);
    if (v.again) { assert.equal(hex(encodeFrame(f)), v.again, v.hex); ok++; }
  }
  assert.ok(ok > 100, `only ${ok} mutations decoded`);
});

test('a message must hold exactly one frame', () => {
  const ping = encodeFrame({ type: 0x03, ref: 1 });
  assert.throws(() => decodeMessage(ping.subarray(0, 3)), MalformedError);
  assert.throws(() => decodeMessage(ping.subarray(0, ping.length - 1)), MalformedError);
  const two = new Uint8Array(ping.length * 2); two.set(ping); two.set(ping, ping.length);
  assert.throws(() => decodeMessage(two), MalformedError);
  assert.throws(() => decodeMessage(ping, 1), MalformedError);
  assert.equal(decodeMessage(ping).ref, 1);
});
