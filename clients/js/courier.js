// Courier's JavaScript client: the wire protocol (docs/protocol.md) over
// WebSocket, one frame per binary message, for browsers and Node.js.
// No build step and no dependencies: import it as an ES module.
//
//   import { connect } from './courier.js';
//   const conn = await connect('ws://127.0.0.1:7480/ws');
//   const reply = await conn.request('users', 'ping');
//
// docs/js.md is its guide.

import { Type, Flag, Code, encodeFrame, decodeMessage, toBytes } from './wire.js';

export { Type, Flag, Code, encodeFrame, decodeFrame, decodeMessage, MalformedError } from './wire.js';

const VERSION = 1;
const HANDSHAKE_MAX_FRAME = 64 << 10;
const FRAME_SLACK = 64 << 10;
const ROLE = Object.freeze({ handler: 1, subscriber: 2, controller: 3, worker: 4 });
const EVENT_KINDS = Object.freeze({ 1: 'leader', 2: 'member-up', 3: 'member-down', 4: 'subscriptions', 5: 'detached' });
// Codes after which reconnecting is no use.
const RECONNECT_NEVER = new Set([Code.UNAUTHORIZED, Code.VERSION, Code.PROTOCOL, Code.FRAME_TOO_LARGE]);
const TASK_EVENTS = Object.freeze({ 1: 'progress', 2: 'retry', 3: 'completed', 4: 'failed', 5: 'lost' });
const textDecoder = new TextDecoder();

/** CourierError is an error the server (or the connection) reported, with its code (docs/protocol.md §11). */
export class CourierError extends Error {
  constructor(code, message, member) {
    super(message || `error code ${code}`);
    this.name = 'CourierError';
    this.code = code;
    if (member) this.member = member;
  }
}

/**
 * connect opens a connection to a Courier server's WebSocket endpoint,
 * `ws://host:7480/ws` (`wss://` with TLS), runs the handshake and
 * resolves to a Connection.
 *
 * url may list several servers (the nodes of a cluster), as an array
 * or as full URLs separated by commas: connect tries them in order and
 * the Connection reconnects to any of them (see Connection._retry).
 * Credentials in the first URL hold for all.
 *
 * Options: user, password (or in the URL: ws://user:pass@host/ws),
 * name, heartbeatMs, WebSocket (an implementation for runtimes without a
 * global one), timeoutMs (the handshake's, default 10 s).
 */
export async function connect(url, opts = {}) {
  const { urls, user, password } = parseURLs(url);
  const creds = { user: opts.user ?? user, password: opts.password ?? password };
  const WS = opts.WebSocket ?? globalThis.WebSocket;
  if (!WS) throw new Error('no WebSocket implementation: use Node.js 22+, node --experimental-websocket on 20, or pass opts.WebSocket');
  const conn = new Connection(urls, WS, { ...opts, ...creds });
  await conn._first();
  return conn;
}

// parseURLs parses connect's url: one URL, an array of them, or URLs
// separated by commas, all ws:// or all wss://. It returns them without
// credentials (and with the path /ws when they have none), and the
// credentials of the first, which hold for all.
function parseURLs(url) {
  const raw = (Array.isArray(url) ? url : String(url).split(',')).map((s) => String(s).trim()).filter((s) => s !== '');
  if (raw.length === 0) throw new TypeError('no server URL given');
  const urls = [];
  let user, password, scheme;
  raw.forEach((r, i) => {
    const u = new URL(r);
    if (u.protocol !== 'ws:' && u.protocol !== 'wss:') throw new TypeError(`want a ws:// or wss:// URL, got ${u.protocol}`);
    if (i === 0) {
      scheme = u.protocol;
      if (u.username) user = decodeURIComponent(u.username);
      if (u.password) password = decodeURIComponent(u.password);
    } else {
      if (u.protocol !== scheme) throw new TypeError(`a URL list mixes ${scheme}// and ${u.protocol}//`);
      if (u.username && decodeURIComponent(u.username) !== user) throw new TypeError('a URL list: give the user once, in the first URL');
    }
    u.username = ''; u.password = '';
    if (u.pathname === '' || u.pathname === '/') u.pathname = '/ws';
    const s = u.toString();
    if (!urls.includes(s)) urls.push(s);
  });
  return { urls, user, password };
}

/**
 * Connection is one connection to a server. Operations may be issued
 * at once and in any number: frames are pipelined, and PUBLISH, REQUEST
 * and SUBMIT wait for credit when the server's window is used up.
 */
export class Connection {
  constructor(urls, WS, opts) {
    this.urls = Object.freeze([...urls]);
    this.url = this.urls[0];
    this._WS = WS;
    this._opts = opts;
    this._ref = 0;
    this._attach = 0;
    this._ops = new Map(); // ref → {resolve, reject}
    this._requests = new Map(); // request id → request state
    this._attachments = new Map(); // attach id → Attachment
    this._watches = new Map(); // SUBMIT's or WATCH's ref → fn(event)
    this._exchanges = new Map(); // declared: name → {config, passive}, declared again on reconnection
    this._reconnect = opts.reconnect !== false;
    this._down = false; // lost, reconnecting
    this._userClosed = false;
    this.ondisconnect = null;
    this.onreconnect = null;
    this.onerror = null;
    this._credit = 0;
    this._creditWaiters = [];
    this._closed = false;
    this._closeHandlers = [];
    this.welcome = null;
  }

