// The JavaScript client against a real server (clients/js/js_test.go
// starts it and gives its WebSocket URL in COURIER_WS_URL).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, CourierError, Code } from '../courier.js';

const url = process.env.COURIER_WS_URL;

// waitFor polls cond until it holds, or fails after a generous deadline.
async function waitFor(cond, what, ms = 20000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

test('connect: the handshake over WebSocket', async () => {
  const c = await connect(url, { name: 'js-test' });
  try {
    assert.match(c.id, /^[A-Za-z0-9_-]+\/c\d+$/);
    assert.equal(c.welcome.version, 1);
    assert.ok(c.welcome.credit > 0);
  } finally {
    c.close();
  }
});

test('connect: a URL that is not ws:// is refused', async () => {
  await assert.rejects(connect('courier://127.0.0.1:7400'), TypeError);
});

test('request-response: a JS requester and a JS handler', async () => {
  const h = await connect(url, { name: 'handler' });
  const r = await connect(url, { name: 'requester' });
  try {
    await h.declare('js.users', { pattern: 'reqresp', strategy: 'round-robin' });
    const seen = [];
    await h.handle('js.users', (req) => {
      seen.push(req.requester);
      if (req.text() === 'fail') throw new Error('asked to fail');
      return { body: 'hello ' + req.text(), headers: { lang: req.headers.lang ?? '' } };
    });
    const resp = await r.request('js.users', 'ana', { headers: { lang: 'pt' }, timeoutMs: 10000 });
    assert.equal(resp.text(), 'hello ana');
    assert.equal(resp.headers.lang, 'pt');
    assert.match(resp.member, /\/c\d+\.1$/);
    assert.deepEqual(seen, [r.id]);
    // Many at once, pipelined.
    const all = await Promise.all(Array.from({ length: 200 }, (_, i) => r.request('js.users', String(i))));
    all.forEach((x, i) => assert.equal(x.text(), 'hello ' + i));
    // The handler's exception is an error response with code 18.
    await assert.rejects(r.request('js.users', 'fail'), (err) => err instanceof CourierError && err.code === Code.APPLICATION && /asked to fail/.test(err.message));
  } finally {
    h.close();
    r.close();
  }
});

test('request-response: chunked responses', async () => {
  const h = await connect(url);
  const r = await connect(url);
  try {
    await h.declare('js.stream', { pattern: 'reqresp' });
    await h.handle('js.stream', async (req) => {
      for (let i = 1; i <= 3; i++) req.chunk(`part ${i}`);
      return 'done';
    });
    const chunks = [];
    const last = await r.request('js.stream', 'go', { onChunk: (c) => chunks.push(c.text()) });
    assert.deepEqual(chunks, ['part 1', 'part 2', 'part 3']);
    assert.equal(last.text(), 'done');
    assert.ok(last.end);
  } finally {
    h.close();
    r.close();
  }
});

test('request-response: a Go handler over TCP answers a JS requester', async () => {
  const c = await connect(url);
  try {
    const resp = await c.request('go.echo', 'from js');
    assert.equal(resp.text(), 'go:from js');
  } finally {
    c.close();
  }
});

test('request-response: errors carry the protocol codes', async () => {
  const c = await connect(url);
  try {
    await assert.rejects(c.request('js.nowhere', 'x'), (err) => err.code === Code.NOT_FOUND);
    await c.declare('js.empty', { pattern: 'reqresp' });
    await assert.rejects(c.request('js.empty', 'x'), (err) => err.code === Code.NO_HANDLER);
    await assert.rejects(c.declare('js.empty', { pattern: 'pubsub' }), (err) => err.code === Code.CLASH);
    await assert.rejects(c.declare('bad name!', { pattern: 'pubsub' }), (err) => err.code === Code.BAD_OPTIONS);
  } finally {
    c.close();
  }
});

test('pub-sub: patterns, subscribe and unsubscribe', async () => {
  const s = await connect(url);
  const p = await connect(url);
  try {
    await p.declare('js.prices', { pattern: 'pubsub' });
    const got = [];
    const sub = await s.subscribe('js.prices', ['eu.*'], (m) => got.push(`${m.key}=${m.text()}`));
    assert.deepEqual(sub.patterns, ['eu.*']);
    await p.publish('js.prices', 'us.ny', 'no');
    await p.publish('js.prices', 'eu.fr.paris', 'no: two words');
    await p.publish('js.prices', 'eu.fr', '1', { confirm: true });
    await waitFor(() => got.length === 1, 'eu.fr');
    assert.deepEqual(got, ['eu.fr=1']);
    assert.deepEqual((await sub.subscribe('us.#')).sort(), ['eu.*', 'us.#']);
    await p.publish('js.prices', 'us.ny.nyc', '2', { confirm: true });
    await waitFor(() => got.length === 2, 'us.ny.nyc');
    assert.deepEqual(await sub.unsubscribe('eu.*'), ['us.#']);
    await p.publish('js.prices', 'eu.fr', 'no: unsubscribed', { confirm: true });
    await p.publish('js.prices', 'us.x', '3', { confirm: true });
    await waitFor(() => got.length === 3, 'us.x');
    assert.deepEqual(got, ['eu.fr=1', 'us.ny.nyc=2', 'us.x=3']);
    // Headers and binary bodies travel as they are.
    const bin = [];
    await s.subscribe('js.prices', ['bin'], (m) => bin.push(m));
    await p.publish('js.prices', 'bin', new Uint8Array([0, 1, 255]), { headers: { h: 'v' }, confirm: true });
    await waitFor(() => bin.length === 1, 'bin');
    assert.deepEqual([...bin[0].body], [0, 1, 255]);
    assert.equal(bin[0].headers.h, 'v');
  } finally {
    s.close();
    p.close();
  }
});

test('pub-sub: 5000 publishes pipelined, every one delivered', async () => {
  const s = await connect(url);
  const p = await connect(url);
  try {
    await p.declare('js.flood', { pattern: 'pubsub' });
    let n = 0;
    await s.subscribe('js.flood', ['#'], () => n++);
    const total = 5000;
    await Promise.all(Array.from({ length: total }, (_, i) => p.publish('js.flood', 'k', String(i))));
    await waitFor(() => n === total, `${total} messages`);
  } finally {
    s.close();
    p.close();
  }
});

test('close: operations after close fail, pending ones are rejected', async () => {
  const c = await connect(url);
  await c.declare('js.closing', { pattern: 'reqresp' });
  await c.handle('js.closing', () => new Promise(() => {})); // never answers
  const other = await connect(url);
  const pending = other.request('js.closing', 'x');
  other.close();
  await assert.rejects(pending, CourierError);
  await assert.rejects(other.request('js.closing', 'y'), CourierError);
  c.close();
});

test('credentials: in the options or the URL; a bad password is code 17', async () => {
  const authURL = process.env.COURIER_WS_AUTH_URL;
  await assert.rejects(connect(authURL, { reconnect: false }), (err) => err.code === Code.UNAUTHORIZED && /user name and password/.test(err.message));
  await assert.rejects(connect(authURL, { user: 'admin', password: 'wrong' }), (err) => err.code === Code.UNAUTHORIZED && /bad user name or password/.test(err.message));
  const a = await connect(authURL, { user: 'admin', password: 's3cret-pass' });
  a.close();
  const u = new URL(authURL);
  u.username = 'admin';
  u.password = 's3cret-pass';
  const b = await connect(u.toString());
  assert.ok(b.id);
  b.close();
});

test('pub-sub: a durable subscription keeps messages while away, acked on return', async () => {
  const p = await connect(url);
  try {
    await p.declare('js.audit', { pattern: 'pubsub' });
    const s1 = await connect(url);
    const first = [];
    await s1.subscribe('js.audit', ['#'], (m) => first.push(m.text()), { durable: 'log' });
    await p.publish('js.audit', 'a', '1', { confirm: true });
    await waitFor(() => first.length === 1, 'the first message');
    s1.close();
    await p.publish('js.audit', 'a', '2', { confirm: true });
    const s2 = await connect(url);
    const second = [];
    await s2.subscribe('js.audit', [], (m) => second.push(m.text()), { durable: 'log' });
    await waitFor(() => second.length === 1, 'the message kept while away');
    assert.deepEqual(second, ['2']);
    s2.close();
  } finally {
    p.close();
  }
});
