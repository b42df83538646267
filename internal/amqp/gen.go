//go:build ignore

// gen writes methods_gen.go from the table of AMQP 0-9-1 methods below
// (the classes and fields of RabbitMQ's amqp0-9-1.extended.xml).
// Run with: go generate ./internal/amqp
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"log"
	"os"
	"strings"
)

type method struct {
	name    string
	id      int
	content bool
	fields  []string // "name:type", type one of octet short long longlong shortstr longstr bit table
}

type class struct {
	name    string
	id      int
	methods []method
}

var classes = []class{
	{"connection", 10, []method{
		{"start", 10, false, []string{"version-major:octet", "version-minor:octet", "server-properties:table", "mechanisms:longstr", "locales:longstr"}},
		{"start-ok", 11, false, []string{"client-properties:table", "mechanism:shortstr", "response:longstr", "locale:shortstr"}},
		{"secure", 20, false, []string{"challenge:longstr"}},
		{"secure-ok", 21, false, []string{"response:longstr"}},
		{"tune", 30, false, []string{"channel-max:short", "frame-max:long", "heartbeat:short"}},
		{"tune-ok", 31, false, []string{"channel-max:short", "frame-max:long", "heartbeat:short"}},
		{"open", 40, false, []string{"virtual-host:shortstr", "reserved-1:shortstr", "reserved-2:bit"}},
		{"open-ok", 41, false, []string{"reserved-1:shortstr"}},
		{"close", 50, false, []string{"reply-code:short", "reply-text:shortstr", "class-id:short", "method-id:short"}},
		{"close-ok", 51, false, nil},
		{"blocked", 60, false, []string{"reason:shortstr"}},
		{"unblocked", 61, false, nil},
		{"update-secret", 70, false, []string{"new-secret:longstr", "reason:shortstr"}},
		{"update-secret-ok", 71, false, nil},
	}},
	{"channel", 20, []method{
		{"open", 10, false, []string{"reserved-1:shortstr"}},
		{"open-ok", 11, false, []string{"reserved-1:longstr"}},
		{"flow", 20, false, []string{"active:bit"}},
		{"flow-ok", 21, false, []string{"active:bit"}},
		{"close", 40, false, []string{"reply-code:short", "reply-text:shortstr", "class-id:short", "method-id:short"}},
		{"close-ok", 41, false, nil},
	}},
	{"exchange", 40, []method{
		{"declare", 10, false, []string{"reserved-1:short", "exchange:shortstr", "type:shortstr", "passive:bit", "durable:bit", "auto-delete:bit", "internal:bit", "no-wait:bit", "arguments:table"}},
		{"declare-ok", 11, false, nil},
		{"delete", 20, false, []string{"reserved-1:short", "exchange:shortstr", "if-unused:bit", "no-wait:bit"}},
		{"delete-ok", 21, false, nil},
		{"bind", 30, false, []string{"reserved-1:short", "destination:shortstr", "source:shortstr", "routing-key:shortstr", "no-wait:bit", "arguments:table"}},
		{"bind-ok", 31, false, nil},
		{"unbind", 40, false, []string{"reserved-1:short", "destination:shortstr", "source:shortstr", "routing-key:shortstr", "no-wait:bit", "arguments:table"}},
		{"unbind-ok", 51, false, nil},
	}},
	{"queue", 50, []method{
		{"declare", 10, false, []string{"reserved-1:short", "queue:shortstr", "passive:bit", "durable:bit", "exclusive:bit", "auto-delete:bit", "no-wait:bit", "arguments:table"}},
		{"declare-ok", 11, false, []string{"queue:shortstr", "message-count:long", "consumer-count:long"}},
		{"bind", 20, false, []string{"reserved-1:short", "queue:shortstr", "exchange:shortstr", "routing-key:shortstr", "no-wait:bit", "arguments:table"}},
		{"bind-ok", 21, false, nil},
		{"purge", 30, false, []string{"reserved-1:short", "queue:shortstr", "no-wait:bit"}},
		{"purge-ok", 31, false, []string{"message-count:long"}},
		{"delete", 40, false, []string{"reserved-1:short", "queue:shortstr", "if-unused:bit", "if-empty:bit", "no-wait:bit"}},
		{"delete-ok", 41, false, []string{"message-count:long"}},
		{"unbind", 50, false, []string{"reserved-1:short", "queue:shortstr", "exchange:shortstr", "routing-key:shortstr", "arguments:table"}},
		{"unbind-ok", 51, false, nil},
	}},
	{"basic", 60, []method{
		{"qos", 10, false, []string{"prefetch-size:long", "prefetch-count:short", "global:bit"}},
		{"qos-ok", 11, false, nil},
		{"consume", 20, false, []string{"reserved-1:short", "queue:shortstr", "consumer-tag:shortstr", "no-local:bit", "no-ack:bit", "exclusive:bit", "no-wait:bit", "arguments:table"}},
		{"consume-ok", 21, false, []string{"consumer-tag:shortstr"}},
		{"cancel", 30, false, []string{"consumer-tag:shortstr", "no-wait:bit"}},
		{"cancel-ok", 31, false, []string{"consumer-tag:shortstr"}},
		{"publish", 40, true, []string{"reserved-1:short", "exchange:shortstr", "routing-key:shortstr", "mandatory:bit", "immediate:bit"}},
		{"return", 50, true, []string{"reply-code:short", "reply-text:shortstr", "exchange:shortstr", "routing-key:shortstr"}},
		{"deliver", 60, true, []string{"consumer-tag:shortstr", "delivery-tag:longlong", "redelivered:bit", "exchange:shortstr", "routing-key:shortstr"}},
		{"get", 70, false, []string{"reserved-1:short", "queue:shortstr", "no-ack:bit"}},
		{"get-ok", 71, true, []string{"delivery-tag:longlong", "redelivered:bit", "exchange:shortstr", "routing-key:shortstr", "message-count:long"}},
		{"get-empty", 72, false, []string{"reserved-1:shortstr"}},
		{"ack", 80, false, []string{"delivery-tag:longlong", "multiple:bit"}},
		{"reject", 90, false, []string{"delivery-tag:longlong", "requeue:bit"}},
		{"recover-async", 100, false, []string{"requeue:bit"}},
		{"recover", 110, false, []string{"requeue:bit"}},
		{"recover-ok", 111, false, nil},
		{"nack", 120, false, []string{"delivery-tag:longlong", "multiple:bit", "requeue:bit"}},
	}},
	{"confirm", 85, []method{
		{"select", 10, false, []string{"nowait:bit"}},
		{"select-ok", 11, false, nil},
	}},
	{"tx", 90, []method{
		{"select", 10, false, nil},
		{"select-ok", 11, false, nil},
		{"commit", 20, false, nil},
		{"commit-ok", 21, false, nil},
		{"rollback", 30, false, nil},
		{"rollback-ok", 31, false, nil},
	}},
}

