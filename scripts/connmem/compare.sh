#!/bin/sh
# compare.sh runs connmem against two courier binaries in turn, over
# WebSocket and over TCP, each against a fresh server with a fresh data
# directory: the before and after of a change, on the same machine at
# the same time (docs/benchmarks.md, "Memory per connected user").
#
#	go build -o /tmp/courier-before ./cmd/courier   # at the commit before
#	go build -o /tmp/courier-after ./cmd/courier
#	go build -o /tmp/connmem ./scripts/connmem
#	sh scripts/connmem/compare.sh /tmp/courier-before /tmp/courier-after /tmp/connmem 10000
set -eu
before=$1 after=$2 connmem=$3 conns=${4:-2000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
date -u '+%F %H:%M UTC'
uptime
port=17500
for kind in ws tcp; do
	for bin in "$before" "$after"; do
		port=$((port + 2))
		http=$((port + 1))
		"$bin" server --data "$dir/d$port" --listen 127.0.0.1:$port --http 127.0.0.1:$http \
			--amqp off --heartbeat 30s >"$dir/server$port.log" 2>&1 &
		pid=$!
		url=courier://127.0.0.1:$port
		[ $kind = ws ] && url=ws://127.0.0.1:$http/ws
		# Wait for the management listener.
		i=0
		until curl -sf "http://127.0.0.1:$http/debug/pprof/" >/dev/null 2>&1; do
			i=$((i + 1))
			[ $i -lt 300 ] || { echo "server $bin did not start" >&2; kill $pid; exit 1; }
			sleep 0.1
		done
		echo "== $kind, $bin"
		"$connmem" --pid $pid --http 127.0.0.1:$http --url "$url" --conns "$conns" --heartbeat 30s | tail -3
		kill $pid
		wait $pid || true
	done
done
uptime
