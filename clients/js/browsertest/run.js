// The JavaScript client's browser tests: the page's query gives the
// server's WebSocket URL (?ws=...); the result lands in window.__result
// ("PASS", or "FAIL: ..."), which the Go test (TestChromium) polls.
import { connect, Code, CourierError } from '../courier.js';

const url = new URLSearchParams(location.search).get('ws');
const log = (s) => { document.getElementById('log').textContent += s + '\n'; };
const eq = (a, b, what) => { if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`${what}: ${JSON.stringify(a)}, want ${JSON.stringify(b)}`); };
const waitFor = async (cond, what) => {
  const end = Date.now() + 20000;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
};

const tests = {
  async 'request-response both ways, chunks'() {
    const h = await connect(url, { name: 'browser-handler' });
    const r = await connect(url, { name: 'browser-requester' });
    await h.declare('web.users', { pattern: 'reqresp' });
    await h.handle('web.users', (req) => { req.chunk('a'); return 'hello ' + req.text(); });
    const chunks = [];
    eq((await r.request('web.users', 'browser', { onChunk: (c) => chunks.push(c.text()) })).text(), 'hello browser', 'response');
    eq(chunks, ['a'], 'chunks');
    eq((await r.request('go.echo', 'x')).text(), 'go:x', 'the Go handler');
    try { await r.request('web.none', 'x'); throw new Error('no error'); } catch (e) { if (!(e instanceof CourierError) || e.code !== Code.NOT_FOUND) throw e; }
    h.close(); r.close();
  },
  async 'pub-sub with patterns'() {
    const c = await connect(url);
    await c.declare('web.news', { pattern: 'pubsub' });
    const got = [];
    await c.subscribe('web.news', ['eu.#'], (m) => got.push(m.key + '=' + m.text()));
    await c.publish('web.news', 'us.ny', 'no', { confirm: true });
    await c.publish('web.news', 'eu.fr.paris', 'oui', { confirm: true });
    await waitFor(() => got.length === 1, 'a message');
    eq(got, ['eu.fr.paris=oui'], 'messages');
    c.close();
  },
  async 'tasks'() {
    const c = await connect(url);
    await c.declare('web.jobs', { pattern: 'tasks', transient: true });
    await c.work('web.jobs', (t) => t.progress(100, 'done ' + t.text()));
    const events = [];
    await c.submit('web.jobs', 'x', { onEvent: (ev) => events.push(ev.kind) });
    await waitFor(() => events.includes('completed'), 'completion');
    eq(events, ['progress', 'completed'], 'events');
    c.close();
  },
};

(async () => {
  try {
    for (const [name, fn] of Object.entries(tests)) {
      await fn();
      log('ok ' + name);
    }
    window.__result = 'PASS';
  } catch (err) {
    log('FAIL ' + err.message);
    window.__result = 'FAIL: ' + err.message;
  }
})();
