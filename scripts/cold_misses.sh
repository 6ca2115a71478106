#!/usr/bin/env bash
# cold_misses.sh BUILD_DIR [LIB...] - the cache lines one tensor's cudaMalloc
# and cudaFree miss under LD_PRELOAD when the CPU's caches were emptied
# before each call, as Python's interpreter empties them between two calls
# (issue 45): bench_per_tensor --cold under valgrind's cachegrind, with a
# last-level cache of 2 MiB that the 4 MiB sweep empties, on the fake CUDA
# libraries. Prints, per size, the last-level read and write misses a pair
# takes outside the benchmark's own loop (the sweep, the clock), for
# BUILD_DIR/libcuheap.so, each LIB (another build: the library before a
# change) and the floor (bench/torch/floor.h). A figure that does not move
# with the machine's noise, unlike the time of a cold pair.
set -euo pipefail
build=${1:?usage: cold_misses.sh BUILD_DIR [LIB...]}
shift
cd "$(dirname "$0")/.."
build=$(cd "$build" && pwd)
command -v valgrind >/dev/null || { echo "valgrind not found: cold misses skipped (apt-get install valgrind)"; exit 0; }
export FAKE_CUDA_CAPACITY=$((80 << 30)) FLOOR_ARENA=4G
pairs=1000
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# misses LIB SIZE: "reads writes" per pair outside bench_per_tensor.c and clock_gettime
misses() {
    LD_PRELOAD="$1" valgrind --tool=cachegrind --cache-sim=yes --LL=2097152,16,64 --cachegrind-out-file="$out" \
        "$build/bench_per_tensor" --pairs "$pairs" --size "$2" --cold 4096 runtime >/dev/null 2>&1 ||
        { echo "cold_misses.sh: cachegrind failed on $1 (size $2)" >&2; exit 1; }
    # events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw; fl= names the file, fn= the function
    awk -v n=$((pairs * 3 + pairs / 4 + 32)) '
        /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
        /^fl=/ { skip = ($0 ~ /bench_per_tensor\.c|clock_gettime|vdso/) }
        /^fn=/ { fskip = ($0 ~ /clock_gettime|now_ns|sweep/) }
        /^[0-9]/ { if (!skip && !fskip) { r += $(col["DLmr"] + 1); w += $(col["DLmw"] + 1) } }
        END { printf "%.1f %.1f", r / n, w / n }' "$out"
}
echo "last-level cache lines missed per cudaMalloc+cudaFree, the caches emptied before each call"
echo "(cachegrind, LL 2 MiB; reads + writes)"
echo
echo "| library | 512 B | 64 KiB | 1 MiB |"
echo "|---|---|---|---|"
row() {
    local name=$1 lib=$2 line="| $1 |" r w
    for size in 512 65536 1048576; do
        read -r r w <<<"$(misses "$lib" "$size")"
        line+=" $r + $w |"
    done
    echo "$line"
}
for lib in "$build/libcuheap.so" "$@" "$build/floor/libfloor_preload.so"; do
    row "$lib" "$lib"
done
# The fenced floor: a device-wide record at each free and its query at the next malloc.
FLOOR_FENCE=1 row "$build/floor/libfloor_preload.so, FLOOR_FENCE=1" "$build/floor/libfloor_preload.so"
