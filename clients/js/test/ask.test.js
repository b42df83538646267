// Ask and answer (docs/protocol.md §6.6) from the JavaScript client:
// handlers that ask their requester questions mid-request, against a
// real server (COURIER_WS_URL, with a Go handler go.ask that asks).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, Code, CourierError } from '../courier.js';

const url = process.env.COURIER_WS_URL;

test('ask: a handler asks, the requester answers, the response uses it', async () => {
  const h = await connect(url);
  const r = await connect(url);
  try {
    await h.declare('js.ask', { pattern: 'reqresp' });
    const att = await h.handle('js.ask', async (req) => {
      const first = await req.ask(`which ${req.text()}?`);
      const second = await req.ask(JSON.stringify({ again: first.text() }));
      return `${first.text()} then ${second.json().n}`;
    });
    const seen = [];
    const resp = await r.request('js.ask', 'colour', {
      onAsk: (q) => {
        seen.push({ text: q.text(), member: q.member });
        return seen.length === 1 ? 'blue' : JSON.stringify({ n: 2 });
      },
    });
    assert.equal(resp.text(), 'blue then 2');
    assert.equal(seen[0].text, 'which colour?');
    assert.deepEqual(JSON.parse(seen[1].text), { again: 'blue' });
    assert.equal(seen[0].member, att.member);
  } finally {
    h.close();
    r.close();
  }
});

test('ask: a requester without onAsk, or one that throws, gives an error answer (code 18)', async () => {
  const h = await connect(url);
  const r = await connect(url);
  try {
    await h.declare('js.ask.err', { pattern: 'reqresp' });
    await h.handle('js.ask.err', async (req) => {
      try {
        await req.ask('anyone?');
        return 'answered';
      } catch (err) {
        assert.ok(err instanceof CourierError);
        return `${err.code}: ${err.message}`;
      }
    });
    const none = await r.request('js.ask.err', 'x');
    assert.equal(none.text(), `${Code.APPLICATION}: the requester takes no questions`);
    const thrown = await r.request('js.ask.err', 'x', { onAsk: async () => { throw new Error('not telling'); } });
    assert.equal(thrown.text(), `${Code.APPLICATION}: not telling`);
  } finally {
    h.close();
    r.close();
  }
});

test('ask: a Go handler over TCP asks a JS requester', async () => {
  const c = await connect(url);
  try {
    const resp = await c.request('go.ask', 'name', { onAsk: (q) => `js answers "${q.text()}"` });
    assert.equal(resp.text(), 'go got: js answers "go asks: name"');
  } finally {
    c.close();
  }
});

test('ask: answered, cancelled or timed out, an ask rejects', async () => {
  const h = await connect(url);
  const r = await connect(url);
  try {
    await h.declare('js.ask.end', { pattern: 'reqresp' });
    const outcomes = [];
    let later = null;
    let cancelled = null;
    await h.handle('js.ask.end', async (req) => {
      switch (req.text()) {
        case 'timeout':
          // The requester never answers: the ask times out.
          await req.ask('slow?', { timeoutMs: 200 }).catch((err) => outcomes.push(['timeout', err.code]));
          return 'done';
        case 'cancel':
          // The requester aborts its request while the ask waits.
          cancelled = req.ask('still there?').catch((err) => err.code);
          return new Promise(() => {}); // never responds
        default:
          later = req;
          return 'answered';
      }
    });
    await r.request('js.ask.end', 'timeout', { onAsk: () => new Promise(() => {}) });
    assert.deepEqual(outcomes, [['timeout', Code.TIMEOUT]]);

    await r.request('js.ask.end', 'plain');
    await assert.rejects(later.ask('too late?'), (err) => err.code === Code.CANCELLED);

    const ac = new AbortController();
    let asked;
    const asking = new Promise((resolve) => { asked = resolve; });
    const req = r.request('js.ask.end', 'cancel', { signal: ac.signal, onAsk: () => { asked(); return new Promise(() => {}); } });
    await asking;
    ac.abort();
    await assert.rejects(req, (err) => err.code === Code.CANCELLED);
    assert.equal(await cancelled, Code.CANCELLED);
  } finally {
    h.close();
    r.close();
  }
});
