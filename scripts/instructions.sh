#!/usr/bin/env bash
# instructions.sh BUILD_DIR [LIB...] - instructions one tensor costs the CPU on
# each way in, counted by valgrind's callgrind on the fake CUDA libraries: a
# figure that does not move with the machine's noise, for judging a change to
# the host-side path without a GPU (issue 45). For each way in (PyTorch's
# plugin entry points, and cudaMalloc/cudaFree under LD_PRELOAD) and each size
# of bench/bench_per_tensor.c (512 B, 64 KiB, 1 MiB, 64 MiB, the mixed live
# set): BUILD_DIR/libcuheap.so, every LIB given (another build of it, the
# library before a change say), and the floor (bench/torch/floor.h). The count
# is the slope between 4,000 and 8,000 pairs of 3 rounds each, so that
# start-up drops out; the loop's own instructions (about 30) and the fake
# driver's are in it. Part of `make bench` where valgrind is installed.
set -euo pipefail
build=${1:?usage: instructions.sh BUILD_DIR [LIB...]}
shift
cd "$(dirname "$0")/.."
build=$(cd "$build" && pwd)
command -v valgrind >/dev/null || { echo "valgrind not found: instruction counts skipped (apt-get install valgrind)"; exit 0; }
for f in "$build/bench_per_tensor" "$build/libcuheap.so" "$build/floor/libfloor_plugin.so" \
         "$build/floor/libfloor_preload.so" "$@"; do
    [ -e "$f" ] || { echo "instructions.sh: $f not found (make bench builds what is needed)" >&2; exit 2; }
done
export FAKE_CUDA_CAPACITY=$((80 << 30)) FLOOR_ARENA=4G   # address space only: no page moves, as on a GPU
# count WAY LIB SIZE PAIRS: instructions of one run
count() {
    local way=$1 lib=$2 size=$3 pairs=$4
    if [ "$way" = plugin ]; then
        valgrind --tool=callgrind --callgrind-out-file=/dev/null "$build/bench_per_tensor" --pairs "$pairs" \
            --size "$size" plugin "$lib" 2>&1
    else
        LD_PRELOAD="$lib" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$build/bench_per_tensor" \
            --pairs "$pairs" --size "$size" runtime 2>&1
    fi | awk '/Collected :|refs:/ { gsub(",", "", $NF); n = $NF } END { if (n == "") exit 1; print n }'
}
row() {
    local way=$1 name=$2 lib=$3 line="| $1 | $2 |"
    for size in 512 65536 1048576 67108864 0; do
        local a b
        a=$(count "$way" "$lib" "$size" 4000) && b=$(count "$way" "$lib" "$size" 8000) ||
            { echo "instructions.sh: callgrind failed on $name ($way, size $size)" >&2; exit 1; }
        line+=" $(( (b - a) / 12000 )) |"
    done
    echo "$line"
}
echo "instructions per allocation+free (callgrind on the fake driver; slope between 4,000 and 8,000 pairs)"
echo
echo "| way in | library | 512 B | 64 KiB | 1 MiB | 64 MiB | mixed |"
echo "|---|---|---|---|---|---|---|"
for way in plugin preload; do
    row "$way" "cuheap ($build/libcuheap.so)" "$build/libcuheap.so"
    for lib in "$@"; do
        row "$way" "$lib" "$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"
    done
    row "$way" floor "$build/floor/libfloor_$way.so"
done
# The fenced floor (FLOOR_FENCE=1): a device-wide record at each cudaFree, its query at the next cudaMalloc.
FLOOR_FENCE=1 row preload "floor, fenced" "$build/floor/libfloor_preload.so"
