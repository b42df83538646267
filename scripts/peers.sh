#!/usr/bin/env bash
# peers.sh start|stop|status [nats|rabbitmq] runs the brokers Courier is
# measured against, on loopback only, with their state in a scratch
# directory:
#
#   nats-server      127.0.0.1:4222, JetStream on (-js); with
#                    NATS_MONITOR_PORT set (such as 8222), its monitoring
#                    endpoint (/varz, /connz) on 127.0.0.1 too
#   rabbitmq-server  127.0.0.1:5672 (AMQP), guest/guest; epmd and the
#                    Erlang distribution port also bound to 127.0.0.1
#
# Install them first with scripts/install-peers.sh. The state lives in
# $PEERS_DIR (default: ${TMPDIR:-/tmp}/courier-peers) and is deleted by
# stop. RabbitMQ runs as the invoking user (root here) with HOME pointed
# at the scratch directory, so it needs neither the rabbitmq user nor
# /var/lib/rabbitmq.
#
# NATS_BIN picks another nats-server binary, such as a newer one built with
# `GOBIN=/tmp/natsbin go install github.com/nats-io/nats-server/v2@latest`;
# run it beside Debian's with its own port and directory:
#
#   NATS_BIN=/tmp/natsbin/nats-server NATS_PORT=4223 \
#     PEERS_DIR=/tmp/courier-peers-nats2 scripts/peers.sh start nats
set -euo pipefail

PEERS_DIR=${PEERS_DIR:-${TMPDIR:-/tmp}/courier-peers}
NATS_BIN=${NATS_BIN:-nats-server}
NATS_PORT=${NATS_PORT:-4222}
NATS_MONITOR_PORT=${NATS_MONITOR_PORT:-}
AMQP_PORT=${AMQP_PORT:-5672}
RABBIT_NODE=${RABBIT_NODE:-courier-bench@localhost}
RABBIT_BIN=/usr/lib/rabbitmq/bin

# Loopback only, for epmd and the node's distribution listener too.
export ERL_EPMD_ADDRESS=127.0.0.1