  // _first opens the first connection: to the servers of the list in
  // order, until one lets it in. A refusal of the credentials ends the
  // tries (the servers of a cluster share their users).
  async _first() {
    const tried = [];
    let last;
    for (const url of this.urls) {
      try {
        await this._open(url);
        return;
      } catch (err) {
        if (this.urls.length === 1 || err.code === Code.UNAUTHORIZED) throw err;
        tried.push(`${url}: ${err.message}`);
        last = err;
      }
    }
    throw new CourierError(last?.code || Code.UNAVAILABLE, `no server of ${this.urls.length} reachable: ${tried.join('; ')}`);
  }

  // _open opens a WebSocket to url and runs the handshake; it resolves
  // to the WELCOME, and this.url is url from then on. Events of an older
  // WebSocket are ignored.
  _open(url) {
    return new Promise((resolve, reject) => {
      let settled = false, welcomed = false;
      let ws;
      const fail = (err) => {
        clearTimeout(timer);
        if (!settled) { settled = true; reject(err); }
        try { ws?.close(); } catch { /* not open */ }
      };
      const ms = this._opts.timeoutMs ?? 10000;
      const timer = setTimeout(() => fail(new CourierError(Code.TIMEOUT, `no WELCOME within ${ms} ms`)), ms);
      try {
        ws = new this._WS(url, ['courier.v1']);
      } catch (err) {
        fail(err);
        return;
      }
      this._ws = ws;
      this._lastError = null;
      this.welcome = null;
      ws.binaryType = 'arraybuffer';
      this._maxFrame = HANDSHAKE_MAX_FRAME + FRAME_SLACK;
      this._onWelcome = (w) => { clearTimeout(timer); settled = welcomed = true; this.url = url; resolve(w); };
      this._onHandshakeError = fail;
      ws.onopen = () => {
        if (ws !== this._ws) return;
        const hello = { versions: [VERSION], name: this._opts.name || undefined };
        if (this._opts.heartbeatMs) hello.heartbeat_ms = this._opts.heartbeatMs;
        if (this._opts.user !== undefined) { hello.user = this._opts.user; hello.password = this._opts.password ?? ''; }
        ws.send(encodeFrame({ type: Type.HELLO, body: JSON.stringify(hello) }));
      };
      ws.onmessage = (ev) => { if (ws === this._ws) this._onMessage(ev.data); };
      ws.onerror = () => { if (!settled) fail(new CourierError(Code.PROTOCOL, `WebSocket to ${url} failed`)); };
      ws.onclose = (ev) => {
        if (ws !== this._ws) return;
        const err = this._lastError ?? new CourierError(Code.OK, `connection closed (WebSocket ${ev.code}${ev.reason ? ': ' + ev.reason : ''})`);
        if (!welcomed) { fail(err); return; }
        this._lost(err);
      };
    });
  }

  // _lost handles the end of a connection that had logged in: the end
  // of the Connection, or a reconnection.
  _lost(err) {
    if (this._closed || this._down) return;
    clearInterval(this._hbTimer);
    if (this._userClosed || !this._reconnect || RECONNECT_NEVER.has(err.code)) {
      this._end(err);
      return;
    }
    this._down = true;
    this._lostURL = this.url;
    this._fail(err);
    if (this.ondisconnect) this.ondisconnect(err);
    this._retry(0);
  }

  // _retry dials again after a jittered, growing wait, and puts back
  // the exchanges and attachments (docs/protocol.md §4.8). Each round
  // tries every server of the list, in a random order, the one just lost
  // last in the first round, as the Go client does; n counts the rounds.
  _retry(n) {
    const max = this._opts.reconnectWaitMaxMs ?? 5000;
    const base = Math.min(max, (this._opts.reconnectWaitMs ?? 100) * 2 ** Math.min(n, 16));
    const wait = base / 2 + Math.random() * base / 2;
    this._retryTimer = setTimeout(async () => {
      if (this._userClosed) return;
      let last = null;
      for (const url of this._order(n)) {
        try {
          await this._open(url);
          last = null;
          break;
        } catch (err) {
          if (this._userClosed) return;
          if (err.code === Code.UNAUTHORIZED) { this._down = false; this._end(err); return; }
          last = err;
        }
      }
      if (this._userClosed) return;
      if (last) {
        const limit = this._opts.maxReconnects ?? Infinity;
        if (n + 1 >= limit) { this._down = false; this._end(last); return; }
        this._retry(n + 1);
        return;
      }
      this._down = false;
      await this._restore();
      if (this.onreconnect) this.onreconnect();
    }, wait);
  }

  // _order returns the servers to try in round n: in a random order, the
  // one the connection was lost to last in the first round.
  _order(n) {
    const urls = [...this.urls];
    for (let i = urls.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [urls[i], urls[j]] = [urls[j], urls[i]];
    }
    if (n === 0 && urls.length > 1) {
      const i = urls.indexOf(this._lostURL);
      if (i >= 0) urls.push(...urls.splice(i, 1));
    }
    return urls;
  }

