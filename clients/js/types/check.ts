// A type check of index.d.ts: every exported function, class and type,
// used as docs/js.md shows them. It is compiled, never run:
//
//	tsc --noEmit --strict -p clients/js/types
//
// (TestTypes in clients/js runs it when tsc is installed.)

import {
  connect, encodeFrame, decodeFrame, decodeMessage,
  Type, Flag, Code, CourierError, MalformedError,
  Connection, Attachment, Request, Response, Message, Task, Question, Answer,
} from '../index.js';
import type {
  Body, Headers, Uint64, Frame, ConnectOptions, Welcome, ExchangeConfig, Member, ExchangeInfo,
  AttachmentEvent, TaskEvent, AttachOptions, RequestOptions, AskOptions, Reply, SubRequest,
  Decision, SubmitOptions,
} from '../index.js';

declare function resize(job: unknown): Promise<void>;
declare const banned: Set<string>;
declare const url: string;

export async function connecting(): Promise<void> {
  const opts: ConnectOptions = {
    name: 'my-page',
    user: 'alice', password: 's3cret',
    heartbeatMs: 1000, timeoutMs: 10000,
    reconnect: true, reconnectWaitMs: 100, reconnectWaitMaxMs: 5000, maxReconnects: 10,
    WebSocket,
  };
  const conn: Connection = await connect('ws://127.0.0.1:7480/ws', opts);
  const id: string = conn.id;
  const u: string = conn.url;
  const w: Welcome | null = conn.welcome;
  if (w) {
    const n: number = w.heartbeat_ms + w.timeout_ms + w.max_frame + w.credit + w.version;
    const s: string = w.server + w.node + w.conn;
    const urls: string[] | undefined = w.connect_urls;
    console.log(n, s, urls);
  }
  console.log(id, u);
  conn.close();
  conn.close('done');

  // A list of URLs: the first that answers, and any of them on a reconnection.
  const any = await connect(['ws://10.0.0.1:7480/ws', 'ws://10.0.0.2:7480/ws'], { reconnect: true });
  const urls: readonly string[] = any.urls;
  const now: string = any.url;
  await connect('ws://10.0.0.1:7480/ws,ws://10.0.0.2:7480/ws');
  console.log(urls, now);

  try {
    await connect('ws://alice:wrong@127.0.0.1:7480/ws');
  } catch (err) {
    if (err instanceof CourierError && err.code === Code.UNAUTHORIZED) {
      const member: string | undefined = err.member;
      console.log(err.message, member);
    }
  }
}

export async function requestResponse(conn: Connection): Promise<void> {
  const info: ExchangeInfo = await conn.declare('users', { pattern: 'reqresp', strategy: 'round-robin' });
  const members: Member[] = info.members;
  console.log(info.name, info.pattern, info.leader, members.map((m) => [m.id, m.role, m.service_tag, m.conn_tag, m.node]));
  await conn.declare('users', {}, { passive: true });
  const h: Attachment = await conn.handle('users', (req: Request) => {
    const { id } = req.json();
    if (!id) throw new Error('no id');
    return { body: JSON.stringify({ id, name: 'Ana' }), headers: { 'content-type': 'application/json' } };
  });
  console.log(h.id, h.exchange, h.role, h.member, h.conn === conn);

  const resp: Response = await conn.request('users', JSON.stringify({ id: 42 }), { timeoutMs: 2000 });
  console.log(resp.json().name, 'from', resp.member, resp.headers['content-type'], resp.chunk, resp.end, resp.body.length);

  await conn.handle('reports', async (req) => {
    for (const line of ['a', 'b', 'c']) req.chunk(line);
    req.chunk(new Uint8Array([1, 2]), { part: 'bytes' });
    return 'done';
  });
  const last = await conn.request('reports', 'q3', { onChunk: (c) => console.log(c.text()) });
  console.log(last.text());

  const ac = new AbortController();
  const ropts: RequestOptions = { key: 'user-42', tag: 'eu', headers: { a: 'b' }, timeoutMs: 500, signal: ac.signal };
  const all = await conn.requestAll('users', new Uint8Array(4), ropts);
  for (const r of all) {
    if (r instanceof Response) console.log(r.text());
    else console.log(r.error.code, r.member);
  }

  // A handler sees its request's details and its cancellation.
  await conn.handle('slow', (req) => {
    const when: number = req.deadline;
    console.log(req.key, req.tag, req.requester, req.headers, req.body, req.text(), req.cancelled, when);
    req.oncancel = () => console.log('cancelled');
    return undefined;
  }, { tag: 'eu', connTag: 'web', options: { region: 'eu' }, onEvent: (ev) => console.log(ev.kind) });

  const replies: Reply[] = ['text', new Uint8Array(1), new ArrayBuffer(2), { body: 'x' }, undefined];
  console.log(replies);
}

export async function askAndAnswer(conn: Connection, window: { confirm(q: string): boolean }): Promise<void> {
  await conn.handle('orders', async (req) => {
    const aopts: AskOptions = { timeoutMs: 30000, signal: new AbortController().signal };
    const answer: Answer = await req.ask('confirm 3 items at 42 EUR?', aopts);
    if (answer.text() !== 'yes') throw new Error('not confirmed');
    console.log(answer.body, answer.json());
    return 'ordered';
  });
  const resp = await conn.request('orders', 'basket-17', {
    onAsk: (q: Question) => (window.confirm(q.text()) ? 'yes' : 'no'),
  });
  await conn.request('orders', 'basket-18', {
    onAsk: async (q) => ({ body: `${q.member}: ${JSON.stringify(q.json())} ${q.body.length}` }),
  });
  console.log(resp.text());
}

