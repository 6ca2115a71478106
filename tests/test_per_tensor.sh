#!/usr/bin/env bash
# test_per_tensor.sh BUILD_DIR - what one tensor asks of the driver on each
# way into cuheap (issue 45), held by bench/bench_per_tensor.c on the fake
# driver, which counts every driver call: PyTorch's plugin entry points make
# no driver call per allocation+free once warm, whatever the size and
# whether vmm is on; cudaMalloc+cudaFree under LD_PRELOAD ask for the current
# context once each and never again for its device (cuCtxGetDevice), and
# make at most the device-wide fence and its query that cudaFree's promise
# costs; the floor (bench/torch/floor.h) asks for nothing but what its way in
# must. The program's own output is checked too: a line per size, and the
# simulated device's build. Plain build only (the sanitized run tests it too).
set -uo pipefail
build=${1:-build}
. "$(dirname "$0")/harness.sh"

bin=$build/bench_per_tensor
[ -x "$bin" ] || bin=build/bench_per_tensor
sim=$build/bench_per_tensor_sim
[ -x "$sim" ] || sim=build/bench_per_tensor_sim
lib=$(realpath build/libcuheap.so)
floor=$(realpath build/floor)
fake=$(realpath build/fake)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export FAKE_CUDA_CAPACITY=$((80 << 30))   # address space: blocks are never touched
export FLOOR_ARENA=4G
pairs=2000

# per NAME VAR=VALUE... -- ARGS: runs the benchmark; output in $TMP/NAME.out.
per() {
    local name=$1
    shift
    local vars=()
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    env LD_LIBRARY_PATH="$fake" "${vars[@]}" timeout 120 "$bin" --pairs $pairs "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    rc=$?
}

# calls NAME SIZE: the driver calls per pair the run printed for SIZE.
calls() {
    awk -v size="$2" '$0 ~ "^  " size " " { for (i = 1; i < NF; i++) if ($(i + 1) == "driver") print $i }' "$TMP/$1.out"
}

# calls_of NAME SIZE FUNCTION: the calls per pair of one driver function (0.00 if not shown).
calls_of() {
    local line
    line=$(grep "^  $2 " "$TMP/$1.out")
    [[ "$line" =~ $3\ ([0-9.]+) ]] && echo "${BASH_REMATCH[1]}" || echo 0.00
}

sizes=("512 B" "64 KiB" "1 MiB" "64 MiB" "mixed")

# all_sizes NAME TEST: TEST (an awk condition on x, the calls per pair) holds for every size.
all_sizes() {
    local s x
    for s in "${sizes[@]}"; do
        x=$(calls "$1" "$s")
        [ -n "$x" ] && awk -v x="$x" "BEGIN { exit !($2) }" || { echo "$s: ${x:-no line}"; return 1; }
    done
}

for conf in vmm:1 vmm:0; do
    per plugin-$conf CUHEAP_CONF=$conf -- plugin "$lib"
    if [ "$rc" -eq 0 ] && all_sizes plugin-$conf "x == 0" >"$TMP/why" 2>&1; then
        ok "plugin, $conf: no driver call per tensor once warm, every size"
    else
        not_ok "plugin, $conf: no driver call per tensor once warm, every size" "$(cat "$TMP/why" "$TMP/plugin-$conf.out" "$TMP/plugin-$conf.err")"
    fi
done

per preload LD_PRELOAD="$lib" -- runtime
check "LD_PRELOAD: a line per size" '[ "$rc" -eq 0 ] && [ "$(grep -c "ns/pair" "$TMP/preload.out")" -eq 5 ]'
device=ok
for s in "${sizes[@]}"; do
    [ "$(calls_of preload "$s" cuCtxGetDevice)" = 0.00 ] || device="$s: $(grep "^  $s " "$TMP/preload.out")"
done
if [ "$device" = ok ]; then
    ok "LD_PRELOAD: the current context's device is not asked for per cudaMalloc (a primary context is known)"
else
    not_ok "LD_PRELOAD: the current context's device is not asked for per cudaMalloc (a primary context is known)" "$device"
fi
# Small objects: cudaFree's fence once per many frees (heap_devicewide.c, the
# free slack), so about one call a pair, the current context; blocks: a fence
# and its query at every pair still.
small=$(calls preload "512 B")
if all_sizes preload "x <= 5" >"$TMP/why" 2>&1 && awk -v x="$small" 'BEGIN {exit !(x != "" && x <= 1.1)}'; then
    ok "LD_PRELOAD: at most 5 driver calls per cudaMalloc+cudaFree, and 512 B about one ($small): fences come per many small frees"
else
    not_ok "LD_PRELOAD: at most 5 driver calls per cudaMalloc+cudaFree, and 512 B about one ($small): fences come per many small frees" \
        "$(cat "$TMP/why" "$TMP/preload.out")"
fi

# Blocks: the fenced floor's three, a cuCtxGetCurrent (the hook's), the
# fence and its query; the query runs in the context the hook found current
# without asking again (cuh_cuda_assume_current).
blocks=ok
for s in "1 MiB" "64 MiB"; do
    x=$(calls preload "$s")
    awk -v x="$x" -v g="$(calls_of preload "$s" cuCtxGetCurrent)" 'BEGIN { exit !(x != "" && x <= 3.0 && g <= 1.0) }' ||
        blocks="$s: $(grep "^  $s " "$TMP/preload.out")"
done
if [ "$blocks" = ok ]; then
    ok "LD_PRELOAD: blocks make 3 driver calls a pair, one cuCtxGetCurrent (the fence's query does not ask again)"
else
    not_ok "LD_PRELOAD: blocks make 3 driver calls a pair, one cuCtxGetCurrent (the fence's query does not ask again)" "$blocks"
fi

per floor-plugin -- plugin "$floor/libfloor_plugin.so"
check "the floor's plugin: no driver call per tensor" '[ "$rc" -eq 0 ] && all_sizes floor-plugin "x == 0"'
per floor-preload LD_PRELOAD="$floor/libfloor_preload.so" -- runtime
check "the floor's preload: cudaGetDevice's one call per tensor and nothing else" \
    '[ "$rc" -eq 0 ] && all_sizes floor-preload "x == 1" && [ "$(calls_of floor-preload mixed cuCtxGetDevice)" = 1.00 ]'
per floor-preload-fenced LD_PRELOAD="$floor/libfloor_preload.so" FLOOR_FENCE=1 -- runtime
check "the fenced floor: cudaGetDevice's call, a device-wide record and its query per tensor" \
    '[ "$rc" -eq 0 ] && all_sizes floor-preload-fenced "x > 2.9 && x <= 3" &&
     [ "$(calls_of floor-preload-fenced "1 MiB" cuCtxRecordEvent)" = 1.00 ] &&
     [ "$(calls_of floor-preload-fenced "1 MiB" cuEventQuery)" = 1.00 ]'

timeout 120 "$sim" --pairs $pairs plugin >"$TMP/sim.out" 2>&1
check "the simulated device's build: no device call per tensor once warm" \
    '[ "$(grep -c "0.00 device calls" "$TMP/sim.out")" -eq 5 ]'

"$bin" --pairs 10 nonsense >"$TMP/usage.out" 2>&1
rc=$?
check "a bad way in is a usage error" '[ "$rc" -eq 2 ] && grep -q "usage: bench_per_tensor" "$TMP/usage.out"'

finish test_per_tensor
