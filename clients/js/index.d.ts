// Type definitions of Courier's JavaScript client (courier.js).

/** A body: bytes, or a string sent as UTF-8. */
export type Body = Uint8Array | ArrayBuffer | ArrayBufferView | string;
/** Headers: names to values, both strings. */
export type Headers = Record<string, string>;
/** A number of the protocol: a number below 2^53, a BigInt above. */
export type Uint64 = number | bigint;

export declare const Type: Readonly<Record<string, number>>;
export declare const Flag: Readonly<{ FATAL: 1; CHUNK: 2; END: 4; ERROR: 8; LAST: 16; REPLY: 32; WATCH: 64 }>;
/** The protocol's error codes (docs/protocol.md §11). */
export declare const Code: Readonly<{
  OK: 0; PROTOCOL: 1; VERSION: 2; FRAME_TOO_LARGE: 3; NOT_FOUND: 4; CLASH: 5; BAD_OPTIONS: 6;
  NO_HANDLER: 7; TIMEOUT: 8; CANCELLED: 9; REJECTED: 10; HANDLER_GONE: 11; INTERNAL: 12;
  NOT_ALLOWED: 13; LIMIT: 14; HEARTBEAT: 15; SHUTDOWN: 16; UNAUTHORIZED: 17; APPLICATION: 18;
  SLOW_CONSUMER: 19; EXCHANGE_DELETED: 20; TOO_MANY_CONNS: 21; TOO_MANY_ATTACHMENTS: 22;
  TOO_MANY_INFLIGHT: 23; DEADLINE_TOO_LONG: 24; QUEUE_FULL: 25; TOO_MANY_PATTERNS: 26;
  EXPR_LIMIT: 27; HANDSHAKE_LIMIT: 28; UNAVAILABLE: 29; STORAGE: 30; NOT_LEADER: 31;
}>;

/** A frame as the codec sees it. */
export interface Frame {
  type: number;
  flags?: number;
  ref?: Uint64;
  attach?: number;
  aux?: Uint64;
  name?: string;
  key?: string;
  tag?: string;
  headers?: Headers;
  body?: Body;
}

/** The bytes of a frame, length prefix included, as wire.AppendFrame writes them. */
export declare function encodeFrame(f: Frame): Uint8Array;
/** Decodes the bytes of one frame after its length prefix; throws MalformedError. */
export declare function decodeFrame(p: Uint8Array): Required<Frame> & { body: Uint8Array };
/** Decodes one WebSocket message, which must hold exactly one frame. */
export declare function decodeMessage(msg: Uint8Array, maxFrame?: number): Required<Frame> & { body: Uint8Array };

export declare class MalformedError extends Error {}

/** An error the server or the connection reported, with its protocol code. */
export declare class CourierError extends Error {
  readonly code: number;
  /** The handler's member id, for an error response from one handler. */
  readonly member?: string;
}

export interface ConnectOptions {
  /** Credentials, when the server has users (or in the URL: ws://user:pass@host/ws). */
  user?: string;
  password?: string;
  /** The connection's name in the server's logs and management API. */
  name?: string;
  /** The heartbeat interval to ask for (ms); default the server's. */
  heartbeatMs?: number;
  /** The handshake's timeout (ms). Default 10000. */
  timeoutMs?: number;
  /** A WebSocket implementation, for runtimes without a global one. */
  WebSocket?: new (url: string, protocols?: string | string[]) => WebSocket;
  /** Reconnect when the connection is lost. Default true. */
  reconnect?: boolean;
  /** First wait before reconnecting (ms, jittered, doubling). Default 100. */
  reconnectWaitMs?: number;
  /** Longest wait between attempts (ms). Default 5000. */
  reconnectWaitMaxMs?: number;
  /** Rounds of attempts (each tries every server of the list) before giving up. Default unlimited. */
  maxReconnects?: number;
}

/** The WELCOME of the server (docs/protocol.md §12). */
export interface Welcome {
  version: number;
  server: string;
  node: string;
  conn: string;
  heartbeat_ms: number;
  timeout_ms: number;
  max_frame: number;
  credit: number;
  connect_urls?: string[];
}

/**
 * Opens a connection to ws://host:7480/ws (wss:// with TLS) and runs the
 * handshake. url may list several servers, as an array or as URLs
 * separated by commas: they are tried in order, and the connection
 * reconnects to any of them.
 */
export declare function connect(url: string | readonly string[], opts?: ConnectOptions): Promise<Connection>;

