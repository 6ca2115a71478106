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
# cudaMallocAsync modes). It ends with a table. Every step is bounded so the
# whole takes well under 8 minutes.
#
# Exit status: 0 only if every part passed.
#
# Environment: NVCC (compiler, default nvcc from PATH or
# /usr/local/cuda/bin/nvcc), GPU_ARCH (default sm_90), GPU_CHECK_OPS
# (default 1000000), SANITIZER_OPS (default 20000), GPU_TORCH=0 (skip the
# PyTorch part), TORCH_STEPS (default 20).
set -euo pipefail

BUILD="${1:-build}"
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
echo "built $BUILD/gpu_check"

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
    line=$(grep -E '^gpu_check: (all checks passed|FAILED)' "$log" | tail -n 1 || true)
    if [[ -n "$line" ]]; then
        echo "${line#gpu_check: }"
    elif [[ "$rc" == 124 || "$rc" == 137 ]]; then
        echo "timed out"
    else
        echo "no verdict (crashed?)"
    fi
}

section "gpu_check ($GPU_CHECK_OPS stress ops)"
MAIN_LOG="$BUILD/gpu_check.log"
run_logged "$MAIN_LOG" timeout "$MAIN_TIMEOUT" "$BUILD"/gpu_check --ops "$GPU_CHECK_OPS"
MAIN_RC=$RUN_RC
MAIN_SECS=$RUN_SECS

SANITIZER=""
if command -v compute-sanitizer >/dev/null 2>&1; then
    SANITIZER="$(command -v compute-sanitizer)"
elif [[ -x "$(dirname "$NVCC")/compute-sanitizer" ]]; then
    SANITIZER="$(dirname "$NVCC")/compute-sanitizer"
elif [[ -x /usr/local/cuda/bin/compute-sanitizer ]]; then
    SANITIZER=/usr/local/cuda/bin/compute-sanitizer
fi

section "gpu_check with CUHEAP_CONF=vmm:1 (virtual memory)"
VMM_LOG="$BUILD/gpu_check.vmm.log"
run_logged "$VMM_LOG" env CUHEAP_CONF=vmm:1 timeout "$MAIN_TIMEOUT" "$BUILD"/gpu_check --ops "$GPU_CHECK_OPS"
VMM_RC=$RUN_RC
VMM_SECS=$RUN_SECS

SAN_RC=""
SAN_SECS=""
SAN_LOG="$BUILD/gpu_check.memcheck.log"
if [[ -n "$SANITIZER" ]]; then
    section "gpu_check under compute-sanitizer memcheck ($SANITIZER_OPS stress ops)"
    run_logged "$SAN_LOG" timeout "$SAN_TIMEOUT" "$SANITIZER" --tool memcheck \
        --error-exitcode 99 "$BUILD"/gpu_check --ops "$SANITIZER_OPS"
    SAN_RC=$RUN_RC
    SAN_SECS=$RUN_SECS
else
    section "compute-sanitizer not found: memcheck run skipped"
fi

# PyTorch: cuheap as the pluggable allocator (checks, then training jobs
# side by side with the native allocator).
TORCH_RC=""
JOBS_RC=""
TORCH_STEPS="${TORCH_STEPS:-20}"
if [[ "${GPU_TORCH:-1}" != 0 ]] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    section "PyTorch checks (torch $(python3 -c 'import torch; print(torch.__version__)'))"
    TORCH_LOG="$BUILD/torch_checks.log"
    run_logged "$TORCH_LOG" timeout 300 python3 tests/gpu/torch_checks.py
    TORCH_RC=$RUN_RC
    TORCH_SECS=$RUN_SECS
    section "PyTorch training jobs: cuheap beside PyTorch's three allocator modes"
    JOBS_LOG="$BUILD/torch_jobs.log"
    run_logged "$JOBS_LOG" timeout 420 python3 bench/torch/run_modes.py --jobs resnet50,gpt2,bert_varlen \
        --modes native,expandable,async,cuheap,cuheap-vmm --steps "$TORCH_STEPS" --out "$BUILD/torch_jobs.json"
    JOBS_RC=$RUN_RC
    JOBS_SECS=$RUN_SECS
    section "PyTorch side-stream prefetch and CUDA graph jobs"
    run_logged "$BUILD/torch_jobs2.log" timeout 150 python3 bench/torch/run_modes.py --jobs sidestream,graph \
        --modes native,cuheap,cuheap-vmm --steps "$TORCH_STEPS" --out "$BUILD/torch_jobs2.json"
    [[ "$RUN_RC" != 0 ]] && JOBS_RC=$RUN_RC
    JOBS_SECS=$(awk -v a="$JOBS_SECS" -v b="$RUN_SECS" 'BEGIN { printf "%.1f", a + b }')
else
    section "PyTorch with CUDA not found (or GPU_TORCH=0): PyTorch checks skipped"
fi

section "summary"
echo "| run | exit | seconds | result |"
echo "|---|---|---|---|"
echo "| gpu_check --ops $GPU_CHECK_OPS | $MAIN_RC | $MAIN_SECS | $(verdict "$MAIN_LOG" "$MAIN_RC") |"
echo "| gpu_check --ops $GPU_CHECK_OPS, vmm:1 | $VMM_RC | $VMM_SECS | $(verdict "$VMM_LOG" "$VMM_RC") |"
if [[ -n "$SANITIZER" ]]; then
    san_summary=$(grep -E 'ERROR SUMMARY' "$SAN_LOG" | tail -n 1 | sed -E 's/^=+ *//' || true)
    echo "| memcheck gpu_check --ops $SANITIZER_OPS | $SAN_RC | $SAN_SECS | $(verdict "$SAN_LOG" "$SAN_RC")${san_summary:+; $san_summary} |"
else
    echo "| memcheck | - | - | skipped: compute-sanitizer not installed |"
fi

if [[ -n "$TORCH_RC" ]]; then
    echo "| PyTorch checks | $TORCH_RC | $TORCH_SECS | $(grep -c '^PASS' "$TORCH_LOG") passed, $(grep -c '^FAIL' "$TORCH_LOG") failed |"
    echo "| PyTorch jobs | $JOBS_RC | $JOBS_SECS | tables above |"
fi

if [[ "$MAIN_RC" != 0 ]]; then
    exit "$MAIN_RC"
fi
if [[ "$VMM_RC" != 0 ]]; then
    exit "$VMM_RC"
fi
if [[ -n "$TORCH_RC" && "$TORCH_RC" != 0 ]]; then
    exit "$TORCH_RC"
fi
if [[ -n "$JOBS_RC" && "$JOBS_RC" != 0 ]]; then
    exit "$JOBS_RC"
fi
if [[ -n "$SAN_RC" && "$SAN_RC" != 0 ]]; then
    exit "$SAN_RC"
fi
exit 0