  // _restore declares the exchanges again and attaches every attachment
  // again with its id and what it has now (patterns, prefetch).
  async _restore() {
    for (const [name, d] of this._exchanges) {
      try {
        await this._op({ type: Type.DECLARE, name, aux: d.passive ? 1 : 0, body: d.config ? JSON.stringify(d.config) : undefined });
      } catch (err) {
        this._emitError(err);
      }
    }
    for (const a of [...this._attachments.values()]) {
      try {
        await this._attachOp(a);
      } catch (err) {
        this._attachments.delete(a.id);
        if (a.onevent) a.onevent({ kind: 'detached', exchange: a.exchange, reason: `not attached again after a reconnection: ${err.message}` });
        this._emitError(err);
      }
    }
  }

  _send(f) {
    if (this._closed) throw this._lastError ?? new CourierError(Code.OK, 'connection closed');
    if (this._down) throw new CourierError(Code.UNAVAILABLE, 'disconnected: reconnecting');
    this._ws.send(encodeFrame(f));
    this._lastSent = Date.now();
  }

  _onMessage(data) {
    if (typeof data === 'string') return this._protocolError('a text message from the server');
    this._lastHeard = Date.now();
    let f;
    try {
      f = decodeMessage(new Uint8Array(data), this._maxFrame);
    } catch (err) {
      return this._protocolError(err.message);
    }
    try {
      this._dispatch(f);
    } catch (err) {
      // A bug of a callback must not end the connection's reading.
      queueMicrotask(() => { throw err; });
    }
  }

  _protocolError(msg) {
    this._lastError = new CourierError(Code.PROTOCOL, msg);
    try { this._ws.send(encodeFrame({ type: Type.CLOSE, aux: Code.PROTOCOL, tag: msg })); } catch { /* closing */ }
    this._ws.close(1002, 'protocol error');
  }

  _dispatch(f) {
    switch (f.type) {
      case Type.WELCOME: return this._welcome(f);
      case Type.PING: return this._send({ type: Type.PONG, ref: f.ref, flags: f.flags });
      case Type.PONG: return;
      case Type.CREDIT: return this._addCredit(Number(f.aux));
      case Type.OK: return this._settle(f.ref, null, f);
      case Type.ERROR:
        if (f.flags & Flag.FATAL) {
          this._lastError = new CourierError(Number(f.aux), f.tag);
          if (this._onHandshakeError && !this.welcome) this._onHandshakeError(this._lastError);
          return;
        }
        if (f.ref === 0) return this._emitError(new CourierError(Number(f.aux), f.tag));
        return this._settle(f.ref, new CourierError(Number(f.aux), f.tag), f);
      case Type.CLOSE:
        this._lastError = new CourierError(Number(f.aux), f.tag || 'the server closed the connection');
        return;
      case Type.RESPONSE: return this._response(f);
      case Type.ASK: return this._ask(f);
      case Type.TASKEVENT: return this._taskEvent(f);
      case Type.REQUEST: case Type.CANCEL: case Type.MESSAGE: case Type.EVENT: case Type.ANSWER:
      case Type.TASK: case Type.SUBREQUEST: {
        const a = this._attachments.get(Number(f.attach));
        if (a) a._frame(f);
        return;
      }
      default:
        return; // frames of later features are ignored, as the protocol asks
    }
  }

  _welcome(f) {
    const w = JSON.parse(textDecoder.decode(f.body));
    this.welcome = w;
    this.id = w.conn;
    this._credit = 0;
    this._addCredit(w.credit);
    this._maxFrame = w.max_frame + FRAME_SLACK;
    this._heartbeat(w.heartbeat_ms, w.timeout_ms);
    this._onWelcome(w);
  }

  // _heartbeat PINGs a quiet server and ends a connection that heard
  // nothing for the timeout (§4.2).
  _heartbeat(interval, timeout) {
    this._lastHeard = this._lastSent = Date.now();
    let nonce = 0;
    const tick = Math.max(5, Math.floor(interval / 2));
    this._hbTimer = setInterval(() => {
      const now = Date.now();
      if (now - this._lastHeard >= timeout) {
        const err = new CourierError(Code.HEARTBEAT, `nothing from the server for ${timeout} ms`);
        const ws = this._ws;
        this._lost(err);
        ws.close(4000, 'heartbeat timeout');
        return;
      }
      if (now - this._lastSent >= interval) this._send({ type: Type.PING, ref: ++nonce });
    }, tick);
    if (this._hbTimer.unref) this._hbTimer.unref();
  }

  _emitError(err) {
    if (this.onerror) this.onerror(err);
  }

  _nextRef() { return ++this._ref; }

  _op(f) {
    f.ref = this._nextRef();
    return new Promise((resolve, reject) => {
      this._ops.set(f.ref, { resolve, reject });
      try { this._send(f); } catch (err) { this._ops.delete(f.ref); reject(err); }
    });
  }

  _settle(ref, err, f) {
    const op = this._ops.get(ref);
    if (!op) return;
    this._ops.delete(ref);
    if (err) op.reject(err); else op.resolve(f);
  }

