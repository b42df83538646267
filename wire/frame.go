// Package wire encodes and decodes Courier protocol frames.
//
// Every frame on a connection, in both directions, has the same layout:
//
//	+--------+------+-------+--------+-------------------------------+
//	| len u32| type | flags | fields | field values ...  | body ...  |
//	|  (BE)  |  u8  |  u8   |   u8   |                   |           |
//	+--------+------+-------+--------+-------------------------------+
//
// len counts the bytes after itself. fields is a bitmap saying which of
// the optional fields follow, always in this order:
//
//	bit 0  Ref     uvarint    correlation id (op ref, request id)
//	bit 1  Attach  uvarint    attachment id, chosen by the client (u32)
//	bit 2  Aux     uvarint    a number whose meaning depends on the type
//	bit 3  Name    string     exchange name or member id
//	bit 4  Key     string     routing or sticky key
//	bit 5  Tag     string     service tag, reason or error message
//	bit 6  Header  uvarint n, then n × (string name, string value)
//	bit 7  Body    the rest of the frame, raw bytes
//
// A string is a uvarint length followed by that many UTF-8 bytes. The
// decoder is strict: unknown types, unknown flags, truncated fields and
// trailing garbage are errors, and no read goes past len. docs/protocol.md
// describes what every frame type means and which fields it carries.
package wire

import "sync"

// Type identifies what a frame is.
type Type uint8

// Frame types. The protocol document gives the fields each one carries.
const (
	TypeHello   Type = 0x01 // client → server, first frame: Body is JSON hello
	TypeWelcome Type = 0x02 // server → client: Body is JSON welcome
	TypePing    Type = 0x03 // either way: Ref is echoed in the Pong
	TypePong    Type = 0x04 // either way
	TypeClose   Type = 0x05 // either way: Aux is a Code, Tag the reason
	TypeError   Type = 0x06 // server → client: Ref of the failed op, Aux Code, Tag message
	TypeOK      Type = 0x07 // server → client: Ref of the op, optional JSON Body
	TypeCredit  Type = 0x08 // server → client: Aux more frames of publish/request/submit credit

	TypeDeclare     Type = 0x10 // Ref, Name, Body JSON exchange config
	TypeDelete      Type = 0x11 // Ref, Name
	TypeList        Type = 0x12 // Ref; OK Body is a JSON list of exchanges
	TypeAttach      Type = 0x13 // Ref, Attach, Name, Aux role, Tag service tag, Body JSON
	TypeDetach      Type = 0x14 // Ref, Attach
	TypeSubscribe   Type = 0x15 // Ref, Attach, Name target member ("" = self), Body JSON patterns
	TypeUnsubscribe Type = 0x16 // Ref, Attach, Name target member ("" = self), Body JSON patterns
	TypeDecision    Type = 0x17 // client → server: Ref token, Attach, Aux verdict, Tag reason, Body JSON patterns
	TypeSubRequest  Type = 0x18 // server → controller: Ref token, Attach, Name member, Body JSON
	TypeEvent       Type = 0x19 // server → member: Attach, Aux EventKind, Name exchange, Body JSON

	TypeRequest  Type = 0x20 // request, both legs
	TypeResponse Type = 0x21 // response, chunk, end or error, both legs
	TypeCancel   Type = 0x22 // requester cancels / handler is told
	TypeAsk      Type = 0x23 // handler asks the requester a question
	TypeAnswer   Type = 0x24 // requester answers a question
	TypePublish  Type = 0x28 // client → server: Name exchange, Key routing key
	TypeMessage  Type = 0x29 // server → subscriber: Attach, Key routing key

	TypeSubmit    Type = 0x30 // client → server: Ref, Name exchange, Key task key, Aux priority, Tag options
	TypeTask      Type = 0x31 // server → worker: Attach, Ref task id, Aux attempts, Key, Header, Body
	TypeAck       Type = 0x32 // worker → server: Attach, Ref task id
	TypeNack      Type = 0x33 // worker → server: Attach, Ref task id, Aux 1 requeue, Tag reason
	TypeProgress  Type = 0x34 // worker → server: Attach, Ref task id, Aux percent, Tag text
	TypeTaskEvent Type = 0x35 // server → watcher: Ref of SUBMIT or WATCH, Aux TaskEventKind, Body JSON
	TypeWatch     Type = 0x36 // client → server: Ref, Name exchange, Aux task id

	// Node-link frames pass between the brokers of a cluster's nodes,
	// never between a client and a server: a server refuses them from a
	// client like any frame a client may not send. 0x40–0x47 carry
	// pub-sub interest and publications, 0x48–0x4f request-response
	// views and forwarded requests. docs/protocol.md §12 gives their
	// fields.
	TypeRSub     Type = 0x40 // node → node: Ref, Name exchange, Body JSON patterns gaining their first subscriber there
	TypeRUnsub   Type = 0x41 // node → node: Name exchange, Body JSON patterns losing their last subscriber there
	TypeRPub     Type = 0x42 // node → node: Name exchange, Key routing key, Header, Body: a publication to fan out there
	TypeRSubAck  Type = 0x43 // node → node: Ref of the RSUB, once its interest is in place
	TypeRSubReq  Type = 0x44 // node → controller's node: Ref token, Name exchange, Tag controller, Body JSON SubRequestBody
	TypeRDecide  Type = 0x45 // node → node: Ref token of an RSUBREQ or RMEMBER, Aux verdict, Attach error code, Tag reason, Body JSON patterns
	TypeRCtrl    Type = 0x46 // node → node: Name exchange, Tag the node's oldest controller ("" none), Aux its attach time
	TypeRMember  Type = 0x47 // node → member's node: Ref token, Name exchange, Tag member id, Aux 0 subscribe 1 unsubscribe, Body JSON patterns
	TypeRView    Type = 0x48 // home node → node: Name exchange, Aux view version, Body JSON members
	TypeRAttach  Type = 0x49 // node → home node: Name exchange, Body JSON member
	TypeRDetach  Type = 0x4a // node → home node: Name exchange, Tag member id
	TypeRReq     Type = 0x4b // node → node: a REQUEST for one member: Ref, Name member id, Key, Tag, Aux deadline ms, Header, Body
	TypeRViewAck Type = 0x4c // node → home: Name exchange, Aux view version applied; home → node: Aux version every node applied

	maxType = 0x4c
)

