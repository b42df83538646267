// The Courier wire codec (docs/protocol.md §2), as wire/codec.go has it:
// every frame is a u32 big-endian length, then type, flags, a field
// bitmap, the fields set in it in bit order, and the body.
//
// Numbers (Ref, Attach, Aux) are JavaScript numbers while they are safe
// integers (below 2^53) and BigInts above; encoders take either.

export const Type = Object.freeze({
  HELLO: 0x01, WELCOME: 0x02, PING: 0x03, PONG: 0x04, CLOSE: 0x05, ERROR: 0x06, OK: 0x07, CREDIT: 0x08,
  DECLARE: 0x10, DELETE: 0x11, LIST: 0x12, ATTACH: 0x13, DETACH: 0x14, SUBSCRIBE: 0x15, UNSUBSCRIBE: 0x16,
  DECISION: 0x17, SUBREQUEST: 0x18, EVENT: 0x19,
  REQUEST: 0x20, RESPONSE: 0x21, CANCEL: 0x22, ASK: 0x23, ANSWER: 0x24, PUBLISH: 0x28, MESSAGE: 0x29,
  SUBMIT: 0x30, TASK: 0x31, ACK: 0x32, NACK: 0x33, PROGRESS: 0x34, TASKEVENT: 0x35, WATCH: 0x36,
});

// Node-link types (0x40–0x4c) are valid frames that a client never sees.
const MAX_TYPE = 0x4c;

export const Flag = Object.freeze({
  FATAL: 0x01, CHUNK: 0x02, END: 0x04, ERROR: 0x08, LAST: 0x10, REPLY: 0x20, WATCH: 0x40,
});

export const Code = Object.freeze({
  OK: 0, PROTOCOL: 1, VERSION: 2, FRAME_TOO_LARGE: 3, NOT_FOUND: 4, CLASH: 5, BAD_OPTIONS: 6,
  NO_HANDLER: 7, TIMEOUT: 8, CANCELLED: 9, REJECTED: 10, HANDLER_GONE: 11, INTERNAL: 12,
  NOT_ALLOWED: 13, LIMIT: 14, HEARTBEAT: 15, SHUTDOWN: 16, UNAUTHORIZED: 17, APPLICATION: 18,
  SLOW_CONSUMER: 19, EXCHANGE_DELETED: 20, TOO_MANY_CONNS: 21, TOO_MANY_ATTACHMENTS: 22,
  TOO_MANY_INFLIGHT: 23, DEADLINE_TOO_LONG: 24, QUEUE_FULL: 25, TOO_MANY_PATTERNS: 26,
  EXPR_LIMIT: 27, HANDSHAKE_LIMIT: 28, UNAVAILABLE: 29, STORAGE: 30, NOT_LEADER: 31,
});

const F_REF = 0x01, F_ATTACH = 0x02, F_AUX = 0x04, F_NAME = 0x08, F_KEY = 0x10, F_TAG = 0x20, F_HEADER = 0x40, F_BODY = 0x80;
const VALID_FLAGS = 0x7f;
const MAX_HEADERS = 256;
const MIN_FRAME = 3;

/** The error a malformed frame gives (code 1 on the server). */
export class MalformedError extends Error {
  constructor(msg) { super(`malformed frame: ${msg}`); this.name = 'MalformedError'; }
}

const enc = new TextEncoder();
const dec = new TextDecoder('utf-8', { fatal: true });

function isZero(v) { return v === undefined || v === null || v === 0 || v === 0n; }

function pushUvarint(out, v) {
  if (typeof v === 'bigint') {
    if (v < 0n || v >= (1n << 64n)) throw new RangeError(`uvarint out of range: ${v}`);
    while (v >= 0x80n) { out.push(Number(v & 0x7fn) | 0x80); v >>= 7n; }
    out.push(Number(v));
    return;
  }
  if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`uvarint out of range: ${v}`);
  while (v >= 0x80) { out.push((v % 0x80) | 0x80); v = Math.floor(v / 0x80); }
  out.push(v);
}

function pushBytes(out, b) { for (let i = 0; i < b.length; i++) out.push(b[i]); }

function pushString(out, s) {
  const b = enc.encode(s);
  pushUvarint(out, b.length);
  pushBytes(out, b);
}

/** toBytes turns a body (Uint8Array, ArrayBuffer, string or undefined) into bytes. */
export function toBytes(body) {
  if (body === undefined || body === null) return new Uint8Array(0);
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  if (typeof body === 'string') return enc.encode(body);
  throw new TypeError('a body is a Uint8Array, an ArrayBuffer or a string');
}

/**
 * encodeFrame returns the bytes of a frame, length prefix included, as
 * wire.AppendFrame writes them: zero fields are left out, headers in
 * the order given.
 */
