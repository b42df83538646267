// The JavaScript client and a list of servers, against two real nodes
// (TestJSFailover): COURIER_WS_URLS lists them, the first first, and a
// POST to COURIER_STOP_URL stops the first.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, Code, CourierError } from '../courier.js';

const urls = (process.env.COURIER_WS_URLS ?? '').split(',');
const stopURL = process.env.COURIER_STOP_URL;

async function waitFor(cond, what, ms = 30000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

test('a URL list: the first node goes away, the client goes on on the other', async () => {
  const [first, second] = urls;
  // Either form of the list: an array here, a string with commas below.
  const c = await connect(urls, { name: 'failover', reconnectWaitMs: 20 });
  const r = await connect(second, { name: 'checker' });
  try {
    assert.deepEqual(c.urls, urls);
    assert.equal(c.url, first, 'the first URL answers first');
    await c.declare('js.failover', { pattern: 'reqresp' });
    await c.handle('js.failover', (req) => `handled ${req.text()} on ${c.url}`);
    await c.declare('js.failover.news', { pattern: 'pubsub' });
    const got = [];
    const news = await c.subscribe('js.failover.news', ['a.*'], (m) => got.push(m.key));
    let lost = null, back = 0;
    c.ondisconnect = (err) => { lost = err; };
    c.onreconnect = () => { back++; };

    const res = await fetch(stopURL, { method: 'POST' });
    assert.ok(res.ok, `POST ${stopURL}: ${res.status}`);

    await waitFor(() => back === 1, 'the reconnection to the second node');
    assert.ok(lost instanceof CourierError, `lost with ${lost}`);
    assert.equal(c.url, second, 'reconnected to the node that is left');
    // Declared again and attached again there: the second node's own
    // clients reach them.
    assert.equal((await r.request('js.failover', 'x', { timeoutMs: 10000 })).text(), `handled x on ${second}`);
    assert.deepEqual(news.patterns, ['a.*']);
    await r.publish('js.failover.news', 'a.b', '1', { confirm: true });
    await waitFor(() => got.length === 1, 'a message after the reconnection');
  } finally {
    c.close();
    r.close();
  }

  // A list whose first node is down: connect goes on to the next.
  const d = await connect(urls.join(','), { name: 'second-choice', reconnect: false });
  try {
    assert.equal(d.url, second);
  } finally {
    d.close();
  }

  // A list none of which answers: one error that names each.
  await assert.rejects(connect([first, first.replace('/ws', '/nowhere')], { reconnect: false }), (err) =>
    err instanceof CourierError && /no server of 2 reachable/.test(err.message) && err.code !== Code.OK);
});

test('a URL list: one scheme, the user once', async () => {
  await assert.rejects(connect(['ws://127.0.0.1:1/ws', 'wss://127.0.0.1:2/ws']), /mixes ws:\/\/ and wss:\/\//);
  await assert.rejects(connect(['ws://a:b@127.0.0.1:1/ws', 'ws://c:d@127.0.0.1:2/ws']), /give the user once/);
  await assert.rejects(connect(''), /no server URL/);
});
