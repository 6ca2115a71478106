"""train_job.py - one PyTorch training job in one allocator mode, as one JSON line.

    python bench/torch/train_job.py --job gpt2 --steps 20 --seed 0

The allocator mode is chosen by the environment before this script starts
(bench/torch/run_modes.py sets it): PyTorch's native caching allocator,
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or backend:cudaMallocAsync,
PYTORCH_NO_CUDA_MEMORY_CACHING=1, or cuheap by CUHEAP_TORCH=1 with scripts/ on
PYTHONPATH (cuheap-vmm: with CUHEAP_CONF=vmm:1). The script itself never imports cuheap: it is the unmodified
training script that environment-only activation must serve; it only looks
whether cuheap_torch was loaded, to read its statistics.

Jobs (random data, fixed seeds, bf16 autocast as in bench/traces):
  resnet50     torchvision ResNet-50, batch 128, 224x224, SGD
  gpt2         GPT-2 small, batch 16 x 1024 tokens, AdamW
  bert_varlen  BERT-base masked LM, batch 16-48, sequence 64-512 varying each step
  sidestream   a conv net fed from pinned host batches copied on a side stream
               with non_blocking=True and record_stream, as prefetching loaders do
  graph        a captured CUDA graph replayed on fresh inputs, checked against
               eager results computed the same way
  llama_ckpt   a Llama-style decoder (12 layers, width 1024) with gradient
               checkpointing, batch 8, sequence 256-2048 varying each step, AdamW
  kv_generate  GPT-2 small generating 48 tokens greedily with a growing KV
               cache, batch 8, prompt 64-512 tokens varying each step; the
               "loss" is the mean of the last logits
  corpus:NAME  a job of the corpus (bench/corpus/jobs.py), as its traces were
               recorded: corpus:lora_varlen, corpus:gcn_graphs, ...
Prints: job, mode, step times (median of the steps after 3 warm-up steps, and every
step's in step_ms_each),
losses (as float.hex, so runs compare bitwise), peak reserved and peak live,
what the process holds on the GPU beside its allocator at the end
(outside_allocator: the CUDA context, kernels, libraries' own cudaMalloc's,
by NVML) and device_peak, the two added: the one figure that compares
LD_PRELOAD, where cuheap also serves the libraries' own cudaMalloc's, with
PyTorch's modes, which count only PyTorch's tensors,
the allocator's cache-release retries, cuheap's CPU waits for the GPU
(cpu_waits; None in PyTorch's own modes), and an out-of-memory as a result
("oom": the step and PyTorch's message) rather than a crash.

With CUHEAP_BENCH_STRICT=1 every kernel is deterministic (attention on the math
path; an operation without a deterministic kernel is an error): losses then
repeat bit for bit between runs, which the fused attention kernels do not.

With CUHEAP_BENCH_LIMIT=BYTES (run_modes.py's *-limit modes) the job runs
under a memory limit: PyTorch's own modes through
set_per_process_memory_fraction, cuheap's through CUHEAP_CONF limit:BYTES
(set by run_modes.py); the mode's name gets "-limit".
"""

import argparse
import json
import os
import statistics
import sys
import time
import ctypes

import torch


def preloaded_cuheap():
    """libcuheap.so when it is preloaded into this process (LD_PRELOAD), else None:
    whatever its file is called (per_tensor.py's preload=PATH), a preloaded
    library that exports cuheap's API."""
    if not os.environ.get("LD_PRELOAD", "").strip():
        return None
    lib = ctypes.CDLL(None)
    return lib if hasattr(lib, "cuheap_get_stats") else None


class CuheapStat(ctypes.Structure):
    _fields_ = [("current", ctypes.c_uint64), ("peak", ctypes.c_uint64)]


class CuheapStats(ctypes.Structure):
    _fields_ = [(n, CuheapStat) for n in ("requested", "allocated", "reserved", "cached", "pending")] + \
        [(n, ctypes.c_uint64) for n in ("num_allocs", "num_frees", "num_segment_allocs", "num_segment_frees",
                                        "num_cache_hits", "num_retries", "num_ooms", "largest_free_extent",
                                        "num_free_extents", "limit", "workspace", "device_total",
                                        "num_cpu_waits")]


def preload_stats():
    st = CuheapStats()
    rc = preloaded_cuheap().cuheap_get_stats(torch.cuda.current_device(), ctypes.byref(st))
    if rc != 0:
        raise SystemExit("cuheap_get_stats failed: %d" % rc)
    return st


def memory_limit():
    """The byte limit run_modes.py set for a *-limit mode (CUHEAP_BENCH_LIMIT), or None."""
    v = os.environ.get("CUHEAP_BENCH_LIMIT")
    return int(v) if v else None


def mode_name():
    name = base_mode_name()
    return name + "-limit" if memory_limit() is not None else name


def base_mode_name():
    if preloaded_cuheap() is not None:
        if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
            return "preload"
        return "preload-caching"
    if "cuheap_torch" in sys.modules and sys.modules["cuheap_torch"].installed():
        conf = os.environ.get("CUHEAP_CONF", "")
        return "cuheap-vmm" if "vmm:1" in conf else "cuheap-plain" if "vmm:0" in conf else "cuheap"
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        return "nocache"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" in conf:
        return "expandable"
    if "cudaMallocAsync" in conf:
        return "async"
    return "native"


