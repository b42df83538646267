#!/usr/bin/env bash
# bench-amqp.sh compares, side by side on this machine, RabbitMQ over
# AMQP 0-9-1, Courier's AMQP port, and Courier's own protocol (issue 16),
# with the same load generator (courier-bench; its amqp:// target is the
# same amqp091-go mapping for RabbitMQ and Courier):
#
#   reqresp   request-response, RPC through direct reply-to on AMQP
#             (amq.rabbitmq.reply-to): sequential and 10 in parallel
#   fanout    one publisher, 10 subscribers: a fanout exchange with an
#             exclusive auto-ack queue each on AMQP
#   tasks     durable 1 KB tasks, published with confirms, one consumer
#             with prefetch 100 acking each
#   backlog   publish two, receive and ack one, to a depth: the rate and
#             the server's RSS as the queue grows
#
#   scripts/install-peers.sh           # once: rabbitmq-server
#   scripts/bench-amqp.sh [outdir]
#
# It starts a `courier server` (client port 7420, AMQP 5682, management
# 7491, a fresh data directory) and RabbitMQ (scripts/peers.sh, AMQP on
# 5673, node amqpbench@localhost, its state under outdir) unless they
# already answer there, and stops what it started. The rounds alternate
# the order of the targets (round r starts with the r-th, cyclically); the
# table gives the median of the rounds with their range, the servers' CPU
# per operation and peak RSS during the run, and the load average before
# the runs. Every run's JSON stays in outdir (default:
# ${TMPDIR:-/tmp}/courier-bench-amqp).
#
# Knobs (environment): ROUNDS (3), CASES ("reqresp fanout tasks
# backlog"), REQRESP_COUNT (10000 cycles each, sequential and parallel),
# FANOUT_COUNT (20000 messages, times 10 subscribers), TASKS_COUNT
# (50000), BACKLOG_DEPTH (100000), TIMEOUT (5m a run), PROFILE (a case:
# record a 10 s CPU profile of the Courier server during its first
# Courier-AMQP run of that case, into outdir/<case>-courier-amqp.pprof),
# COURIER_BIN and BENCH_BIN (prebuilt binaries instead of building this
# tree), COURIER_PORT, COURIER_AMQP_PORT, COURIER_HTTP_PORT, RABBIT_PORT.
#
# Before and after a change: BEFORE_BIN=path/to/old/courier starts a
# second Courier server from that binary (client port COURIER_PORT+1,
# AMQP COURIER_AMQP_PORT+1, management COURIER_HTTP_PORT+1) and measures
# its AMQP port too, in the same rotation, as "Courier AMQP before";
# TARGETS picks the targets (default "rabbitmq courier-amqp courier",
# with courier-amqp-before added when BEFORE_BIN is set), such as
# TARGETS="courier-amqp courier-amqp-before" for the change alone.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${TMPDIR:-/tmp}/courier-bench-amqp}
mkdir -p "$out"
out=$(cd "$out" && pwd)
ROUNDS=${ROUNDS:-3}
CASES=${CASES:-reqresp fanout tasks backlog}
REQRESP_COUNT=${REQRESP_COUNT:-10000}
FANOUT_COUNT=${FANOUT_COUNT:-20000}
TASKS_COUNT=${TASKS_COUNT:-50000}
BACKLOG_DEPTH=${BACKLOG_DEPTH:-100000}
TIMEOUT=${TIMEOUT:-5m}
PROFILE=${PROFILE:-}
COURIER_PORT=${COURIER_PORT:-7420}
COURIER_AMQP_PORT=${COURIER_AMQP_PORT:-5682}
COURIER_HTTP_PORT=${COURIER_HTTP_PORT:-7491}
RABBIT_PORT=${RABBIT_PORT:-5673}

bin=${COURIER_BIN:-$out/courier}
benchbin=${BENCH_BIN:-$out/courier-bench}
if [ -z "${COURIER_BIN:-}" ]; then (cd "$root" && go build -o "$bin" ./cmd/courier); fi
if [ -z "${BENCH_BIN:-}" ]; then (cd "$root" && go build -o "$benchbin" ./cmd/courier-bench); fi

BEFORE_BIN=${BEFORE_BIN:-}
declare -A url=(
	[rabbitmq]="amqp://guest:guest@127.0.0.1:$RABBIT_PORT/"
	[courier-amqp]="amqp://guest:guest@127.0.0.1:$COURIER_AMQP_PORT/"
	[courier]="courier://127.0.0.1:$COURIER_PORT"
	[courier-amqp-before]="amqp://guest:guest@127.0.0.1:$((COURIER_AMQP_PORT + 1))/"
)
default_targets="rabbitmq courier-amqp courier"
if [ -n "$BEFORE_BIN" ]; then default_targets="$default_targets courier-amqp-before"; fi
read -r -a targets <<<"${TARGETS:-$default_targets}"
for t in "${targets[@]}"; do
	if [ -z "${url[$t]:-}" ]; then
		echo "bench-amqp.sh: unknown target $t (rabbitmq, courier-amqp, courier, courier-amqp-before)" >&2
		exit 1
	fi
	if [ "$t" = courier-amqp-before ] && [ -z "$BEFORE_BIN" ]; then
		echo "bench-amqp.sh: courier-amqp-before needs BEFORE_BIN" >&2
		exit 1
	fi
