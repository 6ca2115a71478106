"""ddp_job.py - one DistributedDataParallel training job in one allocator mode, as one JSON line.

    torchrun --standalone --nproc_per_node=2 bench/torch/ddp_job.py --job gpt2 --steps 20 --seed 0

The multi-GPU counterpart of train_job.py: every rank (one process per GPU,
started by torchrun) trains the same model wrapped in
torch.nn.parallel.DistributedDataParallel over NCCL, so the allocator serves
DDP's gradient buckets and the collectives' tensors beside the model's own.
The allocator mode is chosen by the environment before torchrun starts, as
for train_job.py (bench/torch/run_ddp.py sets it); the mode's name, the peaks
and the retries are read by train_job's own functions, so both harnesses
count memory by the same rules.

Jobs (random data seeded by seed, step and rank; the model built from the
same seed on every rank; bf16 autocast, optimizers and deterministic settings
as in train_job.py):
  gpt2      GPT-2 small, batch 8 x 1024 tokens per rank, AdamW
  resnet50  torchvision ResNet-50, batch 64 x 224x224 per rank, SGD

Rank 0 prints the job, the mode, the world size, the step time (the largest of
the ranks' medians of the steps after 3 warm-up steps), rank 0's losses and
every rank's (its local loss, as float.hex so runs compare bitwise), peak
reserved and peak live (the largest over the ranks) and each rank's own
numbers. NCCL's own buffers are not PyTorch tensors: PyTorch's peaks leave
them out, while under LD_PRELOAD with NCCL_CUMEM_ENABLE=0 they are cudaMalloc
memory that cuheap serves and counts. A rank that fails prints its traceback
and exits non-zero; torchrun then stops the others.
"""

import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_job  # noqa: E402  (imports torch: cuheap by environment installs here)

import torch  # noqa: E402
import torch.cuda.nccl  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

WARMUP = 3


def data_generator(seed, step, rank):
    """A CUDA generator for the batch of `step` on `rank`: the same on every run."""
    return torch.Generator(device="cuda").manual_seed((seed * 1000 + step) * 1000 + rank)


def build_gpt2(seed, rank):
    """(model, optimizer factory, loss of (wrapped model, step)) for GPT-2 small."""
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_positions=1024)).cuda()

    def loss_of(net, i):
        ids = torch.randint(0, 50257, (8, 1024), device="cuda", generator=data_generator(seed, i, rank))
        return net(input_ids=ids, labels=ids).loss
    return model, lambda params: torch.optim.AdamW(params, lr=1e-4), loss_of


def build_resnet50(seed, rank):
    """(model, optimizer factory, loss of (wrapped model, step)) for ResNet-50."""
    import torchvision
    model = torchvision.models.resnet50(weights=None).cuda()
    loss_fn = torch.nn.CrossEntropyLoss()

    def loss_of(net, i):
        g = data_generator(seed, i, rank)
        x = torch.randn(64, 3, 224, 224, device="cuda", generator=g)
        y = torch.randint(0, 1000, (64,), device="cuda", generator=g)
        return loss_fn(net(x), y)
    return model, lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), loss_of


JOBS = {"gpt2": build_gpt2, "resnet50": build_resnet50}


def train(args, rank, local_rank):
    """Runs the steps on this rank; returns this rank's numbers."""
    model, make_opt, loss_of = JOBS[args.job](args.seed, rank)
    net = DistributedDataParallel(model, device_ids=[local_rank])
    opt = make_opt(net.parameters())
    times, losses = [], []
    profile_to = os.environ.get("CUHEAP_BENCH_PROFILE")
    prof = None
    for i in range(args.steps):
        if profile_to and i == args.steps - 2:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(net, i)
        train_job.optimize(opt, loss)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss))
    if prof:
        prof.__exit__(None, None, None)
        write_profile(prof, profile_to % rank if "%d" in profile_to else profile_to, times[-2:])
    reserved, live, _ = train_job.allocator_bytes()
    timed = times[WARMUP:] if len(times) > WARMUP else times
    return {"rank": rank, "local_rank": local_rank, "mode": train_job.mode_name(),
            "step_ms": statistics.median(timed) if timed else None, "losses": [x.hex() for x in losses],
            "peak_reserved": reserved, "peak_live": live, "retries": train_job.retries()}


def write_profile(prof, path, step_ms):
    """CUHEAP_BENCH_PROFILE=PATH (%d: the rank): the last two steps under
    torch.profiler, summed per step: the GPU's busy time, the CPU operations
    and CUDA calls that took the most time, as one JSON object."""
    events = prof.key_averages()
    per = lambda us: round(us / 2 / 1e3, 2)
    cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    gpu = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)
    with open(path, "w") as f:
        json.dump({"step_ms": step_ms, "gpu_busy_ms": per(sum(e.self_device_time_total for e in events)),
                   "top_cpu": [[e.key, per(e.self_cpu_time_total), e.count // 2] for e in cpu[:15]],
                   "top_gpu": [[e.key, per(e.self_device_time_total), e.count // 2] for e in gpu[:10]]}, f)


def largest(ranks, key):
    """The largest of the ranks' values of `key`; None when any rank has none."""
    values = [r[key] for r in ranks]
    return None if any(v is None for v in values) else max(values)


def nccl_version():
    try:
        v = torch.cuda.nccl.version()   # a tuple (major, minor, patch[, suffix]) in PyTorch 2
    except Exception:
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def summary(args, ranks):
    modes = sorted({r["mode"] for r in ranks})
    return {
        "job": args.job, "mode": modes[0] if len(modes) == 1 else "mixed:" + ",".join(modes),
        "world_size": len(ranks), "steps": args.steps, "step_ms": largest(ranks, "step_ms"),
        "losses": ranks[0]["losses"], "losses_all_ranks": [r["losses"] for r in ranks],
        "peak_reserved": largest(ranks, "peak_reserved"), "peak_live": largest(ranks, "peak_live"),
        "ranks": ranks, "torch": torch.__version__,
        "nccl": nccl_version(),
        "nccl_cumem": os.environ.get("NCCL_CUMEM_ENABLE"),
    }


def main():
    args = train_job.job_arguments(__doc__, JOBS)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        torch.cuda.set_device(local_rank)   # before any CUDA tensor: one GPU per rank
        dist.init_process_group("nccl")
        if dist.get_world_size() != world:
            raise RuntimeError("WORLD_SIZE is %d, the process group has %d ranks" % (world, dist.get_world_size()))
        train_job.deterministic(args.seed)  # the same initial weights on every rank
        train_job.apply_limit()
        mine = train(args, rank, local_rank)
        ranks = [None] * world
        dist.all_gather_object(ranks, mine)  # uses the current device, set above
        if rank == 0:
            print(json.dumps(summary(args, ranks)), flush=True)
        dist.destroy_process_group()
    except BaseException as e:   # SystemExit too: train_job.allocator_bytes() raises it
        traceback.print_exc()
        sys.stderr.write("ddp_job rank %d failed: %s: %s\n" % (rank, type(e).__name__, " ".join(str(e).split())[:300]))
        sys.stderr.flush()
        sys.stdout.flush()
        # Not sys.exit: a process group whose peers are still inside a
        # collective can hang the interpreter's exit; torchrun stops them.
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
