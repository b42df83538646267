#!/usr/bin/env bash
# install-peers.sh installs the brokers Courier is measured against —
# nats-server and rabbitmq-server — from Debian's packages, and prints
# their versions. It is idempotent: packages already installed are kept.
#
# Debian's rabbitmq-server package starts the service when it can (via
# systemd or invoke-rc.d). We do not want a broker on all interfaces, so
# the install runs with a policy-rc.d that forbids starting services, and
# any service started anyway is stopped; scripts/peers.sh starts both
# brokers on loopback only.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
	echo "install-peers.sh: run as root (apt-get install)" >&2
	exit 1
fi

need=()
for pkg in nats-server rabbitmq-server; do
	if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
		need+=("$pkg")
	fi
done

if [ "${#need[@]}" -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	policy=/usr/sbin/policy-rc.d
	had_policy=0
	if [ -e "$policy" ]; then had_policy=1; fi
	if [ "$had_policy" -eq 0 ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod +x "$policy"
		trap 'rm -f "$policy"' EXIT
	fi
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# A service the package scripts started anyway (no policy-rc.d honoured)
# would listen on every interface: stop it.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
	systemctl stop rabbitmq-server nats-server 2>/dev/null || true
	systemctl disable rabbitmq-server nats-server 2>/dev/null || true
fi

nats-server --version 2>&1 | head -n1
echo "rabbitmq-server: $(dpkg-query -W -f='${Version}' rabbitmq-server)"
echo "erlang: $(dpkg-query -W -f='${Version}' erlang-base 2>/dev/null || echo unknown)"