func camel(s string) string {
	var b strings.Builder
	for _, p := range strings.Split(s, "-") {
		switch p {
		case "id":
			b.WriteString("ID")
		case "ok":
			b.WriteString("OK")
		default:
			b.WriteString(strings.ToUpper(p[:1]) + p[1:])
		}
	}
	return b.String()
}

var goType = map[string]string{
	"octet": "uint8", "short": "uint16", "long": "uint32", "longlong": "uint64",
	"shortstr": "string", "longstr": "string", "bit": "bool", "table": "Table",
}

func main() {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("// Code generated by gen.go; DO NOT EDIT.\n\npackage amqp\n\n")
	p("// Class ids of AMQP 0-9-1.\nconst (\n")
	for _, c := range classes {
		p("\tClass%s = %d\n", camel(c.name), c.id)
	}
	p(")\n\n")
	for _, c := range classes {
		for _, m := range c.methods {
			tn := camel(c.name) + camel(m.name)
			full := c.name + "." + m.name
			p("// %s is %s (class %d, method %d).\ntype %s struct {\n", tn, full, c.id, m.id, tn)
			for _, f := range m.fields {
				n, t, _ := strings.Cut(f, ":")
				p("\t%s %s\n", camel(n), goType[t])
			}
			p("}\n\n")
			p("// ClassMethod returns %d, %d.\nfunc (*%s) ClassMethod() (uint16, uint16) { return %d, %d }\n\n", c.id, m.id, tn, c.id, m.id)
			p("// Name returns %q.\nfunc (*%s) Name() string { return %q }\n\n", full, tn, full)
			p("// HasContent reports whether a content header and body follow.\nfunc (*%s) HasContent() bool { return %v }\n\n", tn, m.content)
			genEncode(p, tn, m.fields)
			genDecode(p, tn, m.fields)
		}
	}
	p("func newMethod(class, method uint16) Method {\n\tswitch uint32(class)<<16 | uint32(method) {\n")
	for _, c := range classes {
		for _, m := range c.methods {
			p("\tcase %d<<16 | %d:\n\t\treturn new(%s)\n", c.id, m.id, camel(c.name)+camel(m.name))
		}
	}
	p("\t}\n\treturn nil\n}\n")
	src, err := format.Source(b.Bytes())
	if err != nil {
		os.WriteFile("methods_gen.go", b.Bytes(), 0o644)
		log.Fatal(err)
	}
	if err := os.WriteFile("methods_gen.go", src, 0o644); err != nil {
		log.Fatal(err)
	}
}

// bitRuns groups fields so that consecutive bits form one run.
func walk(fields []string, one func(name, typ string), bits func(names []string)) {
	for i := 0; i < len(fields); {
		n, t, _ := strings.Cut(fields[i], ":")
		if t != "bit" {
			one(camel(n), t)
			i++
			continue
		}
		var run []string
		for i < len(fields) {
			n, t, _ := strings.Cut(fields[i], ":")
			if t != "bit" {
				break
			}
			run = append(run, camel(n))
			i++
		}
		bits(run)
	}
}

func genEncode(p func(string, ...any), tn string, fields []string) {
	if len(fields) == 0 {
		p("func (*%s) encode(*encoder) {}\n\n", tn)
		return
	}
	p("func (m *%s) encode(e *encoder) {\n", tn)
	walk(fields, func(n, t string) {
		p("\te.%s(m.%s)\n", t, n)
	}, func(names []string) {
		p("\tvar bits uint8\n")
		for i, n := range names {
			p("\tif m.%s {\n\t\tbits |= 1 << %d\n\t}\n", n, i)
		}
		p("\te.octet(bits)\n")
	})
	p("}\n\n")
}

func genDecode(p func(string, ...any), tn string, fields []string) {
	if len(fields) == 0 {
		p("func (*%s) decode(*decoder) {}\n\n", tn)
		return
	}
	p("func (m *%s) decode(d *decoder) {\n", tn)
	walk(fields, func(n, t string) {
		p("\tm.%s = d.%s()\n", n, t)
	}, func(names []string) {
		p("\tbits := d.octet()\n")
		for i, n := range names {
			p("\tm.%s = bits&(1<<%d) != 0\n", n, i)
		}
	})
	p("}\n\n")
}
