// node:assert/strict in a browser: the part the JavaScript client's
// Node.js suite uses (ok, equal, notEqual, deepEqual, match, throws,
// rejects), with node's strict meanings.
export class AssertionError extends Error {
  constructor(msg) { super(msg); this.name = 'AssertionError'; }
}

const show = (v) => {
  try { return typeof v === 'bigint' ? `${v}n` : JSON.stringify(v, (_, x) => (typeof x === 'bigint' ? `${x}n` : x)); } catch { return String(v); }
};

function fail(message, fallback) {
  if (message instanceof Error) throw message;
  throw new AssertionError(message ?? fallback);
}

function ok(v, message) { if (!v) fail(message, `expected a truthy value, got ${show(v)}`); }

function equal(a, b, message) { if (!Object.is(a, b)) fail(message, `${show(a)} !== ${show(b)}`); }

function notEqual(a, b, message) { if (Object.is(a, b)) fail(message, `${show(a)} === ${show(b)}`); }

// same is node's strict deep equality for what the suite compares:
// primitives, arrays, typed arrays, plain objects, Maps and Sets.
function same(a, b) {
  if (Object.is(a, b)) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Object.getPrototypeOf(a) !== Object.getPrototypeOf(b)) return false;
  if (ArrayBuffer.isView(a)) return a.length === b.length && a.every((x, i) => Object.is(x, b[i]));
  if (a instanceof Map) return a.size === b.size && [...a].every(([k, v]) => b.has(k) && same(v, b.get(k)));
  if (a instanceof Set) return a.size === b.size && [...a].every((k) => b.has(k));
  const ka = Object.keys(a), kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && same(a[k], b[k]));
}

function deepEqual(a, b, message) { if (!same(a, b)) fail(message, `${show(a)} is not deeply equal to ${show(b)}`); }

function match(s, re, message) { if (typeof s !== 'string' || !re.test(s)) fail(message, `${show(s)} does not match ${re}`); }

// check judges a thrown value as node does: an Error class by
// instanceof, a RegExp against its message, a function by its result.
function check(err, expected, message) {
  if (expected === undefined) return;
  if (typeof expected === 'string') { message = expected; return; }
  if (expected instanceof RegExp) { match(String(err?.message ?? err), expected, message); return; }
  if (typeof expected === 'function') {
    if (expected.prototype !== undefined && err instanceof expected) return;
    if (Error.isPrototypeOf(expected) || expected === Error) fail(message, `${show(err?.message ?? err)} is not a ${expected.name}`);
    if (expected.call({}, err) !== true) fail(message, `the validator refused ${err?.name ?? ''}: ${err?.message ?? show(err)}`);
    return;
  }
  for (const k of Object.keys(expected)) {
    if (!same(err?.[k], expected[k])) fail(message, `${k}: ${show(err?.[k])}, want ${show(expected[k])}`);
  }
}

function throws(fn, expected, message) {
  try {
    fn();
  } catch (err) {
    check(err, expected, message);
    return;
  }
  fail(message, 'missing expected exception');
}

async function rejects(p, expected, message) {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (err) {
    check(err, expected, message);
    return;
  }
  fail(message, 'missing expected rejection');
}

const assert = Object.assign((v, message) => ok(v, message), {
  ok, equal, notEqual, deepEqual, strictEqual: equal, deepStrictEqual: deepEqual, match, throws, rejects, AssertionError,
});
export default assert;
export { ok, equal, notEqual, deepEqual, match, throws, rejects };