  _addCredit(n) {
    this._credit += n;
    while (this._credit > 0 && this._creditWaiters.length > 0) {
      this._credit--;
      this._creditWaiters.shift().resolve();
    }
  }

  // _takeCredit resolves once the frame may be sent (§4.3).
  _takeCredit() {
    if (this._closed) return Promise.reject(this._lastError ?? new CourierError(Code.OK, 'connection closed'));
    if (this._down) return Promise.reject(new CourierError(Code.UNAVAILABLE, 'disconnected: reconnecting'));
    if (this._credit > 0 && this._creditWaiters.length === 0) { this._credit--; return null; }
    return new Promise((resolve, reject) => this._creditWaiters.push({ resolve, reject }));
  }

  async _sendCredited(f) {
    const wait = this._takeCredit();
    if (wait) await wait;
    this._send(f);
  }

  /** declare creates an exchange, or opens it if it exists (§5.1). config: {pattern, strategy, ...}; resolves to its ExchangeInfo. */
  async declare(name, config, { passive = false } = {}) {
    const f = await this._op({ type: Type.DECLARE, name, aux: passive ? 1 : 0, body: config ? JSON.stringify(config) : undefined });
    this._exchanges.set(name, { config, passive });
    return parseJSON(f.body);
  }

  /** deleteExchange deletes an exchange. */
  async deleteExchange(name) {
    await this._op({ type: Type.DELETE, name });
    this._exchanges.delete(name);
  }

  /** list resolves to the exchanges the user may see. */
  async list() { return parseJSON((await this._op({ type: Type.LIST })).body) ?? []; }

  /**
   * request sends a request and resolves to its first final response,
   * {body, headers, member, text()}; an error response rejects with a
   * CourierError. Options: key, tag, headers, timeoutMs, signal,
   * onChunk(chunk) to receive a streamed response's chunks, and
   * onAsk(question) to answer the questions a handler asks while it
   * serves the request (docs/protocol.md §6.6): what it returns (a
   * body) is the answer, a throw an error answer with its message.
   * Without onAsk every question is answered with an error, "the
   * requester takes no questions", as the Go client does.
   */
  request(exchange, body, opts = {}) {
    return new Promise((resolve, reject) => {
      this._startRequest(exchange, body, opts, {
        chunk: (r) => opts.onChunk && opts.onChunk(r),
        final: (r, err) => (err ? reject(err) : resolve(r)),
        all: false,
      }).catch(reject);
    });
  }

  /**
   * requestAll sends a request and resolves, once the last handler has
   * answered, to every final response (broadcast exchanges give one per
   * handler); error responses are included as {error}.
   */
  requestAll(exchange, body, opts = {}) {
    return new Promise((resolve, reject) => {
      const out = [];
      this._startRequest(exchange, body, opts, {
        chunk: (r) => opts.onChunk && opts.onChunk(r),
        final: (r, err, last) => { out.push(err ? { error: err, member: err.member } : r); if (last) resolve(out); },
        all: true,
      }).catch(reject);
    });
  }

  async _startRequest(exchange, body, opts, sink) {
    const id = this._nextRef();
    const f = { type: Type.REQUEST, ref: id, name: exchange, key: opts.key, tag: opts.tag, headers: opts.headers, body: toBytes(body) };
    if (opts.timeoutMs) f.aux = Math.max(1, Math.ceil(opts.timeoutMs));
    const state = { sink, done: false, onAsk: opts.onAsk };
    this._requests.set(id, state);
    if (opts.signal) {
      const abort = () => {
        if (!this._requests.has(id)) return;
        this._requests.delete(id);
        try { this._send({ type: Type.CANCEL, ref: id }); } catch { /* closed */ }
        sink.final(null, new CourierError(Code.CANCELLED, 'request aborted'), true);
      };
      if (opts.signal.aborted) return abort();
      opts.signal.addEventListener('abort', abort, { once: true });
    }
    try {
      await this._sendCredited(f);
    } catch (err) {
      this._requests.delete(id);
      throw err;
    }
  }

  _response(f) {
    const st = this._requests.get(f.ref);
    if (!st) return;
    const last = (f.flags & Flag.LAST) !== 0;
    if (last) this._requests.delete(f.ref);
    if (f.flags & Flag.ERROR) {
      st.sink.final(null, new CourierError(Number(f.aux), f.tag, f.name), last);
      return;
    }
    const r = new Response(f);
    if (f.flags & Flag.CHUNK) { st.sink.chunk(r); return; }
    if (!st.sink.all && st.done) return;
    st.done = true;
    st.sink.final(r, null, last);
  }

  // _ask answers a handler's question about one of this connection's
  // requests with the request's onAsk. A question for a request that
  // ended is dropped: the broker answers the handler itself.
  _ask(f) {
    const st = this._requests.get(f.ref);
    if (!st) return;
    const answer = (a) => {
      try { this._send({ type: Type.ANSWER, ref: f.ref, aux: f.aux, ...a }); } catch { /* closed */ }
    };
    if (!st.onAsk) {
      answer({ flags: Flag.ERROR, tag: 'the requester takes no questions' });
      return;
    }
    const q = new Question(f);
    Promise.resolve()
      .then(() => st.onAsk(q))
      .then(
        (out) => answer({ body: toBytes(isReply(out) ? out.body : out) }),
        (err) => answer({ flags: Flag.ERROR, tag: String(err?.message ?? err) || 'the requester could not answer' }),
      );
  }

