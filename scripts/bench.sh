#!/usr/bin/env bash
# bench.sh BUILD_DIR - what `make bench` runs (no GPU): the heap's speed on
# the simulated device, then every bundled trace replayed (ratio, minimum
# capacity, ns per event), then the LD_PRELOAD path's CPU cost per
# cudaMalloc/cudaFree on the fake CUDA libraries (bench/bench_preload.c), and
# what one tensor costs on each way in, with the driver calls it makes, beside
# the floor's (bench/bench_per_tensor.c), and the instructions one tensor
# costs on each way in (scripts/instructions.sh, where valgrind is installed),
# and the cache lines a cudaMalloc+cudaFree pair misses when the CPU's caches
# were emptied before each call, as Python empties them (scripts/cold_misses.sh).
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
echo
echo "== one tensor on each way in (bench/bench_per_tensor.c): ns and driver calls per allocation+free"
lib="$(pwd)/$build/libcuheap.so"
floor="$(pwd)/$build/floor"
for conf in vmm:1 vmm:0; do
    CUHEAP_CONF=$conf "$build/bench_per_tensor_sim" plugin
    CUHEAP_CONF=$conf "$build/bench_per_tensor" plugin "$lib"
done
FLOOR_ARENA=4G "$build/bench_per_tensor" plugin "$floor/libfloor_plugin.so"
LD_PRELOAD="$lib" "$build/bench_per_tensor" runtime
FLOOR_ARENA=4G LD_PRELOAD="$floor/libfloor_preload.so" "$build/bench_per_tensor" runtime
"$build/bench_per_tensor" --pairs 20000 runtime
echo
echo "== instructions per tensor on each way in (scripts/instructions.sh: callgrind, steady against the machine's noise)"
scripts/instructions.sh "$build"
echo
echo "== cache lines a pair misses under LD_PRELOAD, caches emptied before each call (scripts/cold_misses.sh)"
scripts/cold_misses.sh "$build"
