package node

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/testutil"
)

// drain gets every message of queue, no-ack, and returns their bodies
// sorted.
func drain(t *testing.T, ch *amqp091.Channel, queue string) []string {
	t.Helper()
	var got []string
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			slices.Sort(got)
			return got
		}
		got = append(got, string(d.Body))
	}
}

// TestAMQPHeadersExchange: bindings to a headers exchange with x-match
// all, any, all-with-x and any-with-x and a void value select what
// queues receive from AMQP and Courier-native publishers alike; the
// bindings survive a restart, unbinding removes one, and a mandatory
// publication no binding admits is returned.
func TestAMQPHeadersExchange(t *testing.T) {
	dir := t.TempDir()
	start := func() (*Node, string) {
		t.Helper()
		n, err := Start(Config{DataDir: dir, Log: quiet, AMQP: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		return n, strings.Replace(n.AMQPURL(), "amqp://", "amqp://guest:guest@", 1) + "/"
	}
	n, url := start()
	c, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("docs", "headers", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	bindings := map[string]amqp091.Table{
		"reports":  {"x-match": "all", "format": "pdf", "type": "report"},
		"pdf-or-7": {"x-match": "any", "format": "pdf", "n": int32(7)},
		"has-lang": {"lang": nil},
		"tenant-a": {"x-match": "all-with-x", "x-tenant": "a"},
		"any-x":    {"x-match": "any-with-x", "x-tenant": "b", "zzz": "1"},
		"no-x":     {"x-match": "any", "x-tenant": "a"}, // x- left out: nothing to match, so nothing
	}
	for q, args := range bindings {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "ignored", "docs", false, args); err != nil {
			t.Fatalf("bind %s: %v", q, err)
		}
	}
	// Binding the same again changes nothing.
	if err := ch.QueueBind("reports", "", "docs", false, bindings["reports"]); err != nil {
		t.Fatal(err)
	}
	_, pch := amqpChannel(t, url)
	if err := pch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := pch.NotifyPublish(make(chan amqp091.Confirmation, 8))
	ctx := testutil.Context(t, 60*time.Second)
	publish := func(body string, h amqp091.Table) {
		t.Helper()
		if err := pch.PublishWithContext(ctx, "docs", "any.key", false, false, amqp091.Publishing{Headers: h, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		if c := testutil.Recv(t, confirms, 30*time.Second); !c.Ack {
			t.Fatalf("%s nacked", body)
		}
	}
	publish("pdf-report", amqp091.Table{"format": "pdf", "type": "report"})
	publish("pdf-log", amqp091.Table{"format": "pdf", "type": "log"})
	publish("seven", amqp091.Table{"n": int32(7)})
	publish("english", amqp091.Table{"lang": "en"})
	publish("tenant-a", amqp091.Table{"x-tenant": "a"})
	publish("tenant-b", amqp091.Table{"x-tenant": "b"})
	// A Courier-native publisher meets the same bindings.
	conn := n.Connect()
	ps, err := conn.PubSub(ctx, "docs")
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.PublishSync(ctx, courier.Message{Key: "k", Header: map[string]string{"format": "pdf", "type": "report"}, Body: []byte("native-report")}); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"reports":  {"native-report", "pdf-report"},
		"pdf-or-7": {"native-report", "pdf-log", "pdf-report", "seven"},
		"has-lang": {"english"},
		"tenant-a": {"tenant-a"},
		"any-x":    {"tenant-b"},
		"no-x":     nil,
	}
	for q, w := range want {
		if got := drain(t, ch, q); !slices.Equal(got, w) {
			t.Errorf("queue %s got %v, want %v", q, got, w)
		}
	}
	conn.Close()
	c.Close()
	n.Close()

	// After a restart, before anyone declares the exchange again, the
	// bindings hold for both kinds of publishers.
	n, url = start()
	defer n.Close()
	_, ch = amqpChannel(t, url)
	conn = n.Connect()
	defer conn.Close()
	ps, err = conn.PubSub(ctx, "docs")
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.PublishSync(ctx, courier.Message{Header: map[string]string{"format": "pdf", "type": "report"}, Body: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	if err := ps.PublishSync(ctx, courier.Message{Header: map[string]string{"format": "doc", "type": "report"}, Body: []byte("not-pdf")}); err != nil {
		t.Fatal(err)
	}
	if got := drain(t, ch, "reports"); !slices.Equal(got, []string{"after"}) {
		t.Fatalf("after the restart, reports got %v", got)
	}
	// Unbinding removes the binding; the queue takes nothing more.
	if err := ch.QueueUnbind("reports", "", "docs", bindings["reports"]); err != nil {
		t.Fatal(err)
	}
	if err := ps.PublishSync(ctx, courier.Message{Header: map[string]string{"format": "pdf", "type": "report"}, Body: []byte("unbound")}); err != nil {
		t.Fatal(err)
	}
	if got := drain(t, ch, "reports"); len(got) != 0 {
		t.Fatalf("reports got %v after the unbind", got)
	}
	if got := drain(t, ch, "pdf-or-7"); !slices.Equal(got, []string{"after", "unbound"}) {
		t.Fatalf("pdf-or-7 got %v", got)
	}

	// A mandatory publication no binding admits is returned.
	_, mch := amqpChannel(t, url)
	returns := mch.NotifyReturn(make(chan amqp091.Return, 1))
	if err := mch.PublishWithContext(ctx, "docs", "", true, false, amqp091.Publishing{Headers: amqp091.Table{"format": "txt"}, Body: []byte("nobody")}); err != nil {
		t.Fatal(err)
	}
	if r := testutil.Recv(t, returns, 30*time.Second); r.ReplyCode != amqp.NoRoute || string(r.Body) != "nobody" {
		t.Fatalf("return %+v", r)
	}

	// An x-match that is none of the four: 406.
	err = ch.QueueBind("has-lang", "", "docs", false, amqp091.Table{"x-match": "some"})
	wantAMQPCode(t, err, amqp.PreconditionFailed)
}

// TestAMQPHeadersBindingBounds: a queue holds at most 64 header
// bindings to one exchange; the 65th is 406, and the 64 hold.
func TestAMQPHeadersBindingBounds(t *testing.T) {
	_, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("h", "headers", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("many", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 64 {
		if err := ch.QueueBind("many", "", "h", false, amqp091.Table{"n": int32(i)}); err != nil {
			t.Fatalf("binding %d: %v", i, err)
		}
	}
	wantAMQPCode(t, ch.QueueBind("many", "", "h", false, amqp091.Table{"n": int32(64)}), amqp.PreconditionFailed)
	_, ch = amqpChannel(t, url)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 3))
	for _, n := range []int32{0, 63, 64} {
		if err := ch.PublishWithContext(testutil.Context(t, 30*time.Second), "h", "", false, false, amqp091.Publishing{Headers: amqp091.Table{"n": n}, Body: []byte{'a' + byte(n%26)}}); err != nil {
			t.Fatal(err)
		}
		if c := testutil.Recv(t, confirms, 30*time.Second); !c.Ack {
			t.Fatalf("publication %d nacked", n)
		}
	}
	// n=0 and n=63 are bound ('a', 'l'); n=64 was refused.
	if got := drain(t, ch, "many"); !slices.Equal(got, []string{"a", "l"}) {
		t.Fatalf("the queue got %q, want a and l", got)
	}
}

// TestAMQPHeadersTyped: a headers binding compares values by type, as
// RabbitMQ does: the binding int 7 takes int 7 of any width, not the
// string "7" nor the float 7; a Courier-native publication's headers are
// strings unless it types them with x-amqp-types. A consumer gets the
// headers back with their types.
func TestAMQPHeadersTyped(t *testing.T) {
	n, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("typed", "headers", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for q, v := range map[string]any{"int7": int32(7), "str7": "7", "yes": true} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		name := "n"
		if q == "yes" {
			name = "flag"
		}
		if err := ch.QueueBind(q, "", "typed", false, amqp091.Table{name: v}); err != nil {
			t.Fatal(err)
		}
	}
	_, pch := amqpChannel(t, url)
	publishConfirmedHeaders := func(body string, h amqp091.Table) {
		t.Helper()
		if err := pch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		dc, err := pch.PublishWithDeferredConfirmWithContext(testutil.Context(t, 30*time.Second), "typed", "", false, false, amqp091.Publishing{Headers: h, Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatalf("%s nacked", body)
		}
	}
	publishConfirmedHeaders("int32", amqp091.Table{"n": int32(7)})
	publishConfirmedHeaders("int64", amqp091.Table{"n": int64(7)})
	publishConfirmedHeaders("int8", amqp091.Table{"n": int8(7)})
	publishConfirmedHeaders("string", amqp091.Table{"n": "7"})
	publishConfirmedHeaders("float", amqp091.Table{"n": float64(7)})
	publishConfirmedHeaders("bool", amqp091.Table{"flag": true})
	publishConfirmedHeaders("bool-as-text", amqp091.Table{"flag": "true"})
	// A client's own x-amqp-types is not believed: the gateway sets it.
	publishConfirmedHeaders("spoofed", amqp091.Table{"n": "7", "x-amqp-types": `{"n":"int"}`})
	ctx := testutil.Context(t, 30*time.Second)
	conn := n.Connect()
	defer conn.Close()
	ps, err := conn.PubSub(ctx, "typed")
	if err != nil {
		t.Fatal(err)
	}
	for body, h := range map[string]map[string]string{
		"native":       {"n": "7"},
		"native-typed": {"n": "7", "x-amqp-types": `{"n":"int"}`},
	} {
		if err := ps.PublishSync(ctx, courier.Message{Header: h, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string][]string{
		"int7": {"int32", "int64", "int8", "native-typed"},
		"str7": {"native", "spoofed", "string"},
		"yes":  {"bool"},
	}
	for q, w := range want {
		if got := drain(t, ch, q); !slices.Equal(got, w) {
			t.Errorf("queue %s got %v, want %v", q, got, w)
		}
	}

	// The headers come back typed, without x-amqp-types.
	if _, err := ch.QueueDeclare("back", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := pch.PublishWithContext(ctx, "", "back", false, false, amqp091.Publishing{Headers: amqp091.Table{
		"i": int32(-3), "f": 2.5, "b": false, "s": "text", "x": []byte("raw")}}); err != nil {
		t.Fatal(err)
	}
	var d amqp091.Delivery
	testutil.WaitForf(t, 30*time.Second, func() bool {
		var ok bool
		d, ok, err = ch.Get("back", true)
		return err != nil || ok
	}, "the message in queue back")
	if err != nil {
		t.Fatal(err)
	}
	wantH := amqp091.Table{"i": int64(-3), "f": 2.5, "b": false, "s": "text", "x": []byte("raw")}
	if len(d.Headers) != len(wantH) {
		t.Fatalf("headers %#v, want %#v", d.Headers, wantH)
	}
	for k, v := range wantH {
		if got := d.Headers[k]; fmt.Sprintf("%T %v", got, got) != fmt.Sprintf("%T %v", v, v) {
			t.Errorf("header %s: %T %v, want %T %v", k, got, got, v, v)
		}
	}
}
