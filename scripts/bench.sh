#!/usr/bin/env bash
# bench.sh BUILD_DIR - what `make bench` runs (no GPU): the heap's speed on
# the simulated device, then every bundled trace replayed (ratio, minimum
# capacity, ns per event). Machines are noisy: compare figures of one run.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
echo "== heap ($(nproc) cores, $(date -u +%Y-%m-%d))"
"$build/bench_heap"
echo
echo "== replay of bench/traces"
"$build/cuheap-replay" --min-capacity bench/traces/*.trace.gz
