#!/usr/bin/env bash
# demo.sh BUILD_DIR - what `make demo` runs: replays the allocation traces of
# three real PyTorch training jobs (bench/traces) on a simulated 80 GiB GPU
# and prints cuheap's peak memory beside what PyTorch's caching allocator
# reserved on the same jobs, then the smallest GPU each job fits in.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
echo "Replaying bench/traces on a simulated GPU (capacity 80 GiB, default settings)."
echo "ratio = peak reserved / peak live bytes; 1.0 is the floor. 'pytorch' is the ratio"
echo "PyTorch's own allocator reached on the same job (recorded with the trace)."
echo
"$build/cuheap-replay" --min-capacity bench/traces/*.trace.gz
echo
echo "min GiB: the smallest device (to 2 MiB) on which the job runs without running out of memory."
