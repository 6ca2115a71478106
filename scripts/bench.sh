#!/usr/bin/env bash
# bench.sh BUILD_DIR - what `make bench` runs (no GPU): the heap's speed on
# the simulated device, then every bundled trace replayed (ratio, minimum
# capacity, ns per event), then the LD_PRELOAD path's CPU cost per
# cudaMalloc/cudaFree on the fake CUDA libraries (bench/bench_preload.c).
# Machines are noisy: compare figures of one run.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
echo "== heap ($(nproc) cores, $(date -u +%Y-%m-%d))"
"$build/bench_heap"
echo
echo "== replay of bench/traces"
"$build/cuheap-replay" --min-capacity bench/traces/*.trace.gz
echo
echo "== LD_PRELOAD path on the fake CUDA libraries (traces recorded without PyTorch's cache)"
export FAKE_CUDA_CAPACITY=$((80 << 30))   # address space only: the blocks are never touched
for trace in bench/traces/nocache/*.trace.gz; do
    "$build/bench_preload" "$trace"
    LD_PRELOAD="$(pwd)/$build/libcuheap.so" "$build/bench_preload" "$trace"
    LD_PRELOAD="$(pwd)/$build/libcuheap.so" "$build/bench_preload" --streams 32 "$trace"
done