done
wants() { [[ " ${targets[*]} " == *" $1 "* ]]; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

peers() { # peers.sh with this script's RabbitMQ
	AMQP_PORT=$RABBIT_PORT RABBIT_NODE=amqpbench@localhost PEERS_DIR=$out/peers \
		"$root/scripts/peers.sh" "$@"
}

started_rabbit=0
server_pids=()
cleanup() {
	for pid in "${server_pids[@]}"; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ "$started_rabbit" = 1 ]; then peers stop rabbitmq >/dev/null || true; fi
}
trap cleanup EXIT

start_courier() { # binary, name, client port, AMQP port, management port
	local b=$1 name=$2 port=$3 amqp=$4 http=$5
	if port_open "$port"; then return; fi
	local data=$out/$name-data
	rm -rf "$data"
	"$b" server --listen "127.0.0.1:$port" --amqp "127.0.0.1:$amqp" \
		--http "127.0.0.1:$http" --data "$data" --log-level warn \
		>"$out/$name-server.log" 2>&1 </dev/null &
	server_pids+=($!)
	for _ in $(seq 1 100); do
		port_open "$port" && port_open "$amqp" && break
		sleep 0.1
	done
	if ! port_open "$amqp"; then
		echo "bench-amqp.sh: $name server did not start; see $out/$name-server.log" >&2
		exit 1
	fi
}

if wants rabbitmq && ! port_open "$RABBIT_PORT"; then
	peers start rabbitmq
	started_rabbit=1
fi
start_courier "$bin" courier "$COURIER_PORT" "$COURIER_AMQP_PORT" "$COURIER_HTTP_PORT"
if [ -n "$BEFORE_BIN" ]; then
	start_courier "$BEFORE_BIN" courier-before $((COURIER_PORT + 1)) $((COURIER_AMQP_PORT + 1)) $((COURIER_HTTP_PORT + 1))
fi

{
	echo "date: $(date -u +%FT%TZ)"
	if [ -n "${COURIER_BIN:-}" ]; then
		echo "courier: $COURIER_BIN (prebuilt)"
	else
		echo "commit: $(git -C "$root" rev-parse --short HEAD)"
		dirty=$(git -C "$root" status --short --untracked-files=no | awk '{print $2}' | tr '\n' ' ')
		if [ -n "$dirty" ]; then echo "uncommitted changes built in: $dirty"; fi
	fi
	if [ -n "$BEFORE_BIN" ]; then echo "before: $BEFORE_BIN"; fi
	echo "targets: ${targets[*]}"
	echo "kernel: $(uname -r), cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
	echo "go: $(go version | awk '{print $3}')"
	echo "rabbitmq-server: $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo '?'), erlang $(dpkg-query -W -f='${Version}' erlang-base 2>/dev/null || echo '?')"
	echo "rounds: $ROUNDS; cases: $CASES; reqresp $REQRESP_COUNT cycles, fanout $FANOUT_COUNT messages x 10, tasks $TASKS_COUNT, backlog depth $BACKLOG_DEPTH"
} | tee "$out/machine.txt"

case_args() { # case: the courier-bench arguments of a case
	case $1 in
	reqresp) echo "reqresp --count $REQRESP_COUNT --parallel 10 --warmup 1000" ;;
	fanout) echo "pubsub --publishers 1 --subscribers 10 --count $FANOUT_COUNT" ;;
	tasks) echo "tasks --count $TASKS_COUNT" ;;
	backlog) echo "backlog --depth $BACKLOG_DEPTH --sample-every $((BACKLOG_DEPTH / 4))" ;;
	*)
		echo "bench-amqp.sh: unknown case $1" >&2
		return 1
		;;
	esac
}

target_args() { # target: how courier-bench names it
	case $1 in
	courier) echo "--url ${url[$1]}" ;;
	*) echo "--target ${url[$1]}" ;;
	esac
}

profiled=0
for r in $(seq 1 "$ROUNDS"); do
	dir=$out/round-$r
	mkdir -p "$dir"
	for c in $CASES; do
		n=${#targets[@]}
		for i in $(seq 0 $((n - 1))); do
			t=${targets[$(((r - 1 + i) % n))]}
			load=$(cut -d' ' -f1 /proc/loadavg)
			echo "round $r: $c on $t (load average $load)" >&2
			prof_pid=
			if [ "$c" = "$PROFILE" ] && [ "$t" = courier-amqp ] && [ "$profiled" = 0 ]; then
				curl -s -o "$out/$c-courier-amqp.pprof" \
					"http://127.0.0.1:$COURIER_HTTP_PORT/debug/pprof/profile?seconds=10" &
				prof_pid=$!
				profiled=1
			fi
			# shellcheck disable=SC2046
			if ! "$benchbin" $(case_args "$c") $(target_args "$t") --timeout "$TIMEOUT" --json \
				>"$dir/$c-$t.json" 2>"$dir/$c-$t.err"; then
				echo "  failed: $(tail -n 1 "$dir/$c-$t.err")" >&2
			fi
			echo "$load" >"$dir/$c-$t.load"
			if [ -n "$prof_pid" ]; then wait "$prof_pid" || true; fi
		done
	done
done

python3 "$root/scripts/bench-amqp-table.py" "$out" | tee "$out/table.txt"
