#!/usr/bin/env bash
# bench-compare.sh runs courier-bench side by side against an embedded
# Courier node, a Courier server, NATS and RabbitMQ on this machine, and
# keeps every output in a results directory (default:
# ${TMPDIR:-/tmp}/courier-bench-results).
#
#   scripts/install-peers.sh     # once
#   scripts/bench-compare.sh [outdir]
#
# It starts the peers (scripts/peers.sh) and a `courier server` on
# 127.0.0.1:7400 when they are not running, and stops what it started.
# The benchmark and the brokers it started run at nice -10, the same for
# every target, so that other work on a shared machine disturbs them less.
# Knobs: REQRESP_ARGS, PUBSUB_MESSAGES (default 1000000), SMALL_MESSAGES
# (default 100000, the run RabbitMQ also takes part in), TIMEOUT, and
# NATS2 (the URL of a second nats-server, such as a newer release started
# as scripts/peers.sh describes, measured as "nats2"; NATS2_BIN is its
# binary, for the version).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${TMPDIR:-/tmp}/courier-bench-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$out/courier
benchbin=$out/courier-bench
TIMEOUT=${TIMEOUT:-5m}
PUBSUB_MESSAGES=${PUBSUB_MESSAGES:-1000000}
SMALL_MESSAGES=${SMALL_MESSAGES:-100000}
REQRESP_ARGS=${REQRESP_ARGS:-}
NATS=nats://127.0.0.1:4222
AMQP=amqp://guest:guest@127.0.0.1:5672/
COURIER=courier://127.0.0.1:7400

(cd "$root" && go build -o "$bin" ./cmd/courier && go build -o "$benchbin" ./cmd/courier-bench)

started_peers=0
status=$("$root/scripts/peers.sh" status)
if [[ $status != *"nats-server: running"* || $status != *"rabbitmq-server: running"* ]]; then
	"$root/scripts/peers.sh" start
	started_peers=1
fi
server_pid=
cleanup() {
	if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
	if [ "$started_peers" = 1 ]; then "$root/scripts/peers.sh" stop; fi
}
trap cleanup EXIT

if ! (exec 3<>/dev/tcp/127.0.0.1/7400) 2>/dev/null; then
	data=$(mktemp -d)
	setsid "$bin" server --listen 127.0.0.1:7400 --data "$data" --log-level warn >"$out/courier-server.log" 2>&1 </dev/null &
	server_pid=$!
	for _ in $(seq 1 50); do (exec 3<>/dev/tcp/127.0.0.1/7400) 2>/dev/null && break; sleep 0.1; done
fi

# The brokers get the benchmark's priority.
for port in 4222 5672 ${NATS2:+${NATS2##*:}}; do
	pid=$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2)
	if [ -n "$pid" ]; then renice -n -10 -p "$pid" >/dev/null; fi
done
[ -n "$server_pid" ] && renice -n -10 -p "$server_pid" >/dev/null

{
	echo "date: $(date -u +%FT%TZ)"
	echo "commit: $(git -C "$root" rev-parse --short HEAD)"
	dirty=$(git -C "$root" status --short --untracked-files=no | awk '{print $2}' | tr '\n' ' ')
	if [ -n "$dirty" ]; then echo "uncommitted changes built in: $dirty"; fi
	echo "kernel: $(uname -r), cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "go: $(go version | awk '{print $3}')"
	echo "$(nats-server --version)"
	if [ -n "${NATS2:-}" ]; then echo "nats2 at $NATS2: $("${NATS2_BIN:-nats-server}" --version)"; fi
	echo "rabbitmq-server: $(dpkg-query -W -f='${Version}' rabbitmq-server), erlang $(dpkg-query -W -f='${Version}' erlang-base)"
} | tee "$out/machine.txt"

run() { # name, courier-bench args...
	local name=$1
	shift
	echo
	echo "== $name: courier-bench $* (load average before: $(cut -d' ' -f1-3 /proc/loadavg))" | sed "s|$bin|courier|"
	nice -n -10 "$benchbin" "$@" --timeout "$TIMEOUT" 2>&1 | tee "$out/$name.txt" || true
	echo "(load average after: $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/$name.txt"
}

# shellcheck disable=SC2086
{
	run reqresp-embedded reqresp --embedded $REQRESP_ARGS
	run reqresp-courier reqresp --url "$COURIER" $REQRESP_ARGS
	run reqresp-nats reqresp --target "$NATS" $REQRESP_ARGS
	if [ -n "${NATS2:-}" ]; then run reqresp-nats2 reqresp --target "$NATS2" $REQRESP_ARGS; fi
	run reqresp-rabbitmq reqresp --target "$AMQP" $REQRESP_ARGS
	run pubsub-embedded pubsub --embedded --count "$PUBSUB_MESSAGES"
	run pubsub-courier pubsub --url "$COURIER" --count "$PUBSUB_MESSAGES"
	run pubsub-nats pubsub --target "$NATS" --count "$PUBSUB_MESSAGES"
	if [ -n "${NATS2:-}" ]; then run pubsub-nats2 pubsub --target "$NATS2" --count "$PUBSUB_MESSAGES"; fi
	run pubsub-small-embedded pubsub --embedded --count "$SMALL_MESSAGES"
	run pubsub-small-courier pubsub --url "$COURIER" --count "$SMALL_MESSAGES"
	run pubsub-small-nats pubsub --target "$NATS" --count "$SMALL_MESSAGES"
	if [ -n "${NATS2:-}" ]; then run pubsub-small-nats2 pubsub --target "$NATS2" --count "$SMALL_MESSAGES"; fi
	run pubsub-small-rabbitmq pubsub --target "$AMQP" --count "$SMALL_MESSAGES"
	run pubsub-fanin-courier pubsub --mode fanin --url "$COURIER" --count "$SMALL_MESSAGES"
	run pubsub-fanin-nats pubsub --mode fanin --target "$NATS" --count "$SMALL_MESSAGES"
	run users-courier users --url "$COURIER" --users 200 --ramp 50 --duration 15s --plot "$out/users-courier.svg"
	run users-nats users --target "$NATS" --users 200 --ramp 50 --duration 15s --plot "$out/users-nats.svg"
	run echo echo
	# One table with the ratios (the short form of the runs above).
	echo
	echo "== courier-bench compare (load average before: $(cut -d' ' -f1-3 /proc/loadavg))"
	nice -n -10 "$benchbin" compare --courier "$COURIER" --nats "$NATS" --amqp "$AMQP" --timeout "$TIMEOUT" 2>&1 | tee "$out/compare.txt" || true
} 2>&1 | tee "$out/all.txt"
