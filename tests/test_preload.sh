#!/usr/bin/env bash
# test_preload.sh BUILD_DIR - LD_PRELOAD=libcuheap.so under CUDA programs, on
# a machine with no GPU: the programs in build/tests/preload run against a
# fake driver (build/fake/libcuda.so.1) and a fake runtime that reaches it as
# the real one does (build/fake/libcudart.so.13, or compiled into the program:
# the static runtime). Each program prints "ok MODE" or what failed; stderr
# carries cuheap's messages. Covered: allocations served by cuheap on every
# way in (runtime symbols, static runtime through dlsym + cuGetProcAddress,
# driver symbols, dlsym, cuGetProcAddress, cudaGetDriverEntryPoint); foreign
# memory passed through; double frees and inner pointers refused; zero sizes
# and alignment; out of memory (the error names the library holding memory);
# fork; IPC handles (a library named in ipc_callers gets them for its blocks;
# the report, written at exit without asking the device, names it and the
# program with the bytes each asked for); cudaFree's ordering against
# pretend kernels on a non-blocking stream; stream destruction; cudaMemGetInfo;
# cudaDeviceReset; two devices; peer access to virtual memory; pinned host
# memory (cudaHostAlloc & co. from cuheap's cache: flags, pass-through,
# cudaFreeHost's ordering, pinned:0); step plans from the steps found in a
# loop that marks none, blocks placed where freed ones were before their
# checks ran (step_plan:1); programs that use no CUDA.
#
# The sanitized run (BUILD_DIR build/san) preloads libasan and the sanitized
# library, build/san/libcuheap-asan.so (whose dlsym runs inside ASan's own
# start-up); the test programs are the plain ones.
set -uo pipefail
build=${1:-build}
. "$(dirname "$0")/harness.sh"

. "$(dirname "$0")/preload_lib.sh"
fake=$(realpath build/fake)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# preload NAME PROGRAM MODE [VAR=VALUE...]: runs PROGRAM MODE under the
# preload; status in $rc, output in $TMP/NAME.out and $TMP/NAME.err.
preload() {
    local name=$1 program=$2 mode=$3
    shift 3
    env LD_PRELOAD="$preload_list" "${san_env[@]}" LD_LIBRARY_PATH="$fake" "$@" timeout 120 "$programs/$program" "$mode" \
        >"$TMP/$name.out" 2>"$TMP/$name.err"
    rc=$?
}

# passes NAME MODE: the run NAME printed "ok MODE" and exited 0.
passes() {
    [ "$rc" -eq 0 ] && grep -qx "ok $2" "$TMP/$1.out"
}

# expect_pass NAME MODE DESCRIPTION
expect_pass() {
    if passes "$1" "$2"; then
        ok "$3"
    else
        not_ok "$3" "$(cat "$TMP/$1.out" "$TMP/$1.err")"
    fi
}

# ---- the programs are what they claim to be ------------------------------
check "the static-runtime program defines cudaMalloc inside itself and needs no libcudart" \
    '! nm -D "$programs/runtime_static" | grep -q cudaMalloc && ! readelf -d "$programs/runtime_static" | grep -q cudart'
check "the shared-runtime program takes cudaMalloc from libcudart.so.13" \
    'nm -D "$programs/runtime_shared" | grep -q " U cudaMalloc" && readelf -d "$programs/runtime_shared" | grep -q "libcudart.so.13"'

