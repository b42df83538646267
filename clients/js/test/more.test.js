// Tasks, leaders and member events, and inverted pub-sub from the
// JavaScript client, against a real server (COURIER_WS_URL).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, Code, CourierError } from '../courier.js';

const url = process.env.COURIER_WS_URL;

async function waitFor(cond, what, ms = 20000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

test('tasks: submit with confirm, watch progress, work with prefetch and ack', async () => {
  const p = await connect(url);
  const w = await connect(url);
  try {
    await p.declare('js.jobs', { pattern: 'tasks', transient: true });
    const id = await p.submit('js.jobs', 'first', { confirm: true, key: 'k1' });
    assert.ok(id > 0);
    let held = 0, most = 0;
    const done = [];
    await w.work('js.jobs', async (task) => {
      held++; most = Math.max(most, held);
      task.progress(50, 'half way');
      await new Promise((r) => setImmediate(r));
      done.push(task.text());
      held--;
    }, { prefetch: 2 });
    const events = [];
    const watched = await p.submit('js.jobs', 'watched', { onEvent: (ev) => events.push(ev) });
    assert.ok(watched > id);
    await waitFor(() => events.some((e) => e.last), 'the watched task to complete');
    assert.deepEqual(events.map((e) => e.kind), ['progress', 'completed']);
    assert.equal(events[0].percent, 50);
    assert.equal(events[0].text, 'half way');
    assert.equal(events[1].id, watched);
    for (let i = 0; i < 20; i++) await p.submit('js.jobs', `t${i}`);
    await waitFor(() => done.length === 22, '22 tasks done');
    assert.ok(most <= 2, `held ${most} tasks at once with prefetch 2`);
  } finally {
    p.close();
    w.close();
  }
});

test('tasks: a failing worker nacks, the task is retried', async () => {
  const c = await connect(url);
  try {
    await c.declare('js.retry', { pattern: 'tasks', transient: true, backoff_ms: 1 });
    const attempts = [];
    await c.work('js.retry', (task) => {
      attempts.push(task.attempts);
      if (task.attempts < 2) throw new Error('not yet');
    });
    const events = [];
    await c.submit('js.retry', 'x', { onEvent: (ev) => events.push(ev.kind) });
    await waitFor(() => events.includes('completed'), 'completion');
    assert.deepEqual(attempts, [0, 1, 2]);
    assert.deepEqual(events, ['retry', 'retry', 'completed']);
  } finally {
    c.close();
  }
});

test('leaders and member events', async () => {
  const a = await connect(url);
  const b = await connect(url);
  try {
    await a.declare('js.sched', { pattern: 'reqresp', strategy: 'leader' });
    const evA = [];
    const first = await a.handle('js.sched', () => 'a', { onEvent: (e) => evA.push(e) });
    await waitFor(() => evA.some((e) => e.kind === 'leader' && e.leader === first.member), 'first to lead');
    const evB = [];
    const second = await b.handle('js.sched', () => 'b', { onEvent: (e) => evB.push(e) });
    await waitFor(() => evA.some((e) => e.kind === 'member-up' && e.member.id === second.member), 'member-up');
    await waitFor(() => evB.some((e) => e.kind === 'leader' && e.leader === first.member), 'second told who leads');
    assert.equal((await b.request('js.sched', 'x')).text(), 'a');
    await first.detach();
    await waitFor(() => evB.some((e) => e.kind === 'leader' && e.leader === second.member), 'second to lead');
    assert.equal((await b.request('js.sched', 'x')).text(), 'b');
  } finally {
    a.close();
    b.close();
  }
});

test('inverted pub-sub: the controller accepts, narrows and refuses', async () => {
  const ctl = await connect(url);
  const s = await connect(url, { name: 'viewer' });
  try {
    await ctl.declare('js.rooms', { pattern: 'pubsub', controlled: true });
    const asked = [];
    const c = await ctl.control('js.rooms', (sub) => {
      asked.push(sub.patterns);
      if (sub.patterns.includes('secret')) return 'no secrets';
      if (sub.patterns.includes('all.#')) return { patterns: ['all.public'] };
      return true;
    });
    const got = [];
    const sub = await s.subscribe('js.rooms', ['lobby'], (m) => got.push(m.key));
    assert.deepEqual(sub.patterns, ['lobby']);
    assert.deepEqual((await sub.subscribe('all.#')).sort(), ['all.public', 'lobby']);
    await assert.rejects(sub.subscribe('secret'), (err) => err.code === Code.REJECTED && /no secrets/.test(err.message));
    assert.deepEqual((await c.subscribeFor(sub.member, 'extra')).sort(), ['all.public', 'extra', 'lobby']);
    await waitFor(() => sub.patterns.includes('extra'), 'the subscriptions event');
    await ctl.publish('js.rooms', 'extra', 'x', { confirm: true });
    await ctl.publish('js.rooms', 'all.private', 'x', { confirm: true });
    await ctl.publish('js.rooms', 'lobby', 'x', { confirm: true });
    await waitFor(() => got.length === 2, 'two messages');
    assert.deepEqual(got, ['extra', 'lobby']);
    assert.equal(asked.length, 3);
  } finally {
    ctl.close();
    s.close();
  }
});

test('reconnect: a handler cut by the server comes back attached', async () => {
  const h = await connect(url, { name: 'comeback', reconnectWaitMs: 20 });
  const r = await connect(url);
  try {
    await h.declare('js.comeback', { pattern: 'reqresp' });
    const sub = await h.subscribe('js.comeback.news', [], () => {}).catch(() => null);
    assert.equal(sub, null, 'no such exchange yet');
    await h.declare('js.comeback.news', { pattern: 'pubsub' });
    const got = [];
    const news = await h.subscribe('js.comeback.news', ['a.*'], (m) => got.push(m.key));
    await news.subscribe('b.#');
    await h.handle('js.comeback', (req) => 'still ' + req.text());
    assert.equal((await r.request('js.comeback', 'here')).text(), 'still here');
    let lost = null, back = 0;
    h.ondisconnect = (err) => { lost = err; };
    h.onreconnect = () => { back++; };
    const old = h.id;
    // The operator closes the connection (DELETE /api/connections/{id}).
    const api = new URL(url);
    api.protocol = 'http:';
    api.pathname = `/api/connections/${old}`;
    const res = await fetch(api, { method: 'DELETE' });
    assert.ok(res.ok, `DELETE ${api}: ${res.status}`);
    await waitFor(() => back === 1, 'the reconnection');
    assert.ok(lost instanceof CourierError);
    assert.notEqual(h.id, old);
    assert.equal((await r.request('js.comeback', 'back')).text(), 'still back');
    assert.deepEqual([...news.patterns].sort(), ['a.*', 'b.#']);
    await r.publish('js.comeback.news', 'b.x.y', '1', { confirm: true });
    await waitFor(() => got.length === 1, 'a message after the reconnection');
  } finally {
    h.close();
    r.close();
  }
});
