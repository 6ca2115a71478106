#!/usr/bin/env bash
# test_floor.sh BUILD_DIR - the floor (bench/torch/floor.h), the yardstick of
# the per-tensor benchmark, on the fake driver: as PyTorch's plugin
# (build/floor/libfloor_plugin.so, loaded with dlopen) and under LD_PRELOAD
# (build/floor/libfloor_preload.so, in front of the fake runtime), it hands
# out distinct, aligned blocks, serves freed ones again (last freed first),
# takes each device's arena once, refuses a double free, passes memory it did
# not hand out to CUDA, and says which setting to raise when its arena or its
# books run out or a setting is bad. Its declarations of CUDA's functions are
# checked against CUDA's headers where they are installed. The floor is not
# sanitized: the sanitized run tests the same plain build.
set -uo pipefail
build=${1:-build}
. "$(dirname "$0")/harness.sh"

floor=$build/floor
[ -e "$floor/libfloor_plugin.so" ] || floor=build/floor
plugin=$(realpath "$floor/libfloor_plugin.so")
preload=$(realpath "$floor/libfloor_preload.so")
program=$build/tests/preload/floor_checks
[ -x "$program" ] || program=build/tests/preload/floor_checks
fake=$(realpath build/fake)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# floor NAME MODE [VAR=VALUE...]: runs the checks' MODE; status in $rc,
# output in $TMP/NAME.out and $TMP/NAME.err. Plugin modes load the plugin,
# the others run under the preload.
floor() {
    local name=$1 mode=$2
    shift 2
    local args=("$mode") pre=()
    case "$mode" in
    plugin*) args+=("$plugin") ;;
    *) pre=(LD_PRELOAD="$preload") ;;
    esac
    # (in a subshell that keeps the shell's own "Aborted" notice out of the log)
    (env "${pre[@]}" LD_LIBRARY_PATH="$fake" "$@" timeout 60 "$program" "${args[@]}" >"$TMP/$name.out" \
        2>"$TMP/$name.err"; exit $?) 2>/dev/null
    rc=$?
}

# expect_ok NAME MODE DESCRIPTION: the run printed "ok MODE" and exited 0.
expect_ok() {
    if [ "$rc" -eq 0 ] && grep -qx "ok $2" "$TMP/$1.out"; then
        ok "$3"
    else
        not_ok "$3" "$(cat "$TMP/$1.out" "$TMP/$1.err")"
    fi
}

check "the plugin exports floor_alloc and floor_free and links no CUDA library" \
    '[ "$(nm -D --defined-only "$plugin" | awk "{print \$3}" | sort | tr "\n" " ")" = "floor_alloc floor_free " ] &&
     ! readelf -d "$plugin" | grep -q "libcud"'
check "the preload defines cudaMalloc and cudaFree only and links no CUDA library" \
    '[ "$(nm -D --defined-only "$preload" | awk "{print \$3}" | sort | tr "\n" " ")" = "cudaFree cudaMalloc " ] &&
     ! readelf -d "$preload" | grep -q "libcud"'

for way in plugin runtime; do
    floor $way $way FAKE_CUDA_DEVICES=2 FLOOR_ARENA=192M
    expect_ok $way $way "$way: distinct aligned blocks, reused last freed first, one arena per device, taken once"
    check "$way: a double free is refused in words" \
        'grep -q "refused: the block is free already (a double free)" "$TMP/$way.err"'
done

floor plugin-exhaust plugin-exhaust FLOOR_ARENA=8M
if [ "$rc" -eq 134 ] && ! grep -q FAIL "$TMP/plugin-exhaust.out" &&
    grep -q "refused: the arena is exhausted (0 of 8388608 bytes left uncut.*raise FLOOR_ARENA" "$TMP/plugin-exhaust.err" &&
    grep -q "no way to refuse: the process stops" "$TMP/plugin-exhaust.err"; then
    ok "plugin: an exhausted arena stops the process after 8 blocks of 1 MiB, naming FLOOR_ARENA"
else
    not_ok "plugin: an exhausted arena stops the process after 8 blocks of 1 MiB, naming FLOOR_ARENA" \
        "rc=$rc $(cat "$TMP/plugin-exhaust.out" "$TMP/plugin-exhaust.err")"
fi

floor runtime-exhaust runtime-exhaust FLOOR_ARENA=8M
expect_ok runtime-exhaust runtime-exhaust "runtime: an exhausted arena answers cudaMalloc with out of memory after 8 blocks"
check "runtime: ... and says to raise FLOOR_ARENA" \
    'grep -q "cudaMalloc(1048576 bytes) on device 0 refused: the arena is exhausted.*raise FLOOR_ARENA" "$TMP/runtime-exhaust.err"'

floor blocks runtime-exhaust FLOOR_ARENA=64M FLOOR_BLOCKS=8
expect_ok blocks runtime-exhaust "runtime: out of blocks (FLOOR_BLOCKS) is out of memory too"
check "runtime: ... and says to raise FLOOR_BLOCKS" \
    'grep -q "8 of FLOOR_BLOCKS=8 blocks cut.*raise FLOOR_BLOCKS" "$TMP/blocks.err"'

floor fenced runtime-fenced FLOOR_ARENA=64M FLOOR_FENCE=1
expect_ok fenced runtime-fenced "FLOOR_FENCE=1: cudaFree records a device-wide fence, cudaMalloc queries it and waits on the GPU while it runs"
floor unfenced runtime-unfenced FLOOR_ARENA=64M
expect_ok unfenced runtime-unfenced "FLOOR_FENCE unset: the floor makes no fence call"
floor fence-bad runtime FLOOR_ARENA=64M FLOOR_FENCE=yes
check "a bad FLOOR_FENCE is named, and no block is served" \
    'grep -q "FLOOR_FENCE=yes is not 0 or 1" "$TMP/fence-bad.err" && grep -q "cudaMalloc(1) on device 0 answered 1" "$TMP/fence-bad.out"'

floor bad runtime-exhaust FLOOR_ARENA=lots
check "a bad FLOOR_ARENA is named, and no block is served" \
    'grep -q "FLOOR_ARENA=lots is not a size" "$TMP/bad.err" && grep -q "refused block 0 with 2" "$TMP/bad.out"'

if [ -e /usr/local/cuda/include/cuda.h ]; then
    for way in plugin preload; do
        check "$way: its CUDA declarations agree with CUDA's headers" \
            'gcc -std=c11 -Wall -Wextra -Werror -DFLOOR_CUDA_HEADERS -I/usr/local/cuda/include -fsyntax-only \
                 bench/torch/floor_$way.c 2>"$TMP/headers.err" || { cat "$TMP/headers.err"; false; }'
    done
else
    echo "skip - CUDA's headers are not in /usr/local/cuda/include: the declarations are not compared"
fi

finish test_floor