# ---- the runtime programs: shared runtime, then static runtime ------------
for runtime in shared static; do
    p=runtime_$runtime
    r="$runtime runtime"

    preload $p-threads $p threads
    expect_pass $p-threads threads "$r: 4 threads x 500 cudaMalloc/cudaFree served by cuheap, every block keeps its data"

    preload $p-entry $p entry-point
    expect_pass $p-entry entry-point "$r: cuMemAlloc/cuMemFree from cudaGetDriverEntryPoint served by cuheap"

    preload $p-pass $p pass-through
    expect_pass $p-pass pass-through "$r: managed memory and a driver allocation are freed by CUDA itself"

    preload $p-double $p double-free
    expect_pass $p-double double-free "$r: a double free and an inner pointer return 1, the heap carries on"
    check "$r: the double free is named on stderr" 'grep -q "double free" "$TMP/$p-double.err"'
    check "$r: the inner pointer is named on stderr" 'grep -q "inside a live block" "$TMP/$p-double.err"'

    preload $p-zero $p zero-and-alignment
    expect_pass $p-zero zero-and-alignment "$r: size 0 gives NULL, NULL ptr gives 1, blocks are 512-byte aligned"

    preload $p-oom $p out-of-memory FAKE_CUDA_CAPACITY=$((64 << 20))
    expect_pass $p-oom out-of-memory "$r: a request beyond the device returns 2 (cudaErrorMemoryAllocation)"
    check "$r: cuheap explains the out-of-memory on stderr" \
        'grep -q "cuheap: CUDA out of memory: out of memory on device 0" "$TMP/$p-oom.err"'
    check "$r: the out-of-memory names the program as holding its 3 MiB" \
        'grep -q "; device memory live by calling library (every device): $p 3.00 MiB$" "$TMP/$p-oom.err"'

    mkdir -p "$TMP/reports-$p"
    preload $p-fork $p fork CUHEAP_CONF="report:$TMP/reports-$p/r-%p.json"
    expect_pass $p-fork fork "$r: a forked child that uses no CUDA exits cleanly"
    parent=$(sed -n 's/^parent \([0-9]*\) child [0-9]*$/\1/p' "$TMP/$p-fork.out")
    check "$r: only the parent writes its report at exit (got: $(ls "$TMP/reports-$p" | tr '\n' ' '))" \
        '[ -n "$parent" ] && [ "$(ls "$TMP/reports-$p")" = "r-$parent.json" ]'

    preload $p-ipc $p ipc CUHEAP_CONF=vmm:0
    expect_pass $p-ipc ipc "$r: vmm:0: IPC handle for a block that starts its segment, refused inside one"
    check "$r: the refused IPC handle names ipc_safe on stderr" 'grep -q "ipc_safe" "$TMP/$p-ipc.err"'
    preload $p-ipc-vm $p ipc
    check "$r: vmm:1, the default: a block in the reservation gets no IPC handle, and stderr names ipc_callers and ipc_safe" \
        'grep -q "virtual memory.*ipc_callers.*ipc_safe:1" "$TMP/$p-ipc-vm.err" && ! grep -qx "ok ipc" "$TMP/$p-ipc-vm.out"'
    preload $p-late-stream $p new-stream-after-reuse
    expect_pass $p-late-stream new-stream-after-reuse \
        "$r: a stream created after a cudaFree'd block came back waits for the work that still used it"
    preload $p-capture $p capture
    expect_pass $p-capture capture "$r: in a graph capture, stream-ordered allocations go to CUDA and freed cuheap blocks are kept"
    check "$r: a cuheap block freed in a capture is reported on stderr" 'grep -q "graph capture" "$TMP/$p-capture.err"'
    preload $p-capfence $p capture-fences
    expect_pass $p-capfence capture-fences \
        "$r: no device-wide fence while a capture is underway (the capture ends whole), one a take-back before and after"
    preload $p-capwait $p capture-waits-for-fence
    expect_pass $p-capwait capture-waits-for-fence \
        "$r: a capture that begins during a device-wide fence's call waits for it to return (the capture ends whole)"
    preload $p-unseencap $p unseen-capture
    expect_pass $p-unseencap unseen-capture \
        "$r: a capture begun behind the hooks: the one device-wide fence that broke it is the last"
    check "$r: ... and stderr says so, naming the setting off" \
        'grep -q "device-wide fences turned off: cuCtxRecordEvent.*did not see" "$TMP/$p-unseencap.err"'
    preload $p-ipc-safe $p ipc-safe CUHEAP_CONF=ipc_safe:1
    expect_pass $p-ipc-safe ipc-safe "$r: with ipc_safe:1 every block, small ones too, gets a handle that names it"
    preload $p-ipc-callers $p ipc-callers NCCL_FAKE_LIB="$programs/libnccl_fake.so"
    expect_pass $p-ipc-callers ipc-callers \
        "$r: a library named libnccl* (its runtime compiled in) gets IPC handles for its blocks, the program not"
    preload $p-ipc-callers-vmm $p ipc-callers NCCL_FAKE_LIB="$programs/libnccl_fake.so" CUHEAP_CONF=vmm:1
    expect_pass $p-ipc-callers-vmm ipc-callers \
        "$r: with vmm:1 too: the library's blocks get plain segments of their own beside the reservation, the program's stay refused"
    check "$r: ... the program's block refused as one in virtual memory, naming ipc_callers" \
        'grep -q "lives in CUDA virtual memory.*ipc_callers" "$TMP/$p-ipc-callers-vmm.err"'
    preload $p-callers $p ipc-callers NCCL_FAKE_LIB="$programs/libnccl_fake.so" CUHEAP_CONF="report:$TMP/$p-callers.json"
    expect_pass $p-callers ipc-callers "$r: the same with a JSON report written at exit"
    check "$r: the report's callers: the library (2 allocations, peak 1 MiB + 1000 B) and the program, nothing live" \
        'python3 - "$TMP/$p-callers.json" "$p" <<'"'"'PY'"'"'