def allocator_bytes():
    """(peak reserved, peak live, reserved now) of this process's allocator, in
    bytes; reserved is None where nothing is cached (nocache)."""
    if mode_name().startswith("preload"):
        # cuheap holds every byte: its peaks are the process's.
        st = preload_stats()
        if st.num_allocs == 0:
            raise SystemExit("libcuheap.so is preloaded but served no allocation")
        return st.reserved.peak, st.requested.peak, st.reserved.current
    if mode_name().startswith("cuheap"):
        stats = sys.modules["cuheap_torch"].memory_stats()
        return (stats["reserved_bytes.all.peak"], stats["requested_bytes.all.peak"],
                stats["reserved_bytes.all.current"])
    if base_mode_name() == "nocache":
        return None, torch.cuda.max_memory_allocated(), None
    return torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def device_used():
    """Bytes in use on this process's GPU as the driver counts them (NVML, which
    no allocator's hooks reach), or None where NVML cannot say."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    handle = ctypes.c_void_p()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        bus = "%08x:%02x:%02x.0" % (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
        found = nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(handle)) == 0
    except AttributeError:
        found = False
    if not found:
        return None
    mem = NvmlMemory()
    return mem.used if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == 0 else None


def outside_allocator(held):
    """Bytes this process holds on the GPU that its allocator (holding `held`
    bytes now) does not count: the CUDA context, loaded kernels, and what
    libraries take with cudaMalloc themselves (cuBLAS's default workspaces: under LD_PRELOAD cuheap serves and
    counts those, in PyTorch's own modes nobody does). Measured at the end,
    after every kernel and library has loaded; None where it cannot be."""
    torch.cuda.synchronize()
    used = device_used()
    return used - held if used is not None and held is not None else None


def cpu_waits():
    """Times cuheap made the CPU wait for the GPU (None for PyTorch's own modes)."""
    if mode_name().startswith("preload"):
        return preload_stats().num_cpu_waits
    if mode_name().startswith("cuheap"):
        return sys.modules["cuheap_torch"].memory_stats()["num_sync_all_streams"]
    return None


def retries():
    """Times this process's allocator released its cache to retry an allocation."""
    if mode_name().startswith("preload") or base_mode_name() == "nocache":
        return None
    if mode_name().startswith("cuheap"):
        return sys.modules["cuheap_torch"].memory_stats()["num_alloc_retries"]
    return torch.cuda.memory_stats().get("num_alloc_retries")


def apply_limit():
    """PyTorch's own modes under a *-limit mode: the same byte limit through
    set_per_process_memory_fraction (cuheap modes get it through CUHEAP_CONF)."""
    limit = memory_limit()
    if limit is None or mode_name().startswith(("cuheap", "preload")):
        return
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(limit / total)


def step_generator(seed, i):
    """The CUDA generator of step i's random data: the same in every mode and run."""
    return torch.Generator(device="cuda").manual_seed(seed * 1000 + i)


def optimize(opt, loss):
    """One training update from `loss` (gradients reset, backward, step); returns the loss."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def make_resnet50(seed):
    import torchvision
    model = torchvision.models.resnet50(weights=None).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        g = step_generator(seed, i)
        x = torch.randn(128, 3, 224, 224, device="cuda", generator=g)
        y = torch.randint(0, 1000, (128,), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        return optimize(opt, loss)
    return step


def make_gpt2(seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_positions=1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        g = step_generator(seed, i)
        ids = torch.randint(0, 50257, (16, 1024), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        return optimize(opt, loss)
    return step


def make_bert_varlen(seed):
    from transformers import BertConfig, BertForMaskedLM
    model = BertForMaskedLM(BertConfig()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    shapes = torch.Generator().manual_seed(seed)

    def step(i):
        batch = int(torch.randint(16, 49, (1,), generator=shapes))
        seq = int(torch.randint(64, 513, (1,), generator=shapes))
        g = step_generator(seed, i)
        ids = torch.randint(0, 30522, (batch, seq), device="cuda", generator=g)
        labels = torch.where(torch.rand(batch, seq, device="cuda", generator=g) < 0.15, ids,
                             torch.full_like(ids, -100))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        return optimize(opt, loss)
    return step


def make_sidestream(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    side = torch.cuda.Stream()
    host = torch.Generator().manual_seed(seed)
    pending = {}

    def prefetch(i):
        x = torch.randn(64, 3, 128, 128, generator=host).pin_memory()
        y = torch.randint(0, 10, (64,), generator=host).pin_memory()
        with torch.cuda.stream(side):
            pending[i] = (x.cuda(non_blocking=True), y.cuda(non_blocking=True), side.record_event())

    prefetch(0)

    def step(i):
        xg, yg, ready = pending.pop(i)
        prefetch(i + 1)   # the next batch copies while this one trains
        torch.cuda.current_stream().wait_event(ready)
        xg.record_stream(torch.cuda.current_stream())
        yg.record_stream(torch.cuda.current_stream())
        loss = torch.nn.functional.cross_entropy(model(xg), yg)
        return optimize(opt, loss)
    return step


def make_graph(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    static_in = torch.zeros(256, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):   # warm up on a side stream, as PyTorch's docs ask
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_in)
    state = {"mismatches": 0}

    def step(i):
        g = step_generator(seed, i)
        x = torch.randn(256, 1024, device="cuda", generator=g)
        static_in.copy_(x)
        graph.replay()
        eager = model(x)
        # Memory churn between replays: if cuheap handed out the graph's
        # memory, these writes would corrupt the next replay.
        junk = [torch.full((1 << 20,), float(k), device="cuda") for k in range(8)]
        del junk
        # Replay and eager may pick different kernels: compare with a tolerance
        # that rounding meets and corruption does not.
        if not torch.allclose(static_out, eager, rtol=1e-3, atol=1e-3):
            state["mismatches"] += 1
        return static_out.float().pow(2).mean()
    step.state = state
    return step


def make_llama_ckpt(seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
    model = LlamaForCausalLM(config).cuda()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    shapes = torch.Generator().manual_seed(seed)

    def step(i):
        seq = int(torch.randint(256, 2049, (1,), generator=shapes))
        g = step_generator(seed, i)
        ids = torch.randint(0, 32000, (8, seq), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        return optimize(opt, loss)
    return step


def make_kv_generate(seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(n_positions=1024)).cuda().eval()
    shapes = torch.Generator().manual_seed(seed)

    def step(i):
        prompt = int(torch.randint(64, 513, (1,), generator=shapes))
        g = step_generator(seed, i)
        ids = torch.randint(0, 50257, (8, prompt), device="cuda", generator=g)
        past = None
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(48):   # the cache grows by one token per step
                out = model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                ids = out.logits[:, -1:].argmax(-1)
        return out.logits[:, -1].float().mean()
    return step


JOBS = {"resnet50": make_resnet50, "gpt2": make_gpt2, "bert_varlen": make_bert_varlen,
        "sidestream": make_sidestream, "graph": make_graph, "llama_ckpt": make_llama_ckpt,
        "kv_generate": make_kv_generate}


def corpus_jobs():
    """The corpus's jobs (bench/corpus/jobs.py) as corpus:NAME: the jobs whose
    traces cuheap-corpus replays, timed here in any mode as the jobs above."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "corpus"))
    import jobs
    return {"corpus:" + name: j.make for name, j in jobs.JOBS.items()}


def job_arguments(doc, jobs):
    """--job (one of `jobs`), --steps and --seed, as every job script takes them."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--job", choices=sorted(jobs), required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def strict():
    """CUHEAP_BENCH_STRICT=1: every kernel must be deterministic (see deterministic)."""
    return os.environ.get("CUHEAP_BENCH_STRICT") == "1"


def deterministic(seed):
    """The same initial weights and, where PyTorch can, bitwise-repeatable kernels.

    With CUHEAP_BENCH_STRICT=1 every kernel must be repeatable: attention runs
    on PyTorch's math path (matrix products and a softmax) instead of the fused
    kernels, whose backward passes add up with atomics in whatever order the
    GPU runs them, and an operation with no deterministic kernel stops the job
    with an error instead of a warning. Slower, but two runs then give the same
    losses bit for bit, so any difference between allocators is the
    allocator's."""
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = False
    if strict():
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)
    torch.use_deterministic_algorithms(True, warn_only=not strict())


def main():
    jobs = {**JOBS, **corpus_jobs()}
    args = job_arguments(__doc__, jobs)
    make = jobs[args.job]
    deterministic(args.seed)
    apply_limit()
    step = make(args.seed)
    losses, times = [], []
    oom = None
    for i in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            loss = step(i)
            torch.cuda.synchronize()
        except (torch.OutOfMemoryError, RuntimeError) as e:
            # Under a memory limit an OOM is a result, not a crash; any other
            # error is re-raised.
            text = str(e)
            if not isinstance(e, torch.OutOfMemoryError) and "out of memory" not in text.lower() and \
                    not (mode_name().startswith("cuheap") and
                         sys.modules["cuheap_torch"].memory_stats()["num_ooms"] > 0):
                raise
            oom = {"step": i, "error": text.strip().splitlines()[0][:200]}
            break
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss))
    reserved, live, held = allocator_bytes()
    outside = outside_allocator(held)
    timed = times[3:] if len(times) > 3 else times
    result = {
        "job": args.job, "mode": mode_name(), "steps": args.steps,
        "step_ms": statistics.median(timed) if timed else None,
        "step_ms_each": [round(t, 1) for t in times],
        "losses": [x.hex() for x in losses], "last_loss": losses[-1] if losses else None,
        "peak_reserved": reserved, "peak_live": live, "outside_allocator": outside,
        "device_peak": reserved + outside if reserved is not None and outside is not None else None,
        "limit": memory_limit(), "retries": retries(),
        "cpu_waits": cpu_waits(),
        "oom": oom, "torch": torch.__version__, "strict": strict(),
    }
    if hasattr(step, "state"):
        result.update(step.state)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