export async function pubSub(conn: Connection): Promise<void> {
  await conn.declare('prices', { pattern: 'pubsub' });
  const sub = await conn.subscribe('prices', ['eu.*'], (m: Message) => console.log(m.key, m.text(), m.headers, m.body, m.json()));
  const now: string[] = await sub.subscribe('us.#');
  await conn.publish('prices', 'eu.fr', '101.5');
  await conn.publish('prices', 'us.ny.nyc', '99', { confirm: true, headers: { src: 'feed' } });
  await sub.unsubscribe('eu.*');
  const patterns: string[] = sub.patterns;
  console.log(now, patterns);
  await conn.subscribe('audit', '#', (m) => console.log(m.key), { durable: 'audit', prefetch: 10 });
  await sub.detach();

  await conn.declare('rooms', { pattern: 'pubsub', controlled: true });
  const ctl = await conn.control('rooms', (s: SubRequest): Decision => {
    const token: Uint64 = s.token;
    console.log(token);
    if (s.member.conn_tag && banned.has(s.member.conn_tag)) return 'banned';
    if (s.patterns.includes('#')) return { patterns: ['lobby'] };
    return true;
  });
  await ctl.subscribeFor('n1/c9.1', 'room.42');
  await ctl.unsubscribeFor('n1/c9.1', ['room.42']);
}

export async function events(conn: Connection): Promise<void> {
  await conn.declare('scheduler', { pattern: 'reqresp', strategy: 'leader' });
  const me = await conn.handle('scheduler', () => 'ok', {
    onEvent: (ev: AttachmentEvent) => {
      if (ev.kind === 'leader') console.log('leader is', ev.leader, ev.leader === me.member ? '(me)' : '');
      if (ev.kind === 'member-up' || ev.kind === 'member-down') console.log(ev.kind, ev.member.id);
      if (ev.kind === 'subscriptions') console.log(ev.patterns.join(' '));
      if (ev.kind === 'detached') console.log(ev.reason);
    },
  });
  me.onevent = (ev) => console.log(ev.exchange, ev.kind);
}

export async function tasks(conn: Connection): Promise<void> {
  const cfg: ExchangeConfig = {
    pattern: 'tasks', max_attempts: 5, ttl_ms: 60000, backoff_ms: 100, backoff_max_ms: 10000,
    dead_letter: 'thumbnails.dead', max_length: 1000, max_bytes: 1 << 20, overflow: 'reject-publish',
  };
  await conn.declare('thumbnails', cfg);
  const sopts: SubmitOptions = {
    key: 'user-42', priority: 5, headers: { a: 'b' }, due: new Date(Date.now() + 1000), ttlMs: 5000,
    onEvent: (ev: TaskEvent) => console.log(ev.kind, ev.percent ?? '', ev.last ? '(end)' : '', ev.id, ev.worker),
  };
  const id: number = await conn.submit('thumbnails', JSON.stringify({ url }), sopts);
  await conn.submit('thumbnails', 'x', { confirm: true, due: Date.now() });
  await conn.watch('thumbnails', id, (ev) => console.log(ev.kind, ev.reason, ev.attempts));
  await conn.work('thumbnails', async (task: Task) => {
    task.progress(50, 'resized');
    await resize(task.json());
    const tid: Uint64 = task.id;
    console.log(tid, task.attempts, task.key, task.headers, task.body, task.text(), task.settled);
  }, { prefetch: 10 });
  await conn.work('thumbnails', (task) => {
    if (task.attempts > 3) task.nack({ requeue: false, reason: 'gave up' });
    else task.ack();
  });
  const list: ExchangeInfo[] = await conn.list();
  console.log(list.length);
  await conn.deleteExchange('thumbnails');
}

export function lifecycle(conn: Connection): void {
  conn.ondisconnect = (err) => console.warn('lost:', err.message, err.code);
  conn.onreconnect = () => console.info('back as', conn.id);
  conn.onerror = (err: CourierError) => console.error(err.code);
  conn.onClose((err) => console.info('closed:', err.message));
}

export function codec(): void {
  const f: Frame = { type: Type.PUBLISH, flags: Flag.CHUNK | Flag.END, ref: 1, attach: 2, aux: 2n ** 60n, name: 'x', key: 'k', tag: 't', headers: { a: 'b' }, body: 'hi' };
  const p: Uint8Array = encodeFrame(f);
  const g = decodeFrame(p.subarray(4));
  const body: Uint8Array = g.body;
  const h = decodeMessage(p, 1 << 20);
  const hdrs: Headers = h.headers;
  const b: Body = g.body;
  console.log(body, hdrs, b, g.type === Type.PUBLISH, g.name);
  try {
    decodeMessage(new Uint8Array(3));
  } catch (err) {
    if (err instanceof MalformedError) console.log(err.message);
  }
  const codes: number[] = [Code.OK, Code.NOT_FOUND, Code.NO_HANDLER, Code.CANCELLED, Code.TIMEOUT, Code.APPLICATION, Code.UNAVAILABLE];
  console.log(codes);
}

export type Options = AttachOptions;
