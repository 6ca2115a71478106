#!/usr/bin/env bash
# demo.sh BUILD_DIR - what `make demo` runs: replays the allocation traces of
# three real PyTorch training jobs (bench/traces) on a simulated 80 GiB GPU
# and prints cuheap's peak memory beside what PyTorch's caching allocator
# reserves on the same jobs (native and expandable_segments, modelled), then
# the smallest GPU each job fits in under each; then asks whether GPT-2 fits
# on a 26 GiB device with plain segments (vmm:0), and why not (free memory in
# pieces too small for its 3 GiB logits), and shows it fitting with the
# default, vmm:1.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
echo "Replaying bench/traces on a simulated GPU (capacity 80 GiB, default settings)."
echo "ratio = peak reserved / peak live bytes; 1.0 is the floor. 'native' and 'expand' are the"
echo "ratios of PyTorch's own allocator on the same job, by default and with"
echo "expandable_segments:True (cuheap-replay's model of it, which gives the peak recorded"
echo "with each trace to the byte)."
echo
"$build/cuheap-replay" --min-capacity bench/traces/*.trace.gz
echo
echo "min cap: the smallest device (to 2 MiB) on which cuheap runs the job without running out of"
echo "memory; native min and expand min: the same for PyTorch's two modes."
echo
echo "Would GPT-2 (25.17 GiB live) run on a 26 GiB device on plain segments (vmm:0)? The replay"
echo "answers, and says why not:"
echo
"$build/cuheap-replay" --capacity 26G --conf vmm:0 bench/traces/gpt2.trace.gz
echo
echo "Free memory in pieces too small for the request, some of it in a segment that a few small"
echo "blocks hold, is what CUDA virtual memory gives back, as the replay checked: with vmm:1,"
echo "cuheap's default, the job runs on that device:"
echo
"$build/cuheap-replay" --capacity 26G bench/traces/gpt2.trace.gz