  /**
   * handle attaches as a handler of a request-response exchange. fn(req)
   * answers with what it returns (a body, or {body, headers}) or throws
   * (an error response, code 18); it may stream with req.chunk(body)
   * before it returns. Options: tag (service tag), connTag, options.
   * Resolves to the Attachment.
   */
  handle(exchange, fn, opts = {}) {
    return this._attachAs(exchange, 'handler', opts, { request: fn });
  }

  /**
   * subscribe attaches as a subscriber of a pub-sub exchange with
   * patterns (`*` one word, `#` any number of words); fn(msg) receives
   * each message {key, headers, body, text()}. Options: connTag,
   * options, durable. Resolves to the Attachment, whose subscribe and
   * unsubscribe change its patterns.
   */
  subscribe(exchange, patterns, fn, opts = {}) {
    return this._attachAs(exchange, 'subscriber', { ...opts, patterns: [].concat(patterns ?? []) }, { message: fn });
  }

  async _attachAs(exchange, role, opts, handlers) {
    const id = ++this._attach;
    const a = new Attachment(this, id, exchange, role, handlers);
    if (opts.onEvent) a.onevent = opts.onEvent;
    a._tag = opts.tag;
    a.patterns = [...(opts.patterns ?? [])];
    a._spec = {};
    if (opts.patterns && opts.patterns.length) a._spec.patterns = opts.patterns;
    if (opts.connTag) a._spec.conn_tag = opts.connTag;
    if (opts.options) a._spec.options = opts.options;
    if (opts.durable) a._spec.durable = opts.durable;
    if (opts.prefetch !== undefined) a._spec.prefetch = opts.prefetch;
    this._attachments.set(id, a);
    try {
      await this._attachOp(a);
      return a;
    } catch (err) {
      this._attachments.delete(id);
      throw err;
    }
  }

  // _attachOp sends a's ATTACH, with its patterns now.
  async _attachOp(a) {
    const spec = { ...a._spec };
    if (a.role === 'subscriber' && !spec.durable) {
      if (a.patterns.length) spec.patterns = a.patterns; else delete spec.patterns;
    }
    const f = await this._op({ type: Type.ATTACH, attach: a.id, name: a.exchange, aux: ROLE[a.role], tag: a._tag, body: JSON.stringify(spec) });
    const res = parseJSON(f.body) ?? {};
    a.member = res.member;
    a.patterns = res.patterns ?? [];
  }

  /** publish publishes a message; with {confirm: true} it resolves once the server has routed it (§7). Options: headers, confirm. */
  async publish(exchange, key, body, opts = {}) {
    const f = { type: Type.PUBLISH, name: exchange, key, headers: opts.headers, body: toBytes(body) };
    if (!opts.confirm) return this._sendCredited(f);
    const wait = this._takeCredit();
    if (wait) await wait;
    f.flags = Flag.REPLY;
    await this._op(f);
  }

  /**
   * control attaches as a controller of a controlled (inverted) pub-sub
   * exchange (§8). fn(sub) decides on each subscription: sub.member is
   * the subscriber ({id, role, conn_tag, options}), sub.patterns what it
   * asks for; fn returns (or resolves to) true to accept, false or a
   * string (the reason) to refuse, or {patterns} to narrow. A throw
   * refuses with its message. Resolves to the Attachment, whose
   * subscribeFor and unsubscribeFor act on a subscriber's behalf.
   */
  control(exchange, fn, opts = {}) {
    return this._attachAs(exchange, 'controller', opts, { subrequest: fn });
  }

  /**
   * submit submits a task to a task exchange (§10). Options: key,
   * priority (0–9), headers, due (a Date or Unix ms), ttlMs, confirm
   * (resolve to the task id once it is durable), onEvent(ev) (watch the
   * task: ev.kind is progress, retry, completed, failed or lost; ev.last marks
   * the end; implies confirm). Without confirm nor onEvent it resolves
   * once sent, to 0.
   */
  async submit(exchange, body, opts = {}) {
    const f = { type: Type.SUBMIT, name: exchange, key: opts.key, aux: opts.priority ?? 0, headers: opts.headers, body: toBytes(body) };
    const tags = [];
    if (opts.due !== undefined) tags.push(`due=${opts.due instanceof Date ? opts.due.getTime() : Math.floor(opts.due)}`);
    if (opts.ttlMs !== undefined) tags.push(`ttl=${Math.floor(opts.ttlMs)}`);
    if (tags.length) f.tag = tags.join(';');
    const wait = this._takeCredit();
    if (wait) await wait;
    if (!opts.confirm && !opts.onEvent) {
      this._send(f);
      return 0;
    }
    f.flags = Flag.REPLY;
    if (opts.onEvent) {
      f.flags |= Flag.WATCH;
      return this._watchOp(f, opts.onEvent);
    }
    return Number((await this._op(f)).aux);
  }

