#!/usr/bin/env bash
# test_preload_faults.sh BUILD_DIR - under LD_PRELOAD, a driver call cuheap
# makes on a program's behalf fails (the fake driver's fault plan,
# tests/fake/fake_faults.c), and the program gets the error CUDA itself would
# have given for its call: for every hooked allocation entry point (runtime
# and driver, device and pinned memory, plain segments and virtual memory),
# a sticky error (an illegal address: 700) comes back as itself, and any
# other failure of an allocation as out of memory (2) with cuheap's message
# on stderr naming the driver call that failed. A free whose fence the driver
# refuses still succeeds (cuheap falls back to fencing stream by stream); one
# that meets a sticky error gets it. After a sticky error every call gets it,
# even one cuheap's caches could serve.
# One process per case (tests/preload/fault_checks.c).
set -uo pipefail
build=${1:-build}
. "$(dirname "$0")/harness.sh"

. "$(dirname "$0")/preload_lib.sh"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cuh_test_preload_faults.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

# case ENTRY PLAN CONF WANT [STDERR-TEXT]
case_() {
    local entry=$1 plan=$2 conf=$3 want=$4 text=${5:-}
    local out
    out=$(env "${san_env[@]}" CUHEAP_CONF="$conf" LD_PRELOAD="$preload_list" timeout 60 \
          "$programs/fault_checks" "$entry" "$plan" 2>"$TMP/err")
    local name="$entry with $plan${conf:+ ($conf)} gives $want"
    if [[ "$out" != "$entry -> $want ("* ]] || [[ "$out" == *"(0 driver calls failed"* ]]; then
        not_ok "$name" "$out
$(cat "$TMP/err")"
    elif [ -n "$text" ] && ! grep -q -- "$text" "$TMP/err"; then
        not_ok "$name, stderr naming $text" "$(cat "$TMP/err")"
    else
        ok "$name"
    fi
}

for entry in cudaMalloc cudaMallocAsync cudaMallocPitch cuMemAlloc_v2 cuMemAllocAsync cuMemAllocPitch_v2; do
    case_ $entry "cuMemAlloc_v2%1=700" vmm:0 700
    case_ $entry "cuMemAlloc_v2%1=2" vmm:0 2 "out of memory"
    case_ $entry "cuMemAlloc_v2%1=1" vmm:0 2 "cuMemAlloc_v2(16777216 bytes) on device 0 failed"
    case_ $entry "cuMemCreate%1=2" vmm:1 2
    case_ $entry "cuMemMap%1=1" vmm:1 2 "cuMemMap("
    case_ $entry "cuMemSetAccess%1=700" vmm:1 700
done
for entry in cudaHostAlloc cudaMallocHost cuMemHostAlloc; do
    case_ $entry "cuMemHostAlloc%1=2" "" 2 "cuMemHostAlloc("
    case_ $entry "cuMemHostAlloc%1=700" "" 700
done
for entry in cudaFree cuMemFree_v2; do   # device-wide frees fence at once; a stream-ordered one, lazily
    case_ $entry "cuCtxRecordEvent%1=1" vmm:0 0 "device-wide fences turned off"
    case_ $entry "sticky@1=700" vmm:0 700
done
# Once a sticky error has struck, every later call gets it, even what
# cuheap's caches could serve without the driver (fault_checks' "after"
# entries make a call that meets the error first, then the one named).
# (an allocation's message may be held back: one a second at most)
for entry in cudaMalloc cuMemAlloc_v2; do
    case_ after-$entry "sticky@1=700" vmm:0 700
done
for entry in cudaFree cudaFreeAsync; do
    case_ after-$entry "sticky@1=700" vmm:0 700 "device 0 is lost (error 700"
done
finish test_preload_faults
