package node

import (
	"strings"
	"testing"
)

// TestPikaHeadersAndGet runs testdata/pika/headers_get.py, a pika
// program written as for RabbitMQ: a headers exchange with x-match all
// and any (a void value for presence), a mandatory publication
// returned, basic.get until get-empty, and an auto-delete queue gone
// with its consumer. Its output is RabbitMQ's for the same program.
func TestPikaHeadersAndGet(t *testing.T) {
	needPika(t)
	n, _ := amqpNode(t)
	_, port, _ := strings.Cut(n.AMQPAddr().String(), ":")
	cmd := tutorial(t, port, "../pika/headers_get.py")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("headers_get.py: %v\n%s", err, out)
	}
	want := ` [x] Sent 'report.pdf'
 [x] Sent 'notes.txt'
 [x] Sent 'alarm.pdf'
 [x] Returned 'lost.doc'
 [x] Got 'report.pdf' from pdfs, 1 left
 [x] Got 'alarm.pdf' from pdfs, 0 left
 [x] pdfs is empty
 [x] Got 'notes.txt' from tagged, 1 left
 [x] Got 'alarm.pdf' from tagged, 0 left
 [x] tagged is empty
 [x] Auto-delete queue gone: 404
`
	if string(out) != want {
		t.Fatalf("headers_get.py printed:\n%s\nwant:\n%s", out, want)
	}
}