  /** watch follows the events of a task anyone submitted: fn(ev) as for submit's onEvent. */
  async watch(exchange, id, fn) {
    await this._watchOp({ type: Type.WATCH, name: exchange, aux: id }, fn);
  }

  async _watchOp(f, fn) {
    f.ref = this._nextRef();
    this._watches.set(f.ref, fn);
    const done = new Promise((resolve, reject) => this._ops.set(f.ref, { resolve, reject }));
    try {
      this._send(f);
      return Number((await done).aux);
    } catch (err) {
      this._watches.delete(f.ref);
      throw err;
    }
  }

  _taskEvent(f) {
    const fn = this._watches.get(f.ref);
    if (!fn) return;
    const last = (f.flags & Flag.LAST) !== 0;
    if (last) this._watches.delete(f.ref);
    fn({ kind: TASK_EVENTS[Number(f.aux)] ?? String(f.aux), last, ...(parseJSON(f.body) ?? {}) });
  }

  /**
   * work attaches as a worker of a task exchange (§10). fn(task)
   * handles each task; when it returns (or resolves) the task is
   * ACKed, when it throws it is NACKed for a retry, unless fn settled it
   * itself (task.ack(), task.nack({requeue}), task.progress(percent,
   * text)). Options: prefetch (tasks held at once, default 100),
   * connTag, options, onEvent. Resolves to the Attachment.
   */
  work(exchange, fn, opts = {}) {
    return this._attachAs(exchange, 'worker', opts, { task: fn });
  }

  /** onclose registers fn(err) to run once the connection has ended. */
  onClose(fn) { this._closeHandlers.push(fn); }

  /** close closes the connection (a CLOSE with code 0, then the WebSocket). */
  close(reason = '') {
    if (this._closed) return;
    this._userClosed = true;
    clearTimeout(this._retryTimer);
    try { this._send({ type: Type.CLOSE, tag: reason }); } catch { /* closing */ }
    const err = new CourierError(Code.OK, 'closed by the client');
    this._ws.close(1000);
    this._end(err);
  }

  _end(err) {
    if (this._closed) return;
    this._closed = true;
    this._lastError = err;
    clearInterval(this._hbTimer);
    this._fail(err);
    for (const a of this._attachments.values()) a._gone(err);
    for (const fn of this._closeHandlers) fn(err);
  }

  // _fail fails what was in flight on the connection that ended.
  _fail(err) {
    for (const op of this._ops.values()) op.reject(err);
    this._ops.clear();
    for (const st of this._requests.values()) st.sink.final(null, err, true);
    this._requests.clear();
    for (const w of this._creditWaiters) w.reject(err);
    this._creditWaiters = [];
    for (const a of this._attachments.values()) a._gone(err);
    this._watches.clear();
    this._credit = 0;
  }
}

/** Response is one response to a request. */
export class Response {
  constructor(f) {
    this.body = f.body;
    this.headers = f.headers;
    this.member = f.name;
    this.chunk = (f.flags & Flag.CHUNK) !== 0;
    this.end = (f.flags & Flag.END) !== 0;
  }
  /** text decodes the body as UTF-8. */
  text() { return textDecoder.decode(this.body); }
  /** json parses the body as JSON. */
  json() { return JSON.parse(this.text()); }
}

/** Attachment is a handler's or subscriber's place on an exchange. */
export class Attachment {
  constructor(conn, id, exchange, role, handlers) {
    this.conn = conn;
    this.id = id;
    this.exchange = exchange;
    this.role = role;
    this._h = handlers;
    this._legs = new Map(); // handler-leg id → Request
    this.member = '';
    this.patterns = [];
    this.onevent = null;
  }

  _frame(f) {
    switch (f.type) {
      case Type.REQUEST: return this._request(f);
      case Type.CANCEL: {
        const req = this._legs.get(f.ref);
        if (req) { this._legs.delete(f.ref); req._cancel(); }
        return;
      }
      case Type.ANSWER: {
        const req = this._legs.get(f.ref);
        if (req) req._answer(f);
        return;
      }
      case Type.MESSAGE:
        if (this._h.message) this._h.message(new Message(f));
        return;
      case Type.TASK:
        if (this._h.task) this._task(f);
        else if (this._h.message) this._durable(f);
        return;
      case Type.SUBREQUEST:
        if (this._h.subrequest) this._subrequest(f);
        return;
      case Type.EVENT: {
        const ev = { kind: EVENT_KINDS[Number(f.aux)] ?? String(f.aux), exchange: f.name, reason: f.tag, ...(parseJSON(f.body) ?? {}) };
        if (ev.kind === 'subscriptions') this.patterns = ev.patterns = ev.patterns ?? [];
        if (ev.kind === 'detached') this.conn._attachments.delete(this.id);
        if (this.onevent) this.onevent(ev);
        return;
      }
      default:
    }
  }

