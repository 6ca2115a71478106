#!/usr/bin/env bash
# gpu-check.sh - tests cuheap on a real GPU (what `make gpu-check` runs).
#
# Run from anywhere on a machine with an NVIDIA GPU; argument 1 is the build
# directory (default: build). It shows the GPU and the driver, builds the
# library (make lib) and tests/gpu/gpu_check.cu against it with nvcc, runs
# gpu_check (1,000,000 stress operations), then runs it again under
# compute-sanitizer's memcheck with a smaller stress (when compute-sanitizer
# is installed); then, where PyTorch with CUDA is installed,
# tests/gpu/torch_checks.py and the training jobs of bench/torch (cuheap as
# PyTorch's pluggable allocator beside its native, expandable_segments and
# cudaMallocAsync modes), and cuheap with vmm:1 under a memory limit of
# 1.05x the job's peak live bytes beside the native allocator at that limit.
# It ends with a table. Every step is bounded; the whole takes about 12
# minutes on an H200 (GPU_PARTS runs parts of it; GPU_PARTS=api,preload with
# GPU_TORCH=0 about 30 seconds).
#
# Exit status: 0 only if every part passed.
#
# The LD_PRELOAD part builds tests/gpu/preload_stress.cu twice (nvcc's static
# runtime and -cudart shared), runs both under LD_PRELOAD=libcuheap.so (and
# under compute-sanitizer's memcheck; PRELOAD_MEMCHECK=0 skips that), once
# more with ipc_safe:1, where a child process must read and write every
# block through its IPC handle,
# and runs the training jobs with PyTorch's caching off (every tensor a
# cudaMalloc served by cuheap) and on, beside the native allocator.
#
# Environment: NVCC (compiler, default nvcc from PATH or
# /usr/local/cuda/bin/nvcc), GPU_ARCH (default sm_90), GPU_CHECK_OPS
# (default 1000000), SANITIZER_OPS (default 20000), PRELOAD_OPS (default
# 200000), GPU_TORCH=0 (skip the PyTorch parts), TORCH_STEPS (default 20),
# GPU_PARTS (default "api,preload,twogpu,torch,ddp": which parts to run;
# twogpu and ddp need two GPUs and are skipped on one), DDP_MODES (run_ddp.py modes), PRELOAD_JOBS
# (default resnet50,gpt2,bert_varlen) and PRELOAD_MODES (default
# native,preload,preload-caching; add native-again to judge losses that are
# not bitwise reproducible against two native runs), run_modes.py names.
set -euo pipefail

BUILD="${1:-build}"
GPU_PARTS="${GPU_PARTS:-api,preload,twogpu,torch,ddp}"
PRELOAD_OPS="${PRELOAD_OPS:-200000}"
part() { [[ ",$GPU_PARTS," == *",$1,"* ]]; }
GPU_ARCH="${GPU_ARCH:-sm_90}"
GPU_CHECK_OPS="${GPU_CHECK_OPS:-1000000}"
SANITIZER_OPS="${SANITIZER_OPS:-20000}"
MAIN_TIMEOUT=180          # seconds for the full run
SAN_TIMEOUT=240           # seconds for the memcheck run

cd "$(dirname "$0")/.."

section() { printf '\n== %s\n' "$*"; }

section "GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L
    echo "driver version: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u | paste -sd ' ')"
else
    echo "nvidia-smi not found"
fi

if [[ -n "${NVCC:-}" ]]; then
    :
elif command -v nvcc >/dev/null 2>&1; then
    NVCC="$(command -v nvcc)"
else
    NVCC=/usr/local/cuda/bin/nvcc
fi
if [[ ! -x "$NVCC" ]] && ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "gpu-check: nvcc not found (set NVCC or put it on PATH)" >&2
    exit 1
fi
echo "nvcc: $NVCC ($("$NVCC" --version | tail -n 1))"

section "build"
make lib BUILD="$BUILD"
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 -Iinclude tests/gpu/gpu_check.cu \
    "$BUILD"/libcuheap.a -ldl -lpthread -o "$BUILD"/gpu_check
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 -Iinclude tests/gpu/preload_stress.cu -ldl -lpthread \
    -o "$BUILD"/preload_stress_static
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 -cudart shared -Iinclude tests/gpu/preload_stress.cu -ldl -lpthread \
    -o "$BUILD"/preload_stress_shared
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 -Iinclude tests/gpu/two_gpus.cu -ldl -o "$BUILD"/two_gpus
echo "built $BUILD/gpu_check, $BUILD/preload_stress_static, $BUILD/preload_stress_shared"
PRELOAD="$(pwd)/$BUILD/libcuheap.so"