import json, sys
callers = {c["library"]: c for c in json.load(open(sys.argv[1]))["callers"]}
lib, prog = callers["libnccl_fake.so"], callers[sys.argv[2]]
assert (lib["allocs"], lib["peak"], lib["live"]) == (2, (1 << 20) + 1000, 0), lib
assert prog["allocs"] >= 2 and prog["peak"] >= 2 << 20 and prog["live"] == 0, prog
PY'
    check "$r: the report at exit did not ask the device how much is free, and says so" \
        'grep -q "\"device_memory\":{\"free\":0,\"total\":[0-9]*,\"free_unknown\":true}" "$TMP/$p-callers.json" &&
         "$build/cuheap-report" --text "$TMP/$p-callers.json" | grep -q "^  device: .*; free not asked (a report at exit makes no device call)$"'
    check "$r: cuheap-report renders the callers again (text, HTML), and its JSON is the file itself" \
        '"$build/cuheap-report" --text "$TMP/$p-callers.json" | grep -A4 "== device memory by caller (LD_PRELOAD) ==" | grep -q "^  libnccl_fake.so  *0 B  *1.00 MiB  *2$" &&
         "$build/cuheap-report" --json "$TMP/$p-callers.json" | cmp -s - "$TMP/$p-callers.json" &&
         "$build/cuheap-report" --html "$TMP/$p-callers.json" | grep -q "<section class=card id=callers>.*" &&
         "$build/cuheap-report" --html "$TMP/$p-callers.json" | grep -q "<tr><td>libnccl_fake.so</td><td>0 B</td>"'
    preload $p-ipc-callers-off $p ipc-callers NCCL_FAKE_LIB="$programs/libnccl_fake.so" CUHEAP_CONF=ipc_callers:none
    check "$r: with ipc_callers:none the library's block is refused, naming ipc_callers" \
        'grep -q "ipc_callers" "$TMP/$p-ipc-callers-off.err" && ! grep -qx "ok ipc-callers" "$TMP/$p-ipc-callers-off.out"'
    for conf in vmm:0 vmm:1; do
        preload $p-ipc-safe-off-$conf $p ipc-safe CUHEAP_CONF=$conf
        check "$r: $conf without ipc_safe:1: the same small blocks are refused, naming ipc_safe" \
            'grep -q "ipc_safe" "$TMP/$p-ipc-safe-off-$conf.err" && ! grep -qx "ok ipc-safe" "$TMP/$p-ipc-safe-off-$conf.out"'
    done

    preload $p-pinned $p pinned
    expect_pass $p-pinned pinned \
        "$r: cudaHostAlloc/cudaMallocHost (flags 0-3) served from cuheap's pinned cache, flags reach CUDA, write-combined and foreign pointers go to CUDA"
    preload $p-pinned-double $p pinned-double-free
    expect_pass $p-pinned-double pinned-double-free "$r: a double cudaFreeHost and an inner pointer return 1"
    check "$r: the pinned double free is named on stderr" 'grep -q "freed already" "$TMP/$p-pinned-double.err"'
    preload $p-pinned-order $p pinned-ordering
    expect_pass $p-pinned-order pinned-ordering \
        "$r: cudaFreeHost under a queued copy returns at once and the buffer is not handed out before the copy ran"
    preload $p-pinned-off $p pinned-off CUHEAP_CONF=pinned:0
    expect_pass $p-pinned-off pinned-off "$r: with pinned:0 every pinned allocation and free is CUDA's"

    preload $p-order $p free-ordering
    expect_pass $p-order free-ordering \
        "$r: cudaFree under a running kernel on a non-blocking stream: the block waits for it, then comes back"

    preload $p-steps $p steps-planned CUHEAP_CONF=step_plan:1,vmm_margin:0
    expect_pass $p-steps steps-planned \
        "$r: a loop that marks no steps gets a plan from the steps found, its checks seeing no later block's bytes"

    preload $p-destroy $p stream-destroy
    expect_pass $p-destroy stream-destroy \
        "$r: cudaStreamDestroy with a pending free; the block comes back once the work completes"

    preload $p-async-reuse $p async-reuse
    expect_pass $p-async-reuse async-reuse \
        "$r: cudaMallocAsync on stream B gets what cudaFreeAsync on A freed under a running kernel, B waiting for it on the GPU (reuse_across_streams:1, the LD_PRELOAD default)"
    preload $p-async-reuse-off $p async-reuse-off CUHEAP_CONF=reuse_across_streams:0
    expect_pass $p-async-reuse-off async-reuse-off \
        "$r: with reuse_across_streams:0 stream B does not get that memory before the kernel ran"
    preload $p-async-reuse-unset $p async-reuse CUHEAP_CONF=reuse_across_streams:0
    check "$r: the async-reuse check fails when the heap does not reuse (it can fail)" '! passes $p-async-reuse-unset async-reuse'

    preload $p-meminfo $p meminfo
    expect_pass $p-meminfo meminfo "$r: cudaMemGetInfo and cuMemGetInfo_v2 count cuheap's ready cache as free, once"

    preload $p-meminfo-fresh $p meminfo-right-after-free
    expect_pass $p-meminfo-fresh meminfo-right-after-free \
        "$r: cudaMemGetInfo right after cudaFree(64 MiB) with no GPU work counts the 64 MiB as free"

    preload $p-meminfo-off $p meminfo-uncached CUHEAP_CONF=meminfo_cached:0
    expect_pass $p-meminfo-off meminfo-uncached "$r: with meminfo_cached:0 cudaMemGetInfo is the device's own figure"

    preload $p-reset $p device-reset
    expect_pass $p-reset device-reset "$r: cudaDeviceReset drops the heap; cudaMalloc works after it"

    preload $p-peer $p peer-access FAKE_CUDA_DEVICES=2 CUHEAP_CONF=vmm:1
    expect_pass $p-peer peer-access \
        "$r: vmm:1 and cudaDeviceEnablePeerAccess: the peer gets the owner's mapped pages and those mapped later, one way"

    preload $p-two $p two-devices FAKE_CUDA_DEVICES=2
    expect_pass $p-two two-devices \
        "$r: two devices: cudaMalloc on the current one, cudaFree to the owner's heap, meminfo and reset per device"