  _request(f) {
    const req = new Request(this, f);
    this._legs.set(f.ref, req);
    Promise.resolve()
      .then(() => this._h.request(req))
      .then(
        (out) => {
          if (req._finished) return;
          const { body, headers } = isReply(out) ? out : { body: out };
          req._final({ type: Type.RESPONSE, ref: f.ref, headers, body: toBytes(body), flags: req._chunked ? Flag.END : 0 });
        },
        (err) => {
          if (req._finished) return;
          const code = err instanceof CourierError ? err.code : Code.APPLICATION;
          req._final({ type: Type.RESPONSE, ref: f.ref, flags: Flag.ERROR, aux: code, tag: String(err?.message ?? err) });
        },
      );
  }

  _task(f) {
    const task = new Task(this, f);
    Promise.resolve()
      .then(() => this._h.task(task))
      .then(() => task.ack(), (err) => task.nack({ requeue: true, reason: String(err?.message ?? err) }));
  }

  // _durable hands a durable subscriber its message, and ACKs it once
  // the callback returns (NACK, redelivered, if it throws).
  _durable(f) {
    const task = new Task(this, f);
    Promise.resolve()
      .then(() => this._h.message(task))
      .then(() => task.ack(), (err) => task.nack({ requeue: true, reason: String(err?.message ?? err) }));
  }

  _subrequest(f) {
    const req = { token: f.ref, ...(parseJSON(f.body) ?? {}) };
    const decide = (verdict, reason, patterns) => {
      try {
        this.conn._send({ type: Type.DECISION, ref: f.ref, attach: this.id, aux: verdict, tag: reason, body: patterns ? JSON.stringify({ patterns }) : undefined });
      } catch { /* closed */ }
    };
    Promise.resolve()
      .then(() => this._h.subrequest(req))
      .then(
        (d) => {
          if (d === true || d === undefined) return decide(0);
          if (d === false) return decide(1, 'refused');
          if (typeof d === 'string') return decide(1, d);
          if (d && Array.isArray(d.patterns)) return decide(0, undefined, d.patterns);
          return decide(1, 'refused');
        },
        (err) => decide(1, String(err?.message ?? err)),
      );
  }

  /** subscribeFor, on a controller, adds patterns to the subscriber member (§8); resolves to its patterns now. */
  async subscribeFor(member, patterns) {
    const f = await this.conn._op({ type: Type.SUBSCRIBE, attach: this.id, name: member, body: JSON.stringify({ patterns: [].concat(patterns) }) });
    return parseJSON(f.body)?.patterns ?? [];
  }

  /** unsubscribeFor, on a controller, removes patterns from the subscriber member; resolves to its patterns now. */
  async unsubscribeFor(member, patterns) {
    const f = await this.conn._op({ type: Type.UNSUBSCRIBE, attach: this.id, name: member, body: JSON.stringify({ patterns: [].concat(patterns) }) });
    return parseJSON(f.body)?.patterns ?? [];
  }

  /** subscribe adds patterns to a subscriber; resolves to its patterns now. */
  async subscribe(patterns) {
    const f = await this.conn._op({ type: Type.SUBSCRIBE, attach: this.id, body: JSON.stringify({ patterns: [].concat(patterns) }) });
    this.patterns = parseJSON(f.body)?.patterns ?? [];
    return this.patterns;
  }

  /** unsubscribe removes patterns from a subscriber; resolves to its patterns now. */
  async unsubscribe(patterns) {
    const f = await this.conn._op({ type: Type.UNSUBSCRIBE, attach: this.id, body: JSON.stringify({ patterns: [].concat(patterns) }) });
    this.patterns = parseJSON(f.body)?.patterns ?? [];
    return this.patterns;
  }

  /** detach ends the attachment. */
  async detach() {
    await this.conn._op({ type: Type.DETACH, attach: this.id });
    this.conn._attachments.delete(this.id);
  }

  _gone(err) {
    for (const req of this._legs.values()) req._cancel(err);
    this._legs.clear();
  }
}

