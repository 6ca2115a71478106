#!/usr/bin/env bash
# gpu-bench.sh - what `make gpu-bench` runs on a machine with an NVIDIA GPU:
# the benchmark tables of bench/README.md, in one run.
#
#  1. bench/gpu/alloc_latency.cu: ns per malloc+free, cuheap against
#     cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync, by size and
#     mixed, 1 and 16 threads (ALLOC_PAIRS pairs per thread, default 20000);
#  2. bench/gpu/sync_costs.cu: what an event record, query and stream wait
#     cost (the figures behind cuheap's cudaFree bookkeeping);
#     bench/gpu/vm_costs.cu: what mapping, granting access to and unmapping a
#     page of virtual memory cost (the price of a page moved under vmm:1);
#     bench/gpu/vm_regroup.cu: scattered free pages gathered into one
#     allocation (released and created anew) against moved one by one;
#     bench/gpu/vm_unmap_thread.cu: whether a move's unmap can run on a
#     second thread while the allocating thread maps;
#     bench/gpu/pinned_costs.cu: cudaHostAlloc+cudaFreeHost against cuheap's
#     pinned cache, and host-to-device copy bandwidth from each;
#     bench/gpu/preload_pairs.c (part pairs): a cudaMalloc+cudaFree pair by
#     size under LD_PRELOAD, cuheap beside the floor (bench/torch/floor.h)
#     and CUDA's own, in PAIRS_ROUNDS alternating rounds (default 3), and the
#     fence cudaFree's promise costs;
#  3. where PyTorch is installed, bench/torch/run_modes.py: the training jobs
#     (BENCH_JOBS, default resnet50,gpt2,bert_varlen,llama_ckpt,kv_generate)
#     under BENCH_MODES (default native,expandable,async,cuheap,preload),
#     side by side. 25 job runs take 10-15 minutes: on a machine that limits
#     one command's time, run the jobs in two calls (BENCH_JOBS=...).
#  4. where PyTorch is installed, bench/torch/alloc_latency_torch.cpp: the same
#     latency loop as 1. against PyTorch's caching allocator (part torchlat).
#  5. part pertensor, only when asked (BENCH_PARTS=pertensor): where PyTorch
#     is installed, bench/torch/per_tensor.py: torch.empty + del per tensor in
#     PyTorch's three modes, cuheap's plugin (vmm:1, vmm:0) and LD_PRELOAD, and
#     the floor (bench/torch/floor.h, built here with `make floor`) as plugin
#     and preload; PER_TENSOR_ROUNDS rounds (default 2) of every mode, about
#     5 minutes.
# On a host of 8 cores or more the PyTorch parts and the pairs run pinned
# (taskset): the jobs to JOBS_CPUS (default 4-7), one tensor and the pairs to
# PIN_CPU (default 5). Unpinned, a job's rounds differed by up to 45% and a
# loop's speed jumped by 2x between runs; pinned they repeat within 3%
# (docs/benchmarks.md). JOBS_CPUS= and PIN_CPU= (empty) run unpinned.
# BENCH_PARTS picks parts (default latency,sync,vm,pinned,pairs,torchlat,jobs).
# Argument 1 is the build directory (default build). Exit status 0 only if
# every part ran.
set -euo pipefail
BUILD="${1:-build}"
GPU_ARCH="${GPU_ARCH:-sm_90}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
cd "$(dirname "$0")/.."
rc=0
section() { printf '\n== %s\n' "$*"; }
parts=",${BENCH_PARTS:-latency,sync,vm,pinned,pairs,torchlat,jobs},"
want() { [[ "$parts" == *",$1,"* ]]; }
# on_cpus CPUS CMD...: CMD on those CPUs where the host has 8 cores or more and taskset is there.
on_cpus() {
    local cpus=$1
    shift
    if [[ -n "$cpus" && $(nproc) -ge 8 ]] && command -v taskset >/dev/null; then
        taskset -c "$cpus" "$@"
    else
        "$@"
    fi
}
JOBS_CPUS="${JOBS_CPUS-4-7}"
PIN_CPU="${PIN_CPU-5}"

section "GPU"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi not found"
echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sort -u | paste -sd ' ')"
echo "nvcc: $("$NVCC" --version | tail -n 1)"

section "build"
make lib BUILD="$BUILD"
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 -Iinclude bench/gpu/alloc_latency.cu "$BUILD"/libcuheap.a \
    -ldl -lpthread -o "$BUILD"/alloc_latency
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 bench/gpu/sync_costs.cu -o "$BUILD"/sync_costs
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 bench/gpu/vm_costs.cu -lcuda -o "$BUILD"/vm_costs
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 bench/gpu/vm_regroup.cu -lcuda -o "$BUILD"/vm_regroup
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 bench/gpu/vm_unmap_thread.cu -lcuda -o "$BUILD"/vm_unmap_thread
"$NVCC" -O2 -arch="$GPU_ARCH" -std=c++17 -Iinclude bench/gpu/pinned_costs.cu "$BUILD"/libcuheap.a \
    -ldl -lpthread -o "$BUILD"/pinned_costs

