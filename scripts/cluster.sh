#!/usr/bin/env bash
# cluster.sh start|stop|status|urls nats|courier [N] runs an N-node
# cluster of nats-server or of `courier server` on loopback, for the
# cluster benchmarks (docs/benchmarks.md "Cluster"). N is 3 by default,
# 1 to 9; state lives in $CLUSTER_DIR (default:
# ${TMPDIR:-/tmp}/courier-cluster) and stop deletes it.
#
# nats-server, node K (1..N):
#   client   127.0.0.1:$((NATS_BASE + K))        (default 4231, 4232, ...)
#   routes   127.0.0.1:$((NATS_ROUTE_BASE + K))  (default 6231, 6232, ...)
#   monitor  127.0.0.1:$((NATS_MONITOR_BASE + K)) (default 8231, 8232, ...)
#   nats-server -n nK -a 127.0.0.1 -p CLIENT -m MONITOR
#     --cluster_name $NATS_CLUSTER_NAME --cluster nats://127.0.0.1:ROUTE
#     --routes nats://127.0.0.1:<every other node's route port>
#   a full mesh of routes; start waits until every node has N-1 routes.
#   Core NATS only (no -js): the cluster benchmarks measure request-reply
#   and pub-sub.
#
# courier server, node K (the issue's flags; the ports as in the issue):
#   courier server --node nK --listen 127.0.0.1:74K0 --http 127.0.0.1:748K
#     --cluster 127.0.0.1:750K --join <the other nodes' cluster addresses>
#     --data $CLUSTER_DIR/courier/nK
#   start waits until every node lists every node alive and its links up
#   (GET /api/nodes).
#   With N=1 it starts one node without --cluster and --join: the
#   single-node baseline, started the same way. A courier built before
#   the cluster landed has no --cluster and --join: start says so (and
#   that N=1 still works) instead of starting nodes that cannot meet.
#   The courier binary is $COURIER_BIN, else one built from this
#   repository into $CLUSTER_DIR/bin (so it has this checkout's flags).
#
# urls prints the client URLs, comma-separated, for courier-bench
# (--subscriber-urls, --nats-nodes, --courier-nodes); `urls courier http`
# prints the management URLs (--nodes-http).
#
# Knobs: NATS_BIN, NATS_BASE, NATS_ROUTE_BASE, NATS_MONITOR_BASE,
# NATS_CLUSTER_NAME, COURIER_BIN, COURIER_BASE (7400: node K's client
# port is COURIER_BASE + 10K), COURIER_HTTP_BASE (7480: + K),
# COURIER_CLUSTER_BASE (7500: + K), COURIER_ARGS (extra flags for every
# node, such as "--log-level warn"), CLUSTER_DIR.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
CLUSTER_DIR=${CLUSTER_DIR:-${TMPDIR:-/tmp}/courier-cluster}
NATS_BIN=${NATS_BIN:-nats-server}
NATS_BASE=${NATS_BASE:-4230}
NATS_ROUTE_BASE=${NATS_ROUTE_BASE:-6230}
NATS_MONITOR_BASE=${NATS_MONITOR_BASE:-8230}
NATS_CLUSTER_NAME=${NATS_CLUSTER_NAME:-courier-bench}
COURIER_BIN=${COURIER_BIN:-}
COURIER_BASE=${COURIER_BASE:-7400}
COURIER_HTTP_BASE=${COURIER_HTTP_BASE:-7480}
COURIER_CLUSTER_BASE=${COURIER_CLUSTER_BASE:-7500}
COURIER_ARGS=${COURIER_ARGS:---log-level warn}

usage() {
	echo "usage: $0 start|stop|status|urls nats|courier [N]   (N: 1 to 9, default 3; urls courier http: management URLs)" >&2
	exit 2
}

