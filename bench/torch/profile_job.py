"""profile_job.py - where one job's step time goes in one allocator mode.

    CUHEAP_TORCH=1 PYTHONPATH=scripts python bench/torch/profile_job.py --job llama_ckpt --steps 8

The mode comes from the environment, as for train_job.py (run_modes.py's
modes). After the warm-up steps, two steps run under torch.profiler; it
prints one JSON line: the step times, the GPU's busy time per step (the sum
of kernel and copy times), the CPU time per step, and the CPU operations and
CUDA runtime calls that took the most time. A step slower than another
mode's with the same GPU time is lost on the CPU side; with more GPU time,
on the GPU (memory layout, waits).
"""

import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import train_job


def main():
    args = train_job.job_arguments(__doc__, train_job.JOBS)
    train_job.deterministic(args.seed)
    step = train_job.JOBS[args.job](args.seed)
    times = []
    profiled = 2
    warm = max(args.steps - profiled, 1)
    for i in range(warm):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(warm, warm + profiled):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(i)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events) / profiled
    cpu_ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    runtime = [e for e in cpu_ops if e.key.startswith("cuda") or e.key.startswith("cu")]
    print(json.dumps({
        "job": args.job, "mode": train_job.mode_name(),
        "step_ms": [round(t, 1) for t in times], "profiled_step_ms": round(statistics.mean(times[-profiled:]), 1),
        "gpu_busy_ms_per_step": round(gpu_us / 1e3, 1),
        "top_cpu_ops": [[e.key, round(e.self_cpu_time_total / profiled / 1e3, 2), e.count // profiled]
                        for e in cpu_ops[:12]],
        "cuda_runtime_calls": [[e.key, round(e.self_cpu_time_total / profiled / 1e3, 2), e.count // profiled]
                               for e in runtime[:10]],
    }), flush=True)


if __name__ == "__main__":
    main()