# Runs "$@" with its output on the terminal and in log file $1 (the first
# argument); sets RUN_RC and RUN_SECS.
run_logged() {
    local log="$1"
    shift
    local t0 t1
    t0=$(date +%s.%N)
    RUN_RC=0
    "$@" 2>&1 | tee "$log" || RUN_RC=$?
    t1=$(date +%s.%N)
    RUN_SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
}

# The last "gpu_check: ..." line of a log, or a word on why there is none.
verdict() {
    local log="$1" rc="$2" line
    line=$(grep -E '^(gpu_check|preload_stress): (all checks passed|FAILED)' "$log" | tail -n 1 || true)
    if [[ -n "$line" ]]; then
        echo "${line#*: }"
    elif [[ "$rc" == 124 || "$rc" == 137 ]]; then
        echo "timed out"
    else
        echo "no verdict (crashed?)"
    fi
}

# Every run adds a row to the summary table; FINAL_RC is the first failure.
ROWS=()
FINAL_RC=0
row() {   # row NAME RC SECONDS RESULT
    ROWS+=("| $1 | $2 | $3 | $4 |")
    if [[ "$2" != 0 && "$FINAL_RC" == 0 ]]; then FINAL_RC=$2; fi
}

SANITIZER=""
if command -v compute-sanitizer >/dev/null 2>&1; then
    SANITIZER="$(command -v compute-sanitizer)"
elif [[ -x "$(dirname "$NVCC")/compute-sanitizer" ]]; then
    SANITIZER="$(dirname "$NVCC")/compute-sanitizer"
elif [[ -x /usr/local/cuda/bin/compute-sanitizer ]]; then
    SANITIZER=/usr/local/cuda/bin/compute-sanitizer
fi
san_summary() { grep -E 'ERROR SUMMARY' "$1" | tail -n 1 | sed -E 's/^=+ *//' || true; }
# driver_probe NAME ROW: builds bench/gpu/NAME.cu against the driver, runs it,
# and gives it a row named ROW whose result is the probe's last line.
driver_probe() {
    local name=$1 label=$2
    if "$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 "bench/gpu/$name.cu" -o "$BUILD/$name" -lcuda; then
        run_logged "$BUILD/$name.log" timeout 60 "$BUILD/$name"
        row "$label" "$RUN_RC" "$RUN_SECS" "$(tail -1 "$BUILD/$name.log")"
    else
        row "$name" 1 - "build failed"
    fi
}

if part api; then
    section "gpu_check ($GPU_CHECK_OPS stress ops)"
    run_logged "$BUILD/gpu_check.log" timeout "$MAIN_TIMEOUT" "$BUILD"/gpu_check --ops "$GPU_CHECK_OPS"
    row "gpu_check --ops $GPU_CHECK_OPS" "$RUN_RC" "$RUN_SECS" "$(verdict "$BUILD/gpu_check.log" "$RUN_RC")"

    # The default is vmm:1 (virtual memory); plain segments (vmm:0) too.
    section "gpu_check with CUHEAP_CONF=vmm:0 (plain segments)"
    run_logged "$BUILD/gpu_check.plain.log" env CUHEAP_CONF=vmm:0 timeout "$MAIN_TIMEOUT" "$BUILD"/gpu_check --ops "$GPU_CHECK_OPS"
    row "gpu_check --ops $GPU_CHECK_OPS, vmm:0" "$RUN_RC" "$RUN_SECS" "$(verdict "$BUILD/gpu_check.plain.log" "$RUN_RC")"

    # Physical units of several pages (vmm_unit), mapped and moved whole.
    section "gpu_check with CUHEAP_CONF=vmm_unit:8M (units of up to 4 pages)"
    run_logged "$BUILD/gpu_check.unit.log" env CUHEAP_CONF=vmm_unit:8M timeout "$MAIN_TIMEOUT" "$BUILD"/gpu_check --ops "$GPU_CHECK_OPS"
    row "gpu_check --ops $GPU_CHECK_OPS, vmm_unit:8M" "$RUN_RC" "$RUN_SECS" "$(verdict "$BUILD/gpu_check.unit.log" "$RUN_RC")"

    if [[ -n "$SANITIZER" ]]; then
        section "gpu_check under compute-sanitizer memcheck ($SANITIZER_OPS stress ops)"
        log="$BUILD/gpu_check.memcheck.log"
        run_logged "$log" timeout "$SAN_TIMEOUT" "$SANITIZER" --tool memcheck \
            --error-exitcode 99 "$BUILD"/gpu_check --ops "$SANITIZER_OPS"
        row "memcheck gpu_check --ops $SANITIZER_OPS" "$RUN_RC" "$RUN_SECS" "$(verdict "$log" "$RUN_RC"); $(san_summary "$log")"
        # Under the default, vmm:1, a page unmapped while queued work still
        # reads it is an invalid access memcheck names (check g moves pages
        # under such work); plain segments (vmm:0) too.
        log="$BUILD/gpu_check.plain.memcheck.log"
        run_logged "$log" env CUHEAP_CONF=vmm:0 timeout "$SAN_TIMEOUT" "$SANITIZER" --tool memcheck \
            --error-exitcode 99 "$BUILD"/gpu_check --ops "$SANITIZER_OPS"
        row "memcheck gpu_check --ops $SANITIZER_OPS, vmm:0" "$RUN_RC" "$RUN_SECS" "$(verdict "$log" "$RUN_RC"); $(san_summary "$log")"
    else
        row "memcheck" - - "skipped: compute-sanitizer not installed"
    fi
