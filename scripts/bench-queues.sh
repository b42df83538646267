#!/usr/bin/env bash
# bench-queues.sh runs the durable-queue scenarios, tasks and backlog,
# side by side against a Courier server, nats-server with JetStream and
# RabbitMQ on this machine, ROUNDS times over, and keeps every output in a
# results directory (default: ${TMPDIR:-/tmp}/courier-bench-queues).
#
#   scripts/install-peers.sh     # once
#   scripts/bench-queues.sh [outdir]
#
# It starts the peers (scripts/peers.sh, which honours PEERS_DIR,
# NATS_PORT, AMQP_PORT and RABBIT_NODE) and a fresh `courier server` on
# 127.0.0.1:$COURIER_PORT for each round, and stops what it started. Each
# run's output starts with the load average before it and ends with the
# one after. Knobs: ROUNDS (default 2), TASKS (tasks per tasks run,
# default 200000), DEPTH (backlog depth, default 1000000), SAMPLE_EVERY
# (default 50000), COURIER_PORT (default 7400), MAX_RSS_MB (backlog's
# --max-rss-mb, default 0: none), MEMORY_BUDGET (such as 64MiB: also a
# Courier server with --memory-budget set so, besides the default budget),
# LAZY=1 (also a RabbitMQ run with the queue in lazy mode, set by policy).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${TMPDIR:-/tmp}/courier-bench-queues}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$out/courier
benchbin=$out/courier-bench
ROUNDS=${ROUNDS:-2}
TASKS=${TASKS:-200000}
DEPTH=${DEPTH:-1000000}
SAMPLE_EVERY=${SAMPLE_EVERY:-50000}
MAX_RSS_MB=${MAX_RSS_MB:-0}
COURIER_PORT=${COURIER_PORT:-7400}
NATS_PORT=${NATS_PORT:-4222}
AMQP_PORT=${AMQP_PORT:-5672}
RABBIT_NODE=${RABBIT_NODE:-courier-bench@localhost}
export NATS_PORT AMQP_PORT RABBIT_NODE
NATS=nats://127.0.0.1:$NATS_PORT
AMQP=amqp://guest:guest@127.0.0.1:$AMQP_PORT/
COURIER=courier://127.0.0.1:$COURIER_PORT

(cd "$root" && go build -o "$bin" ./cmd/courier && go build -o "$benchbin" ./cmd/courier-bench)

started_peers=0
status=$("$root/scripts/peers.sh" status)
if [[ $status != *"nats-server: running"* || $status != *"rabbitmq-server: running"* ]]; then
	"$root/scripts/peers.sh" start
	started_peers=1
fi
server_pid=
data=
stop_server() {
	if [ -n "$server_pid" ]; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
		server_pid=
	fi
	if [ -n "$data" ]; then rm -rf "$data"; data=; fi
}
start_server() { # [server flags...]: a fresh Courier server with an empty data directory
	stop_server
	data=$(mktemp -d "${TMPDIR:-/tmp}/courier-bench-queues-data.XXXXXX")
	echo "courier server $* (data $data)" >>"$out/courier-server.log"
	"$bin" server --listen "127.0.0.1:$COURIER_PORT" --http off --data "$data" --log-level warn "$@" \
		>>"$out/courier-server.log" 2>&1 </dev/null &
	server_pid=$!
	for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$COURIER_PORT") 2>/dev/null && break; sleep 0.1; done
	renice -n -10 -p "$server_pid" >/dev/null || true
}
cleanup() {
	stop_server
	if [ "$started_peers" = 1 ]; then "$root/scripts/peers.sh" stop; fi
}
trap cleanup EXIT

# The brokers get the benchmark's priority.
for port in "$NATS_PORT" "$AMQP_PORT"; do
	pid=$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2)
	if [ -n "$pid" ]; then renice -n -10 -p "$pid" >/dev/null; fi
done

rabbitmqctl() { HOME="${PEERS_DIR:-${TMPDIR:-/tmp}/courier-peers}/rabbitmq" /usr/lib/rabbitmq/bin/rabbitmqctl -n "$RABBIT_NODE" "$@"; }