export interface ExchangeConfig {
  pattern: 'reqresp' | 'pubsub' | 'tasks';
  strategy?: string;
  key_expr?: string;
  route_expr?: string;
  controlled?: boolean;
  transient?: boolean;
  max_attempts?: number;
  ttl_ms?: number;
  backoff_ms?: number;
  backoff_max_ms?: number;
  dead_letter?: string;
  max_length?: number;
  max_bytes?: number;
  overflow?: 'reject-publish' | 'drop-head';
}

export interface Member {
  id: string;
  role: 'handler' | 'subscriber' | 'controller' | 'worker';
  service_tag?: string;
  conn_tag?: string;
  options?: Record<string, string>;
  node?: string;
}

export interface ExchangeInfo extends Partial<ExchangeConfig> {
  name: string;
  pattern: ExchangeConfig['pattern'];
  leader?: string;
  members: Member[];
  subscribers: number;
  requests: number;
  publishes: number;
  queue?: Record<string, unknown>;
}

/** What every EVENT to an attachment (§9) holds. */
export interface EventBase {
  /** The attachment's exchange. */
  exchange: string;
  /** Why it was detached ('' for other kinds). */
  reason: string;
  /** The group's leader's member id, when it has one. */
  leader?: string;
  /** The group's members (leader, member-up, member-down). */
  members?: Member[];
  /** The leader's fencing token in a cluster (epoch, then term). */
  epoch?: number;
  term?: number;
}

/**
 * An EVENT to an attachment (§9), told apart by kind: `ev.kind ===
 * 'member-up'` makes `ev.member` a Member.
 */
export type AttachmentEvent =
  | (EventBase & { kind: 'leader'; /** The member whose change made it. */ member?: Member })
  | (EventBase & { kind: 'member-up' | 'member-down'; member: Member })
  | (EventBase & { kind: 'subscriptions'; /** The subscriber's patterns now. */ patterns: string[] })
  | (EventBase & { kind: 'detached' });

/** A TASKEVENT of a watched task (§10). */
export interface TaskEvent {
  kind: 'progress' | 'retry' | 'completed' | 'failed' | 'lost' | string;
  /** No more events follow. */
  last: boolean;
  id: number;
  percent?: number;
  text?: string;
  attempts?: number;
  due_ms?: number;
  reason?: string;
  worker?: string;
}

export interface AttachOptions {
  /** The service tag (handlers). */
  tag?: string;
  connTag?: string;
  options?: Record<string, string>;
  onEvent?: (ev: AttachmentEvent) => void;
}

export interface RequestOptions {
  key?: string;
  tag?: string;
  headers?: Headers;
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Receives the chunks of a streamed response. */
  onChunk?: (chunk: Response) => void;
  /**
   * Answers the questions a handler asks while it serves the request
   * (docs/protocol.md §6.6): what it returns is the answer, a throw an
   * error answer with its message. Without it every question is
   * answered with an error, "the requester takes no questions".
   */
  onAsk?: (question: Question) => Body | { body?: Body } | Promise<Body | { body?: Body }>;
}

/** A question a handler asks the requester (RequestOptions.onAsk). */
export declare class Question {
  readonly body: Uint8Array;
  /** The asking handler's member id. */
  readonly member: string;
  text(): string;
  json<T = any>(): T;
}

/** The requester's answer to a handler's question (Request.ask). */
export declare class Answer {
  readonly body: Uint8Array;
  text(): string;
  json<T = any>(): T;
}

export interface AskOptions {
  /** Rejects with code 8 (TIMEOUT) when no answer came within it. */
  timeoutMs?: number;
  /** Rejects with code 9 (CANCELLED) when aborted. */
  signal?: AbortSignal;
}

export type Reply = Body | { body?: Body; headers?: Headers } | undefined | void;

export interface SubRequest {
  token: Uint64;
  member: Member;
  patterns: string[];
}

/** A controller's decision: accept (true), refuse (false or the reason), or narrow. */
export type Decision = boolean | string | { patterns: string[] } | undefined | void;

export interface SubmitOptions {
  key?: string;
  priority?: number;
  headers?: Headers;
  /** Deliver at this time (a Date or Unix ms). */
  due?: Date | number;
  ttlMs?: number;
  /** Resolve to the task id once the task is durable. */
  confirm?: boolean;
  /** Watch the task's events; implies confirm. */
  onEvent?: (ev: TaskEvent) => void;
}