fi

# A preload_stress run named RUNTIME[+plain][+noreuse]: sets rt (the build),
# conf (an env assignment or nothing) and tag (what the tables add to the
# name).
preload_run() {
    rt=${1%%+*}
    local keys=()
    [[ $1 == *+plain* ]] && keys+=(vmm:0)
    [[ $1 == *+noreuse* ]] && keys+=(reuse_across_streams:0)
    [[ $1 == *+ipc* ]] && keys+=(ipc_safe:1)
    [[ $1 == *+unit* ]] && keys+=(vmm_unit:8M)
    [[ $1 == *+plan* ]] && keys+=(step_plan:1 vmm_margin:0)
    conf="" tag=""
    if (( ${#keys[@]} )); then
        local joined
        joined=$(IFS=,; echo "${keys[*]}")
        conf="CUHEAP_CONF=$joined" tag=", $joined"
    fi
}

# What a preload_stress run held: "peak reserved X MiB for Y MiB live".
preload_memory() {
    sed -n 's/.*PASS served.*peak reserved \([0-9.]*\) MiB, peak live \([0-9.]*\) MiB.*/peak reserved \1 MiB for \2 MiB live/p' "$1" | tail -n 1
}

# What its IPC check saw: "IPC handles given G of N, refused R".
preload_ipc() {
    sed -n 's/^\(PASS\|FAIL\) ipc *\([0-9]*\) of \([0-9]*\) handles given.*exit \(-*[0-9]*\)), \([0-9]*\) refused.*/IPC handles given \2 of \3 (child exit \4), refused \5/p' "$1" | tail -n 1
}

if part preload; then
    # Under the default, vmm:1, every cudaFree'd block comes back through a
    # take-back whose pages move at once behind the GPU's wait while their old
    # mapping stays until the GPU has passed the free (the slow-kernel test
    # reads a freed buffer while the host allocates again). static+plain: the
    # static build again with CUHEAP_CONF=vmm:0, plain segments.
    # Under LD_PRELOAD memory other streams freed in order serves a request
    # once its stream (or, for cudaMalloc, every stream) waits for that work
    # on the GPU (reuse_across_streams:1, the default there); the slow-kernel
    # test must still find its data intact. static+noreuse: with
    # reuse_across_streams:0 such memory waits for an event instead, and the
    # heap grows while the GPU runs behind.
    # static+plan: step plans with the steps found in the allocations (check
    # h's training loop marks none) and pages moving every step until the
    # plan is in force (vmm_margin:0); --expect-plan wants blocks placed.
    for run in static shared static+plain static+noreuse static+plain+noreuse static+unit static+plan; do
        preload_run "$run"
        section "preload_stress ($rt runtime$tag) under LD_PRELOAD=$PRELOAD"
        log="$BUILD/preload_stress.$run.log"
        extra=()
        [[ $run == *+plan* ]] && extra=(--expect-plan)
        run_logged "$log" env LD_PRELOAD="$PRELOAD" $conf timeout "$MAIN_TIMEOUT" "$BUILD/preload_stress_$rt" \
            --ops "$PRELOAD_OPS" --expect-cuheap ${extra[@]+"${extra[@]}"}
        row "LD_PRELOAD preload_stress, $rt runtime, $PRELOAD_OPS ops$tag" "$RUN_RC" "$RUN_SECS" \
            "$(verdict "$log" "$RUN_RC"); $(preload_memory "$log"); $(preload_ipc "$log")"
    done
    # static+ipc: CUHEAP_CONF=ipc_safe:1, where every block starts a segment
    # of its own and every cudaIpcGetMemHandle must give a handle that a
    # child process reads the block through (a shorter stress: every new
    # block size is a device allocation).
    preload_run static+ipc
    section "preload_stress ($rt runtime$tag) under LD_PRELOAD=$PRELOAD"
    log="$BUILD/preload_stress.static+ipc.log"
    run_logged "$log" env LD_PRELOAD="$PRELOAD" $conf timeout "$MAIN_TIMEOUT" "$BUILD/preload_stress_$rt" \
        --ops "$SANITIZER_OPS" --expect-cuheap --expect-ipc
    row "LD_PRELOAD preload_stress, $rt runtime, $SANITIZER_OPS ops$tag" "$RUN_RC" "$RUN_SECS" \
        "$(verdict "$log" "$RUN_RC"); $(preload_ipc "$log")"
    # What cudaFree's bookkeeping costs per call (events, queries, waits):
    # the figures behind the take-back policy in heap.c.
    section "event and stream-wait costs (bench/gpu/sync_costs.cu)"
    if "$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 bench/gpu/sync_costs.cu -o "$BUILD"/sync_costs; then
        run_logged "$BUILD/sync_costs.log" timeout 60 "$BUILD"/sync_costs
        row "sync_costs (ns per event record, query, stream wait)" "$RUN_RC" "$RUN_SECS" "table above"
    else
        row "sync_costs" 1 - "build failed"
    fi
    # Whether giving a segment back waits for the GPU: what the wait before
    # idle segments go back (heap_segments.c, release_idle_segments_locked) relies on.
    section "does cuMemFree wait for the GPU (bench/gpu/free_sync.cu)"
    driver_probe free_sync "free_sync (cuMemFree with a kernel running on another stream)"
    # What cudaFree's device-wide fences rely on: one event over every
    # stream, one wait that every stream (those created later too) obeys,
    # and what they cost against an event and a wait per stream.
    section "device-wide fences (bench/gpu/ctx_fence.cu)"
    driver_probe ctx_fence "ctx_fence (cuCtxRecordEvent / cuCtxWaitEvent)"
    # What physical units (vmm_unit) rely on: a mapping takes a whole
    # allocation, so a unit moves whole. Should a driver map parts, units
    # could move in pieces (bench/HISTORY.md, "Pieces of a unit").
    section "does cuMemMap take part of an allocation (bench/gpu/vm_offset_probe.cu)"
    driver_probe vm_offset_probe "vm_offset_probe (cuMemMap of part of an allocation)"
    # The same under compute-sanitizer's memcheck (PRELOAD_MEMCHECK=0 skips
    # it), without the deliberate double free and the IPC guard's refusals:
    # memcheck rightly reports their error returns as API errors. The
    # ipc_safe:1 run shares every block with a child process and provokes
    # no refusal (the child runs outside memcheck, which follows only the
    # program it started).
    if [[ -n "$SANITIZER" && "${PRELOAD_MEMCHECK:-1}" == 1 ]]; then
        for run in static shared static+plain static+noreuse static+plain+noreuse static+ipc static+unit; do
            preload_run "$run"
            section "preload_stress ($rt runtime$tag) under LD_PRELOAD and compute-sanitizer memcheck"
            log="$BUILD/preload_stress.$run.memcheck.log"
            ipc=--no-ipc
            [[ $run == *+ipc* ]] && ipc=--expect-ipc
            # The preload goes to the program only (through env), not to
            # the sanitizer's own launcher.
            run_logged "$log" timeout 150 "$SANITIZER" --tool memcheck --error-exitcode 99 \
                env LD_PRELOAD="$PRELOAD" $conf "$BUILD/preload_stress_$rt" --ops "$SANITIZER_OPS" --expect-cuheap \
                --no-double-free $ipc
            seen=$(preload_ipc "$log")
            row "memcheck LD_PRELOAD preload_stress, $rt runtime$tag" "$RUN_RC" "$RUN_SECS" \
                "$(verdict "$log" "$RUN_RC"); $(san_summary "$log")${seen:+; $seen}"
        done
    fi
fi

# One process, two GPUs, under the preload: a heap per device, frees from
# the other device, peer access (vmm:1: cuheap grants its pages), pinned
# memory copied to both. Needs two GPUs (the nvidia-h200-x2 machine).
if part twogpu; then
    if (( $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') >= 2 )); then
        for vmm in 0 1; do
            section "two_gpus under LD_PRELOAD, vmm:$vmm"
            log="$BUILD/two_gpus.vmm$vmm.log"
            run_logged "$log" env LD_PRELOAD="$PRELOAD" CUHEAP_CONF="vmm:$vmm" timeout 120 "$BUILD/two_gpus"
            row "LD_PRELOAD two_gpus (one process, 2 GPUs, peer access), vmm:$vmm" "$RUN_RC" "$RUN_SECS" \
                "$(grep -E '^two_gpus: ' "$log" | tail -n 1 | sed 's/^two_gpus: //')"
        done
    else
        row "two_gpus (one process, 2 GPUs)" - - "skipped: fewer than two GPUs"
    fi
fi

# PyTorch: cuheap as the pluggable allocator and by LD_PRELOAD, beside
# PyTorch's own modes.
TORCH_STEPS="${TORCH_STEPS:-20}"
if [[ "${GPU_TORCH:-1}" != 0 ]] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    if part torch; then
        section "PyTorch checks (torch $(python3 -c 'import torch; print(torch.__version__)'))"
        log="$BUILD/torch_checks.log"
        run_logged "$log" timeout 480 python3 tests/gpu/torch_checks.py
        row "PyTorch checks" "$RUN_RC" "$RUN_SECS" "$(grep -c '^PASS' "$log") passed, $(grep -c '^FAIL' "$log") failed"
        section "PyTorch training jobs: cuheap beside PyTorch's three allocator modes"
        run_logged "$BUILD/torch_jobs.log" timeout 420 python3 bench/torch/run_modes.py --jobs resnet50,gpt2,bert_varlen \
            --modes native,expandable,async,cuheap,cuheap-plain --steps "$TORCH_STEPS" --out "$BUILD/torch_jobs.json"
        row "PyTorch jobs (plugin)" "$RUN_RC" "$RUN_SECS" "table above"
        # vmm:1 under a memory limit of 1.05x the native run's peak live
        # bytes, beside PyTorch's native allocator at the same limit
        # (set_per_process_memory_fraction): an OOM there is a result.
        section "PyTorch training jobs under a memory limit (1.05x live): cuheap vmm:1 beside native"
        run_logged "$BUILD/torch_limit.log" timeout 420 python3 bench/torch/run_modes.py --jobs resnet50,gpt2,bert_varlen \
            --modes native,cuheap,cuheap-vmm-limit,native-limit --limit-live 1.05 --steps "$TORCH_STEPS" \
            --out "$BUILD/torch_limit.json"
        row "PyTorch jobs under a 1.05x-live limit" "$RUN_RC" "$RUN_SECS" "table above"
        section "PyTorch side-stream prefetch and CUDA graph jobs"
        run_logged "$BUILD/torch_jobs2.log" timeout 150 python3 bench/torch/run_modes.py --jobs sidestream,graph \
            --modes native,cuheap,cuheap-plain --steps "$TORCH_STEPS" --out "$BUILD/torch_jobs2.json"
        row "PyTorch side-stream and graph jobs" "$RUN_RC" "$RUN_SECS" "table above"
    fi
    if part ddp; then
        # torchrun with DistributedDataParallel over NCCL, one process per
        # GPU: needs two GPUs (the nvidia-h200-x2 machine).
        if (( $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') >= 2 )); then
            section "DDP over two GPUs (torchrun, NCCL; NVLink multicast off)"
            run_logged "$BUILD/torch_ddp.log" timeout 400 python3 bench/torch/run_ddp.py --jobs resnet50,gpt2 \
                --modes "${DDP_MODES:-native,native-again,cuheap,preload-caching,preload}" --nproc 2 \
                --steps "$TORCH_STEPS" --out "$BUILD/torch_ddp.json"
            row "DDP, 2 GPUs" "$RUN_RC" "$RUN_SECS" "table above"
        else
            row "DDP, 2 GPUs" - - "skipped: fewer than two GPUs"
        fi
    fi
    if part preload; then
        section "PyTorch training jobs under LD_PRELOAD (caching off and on) beside native"
        run_logged "$BUILD/torch_preload.log" timeout 420 python3 bench/torch/run_modes.py \
            --jobs "${PRELOAD_JOBS:-resnet50,gpt2,bert_varlen}" \
            --modes "${PRELOAD_MODES:-native,preload,preload-caching}" \
            --steps "$TORCH_STEPS" --out "$BUILD/torch_preload.json"
        row "PyTorch jobs (LD_PRELOAD)" "$RUN_RC" "$RUN_SECS" "table above"
    fi
else
    section "PyTorch with CUDA not found (or GPU_TORCH=0): PyTorch parts skipped"
fi

section "summary"
echo "| run | exit | seconds | result |"
echo "|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
exit "$FINAL_RC"