done

# A non-blocking stream cuheap never heard of (made behind its back): the
# device-wide fences (cuCtxRecordEvent, cuCtxWaitEvent) cover it, so the
# kernel reading a freed block is never overtaken. The ordering check can
# fail: fenced stream by stream (a driver without those calls, or
# device_fences:0), the block goes to the next cudaMalloc while the kernel
# still reads it. (A static runtime's cudaFree synchronizes first.)
preload unseen-covered runtime_shared free-ordering-unseen-stream
expect_pass unseen-covered free-ordering-unseen-stream \
    "shared runtime: a stream cuheap never heard of is covered by the device-wide fences"
preload unseen runtime_shared free-ordering-unseen-stream FAKE_CUDA_NO_CTX_EVENTS=1
check "the ordering check sees corrupt bytes when the stream is unknown to cuheap and the driver has no device-wide events" \
    '[ "$rc" -ne 0 ] && grep -q "corrupt bytes: A was handed out again" "$TMP/unseen.out" && ! grep -q "device-wide fences turned off" "$TMP/unseen.err"'
preload unseen-df0 runtime_shared free-ordering-unseen-stream CUHEAP_CONF=device_fences:0
check "... and with device_fences:0" \
    '[ "$rc" -ne 0 ] && grep -q "corrupt bytes: A was handed out again" "$TMP/unseen-df0.out"'

