package node

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzQueueOpsMessage: a queue-ops message from a peer (a request to a
// leader's node, or its answer) is read with its length bounded before
// anything is allocated, and never panics; what decodes encodes again.
func FuzzQueueOpsMessage(f *testing.F) {
	frame := func(s string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...)
	}
	f.Add(frame(`{"v":1}`))
	f.Add(frame(`{"queues":[{"name":"q","members":[{"node":"a","voter":true,"behind":0},{"node":"b","voter":false,"behind":12}],"counters":{"Name":"q","MessagesReady":3}}]}`))
	f.Add(frame(`{"queues":null}`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(frame(`{"queues":[{"name":1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var req opsRequest
		_ = readMsg(bytes.NewReader(b), &req, maxOpsRequest)
		var resp opsResponse
		if err := readMsg(bytes.NewReader(b), &resp, 1<<16); err != nil {
			return
		}
		var out bytes.Buffer
		if err := writeMsg(&out, resp, maxOpsResponse); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var again opsResponse
		if err := readMsg(&out, &again, maxOpsResponse); err != nil || len(again.Queues) != len(resp.Queues) {
			t.Fatalf("round trip: %v, %d queues, want %d", err, len(again.Queues), len(resp.Queues))
		}
	})
}

// TestQueueOpsMessageBounds: a message announcing more than the limit
// is refused from its length alone.
func TestQueueOpsMessageBounds(t *testing.T) {
	b := binary.BigEndian.AppendUint32(nil, maxOpsRequest+1)
	var req opsRequest
	if err := readMsg(bytes.NewReader(b), &req, maxOpsRequest); err == nil {
		t.Fatal("an oversized request was read")
	}
}
