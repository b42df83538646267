#!/usr/bin/env bash
# bench-embedded.sh compares the embedded request-response benchmarks of
# the node package (BenchmarkRequestSequential and
# BenchmarkRequestParallel10, beside BenchmarkFloorSequential and
# BenchmarkFloorParallel10: the same shapes with bare channels, the
# ceiling of handing requests to a goroutine on this machine) at several
# git revisions, side by side: it
# builds each revision's test binary once, then runs them in turn, ROUNDS
# times over, and prints each figure's median and minimum. On a shared
# machine interleaved rounds are what makes two revisions comparable: the
# load moves during a run, and each revision meets it as often.
#
#   scripts/bench-embedded.sh                      # the working tree alone
#   scripts/bench-embedded.sh HEAD~5 HEAD          # two revisions
#   ROUNDS=6 BENCHTIME=1s CPUS=1,2 scripts/bench-embedded.sh v1 .
#
# "." is the working tree, uncommitted changes included. Knobs: ROUNDS
# (default 4), BENCHTIME (default 700ms, per benchmark and round), CPUS
# (GOMAXPROCS values, default 1,2), BENCH (the -test.bench pattern). It prints the load average at the end.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-4}
BENCHTIME=${BENCHTIME:-700ms}
CPUS=${CPUS:-1,2}
BENCH=${BENCH:-'(Request|Floor)(Sequential|Parallel10)$'}
revs=("$@")
[ ${#revs[@]} -eq 0 ] && revs=(.)
work=$(mktemp -d)
trap 'rm -rf "$work"; git -C "$root" worktree prune' EXIT

bins=()
for rev in "${revs[@]}"; do
	name=$(printf '%s' "$rev" | tr -c 'A-Za-z0-9._-' '_')
	[ "$rev" = . ] && name=worktree
	bin=$work/$name.test
	if [ "$rev" = . ]; then
		(cd "$root" && go test -c -o "$bin" ./node)
	else
		tree=$work/tree-$name
		git -C "$root" worktree add --detach -q "$tree" "$rev"
		(cd "$tree" && go test -c -o "$bin" ./node)
		git -C "$root" worktree remove --force "$tree"
	fi
	bins+=("$bin")
done

results=$work/results
for _ in $(seq "$ROUNDS"); do
	for bin in "${bins[@]}"; do
		"$bin" -test.run '^$' -test.bench "$BENCH" \
			-test.benchtime "$BENCHTIME" -test.cpu "$CPUS" |
			awk -v rev="$(basename "$bin" .test)" '/^Benchmark/ {print rev, $1, $3, $5}' >>"$results"
	done
done

# rev benchmark ns/op cpu-ns/op → the median and minimum of each.
sort -k2,2 -k1,1 "$results" | awk '
function isort(a, n,   i, j, v) {
	for (i = 2; i <= n; i++) {
		v = a[i]
		for (j = i - 1; j >= 1 && a[j] > v; j--) a[j+1] = a[j]
		a[j+1] = v
	}
}
function flush() {
	if (n == 0) return
	isort(ns, n); isort(cpu, n)
	med = (n % 2) ? ns[(n+1)/2] : (ns[n/2] + ns[n/2+1]) / 2
	cmed = (n % 2) ? cpu[(n+1)/2] : (cpu[n/2] + cpu[n/2+1]) / 2
	printf "%-30s %-24s ns/op median %6.0f min %6.0f  cpu-ns/op median %6.0f  = %8.0f cycles/s\n", key2, key1, med, ns[1], cmed, 1e9 / med
	n = 0; split("", ns); split("", cpu)
}
{
	if ($2 != key2 || $1 != key1) { flush(); key1 = $1; key2 = $2 }
	n++; ns[n] = $3; cpu[n] = $4
}
END { flush() }'
uptime