# The service checks can fail: without the preload nothing reports to cuheap.
env LD_LIBRARY_PATH="$fake" "$programs/runtime_shared" threads >"$TMP/bare.out" 2>&1
rc=$?
check "without the preload the threads check fails, naming the missing library" \
    '[ "$rc" -ne 0 ] && grep -q "libcuheap.so not preloaded" "$TMP/bare.out"'

# ---- the driver program (linked with -lcuda) ------------------------------
preload drv-noctx driver_checks no-context
expect_pass drv-noctx no-context "driver: cuMemAlloc_v2 with no current context returns 201 and is not served"
preload drv-symbol driver_checks symbol
expect_pass drv-symbol symbol "driver: cuMemAlloc_v2/cuMemFree_v2 by symbol served by cuheap"
preload drv-dlsym driver_checks dlsym
expect_pass drv-dlsym dlsym "driver: cuMemAlloc_v2/cuMemFree_v2 through dlsym on libcuda.so.1 served by cuheap"
preload drv-proc driver_checks get-proc-address
expect_pass drv-proc get-proc-address \
    "driver: cuGetProcAddress(_v2) cuMemAlloc, and cuMemAllocAsync with the per-thread flag (_ptsz), served by cuheap"
preload drv-zero driver_checks zero-size
expect_pass drv-zero zero-size "driver: cuMemAlloc_v2(&d, 0) returns 1 (CUDA_ERROR_INVALID_VALUE)"
preload drv-oom driver_checks out-of-memory FAKE_CUDA_CAPACITY=$((64 << 20))
expect_pass drv-oom out-of-memory "driver: a request beyond the device returns 2 (CUDA_ERROR_OUT_OF_MEMORY)"
check "driver: cuheap explains the out-of-memory on stderr" 'grep -q "cuheap: CUDA out of memory" "$TMP/drv-oom.err"'
preload drv-pinned driver_checks pinned
expect_pass drv-pinned pinned \
    "driver: cuMemHostAlloc/cuMemAllocHost_v2/cuMemFreeHost by symbol served by cuheap, flags intact; no context: 201"

# ---- processes that never touch CUDA -------------------------------------
env LD_PRELOAD="$preload_list" "${san_env[@]}" LD_LIBRARY_PATH="$fake" /bin/true >"$TMP/true.out" 2>&1
rc=$?
check "/bin/true runs under the preload" '[ "$rc" -eq 0 ] && [ ! -s "$TMP/true.out" ]'
env LD_PRELOAD="$preload_list" "${san_env[@]}" LD_LIBRARY_PATH="$fake" LD_DEBUG=libs /bin/true >"$TMP/true-libs.out" 2>&1
check "/bin/true under the preload loads no libcuda.so.1" '! grep -q "calling init: .*libcuda.so" "$TMP/true-libs.out"'
env LD_PRELOAD="$preload_list" "${san_env[@]}" LD_LIBRARY_PATH="$fake" python3 -c 'import ctypes' >"$TMP/python.out" 2>&1
rc=$?
check "python3 -c 'import ctypes' runs under the preload" '[ "$rc" -eq 0 ] && [ ! -s "$TMP/python.out" ]'

preload rtld-next rtld_next ""
check "dlsym(RTLD_NEXT, ...) from a library answers relative to that library" \
    '[ "$rc" -eq 0 ] && grep -qx "ok rtld-next" "$TMP/rtld-next.out"'

preload no-cuda no_cuda ""
expect_pass no-cuda no-cuda "a program that calls dlsym but uses no CUDA does not get libcuda.so.1 loaded"
env LD_PRELOAD="$preload_list" "${san_env[@]}" LD_LIBRARY_PATH="$fake" python3 -c \
    'import ctypes; print("ok python" if "libcuda.so" not in open("/proc/self/maps").read() else "libcuda.so.1 loaded")' \
    >"$TMP/python-maps.out" 2>&1
rc=$?
expect_pass python-maps python "python3 -c 'import ctypes' does not get libcuda.so.1 loaded"

finish test_preload
