#!/usr/bin/env bash
# bench-cluster.sh [outdir] measures Courier and NATS clusters side by
# side on this machine, with a single Courier server as the baseline
# (docs/benchmarks.md "Cluster"):
#
#   1. a 3-node NATS cluster and a 3-node Courier cluster
#      (scripts/cluster.sh): request-response with the requester on node
#      A and the handler on node B, and with both on node A, sequential
#      and Parallel 100 (courier-bench cluster --cases
#      reqresp-cross,reqresp-same);
#   2. 5-node clusters: one publisher on node A, $SUBSCRIBERS subscribers
#      spread round-robin over the five, with each Courier node's link
#      counters over 20 publications (--cases fanout-spread);
#   2b. embedded: two node.Start nodes joined as a cluster in one
#      process, requester on one and handler on the other
#      (courier-bench reqresp --embedded-cross), and one embedded node
#      (--embedded), taking turns $ROUNDS times;
#   3. the idle cost: CPU and RSS of every server of an idle 3-node
#      cluster after $EXCHANGES exchanges (NATS: as many subscriptions)
#      (courier-bench idle).
#
# A courier built before the cluster landed has no --cluster flag: its
# cluster columns are then left out, with a line saying so, and the
# single server and NATS are measured alone. Every output goes to
# outdir (default ${TMPDIR:-/tmp}/courier-bench-cluster), with the
# machine, the versions and `uptime` before and after each run.
#
# Knobs: ROUNDS (5), FANOUT_ROUNDS (3), SUBSCRIBERS (10000), MESSAGES
# (200), EXCHANGES (10000), IDLE_WINDOW (30s), SINGLE_PORT (7400: the
# baseline server's client port; its HTTP port is SINGLE_HTTP, 7480),
# COURIER_ARGS (every Courier server's extra flags; default
# "--log-level warn --heartbeat 5s", see below), STEPS (default
# "reqresp embedded fanout idle").
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${TMPDIR:-/tmp}/courier-bench-cluster}
mkdir -p "$out"
out=$(cd "$out" && pwd)
ROUNDS=${ROUNDS:-5}
FANOUT_ROUNDS=${FANOUT_ROUNDS:-3}
SUBSCRIBERS=${SUBSCRIBERS:-10000}
MESSAGES=${MESSAGES:-200}
EXCHANGES=${EXCHANGES:-10000}
IDLE_WINDOW=${IDLE_WINDOW:-30s}
SINGLE_PORT=${SINGLE_PORT:-7400}
SINGLE_HTTP=${SINGLE_HTTP:-7480}
STEPS=${STEPS:-reqresp embedded fanout idle}
# Every Courier server (the cluster's nodes and the single one) gets
# these flags. --heartbeat 5s: 10,000 subscriber connections from one
# process on a loaded 2-core machine go silent for more than the
# default 3 x 1 s now and then, and are cut (NATS pings every 2 minutes).
export COURIER_ARGS=${COURIER_ARGS:---log-level warn --heartbeat 5s}
export CLUSTER_DIR=$out/clusters
export COURIER_BIN=$out/courier
bench=$out/courier-bench
cluster=$root/scripts/cluster.sh

(cd "$root" && go build -o "$COURIER_BIN" ./cmd/courier && go build -o "$bench" ./cmd/courier-bench)

single_pid=
cleanup() {
	# The steps run in a pipeline's subshell: the single server's pid is
	# in its file.
	if [ -s "$out/single/pid" ]; then kill "$(cat "$out/single/pid")" 2>/dev/null || true; fi
	"$cluster" stop nats >/dev/null 2>&1 || true
	"$cluster" stop courier >/dev/null 2>&1 || true
}
trap cleanup EXIT

has_cluster=0
if "$COURIER_BIN" server --help 2>&1 | grep -q -- '--cluster '; then has_cluster=1; fi

{
	echo "date: $(date -u +%FT%TZ)"
	echo "commit: $(git -C "$root" rev-parse --short HEAD)"
	echo "kernel: $(uname -r), cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
	echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "go: $(go version | awk '{print $3}')"
	echo "$(nats-server --version)"
	if [ "$has_cluster" = 1 ]; then echo "courier: with --cluster"; else echo "courier: no --cluster flag (built before the cluster): single server and NATS only"; fi
} | tee "$out/machine.txt"