var typeNames = [...]string{
	TypeHello: "HELLO", TypeWelcome: "WELCOME", TypePing: "PING", TypePong: "PONG",
	TypeClose: "CLOSE", TypeError: "ERROR", TypeOK: "OK", TypeCredit: "CREDIT",
	TypeDeclare: "DECLARE", TypeDelete: "DELETE", TypeList: "LIST", TypeAttach: "ATTACH",
	TypeDetach: "DETACH", TypeSubscribe: "SUBSCRIBE", TypeUnsubscribe: "UNSUBSCRIBE",
	TypeDecision: "DECISION", TypeSubRequest: "SUBREQUEST", TypeEvent: "EVENT",
	TypeRequest: "REQUEST", TypeResponse: "RESPONSE", TypeCancel: "CANCEL", TypeAsk: "ASK",
	TypeAnswer: "ANSWER", TypePublish: "PUBLISH", TypeMessage: "MESSAGE",
	TypeSubmit: "SUBMIT", TypeTask: "TASK", TypeAck: "ACK", TypeNack: "NACK",
	TypeProgress: "PROGRESS", TypeTaskEvent: "TASKEVENT", TypeWatch: "WATCH",
	TypeRSub: "RSUB", TypeRUnsub: "RUNSUB", TypeRPub: "RPUB", TypeRSubAck: "RSUBACK",
	TypeRSubReq: "RSUBREQ", TypeRDecide: "RDECIDE", TypeRCtrl: "RCTRL", TypeRMember: "RMEMBER",
	TypeRView: "RVIEW", TypeRAttach: "RATTACH", TypeRDetach: "RDETACH", TypeRReq: "RREQ",
	TypeRViewAck: "RVIEWACK",
}