port_open() { # port: is something listening on 127.0.0.1:port?
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

alive() { # pidfile
	[ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

# nodes prints the node numbers of a running or stopped cluster: those
# with a directory under $CLUSTER_DIR/$1.
nodes() {
	local d
	for d in "$CLUSTER_DIR/$1"/n[1-9]; do
		[ -d "$d" ] && echo "${d##*/n}"
	done
	return 0
}

nats_client() { echo $((NATS_BASE + $1)); }
nats_route() { echo $((NATS_ROUTE_BASE + $1)); }
nats_monitor() { echo $((NATS_MONITOR_BASE + $1)); }
courier_listen() { echo $((COURIER_BASE + 10 * $1)); }
courier_http() { echo $((COURIER_HTTP_BASE + $1)); }
courier_cluster() { echo $((COURIER_CLUSTER_BASE + $1)); }

check_free() { # what, ports...
	local what=$1 p
	shift
	for p in "$@"; do
		if port_open "$p"; then
			echo "cluster.sh: 127.0.0.1:$p ($what) is taken by another process" >&2
			return 1
		fi
	done
}

# nats_routes prints how many routes node K's monitor reports (0 if it
# does not answer; "?" without curl, when start waits for the client
# ports only).
nats_routes() {
	if ! command -v curl >/dev/null 2>&1; then
		echo "?"
		return
	fi
	curl -fsS --max-time 2 "http://127.0.0.1:$(nats_monitor "$1")/routez" 2>/dev/null |
		sed -n 's/.*"num_routes": *\([0-9]*\).*/\1/p' | head -n1 || true
}

start_nats() { # n
	local n=$1 k dir
	command -v "$NATS_BIN" >/dev/null 2>&1 || { echo "cluster.sh: $NATS_BIN missing: run scripts/install-peers.sh" >&2; exit 1; }
	if [ -n "$(nodes nats)" ]; then
		echo "cluster.sh: a NATS cluster is already here ($CLUSTER_DIR/nats): stop it first" >&2
		exit 1
	fi
	for k in $(seq 1 "$n"); do
		check_free "nats n$k" "$(nats_client "$k")" "$(nats_route "$k")" "$(nats_monitor "$k")"
	done
	for k in $(seq 1 "$n"); do
		dir="$CLUSTER_DIR/nats/n$k"
		mkdir -p "$dir"
		local routes=() j
		for j in $(seq 1 "$n"); do
			if [ "$j" != "$k" ]; then routes+=("nats://127.0.0.1:$(nats_route "$j")"); fi
		done
		local rflag=()
		if [ "${#routes[@]}" -gt 0 ]; then rflag=(--routes "$(IFS=,; echo "${routes[*]}")"); fi
		# setsid: the server outlives this shell, in its own group.
		setsid "$NATS_BIN" -n "n$k" -a 127.0.0.1 -p "$(nats_client "$k")" -m "$(nats_monitor "$k")" \
			--cluster_name "$NATS_CLUSTER_NAME" --cluster "nats://127.0.0.1:$(nats_route "$k")" "${rflag[@]}" \
			-P "$dir/pid" -l "$dir/log" </dev/null >/dev/null 2>&1 &
	done
	for _ in $(seq 1 300); do
		local ready=0
		for k in $(seq 1 "$n"); do
			local r
			r=$(nats_routes "$k")
			if port_open "$(nats_client "$k")" && { [ "$r" = "?" ] || [ "${r:-0}" -ge $((n - 1)) ]; }; then ready=$((ready + 1)); fi
		done
		if [ "$ready" = "$n" ]; then
			echo "nats-server $("$NATS_BIN" --version | awk '{print $2}'): $n nodes, cluster $NATS_CLUSTER_NAME, full mesh of routes"
			status_nats
			echo "urls: $(urls_nats)"
			return
		fi
		sleep 0.1
	done
	echo "cluster.sh: the NATS cluster did not form within 30s; logs in $CLUSTER_DIR/nats/n*/log" >&2
	status_nats >&2
	return 1
}

# courier_bin prints the courier binary to run, building it from this
# repository when COURIER_BIN is not set.
courier_bin() {
	if [ -n "$COURIER_BIN" ]; then
		echo "$COURIER_BIN"
		return
	fi
	mkdir -p "$CLUSTER_DIR/bin"
	(cd "$root" && go build -o "$CLUSTER_DIR/bin/courier" ./cmd/courier) >&2
	echo "$CLUSTER_DIR/bin/courier"
}

start_courier() { # n
	local n=$1 k dir bin help
	if [ -n "$(nodes courier)" ]; then
		echo "cluster.sh: a Courier cluster is already here ($CLUSTER_DIR/courier): stop it first" >&2
		exit 1
	fi
	bin=$(courier_bin)
	help=$("$bin" server --help 2>&1)
	local nameflag=--node
	if ! grep -q -- '--node ' <<<"$help"; then nameflag=--name; fi
	if [ "$n" -gt 1 ] && { ! grep -q -- '--cluster ' <<<"$help" || ! grep -q -- '--join ' <<<"$help"; }; then
		echo "cluster.sh: $bin server has no --cluster and --join flags: this build predates the cluster" >&2
		echo "cluster.sh: (issue 14), so its nodes cannot form one. Build a courier with the cluster, or" >&2
		echo "cluster.sh: start the single-node baseline: $0 start courier 1" >&2
		exit 1
	fi
	for k in $(seq 1 "$n"); do
		local ports=("$(courier_listen "$k")" "$(courier_http "$k")")
		if [ "$n" -gt 1 ]; then ports+=("$(courier_cluster "$k")"); fi
		check_free "courier n$k" "${ports[@]}"
	done
	for k in $(seq 1 "$n"); do
		dir="$CLUSTER_DIR/courier/n$k"
		mkdir -p "$dir/data"
		local args=("$nameflag" "n$k" --listen "127.0.0.1:$(courier_listen "$k")" --http "127.0.0.1:$(courier_http "$k")" --data "$dir/data")
		if [ "$n" -gt 1 ]; then
			local join=() j
			for j in $(seq 1 "$n"); do
				if [ "$j" != "$k" ]; then join+=("127.0.0.1:$(courier_cluster "$j")"); fi
			done
			args+=(--cluster "127.0.0.1:$(courier_cluster "$k")" --join "$(IFS=,; echo "${join[*]}")")
		fi
		# shellcheck disable=SC2086
		setsid "$bin" server "${args[@]}" $COURIER_ARGS </dev/null >"$dir/log" 2>&1 &
		echo $! >"$dir/pid"
		echo "$bin server ${args[*]} $COURIER_ARGS" >"$dir/cmd"
	done
	for _ in $(seq 1 300); do
		local ready=0
		for k in $(seq 1 "$n"); do
			if port_open "$(courier_listen "$k")" && port_open "$(courier_http "$k")"; then ready=$((ready + 1)); fi
			if ! alive "$CLUSTER_DIR/courier/n$k/pid"; then
				echo "cluster.sh: courier n$k exited; its log ($CLUSTER_DIR/courier/n$k/log):" >&2
				tail -n 20 "$CLUSTER_DIR/courier/n$k/log" >&2
				return 1
			fi
		done
		if [ "$ready" = "$n" ]; then
			echo "courier ($bin): $n node(s) listening"
			cat "$CLUSTER_DIR"/courier/n*/cmd
			if [ "$n" -gt 1 ]; then wait_courier_joined "$n" || return 1; fi
			status_courier
			echo "urls: $(urls_courier)"
			echo "http: $(urls_courier http)"
			return
		fi
		sleep 0.1
	done
	echo "cluster.sh: the Courier nodes did not listen within 30s; logs in $CLUSTER_DIR/courier/n*/log" >&2
	return 1
}

# courier_joined prints how many nodes node K's GET /api/nodes lists as
# alive and how many of its links are up, as "ALIVE UP" ("0 0" if it
# does not answer). Its own row lists a link to every other node, each
# other row its link to that node: all joined, that is N alive and
# 2(N-1) links up.
courier_joined() {
	local doc
	doc=$(curl -fsS --max-time 2 "http://127.0.0.1:$(courier_http "$1")/api/nodes" 2>/dev/null || true)
	echo "$(grep -o '"state": *"alive"' <<<"$doc" | wc -l) $(grep -o '"up": *true' <<<"$doc" | wc -l)"
}

# wait_courier_joined waits until every node sees every node alive and
# its links up (at most 60 s); without curl it says it cannot tell.
wait_courier_joined() { # n
	local n=$1 k
	if ! command -v curl >/dev/null 2>&1; then
		echo "(no curl: listening is not yet joined; see courier cluster status, or GET /api/nodes)"
		return 0
	fi
	for _ in $(seq 1 600); do
		local joined=0
		for k in $(seq 1 "$n"); do
			read -r a u <<<"$(courier_joined "$k")"
			if [ "$a" -ge "$n" ] && [ "$u" -ge $((2 * (n - 1))) ]; then joined=$((joined + 1)); fi
		done
		if [ "$joined" = "$n" ]; then
			echo "courier: $n nodes joined: each lists $n alive and its $((n - 1)) links up (GET /api/nodes)"
			return 0
		fi
		sleep 0.1
	done
	echo "cluster.sh: the Courier nodes did not all join within 60s; GET /api/nodes on each (alive, links up):" >&2
	for k in $(seq 1 "$n"); do echo "  n$k: $(courier_joined "$k")" >&2; done
	return 1
}

stop_cluster() { # nats|courier
	local what=$1 k pidfile pid
	for k in $(nodes "$what"); do
		pidfile="$CLUSTER_DIR/$what/n$k/pid"
		if alive "$pidfile"; then
			pid=$(cat "$pidfile")
			kill "$pid"
			for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
			echo "$what n$k stopped (pid $pid)"
		fi
	done
	rm -rf "${CLUSTER_DIR:?}/$what"
	if [ ! -d "$CLUSTER_DIR/nats" ] && [ ! -d "$CLUSTER_DIR/courier" ]; then
		rm -rf "${CLUSTER_DIR:?}/bin"
		rmdir "$CLUSTER_DIR" 2>/dev/null || true
	fi
}

status_nats() {
	local k any=0
	for k in $(nodes nats); do
		any=1
		local pidfile="$CLUSTER_DIR/nats/n$k/pid"
		if alive "$pidfile"; then
			echo "nats n$k: running (pid $(cat "$pidfile")), client 127.0.0.1:$(nats_client "$k"), routes 127.0.0.1:$(nats_route "$k") ($(nats_routes "$k") up), monitor http://127.0.0.1:$(nats_monitor "$k")"
		else
			echo "nats n$k: stopped"
		fi
	done
	if [ "$any" = 0 ]; then echo "nats: no cluster"; fi
}

status_courier() {
	local k any=0
	for k in $(nodes courier); do
		any=1
		local pidfile="$CLUSTER_DIR/courier/n$k/pid"
		if alive "$pidfile"; then
			echo "courier n$k: running (pid $(cat "$pidfile")), client 127.0.0.1:$(courier_listen "$k"), http 127.0.0.1:$(courier_http "$k"), log $CLUSTER_DIR/courier/n$k/log"
		else
			echo "courier n$k: stopped"
		fi
	done
	if [ "$any" = 0 ]; then echo "courier: no cluster"; fi
}

urls_nats() {
	local k out=()
	for k in $(nodes nats); do out+=("nats://127.0.0.1:$(nats_client "$k")"); done
	(IFS=,; echo "${out[*]}")
}

urls_courier() { # [http]
	local k out=()
	for k in $(nodes courier); do
		if [ "${1:-}" = http ]; then
			out+=("http://127.0.0.1:$(courier_http "$k")")
		else
			out+=("courier://127.0.0.1:$(courier_listen "$k")")
		fi
	done
	(IFS=,; echo "${out[*]}")
}

cmd=${1:-}
what=${2:-}
case "$what" in
nats | courier) ;;
*) usage ;;
esac

case "$cmd" in
start)
	n=${3:-3}
	[[ $n =~ ^[1-9]$ ]] || usage
	mkdir -p "$CLUSTER_DIR"
	"start_$what" "$n"
	;;
stop) stop_cluster "$what" ;;
status) "status_$what" ;;
urls) "urls_$what" "${3:-}" ;;
*) usage ;;
esac