/** Request is a request delivered to a handler. */
export class Request {
  constructor(a, f) {
    this._a = a;
    this._leg = f.ref;
    this.body = f.body;
    this.headers = f.headers;
    this.key = f.key;
    this.tag = f.tag;
    this.requester = f.name;
    this.deadline = f.aux ? Date.now() + Number(f.aux) : 0;
    this.cancelled = false;
    this._chunked = false;
    this._finished = false;
    this._asks = new Map(); // ask id → {resolve, reject}
    this._nextAsk = 0;
    this.oncancel = null;
  }
  /**
   * ask sends the requester a question while the request is served and
   * resolves to its answer, {body, text(), json()} (docs/protocol.md
   * §6.6). An error answer rejects with a CourierError of code 18
   * (APPLICATION) and the requester's reason; so does a requester that
   * takes no questions. It rejects with code 9 (CANCELLED) once the
   * request is cancelled or answered, or the connection is lost, and
   * with code 8 (TIMEOUT) after opts.timeoutMs; opts.signal aborts it.
   */
  ask(question, opts = {}) {
    if (this.cancelled) return Promise.reject(new CourierError(Code.CANCELLED, 'the request was cancelled'));
    if (this._finished) return Promise.reject(new CourierError(Code.CANCELLED, 'the request was answered already'));
    const id = ++this._nextAsk;
    return new Promise((resolve, reject) => {
      let timer = null;
      const settle = (fn, v) => {
        if (!this._asks.has(id)) return;
        this._asks.delete(id);
        if (timer !== null) clearTimeout(timer);
        if (opts.signal) opts.signal.removeEventListener('abort', abort);
        fn(v);
      };
      const abort = () => settle(reject, new CourierError(Code.CANCELLED, 'ask aborted'));
      this._asks.set(id, { resolve: (v) => settle(resolve, v), reject: (e) => settle(reject, e) });
      if (opts.signal) {
        if (opts.signal.aborted) { abort(); return; }
        opts.signal.addEventListener('abort', abort, { once: true });
      }
      if (opts.timeoutMs) {
        timer = setTimeout(() => settle(reject, new CourierError(Code.TIMEOUT, `no answer within ${opts.timeoutMs} ms`)), opts.timeoutMs);
      }
      try {
        this._a.conn._send({ type: Type.ASK, ref: this._leg, attach: this._a.id, aux: id, body: toBytes(question) });
      } catch (err) {
        settle(reject, err);
      }
    });
  }
  _answer(f) {
    const w = this._asks.get(Number(f.aux));
    if (!w) return;
    if (f.flags & Flag.ERROR) w.reject(new CourierError(Code.APPLICATION, f.tag));
    else w.resolve(new Answer(f));
  }
  _endAsks(why) {
    for (const w of [...this._asks.values()]) w.reject(new CourierError(Code.CANCELLED, why));
  }
  /** text decodes the body as UTF-8. */
  text() { return textDecoder.decode(this.body); }
  /** json parses the body as JSON. */
  json() { return JSON.parse(this.text()); }
  /** chunk sends one chunk of a streamed response; the handler's return value ends the stream. */
  chunk(body, headers) {
    if (this._finished) return;
    this._chunked = true;
    this._a.conn._send({ type: Type.RESPONSE, ref: this._leg, flags: Flag.CHUNK, headers, body: toBytes(body) });
  }
  _final(f) {
    this._finished = true;
    this._a._legs.delete(this._leg);
    this._endAsks('the request was answered');
    if (!this.cancelled) {
      try { this._a.conn._send(f); } catch { /* closed */ }
    }
  }
  _cancel(err) {
    this.cancelled = true;
    this._finished = true;
    this._endAsks(err ? `the connection was lost: ${err.message}` : 'the request was cancelled');
    if (this.oncancel) this.oncancel();
  }
}

/** Question is a question a handler asks a requester (request's onAsk). */
export class Question {
  constructor(f) {
    this.body = f.body;
    /** member is the asking handler's member id. */
    this.member = f.name;
  }
  /** text decodes the body as UTF-8. */
  text() { return textDecoder.decode(this.body); }
  /** json parses the body as JSON. */
  json() { return JSON.parse(this.text()); }
}

/** Answer is a requester's answer to a handler's question (Request.ask). */
export class Answer {
  constructor(f) { this.body = f.body; }
  /** text decodes the body as UTF-8. */
  text() { return textDecoder.decode(this.body); }
  /** json parses the body as JSON. */
  json() { return JSON.parse(this.text()); }
}

/** Task is a task delivered to a worker (or a durable subscriber), to be settled once. */
export class Task {
  constructor(a, f) {
    this._a = a;
    this.id = f.ref;
    this.attempts = Number(f.aux);
    this.key = f.key;
    this.headers = f.headers;
    this.body = f.body;
    this.settled = false;
  }
  /** text decodes the body as UTF-8. */
  text() { return textDecoder.decode(this.body); }
  /** json parses the body as JSON. */
  json() { return JSON.parse(this.text()); }
  /** ack settles the task as done. */
  ack() { this._settle({ type: Type.ACK }); }
  /** nack settles the task as failed: retried after a backoff with {requeue: true} (the default), else dead-lettered. */
  nack({ requeue = true, reason } = {}) { this._settle({ type: Type.NACK, aux: requeue ? 1 : 0, tag: reason }); }
  /** progress tells the task's watchers how far it got (percent 0–100 and a short text). */
  progress(percent, text) {
    if (this.settled) return;
    this._a.conn._send({ type: Type.PROGRESS, attach: this._a.id, ref: this.id, aux: Math.max(0, Math.min(100, Math.round(percent))), tag: text });
  }
  _settle(f) {
    if (this.settled) return;
    this.settled = true;
    try { this._a.conn._send({ ...f, attach: this._a.id, ref: this.id }); } catch { /* closed: the task is delivered again */ }
  }
}

/** Message is a published message delivered to a subscriber. */
export class Message {
  constructor(f) {
    this.key = f.key;
    this.headers = f.headers;
    this.body = f.body;
  }
  /** text decodes the body as UTF-8. */
  text() { return textDecoder.decode(this.body); }
  /** json parses the body as JSON. */
  json() { return JSON.parse(this.text()); }
}

function isReply(v) {
  return v !== null && typeof v === 'object' && !(v instanceof Uint8Array) && !(v instanceof ArrayBuffer) && !ArrayBuffer.isView(v) && ('body' in v || 'headers' in v);
}

function parseJSON(b) {
  if (!b || b.length === 0) return null;
  return JSON.parse(textDecoder.decode(b));
}