rabbit_env() {
	export HOME="$PEERS_DIR/rabbitmq"
	export RABBITMQ_NODENAME="$RABBIT_NODE"
	export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	export RABBITMQ_NODE_PORT="$AMQP_PORT"
	export RABBITMQ_MNESIA_BASE="$PEERS_DIR/rabbitmq/mnesia"
	export RABBITMQ_LOG_BASE="$PEERS_DIR/rabbitmq/log"
	export RABBITMQ_PID_FILE="$PEERS_DIR/rabbitmq/rabbitmq.pid"
	export RABBITMQ_ENABLED_PLUGINS_FILE="$PEERS_DIR/rabbitmq/enabled_plugins"
	export RABBITMQ_CONFIG_FILE="$PEERS_DIR/rabbitmq/rabbitmq"
	export RABBITMQ_ADVANCED_CONFIG_FILE="$PEERS_DIR/rabbitmq/advanced.config"
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

port_open() { # port: is something listening on 127.0.0.1:port?
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

alive() { # pidfile
	[ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start_nats() {
	local dir="$PEERS_DIR/nats"
	if alive "$dir/nats.pid"; then
		echo "nats-server already running (pid $(cat "$dir/nats.pid"))"
		return
	fi
	if port_open "$NATS_PORT"; then
		echo "peers.sh: 127.0.0.1:$NATS_PORT is taken by another process" >&2
		return 1
	fi
	mkdir -p "$dir/jetstream"
	local monitor=()
	if [ -n "$NATS_MONITOR_PORT" ]; then monitor=(-m "$NATS_MONITOR_PORT"); fi # on -a's address
	setsid "$NATS_BIN" -js -a 127.0.0.1 -p "$NATS_PORT" "${monitor[@]}" -sd "$dir/jetstream" \
		-P "$dir/nats.pid" -l "$dir/nats.log" </dev/null &
	for _ in $(seq 1 100); do
		if port_open "$NATS_PORT"; then
			echo "nats-server $("$NATS_BIN" --version | awk '{print $2}') on 127.0.0.1:$NATS_PORT (pid $(cat "$dir/nats.pid"), log $dir/nats.log)"
			return
		fi
		sleep 0.1
	done
	echo "peers.sh: nats-server did not start; see $dir/nats.log" >&2
	return 1
}

start_rabbit() {
	rabbit_env
	local dir="$PEERS_DIR/rabbitmq"
	if alive "$RABBITMQ_PID_FILE"; then
		echo "rabbitmq-server already running (pid $(cat "$RABBITMQ_PID_FILE"))"
		return
	fi
	if port_open "$AMQP_PORT"; then
		echo "peers.sh: 127.0.0.1:$AMQP_PORT is taken by another process" >&2
		return 1
	fi
	mkdir -p "$dir/mnesia" "$dir/log"
	echo '[].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
	# Only the listener's address comes from the environment; keep the
	# rest at the defaults users benchmark with.
	: >"$RABBITMQ_CONFIG_FILE.conf"
	echo '[].' >"$RABBITMQ_ADVANCED_CONFIG_FILE"
	# setsid: the node and its epmd outlive this shell, in their own group.
	setsid "$RABBIT_BIN/rabbitmq-server" >"$dir/log/startup.log" 2>&1 </dev/null &
	# await_startup fails at once while the node is not yet up: retry.
	for _ in $(seq 1 120); do
		if "$RABBIT_BIN/rabbitmqctl" -n "$RABBIT_NODE" -q await_startup --timeout 5 >/dev/null 2>&1 &&
			port_open "$AMQP_PORT"; then
			echo "rabbitmq-server $("$RABBIT_BIN/rabbitmqctl" -n "$RABBIT_NODE" -q version 2>/dev/null) on 127.0.0.1:$AMQP_PORT (pid $(cat "$RABBITMQ_PID_FILE" 2>/dev/null), node $RABBIT_NODE, logs $dir/log)"
			return
		fi
		sleep 1
	done
	echo "peers.sh: rabbitmq-server did not start; see $dir/log" >&2
	tail -n 20 "$dir/log/startup.log" >&2 || true
	return 1
}

stop_nats() {
	local pidfile="$PEERS_DIR/nats/nats.pid"
	if alive "$pidfile"; then
		local pid
		pid=$(cat "$pidfile")
		kill "$pid"
		for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		echo "nats-server stopped"
	fi
	rm -rf "$PEERS_DIR/nats"
}

stop_rabbit() {
	rabbit_env
	if alive "$RABBITMQ_PID_FILE"; then
		local pid
		pid=$(cat "$RABBITMQ_PID_FILE")
		"$RABBIT_BIN/rabbitmqctl" -n "$RABBIT_NODE" -q shutdown >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
		for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
		echo "rabbitmq-server stopped"
	fi
	# The epmd the node started (ours, on loopback) goes with it, unless
	# another node still uses it.
	if command -v epmd >/dev/null 2>&1 && [ "$(epmd -names 2>/dev/null | grep -c '^name ')" = 0 ]; then
		epmd -kill >/dev/null 2>&1 || true
	fi
	rm -rf "$PEERS_DIR/rabbitmq"
}

status() {
	if alive "$PEERS_DIR/nats/nats.pid"; then echo "nats-server: running (pid $(cat "$PEERS_DIR/nats/nats.pid"))"; else echo "nats-server: stopped"; fi
	rabbit_env
	if alive "$RABBITMQ_PID_FILE"; then echo "rabbitmq-server: running (pid $(cat "$RABBITMQ_PID_FILE"))"; else echo "rabbitmq-server: stopped"; fi
}

what=${2:-all}
case "$what" in
all | nats | rabbitmq) ;;
*)
	echo "usage: $0 start|stop|status [nats|rabbitmq]" >&2
	exit 2
	;;
esac

case "${1:-}" in
start)
	if [ "$what" != rabbitmq ]; then
		command -v "$NATS_BIN" >/dev/null 2>&1 || { echo "peers.sh: $NATS_BIN missing: run scripts/install-peers.sh" >&2; exit 1; }
	fi
	if [ "$what" != nats ]; then
		command -v "$RABBIT_BIN/rabbitmq-server" >/dev/null 2>&1 || { echo "peers.sh: rabbitmq-server missing: run scripts/install-peers.sh" >&2; exit 1; }
	fi
	mkdir -p "$PEERS_DIR"
	if [ "$what" != rabbitmq ]; then start_nats; fi
	if [ "$what" != nats ]; then start_rabbit; fi
	;;
stop)
	if [ "$what" != rabbitmq ]; then stop_nats; fi
	if [ "$what" != nats ]; then stop_rabbit; fi
	rmdir "$PEERS_DIR" 2>/dev/null || true
	;;
status)
	status
	;;
*)
	echo "usage: $0 start|stop|status [nats|rabbitmq]" >&2
	exit 2
	;;
esac
