package meta

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"
)

// FuzzReadFrame: any bytes from a peer give a request or an error,
// never a panic or an allocation past maxFrame.
func FuzzReadFrame(f *testing.F) {
	var ok bytes.Buffer
	writeFrame(&ok, typeApply, request{TimeoutMS: 10, Command: &command{V: 1, Op: opDeclare, Name: "x"}})
	f.Add(ok.Bytes())
	var beat bytes.Buffer
	writeFrame(&beat, typeBeat, request{TimeoutMS: 500, Node: "n1", Config: 9, Marks: true})
	f.Add(beat.Bytes())
	var mark, fence bytes.Buffer
	writeFrame(&mark, typeMark, request{TimeoutMS: 500, Node: "n1", Config: 9})
	f.Add(mark.Bytes())
	writeFrame(&fence, typeFence, request{TimeoutMS: 500, Term: 4})
	f.Add(fence.Bytes())
	f.Add([]byte{protoVersion, typeApply, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2, typeRead, 0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req request
		if _, err := readFrame(bytes.NewReader(b), &req, nil); err == nil && len(b) > frameHeader+maxFrame {
			t.Fatalf("a frame of %d bytes read", len(b))
		}
	})
}

// FuzzReadResponse: any bytes a peer answers with give a response or
// an error, never a panic or an allocation past maxFrame; a fencing
// reply's receipts stay within the frame.
func FuzzReadResponse(f *testing.F) {
	for _, r := range []response{
		{Beat: &beatReply{Epoch: 2, Live: true, Term: 3, Config: 9, Voters: []string{"n1", "n2", "n3"}, Fence: 3}},
		{Mark: &markReply{Fence: 3}},
		{Fence: &fenceReply{Receipts: map[string]fenceAge{"n1": {AgeNS: 1e8, Config: 9}, "n2": {AgeNS: -1}}}},
		{Err: &errInfo{Kind: "stale", Msg: "meta: stale"}},
	} {
		var b bytes.Buffer
		writeFrame(&b, typeOK, r)
		f.Add(b.Bytes())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var resp response
		if _, err := readFrame(bytes.NewReader(b), &resp, nil); err == nil && resp.Fence != nil && len(resp.Fence.Receipts) > maxFrame {
			t.Fatalf("%d receipts in a frame", len(resp.Fence.Receipts))
		}
	})
}

// FuzzDecodeLog: any bytes in the log file give an entry or an error.
func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(&raft.Log{Index: 3, Term: 2, Type: raft.LogCommand, Data: []byte("{}"), Extensions: []byte("e")}))
	f.Add(make([]byte, logHeader+8))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if decodeLog(b, &l) == nil {
			if got := encodeLog(&l); !bytes.Equal(got, b) {
				t.Fatalf("entry does not round-trip")
			}
		}
	})
}

// FuzzApply: any command bytes leave the state machine consistent, and
// a command of a client session applied twice changes the state once.
func FuzzApply(f *testing.F) {
	f.Add([]byte(`{"v":1,"op":"declare","name":"a.b","config":{"pattern":"tasks","max_attempts":-1},"home":"n1"}`))
	f.Add([]byte(`{"v":1,"op":"put-user","name":"u","password_hash":"x","set_tags":true,"tags":["administrator"]}`))
	f.Add([]byte(`{"v":1,"op":"rehome","name":"n1"}`))
	f.Add([]byte(`{"v":1,"op":"bump-epoch","name":"n1","epoch":1,"renewed":1}`))
	f.Add([]byte(`{"v":2,"op":"declare","name":"a.b","config":{"pattern":"pubsub"},"home":"n1","session":"n1/s","seq":1,"done":1}`))
	f.Add([]byte(`{"v":2,"op":"delete","name":"x","session":"n1/s","seq":2,"done":1}`))
	f.Add([]byte(`{"v":2,"op":"open-session","session":"n2/t"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fs := newFSM(nil, 1<<20)
		fs.Apply(&raft.Log{Index: 1, Data: []byte(`{"v":1,"op":"renew","name":"n1"}`)})
		fs.Apply(&raft.Log{Index: 2, Data: []byte(`{"v":2,"op":"open-session","session":"n1/s"}`)})
		fs.Apply(&raft.Log{Index: 3, Data: []byte(`{"v":2,"op":"declare","name":"x","config":{"pattern":"pubsub"},"home":"n1","session":"n1/s","seq":1,"done":1}`)})
		fs.Apply(&raft.Log{Index: 4, Data: b})
		once := fs.st.clone()
		fs.Apply(&raft.Log{Index: 5, Data: b})
		var c command
		if decodeCommand(b, &c) == nil && c.Session != "" && catalogOps[c.Op] {
			if !reflect.DeepEqual(once.Exchanges, fs.st.Exchanges) || !reflect.DeepEqual(once.Users, fs.st.Users) {
				t.Fatalf("a command of a session applied twice changed the state twice: %s", b)
			}
		}
		for name, ex := range fs.st.Exchanges {
			if name != ex.Name || !validName(name) || ex.Config.Pattern == "" {
				t.Fatalf("bad exchange %q: %+v", name, ex)
			}
		}
		snap, err := fs.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		g := newFSM(nil, 1<<20)
		if err := g.Restore(io.NopCloser(bytes.NewReader(snap.(snapshot)))); err != nil {
			t.Fatalf("a snapshot does not load: %v", err)
		}
		got, _ := json.Marshal(g.sessions)
		want, _ := json.Marshal(fs.sessions)
		if !bytes.Equal(got, want) {
			t.Fatalf("sessions after a restore: %s, want %s", got, want)
		}
	})
}