export function encodeFrame(f) {
  const out = [0, 0, 0, 0, f.type, f.flags || 0, 0];
  let fields = 0;
  if (!isZero(f.ref)) { fields |= F_REF; pushUvarint(out, f.ref); }
  if (!isZero(f.attach)) {
    if (Number(f.attach) > 0xffffffff) throw new RangeError(`attach over 32 bits: ${f.attach}`);
    fields |= F_ATTACH; pushUvarint(out, f.attach);
  }
  if (!isZero(f.aux)) { fields |= F_AUX; pushUvarint(out, f.aux); }
  if (f.name) { fields |= F_NAME; pushString(out, f.name); }
  if (f.key) { fields |= F_KEY; pushString(out, f.key); }
  if (f.tag) { fields |= F_TAG; pushString(out, f.tag); }
  const headers = f.headers ? Object.entries(f.headers) : [];
  if (headers.length > 0) {
    if (headers.length > MAX_HEADERS) throw new RangeError(`more than ${MAX_HEADERS} headers`);
    fields |= F_HEADER;
    pushUvarint(out, headers.length);
    for (const [k, v] of headers) { pushString(out, k); pushString(out, String(v)); }
  }
  const head = out.length;
  const body = toBytes(f.body);
  if (body.length > 0) fields |= F_BODY;
  out[6] = fields;
  const n = head - 4 + body.length;
  const buf = new Uint8Array(head + body.length);
  buf.set(out, 0);
  buf.set(body, head);
  new DataView(buf.buffer).setUint32(0, n, false);
  return buf;
}

class Cursor {
  constructor(p) { this.p = p; this.i = 0; }
  uvarint() {
    let lo = 0, mul = 1, big = null;
    for (let n = 0; ; n++) {
      if (this.i >= this.p.length) throw new MalformedError('uvarint cut short');
      if (n === 10) throw new MalformedError('uvarint overflows 64 bits');
      const b = this.p[this.i++];
      if (n === 9 && b > 1) throw new MalformedError('uvarint overflows 64 bits');
      if (big === null && n < 7) {
        lo += (b & 0x7f) * mul; mul *= 0x80;
      } else {
        if (big === null) big = BigInt(lo);
        big |= BigInt(b & 0x7f) << BigInt(7 * n);
      }
      if (b < 0x80) {
        if (big === null) return lo;
        return big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
      }
    }
  }
  string() {
    const n = this.uvarint();
    if (typeof n === 'bigint' || n > this.p.length - this.i) throw new MalformedError('string runs past the end of the frame');
    const b = this.p.subarray(this.i, this.i + n);
    this.i += n;
    try { return dec.decode(b); } catch { throw new MalformedError('string is not valid UTF-8'); }
  }
}

/**
 * decodeFrame decodes p, the bytes of one frame after its length prefix,
 * as wire.Decode does, rejecting what it rejects (MalformedError). The
 * body is a view of p.
 */
export function decodeFrame(p) {
  if (p.length < MIN_FRAME) throw new MalformedError(`${p.length} bytes, need at least ${MIN_FRAME}`);
  const type = p[0], flags = p[1], fields = p[2];
  if (type === 0 || type > MAX_TYPE || !validType(type)) throw new MalformedError(`unknown type 0x${type.toString(16)}`);
  if (flags & ~VALID_FLAGS) throw new MalformedError(`unknown flags 0x${flags.toString(16)}`);
  const c = new Cursor(p);
  c.i = 3;
  const f = { type, flags, ref: 0, attach: 0, aux: 0, name: '', key: '', tag: '', headers: {}, body: new Uint8Array(0) };
  if (fields & F_REF) f.ref = c.uvarint();
  if (fields & F_ATTACH) {
    f.attach = c.uvarint();
    if (typeof f.attach === 'bigint' || f.attach > 0xffffffff) throw new MalformedError('attach over 32 bits');
  }
  if (fields & F_AUX) f.aux = c.uvarint();
  if (fields & F_NAME) f.name = c.string();
  if (fields & F_KEY) f.key = c.string();
  if (fields & F_TAG) f.tag = c.string();
  if (fields & F_HEADER) {
    const n = c.uvarint();
    if (typeof n === 'bigint' || n > MAX_HEADERS) throw new MalformedError(`more than ${MAX_HEADERS} headers`);
    for (let i = 0; i < n; i++) {
      const k = c.string();
      f.headers[k] = c.string();
    }
  }
  if (fields & F_BODY) {
    if (c.i >= p.length) throw new MalformedError('body bit set without a body');
    f.body = p.subarray(c.i);
  } else if (c.i !== p.length) {
    throw new MalformedError(`${p.length - c.i} bytes left over`);
  }
  return f;
}

function validType(t) {
  return (t >= 0x01 && t <= 0x08) || (t >= 0x10 && t <= 0x19) || (t >= 0x20 && t <= 0x24) ||
    t === 0x28 || t === 0x29 || (t >= 0x30 && t <= 0x36) || (t >= 0x40 && t <= MAX_TYPE);
}

/**
 * decodeMessage decodes one WebSocket message, which must hold exactly
 * one frame with its length prefix.
 */
export function decodeMessage(msg, maxFrame) {
  if (msg.length < 4) throw new MalformedError(`a message of ${msg.length} bytes, shorter than a frame`);
  const n = new DataView(msg.buffer, msg.byteOffset, msg.byteLength).getUint32(0, false);
  if (maxFrame && n > maxFrame) throw new MalformedError(`frame of ${n} bytes over the limit ${maxFrame}`);
  if (n !== msg.length - 4) throw new MalformedError(`a message of ${msg.length} bytes holds a frame of ${n + 4}`);
  return decodeFrame(msg.subarray(4));
}