export declare class Connection {
  /** The URL of the server connected to now (without credentials). */
  readonly url: string;
  /** The servers connect was given, in its order (without credentials). */
  readonly urls: readonly string[];
  /** The connection id, such as "n1/c7" (changes on reconnection). */
  readonly id: string;
  readonly welcome: Welcome | null;
  /** Errors that belong to no operation (ERROR with Ref 0). */
  onerror: ((err: CourierError) => void) | null;
  ondisconnect: ((err: CourierError) => void) | null;
  onreconnect: (() => void) | null;

  declare(name: string, config?: ExchangeConfig | Record<string, never>, opts?: { passive?: boolean }): Promise<ExchangeInfo>;
  deleteExchange(name: string): Promise<void>;
  list(): Promise<ExchangeInfo[]>;

  request(exchange: string, body?: Body, opts?: RequestOptions): Promise<Response>;
  requestAll(exchange: string, body?: Body, opts?: RequestOptions): Promise<Array<Response | { error: CourierError; member?: string }>>;
  handle(exchange: string, fn: (req: Request) => Reply | Promise<Reply>, opts?: AttachOptions): Promise<Attachment>;

  subscribe(exchange: string, patterns: string | string[], fn: (msg: Message) => void, opts?: AttachOptions & { durable?: string; prefetch?: number }): Promise<Attachment>;
  publish(exchange: string, key: string, body?: Body, opts?: { headers?: Headers; confirm?: boolean }): Promise<void>;
  control(exchange: string, fn: (sub: SubRequest) => Decision | Promise<Decision>, opts?: AttachOptions): Promise<Attachment>;

  submit(exchange: string, body?: Body, opts?: SubmitOptions): Promise<number>;
  watch(exchange: string, id: number, fn: (ev: TaskEvent) => void): Promise<void>;
  work(exchange: string, fn: (task: Task) => void | Promise<void>, opts?: AttachOptions & { prefetch?: number }): Promise<Attachment>;

  onClose(fn: (err: CourierError) => void): void;
  close(reason?: string): void;
}

export declare class Attachment {
  readonly conn: Connection;
  readonly id: number;
  readonly exchange: string;
  readonly role: 'handler' | 'subscriber' | 'controller' | 'worker';
  /** The member id, such as "n1/c7.2" (changes on reconnection). */
  readonly member: string;
  /** A subscriber's patterns now. */
  readonly patterns: string[];
  onevent: ((ev: AttachmentEvent) => void) | null;
  subscribe(patterns: string | string[]): Promise<string[]>;
  unsubscribe(patterns: string | string[]): Promise<string[]>;
  subscribeFor(member: string, patterns: string | string[]): Promise<string[]>;
  unsubscribeFor(member: string, patterns: string | string[]): Promise<string[]>;
  detach(): Promise<void>;
}

export declare class Response {
  readonly body: Uint8Array;
  readonly headers: Headers;
  /** The handler's member id. */
  readonly member: string;
  readonly chunk: boolean;
  readonly end: boolean;
  text(): string;
  json<T = any>(): T;
}

export declare class Request {
  readonly body: Uint8Array;
  readonly headers: Headers;
  readonly key: string;
  readonly tag: string;
  /** The requester's connection id. */
  readonly requester: string;
  /** When the requester stops waiting (Date.now() ms), 0 for never. */
  readonly deadline: number;
  readonly cancelled: boolean;
  oncancel: (() => void) | null;
  text(): string;
  json<T = any>(): T;
  /** Sends one chunk of a streamed response. */
  chunk(body: Body, headers?: Headers): void;
  /**
   * Asks the requester a question and resolves to its answer. An error
   * answer rejects with a CourierError of code 18 (APPLICATION); a
   * request cancelled or answered, or a connection lost, with code 9.
   */
  ask(question: Body, opts?: AskOptions): Promise<Answer>;
}

export declare class Message {
  readonly key: string;
  readonly headers: Headers;
  readonly body: Uint8Array;
  text(): string;
  json<T = any>(): T;
}

export declare class Task {
  readonly id: Uint64;
  /** Failed attempts before this delivery. */
  readonly attempts: number;
  readonly key: string;
  readonly headers: Headers;
  readonly body: Uint8Array;
  readonly settled: boolean;
  text(): string;
  json<T = any>(): T;
  ack(): void;
  nack(opts?: { requeue?: boolean; reason?: string }): void;
  progress(percent: number, text?: string): void;
}