// Link reports whether t is a node-link frame type, which only another
// node of the cluster may send.
func (t Type) Link() bool { return t >= TypeRSub && t.Valid() }

// String returns the protocol name of t, such as "REQUEST".
func (t Type) String() string {
	if int(t) < len(typeNames) && typeNames[t] != "" {
		return typeNames[t]
	}
	return "UNKNOWN"
}

// Valid reports whether t is a frame type of this protocol version.
func (t Type) Valid() bool { return int(t) < len(typeNames) && typeNames[t] != "" }

// Flags qualify a frame; their meaning depends on the type.
type Flags uint8

// Frame flags.
const (
	// FlagFatal on an ERROR: the server closes the connection after it.
	FlagFatal Flags = 1 << 0
	// FlagChunk on a RESPONSE: one chunk of a stream; more follow.
	FlagChunk Flags = 1 << 1
	// FlagEnd on a RESPONSE: the end marker of a chunked stream.
	FlagEnd Flags = 1 << 2
	// FlagError on a RESPONSE or ANSWER: it carries an error, Aux is its
	// Code and Tag its message.
	FlagError Flags = 1 << 3
	// FlagLast on a RESPONSE to the requester: no more responses follow
	// for this request from any handler.
	FlagLast Flags = 1 << 4
	// FlagReply on a PUBLISH: the server answers OK (or ERROR) with Ref
	// once the message is routed. On a SUBMIT: the server answers OK,
	// Aux the task id, once the task is durable (a publisher confirm).
	FlagReply Flags = 1 << 5
	// FlagWatch on a SUBMIT: after its OK, TASKEVENT frames with its Ref
	// report the task's progress through to completion or failure. On
	// an OK: TASKEVENT frames with its Ref follow (answering a SUBMIT
	// with FlagWatch, or a WATCH).
	FlagWatch Flags = 1 << 6

	allFlags = FlagFatal | FlagChunk | FlagEnd | FlagError | FlagLast | FlagReply | FlagWatch
)

// Field presence bits, in wire order.
const (
	fRef uint8 = 1 << iota
	fAttach
	fAux
	fName
	fKey
	fTag
	fHeader
	fBody
)

// Frame is one decoded protocol frame. Which fields are meaningful depends
// on Type. The zero value of a field is not sent.
//
// Frames passed between the broker, the server and Conns move ownership
// with them: whoever receives a *Frame may keep or reuse it, and the sender
// must not touch it again. Body may be shared read-only between frames.
type Frame struct {
	Type   Type
	Flags  Flags
	Ref    uint64
	Attach uint32
	Aux    uint64
	Name   string
	Key    string
	Tag    string
	Header map[string]string
	Body   []byte

	// Batch, when set, defers the frame's write to the end of its
	// producer's batch; it is not encoded. See [Batch].
	Batch *Batch

	// Waiter is an in-process requester's handle for a REQUEST (its
	// waiting call): the broker keeps it with the request and sets it on
	// every frame it sends the requester for that request (responses,
	// questions, failures), so the requester finds its call without a
	// lookup by Ref. It is not encoded, and nil on frames from a network.
	Waiter any
}

var framePool = sync.Pool{New: func() any { return new(Frame) }}

// NewFrame returns a zeroed frame from a pool; see [Frame.Release].
func NewFrame(t Type) *Frame {
	f := framePool.Get().(*Frame)
	f.Type = t
	return f
}

// Release returns f to the pool. f must not be used afterwards.
func (f *Frame) Release() {
	*f = Frame{}
	framePool.Put(f)
}

// Clone returns a pooled copy of f that shares Body and Header.
func (f *Frame) Clone() *Frame {
	g := framePool.Get().(*Frame)
	*g = *f
	return g
}