if want latency; then
    section "allocation latency (bench/gpu/alloc_latency.cu)"
    timeout 300 "$BUILD"/alloc_latency --pairs "${ALLOC_PAIRS:-20000}" || rc=1
fi

if want sync; then
    section "event and stream-wait costs (bench/gpu/sync_costs.cu)"
    timeout 60 "$BUILD"/sync_costs || rc=1
fi

if want vm; then
    section "virtual-memory page costs (bench/gpu/vm_costs.cu)"
    timeout 120 "$BUILD"/vm_costs || rc=1
    section "scattered pages gathered into one allocation (bench/gpu/vm_regroup.cu)"
    timeout 180 "$BUILD"/vm_regroup || rc=1
    section "an old range unmapped by a second thread (bench/gpu/vm_unmap_thread.cu)"
    timeout 120 "$BUILD"/vm_unmap_thread || rc=1
fi

if want pinned; then
    section "pinned host memory (bench/gpu/pinned_costs.cu)"
    timeout 300 "$BUILD"/pinned_costs || rc=1
fi

if want pairs; then
    section "a cudaMalloc+cudaFree pair under LD_PRELOAD, ns (bench/gpu/preload_pairs.c)"
    make floor BUILD="$BUILD" >/dev/null
    cudart_dir=$(dirname "$(dirname "$NVCC")")/lib64
    if gcc -std=c11 -O2 -I"$cudart_dir/../include" bench/gpu/preload_pairs.c -L"$cudart_dir" -lcudart -lcuda \
        -Wl,-rpath,"$cudart_dir" -o "$BUILD"/preload_pairs; then
        for round in $(seq "${PAIRS_ROUNDS:-3}"); do
            out=$(on_cpus "$PIN_CPU" env FLOOR_ARENA=8G LD_PRELOAD="$BUILD/floor/libfloor_preload.so" "$BUILD"/preload_pairs) || rc=1
            echo "round $round, floor:  $out"
            out=$(on_cpus "$PIN_CPU" env LD_PRELOAD="$(pwd)/$BUILD/libcuheap.so" "$BUILD"/preload_pairs) || rc=1
            echo "round $round, cuheap: $out"
        done
        out=$("$BUILD"/preload_pairs 2000 --fences) || rc=1
        echo "CUDA's own, which synchronizes: $out"
    else
        echo "preload_pairs: build failed"
        rc=1
    fi
fi

if want torchlat; then
    section "allocation latency against PyTorch's caching allocator (bench/torch/alloc_latency_torch.cpp)"
    torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
    if [[ -n "$torch_dir" ]]; then
        abi=$(python3 -c 'import torch; print(int(torch.compiled_with_cxx11_abi()))')
        if "$NVCC" -O2 -std=c++17 -cudart shared -Xcompiler -D_GLIBCXX_USE_CXX11_ABI="$abi" \
            -I"$torch_dir/include" bench/torch/alloc_latency_torch.cpp -L"$torch_dir/lib" -lc10_cuda -lc10 \
            -ldl -lpthread -Xlinker -rpath -Xlinker "$torch_dir/lib" -o "$BUILD"/alloc_latency_torch; then
            timeout 300 "$BUILD"/alloc_latency_torch "$(pwd)/$BUILD/libcuheap.so" "${ALLOC_PAIRS:-20000}" || rc=1
        else
            echo "alloc_latency_torch: build failed"
            rc=1
        fi
    else
        echo "PyTorch not found: skipped"
    fi
fi

if want jobs; then
    if [[ "${GPU_TORCH:-1}" == 0 ]]; then
        echo "training jobs skipped: GPU_TORCH=0"
    elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        echo "PyTorch with CUDA not found: training jobs skipped"
    else
        section "training jobs (bench/torch/run_modes.py)"
        on_cpus "$JOBS_CPUS" timeout 1200 python3 bench/torch/run_modes.py \
            --jobs "${BENCH_JOBS:-resnet50,gpt2,bert_varlen,llama_ckpt,kv_generate}" \
            --modes "${BENCH_MODES:-native,expandable,async,cuheap,preload}" \
            --steps "${TORCH_STEPS:-20}" --out "$BUILD/gpu_bench_jobs.json" || rc=1
    fi
fi
if want pertensor; then
    section "one tensor through PyTorch, beside the floor (bench/torch/per_tensor.py)"
    make floor BUILD="$BUILD"
    if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        echo "PyTorch with CUDA not found: per-tensor benchmark skipped"
    else
        on_cpus "$PIN_CPU" timeout 1500 python3 bench/torch/per_tensor.py --build "$BUILD" --rounds "${PER_TENSOR_ROUNDS:-2}" \
            --out "$BUILD/gpu_bench_per_tensor.json" || rc=1
    fi
fi
exit $rc