{
	echo "date: $(date -u +%FT%TZ)"
	echo "commit: $(git -C "$root" rev-parse --short HEAD) ($(git -C "$root" log -1 --format=%s | cut -c1-80))"
	dirty=$(git -C "$root" status --short --untracked-files=no | awk '{print $2}' | tr '\n' ' ')
	if [ -n "$dirty" ]; then echo "uncommitted changes built in: $dirty"; fi
	echo "kernel: $(uname -r), cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "disk: $(df -h "$out" | awk 'NR==2 {print $1", "$2" total, "$4" free"}')"
	# What one synchronous 4 KiB write costs on this disk: every broker
	# here confirms only after (group-)committing to it, or not.
	dd if=/dev/zero of="$out/dd.test" bs=4k count=500 oflag=dsync 2>&1 | tail -n1 | sed 's/^/dd 4 KiB oflag=dsync x500: /'
	dd if=/dev/zero of="$out/dd.test" bs=1M count=256 oflag=direct 2>&1 | tail -n1 | sed 's/^/dd 1 MiB oflag=direct x256: /'
	rm -f "$out/dd.test"
	echo "go: $(go version | awk '{print $3}')"
	echo "courier server: default --memory-budget (32 MiB; high watermark 40% of the machine)${MEMORY_BUDGET:+, and --memory-budget $MEMORY_BUDGET}"
	echo "$(nats-server --version) (JetStream: -js -sd, default sync_interval)"
	echo "rabbitmq-server: $(dpkg-query -W -f='${Version}' rabbitmq-server), erlang $(dpkg-query -W -f='${Version}' erlang-base)"
} | tee "$out/machine.txt"

run() { # name, courier-bench args...
	local name=$1
	shift
	echo
	echo "== $name: courier-bench $* (load average before: $(cut -d' ' -f1-3 /proc/loadavg))" | sed "s|$bin|courier|" | tee "$out/$name.txt"
	nice -n -10 "$benchbin" "$@" 2>&1 | tee -a "$out/$name.txt" || true
	echo "(load average after: $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/$name.txt"
}

backlog_args=(--depth "$DEPTH" --sample-every "$SAMPLE_EVERY" --max-rss-mb "$MAX_RSS_MB" --timeout 45m)

# Everything below goes to all.txt too; the runs stay in this shell, so
# that the trap stops the server they start.
exec > >(tee "$out/all.txt") 2>&1
for r in $(seq 1 "$ROUNDS"); do
	start_server
	run "tasks-courier-$r" tasks --url "$COURIER" --count "$TASKS"
	if [ -n "${MEMORY_BUDGET:-}" ]; then
		start_server --memory-budget "$MEMORY_BUDGET"
		run "tasks-courier-budget-$r" tasks --url "$COURIER" --count "$TASKS"
	fi
	run "tasks-nats-$r" tasks --target "$NATS" --count "$TASKS"
	run "tasks-rabbitmq-$r" tasks --target "$AMQP" --count "$TASKS"
	start_server
	run "backlog-courier-$r" backlog --url "$COURIER" "${backlog_args[@]}" --plot "$out/backlog-courier-$r.svg"
	if [ -n "${MEMORY_BUDGET:-}" ]; then
		start_server --memory-budget "$MEMORY_BUDGET"
		run "backlog-courier-budget-$r" backlog --url "$COURIER" "${backlog_args[@]}" --plot "$out/backlog-courier-budget-$r.svg"
	fi
	stop_server
	run "backlog-nats-$r" backlog --target "$NATS" "${backlog_args[@]}" --plot "$out/backlog-nats-$r.svg"
	run "backlog-rabbitmq-$r" backlog --target "$AMQP" "${backlog_args[@]}" --plot "$out/backlog-rabbitmq-$r.svg"
	if [ "${LAZY:-0}" = 1 ]; then
		rabbitmqctl set_policy bench-lazy '^bench\.' '{"queue-mode":"lazy"}' --apply-to queues >/dev/null
		run "tasks-rabbitmq-lazy-$r" tasks --target "$AMQP" --count "$TASKS"
		run "backlog-rabbitmq-lazy-$r" backlog --target "$AMQP" "${backlog_args[@]}" --plot "$out/backlog-rabbitmq-lazy-$r.svg"
		rabbitmqctl clear_policy bench-lazy >/dev/null
	fi
done
stop_server
run harness-tasks tasks --harness --count "$TASKS"
run harness-backlog backlog --harness --depth "$DEPTH" --sample-every "$SAMPLE_EVERY"