# The single-node baseline, on its own ports, fresh for every step (a
# step's connections leave memory behind that the next step's figures
# would carry).
SINGLE=courier://127.0.0.1:$SINGLE_PORT
start_single() {
	rm -rf "$out/single"
	mkdir -p "$out/single"
	# shellcheck disable=SC2086
	setsid "$COURIER_BIN" server --listen "127.0.0.1:$SINGLE_PORT" --http "127.0.0.1:$SINGLE_HTTP" \
		--data "$out/single/data" $COURIER_ARGS >"$out/single/log" 2>&1 </dev/null &
	single_pid=$!
	echo "$single_pid" >"$out/single/pid"
	for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$SINGLE_PORT") 2>/dev/null && break; sleep 0.1; done
	echo "single Courier server (pid $single_pid): $COURIER_BIN server --listen 127.0.0.1:$SINGLE_PORT --http 127.0.0.1:$SINGLE_HTTP --data $out/single/data $COURIER_ARGS"
}
stop_single() {
	if [ -n "$single_pid" ]; then
		kill "$single_pid" 2>/dev/null || true
		for _ in $(seq 1 50); do kill -0 "$single_pid" 2>/dev/null || break; sleep 0.1; done
		single_pid=
		rm -f "$out/single/pid"
	fi
}

start_clusters() { # n
	start_single
	"$cluster" start nats "$1" | tee -a "$out/clusters.txt"
	if [ "$has_cluster" = 1 ]; then "$cluster" start courier "$1" | tee -a "$out/clusters.txt"; fi
}
stop_clusters() {
	"$cluster" stop nats
	"$cluster" stop courier
	stop_single
}

run() { # name, courier-bench args...
	local name=$1
	shift
	echo
	echo "== $name: courier-bench $*" | sed "s|$out/||g"
	echo "uptime before: $(uptime)"
	"$bench" "$@" 2>"$out/$name.log" | tee "$out/$name.txt" || true
	echo "uptime after: $(uptime)" | tee -a "$out/$name.txt"
}

courier_nodes() {
	if [ "$has_cluster" = 1 ]; then
		echo --courier-nodes "$("$cluster" urls courier)" --courier-http "$("$cluster" urls courier http)"
	fi
}

# shellcheck disable=SC2046
{
	for step in $STEPS; do
		case $step in
		reqresp)
			start_clusters 3
			run reqresp-3 cluster --cases reqresp-cross,reqresp-same --rounds "$ROUNDS" \
				--nats-nodes "$("$cluster" urls nats)" $(courier_nodes) --single "$SINGLE"
			stop_clusters
			;;
		embedded)
			for r in $(seq 1 "$ROUNDS"); do
				run "embedded-cross-$r" reqresp --embedded-cross --count 20000 --parallel 100
				run "embedded-one-$r" reqresp --embedded --count 20000 --parallel 100
			done
			;;
		fanout)
			start_clusters 5
			run fanout-5 cluster --cases fanout-spread --rounds "$FANOUT_ROUNDS" --subscribers "$SUBSCRIBERS" --messages "$MESSAGES" \
				--nats-nodes "$("$cluster" urls nats)" $(courier_nodes) --single "$SINGLE"
			stop_clusters
			;;
		idle)
			start_clusters 3
			run idle-nats-3 idle --target "$("$cluster" urls nats)" --exchanges "$EXCHANGES" --window "$IDLE_WINDOW" --baseline
			if [ "$has_cluster" = 1 ]; then
				run idle-courier-3 idle --url "$("$cluster" urls courier)" --exchanges "$EXCHANGES" --window "$IDLE_WINDOW" --baseline
			fi
			run idle-courier-single idle --url "$SINGLE" --exchanges "$EXCHANGES" --window "$IDLE_WINDOW" --baseline
			stop_clusters
			;;
		*)
			echo "bench-cluster.sh: unknown step $step (reqresp, embedded, fanout, idle)" >&2
			exit 2
			;;
		esac
	done
} 2>&1 | tee "$out/all.txt"
