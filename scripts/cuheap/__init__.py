"""cuheap: cuheap as PyTorch's CUDA allocator.

Installed with `pip install .` from the cuheap repository (the package then
carries libcuheap.so), or used from the repository's scripts/ folder. Three
ways to turn it on, none of which needs a change to a training script beyond
the first:

    import cuheap; cuheap.install()        # in code, before any CUDA tensor
    CUHEAP_TORCH=1 python train.py         # by environment (pip-installed; else
                                           # also PYTHONPATH=/path/to/cuheap/scripts)
    python -m cuheap train.py args...      # runs the script with cuheap installed

`python -m cuheap` alone says which library it would load and how it would be
turned on. The launcher `cuheap --torch -- COMMAND` sets up the second way for
any command. scripts/cuheap_torch.py keeps the module's old name working: it
is this package under both names.

The library is found from CUHEAP_LIB, else libcuheap.so inside this package
(the pip package's copy, or make install's link to it), else
build/libcuheap.so of the source tree this folder is in. Settings come from
CUHEAP_CONF (docs/settings.md); as PyTorch's allocator cuheap runs on CUDA
virtual memory (vmm:1) unless CUHEAP_CONF sets vmm.

Then memory_stats() answers with the keys of torch.cuda.memory_stats() (whose
own version raises for pluggable allocators), memory_summary() prints a
summary, and dump_report(path) writes cuheap's full report, with what each
of the last optimizer steps asked of the device (mark_step() marks others). Once installed,
torch.cuda's own statistics functions (memory_stats, max_memory_allocated,
reset_peak_memory_stats, ...) answer from cuheap too, where PyTorch's plugin
interface would raise, and torch.compile(mode="reduce-overhead") records plain
CUDA graphs instead of CUDA-graph trees, which that interface cannot serve.

Standard library and torch only.
"""

import ctypes
import os
import runpy
import sys

__all__ = ["install", "installed", "memory_stats", "memory_summary", "memory_snapshot", "reset_peak_memory_stats",
           "reset_accumulated_memory_stats", "dump_report", "mark_step", "last_error", "library_path", "status"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_lib = None
_allocator = None


class _Stat(ctypes.Structure):
    _fields_ = [("current", ctypes.c_uint64), ("peak", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    """Mirror of cuheap_stats_t in include/cuheap.h (same order)."""

    _fields_ = [
        ("requested", _Stat),
        ("allocated", _Stat),
        ("reserved", _Stat),
        ("cached", _Stat),
        ("pending", _Stat),
        ("num_allocs", ctypes.c_uint64),
        ("num_frees", ctypes.c_uint64),
        ("num_segment_allocs", ctypes.c_uint64),
        ("num_segment_frees", ctypes.c_uint64),
        ("num_cache_hits", ctypes.c_uint64),
        ("num_retries", ctypes.c_uint64),
        ("num_ooms", ctypes.c_uint64),
        ("largest_free_extent", ctypes.c_uint64),
        ("num_free_extents", ctypes.c_uint64),
        ("limit", ctypes.c_uint64),
        ("workspace", ctypes.c_uint64),
        ("device_total", ctypes.c_uint64),
        ("num_cpu_waits", ctypes.c_uint64),
    ]


def _library_candidates():
    """Where libcuheap.so may be, in order: inside this package (the pip
    package's copy, make install's link), then the source tree's build folder
    (this package is scripts/cuheap there)."""
    return [os.path.join(_HERE, "libcuheap.so"),
            os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "libcuheap.so")]


def library_path():
    """Where libcuheap.so is: $CUHEAP_LIB, else the first of the places above
    that has it (else the first, which _load() reports missing)."""
    if os.environ.get("CUHEAP_LIB"):
        return os.environ["CUHEAP_LIB"]
    candidates = _library_candidates()
    return next((c for c in candidates if os.path.exists(c)), candidates[0])


def _load():
    global _lib
    if _lib is None:
        path = library_path()
        if not os.path.exists(path):
            where = ("CUHEAP_LIB=%s" % path if os.environ.get("CUHEAP_LIB")
                     else " or ".join(_library_candidates()))
            raise RuntimeError(
                "cuheap: libcuheap.so not found (%s); build it with 'make' in the cuheap folder, "
                "install the package with 'pip install .', or set CUHEAP_LIB" % where)
        _lib = ctypes.CDLL(path)
        _lib.cuheap_last_error.restype = ctypes.c_char_p
        _lib.cuheap_status_string.restype = ctypes.c_char_p
        _lib.cuheap_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
        _lib.cuheap_dump_report.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _lib.cuheap_reset_peaks.argtypes = [ctypes.c_int]
    return _lib


def _address(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def installed():
    """True once cuheap serves this process's CUDA allocations."""
    return _allocator is not None


def _answer_to_old_name():
    """Programs written for the module's old name look it up as
    sys.modules["cuheap_torch"] (bench/torch/train_job.py does, to read the
    statistics): once cuheap is turned on it is there under both names."""
    sys.modules.setdefault("cuheap_torch", sys.modules[__name__])


def install():
    """Makes cuheap PyTorch's CUDA allocator. Call before the first CUDA tensor;
    afterwards PyTorch cannot switch allocators and this raises RuntimeError."""
    global _allocator
    if _allocator is not None:
        return
    _answer_to_old_name()
    import torch

    lib = _load()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "cuheap_torch_alloc", "cuheap_torch_free")
    backend = allocator.allocator()
    hooks = [
        ("set_init_fn", "cuheap_torch_init"),
        ("set_reset_fn", "cuheap_torch_reset"),
        ("set_memory_fraction_fn", "cuheap_torch_memory_fraction"),
        ("set_record_stream_fn", "cuheap_torch_record_stream"),
        ("set_base_alloc_fn", "cuheap_torch_base_alloc"),
        ("set_begin_allocate_to_pool", "cuheap_torch_begin_pool"),
        ("set_end_allocate_to_pool_fn", "cuheap_torch_end_pool"),
        ("set_release_pool", "cuheap_torch_release_pool"),
    ]
    missing = []
    for setter, symbol in hooks:
        if hasattr(backend, setter):
            getattr(backend, setter)(_address(lib, symbol))
        else:
            missing.append(setter)
    if missing:
        sys.stderr.write("cuheap: this PyTorch has no %s; those features fall back to PyTorch's defaults\n"
                         % ", ".join(missing))
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise RuntimeError(
            "cuheap.install() came too late: PyTorch has already made CUDA allocations with its own "
            "allocator and cannot switch (%s). Call install() before the first CUDA tensor, or use "
            "CUHEAP_TORCH=1 / python -m cuheap." % e) from None
    _allocator = allocator
    _answer_torch_statistics()
    _use_plain_cuda_graphs()
    _mark_optimizer_steps()


def mark_step():
    """Marks the end of a step: cuheap's reports then show what each of the last
    32 steps asked of the device (pages mapped and moved, new device memory, CPU
    waits for the GPU). Once installed, every optimizer step is marked on its
    own (two optimizers stepping in one iteration mark two steps)."""
    _load().cuheap_mark_step()


def _mark_optimizer_steps():
    """Marks a step after every optimizer step, through torch.optim's global
    post-step hook (PyTorch 2.0 and later; older ones mark none)."""
    def hook(module):
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is not None:
            register(lambda optimizer, args, kwargs: mark_step())
    _after_import("torch.optim.optimizer", hook)


def last_error():
    """cuheap's explanation of the calling thread's last failure, or ''."""
    return _load().cuheap_last_error().decode()


def _raw_stats(device):
    stats = _Stats()
    rc = _load().cuheap_get_stats(device, ctypes.byref(stats))
    if rc != 0:
        raise RuntimeError("cuheap_get_stats: %s" % last_error())
    return {name: (getattr(stats, name).current, getattr(stats, name).peak) if isinstance(getattr(stats, name), _Stat)
            else getattr(stats, name) for name, _ in _Stats._fields_}


def torch_stats_from(raw):
    """torch.cuda.memory_stats()-style keys from cuheap's statistics (a dict as
    _raw_stats returns). Only the "all" pools: cuheap has no small/large split
    in PyTorch's sense, so pool-specific keys are absent rather than invented."""
    out = {}

    def stat(prefix, pair):
        out[prefix + ".all.current"] = pair[0]
        out[prefix + ".all.peak"] = pair[1]

    stat("allocated_bytes", raw["allocated"])
    stat("active_bytes", raw["allocated"])
    stat("requested_bytes", raw["requested"])
    stat("reserved_bytes", raw["reserved"])
    stat("inactive_split_bytes", raw["cached"])
    out["allocation.all.current"] = raw["num_allocs"] - raw["num_frees"]
    out["allocation.all.allocated"] = raw["num_allocs"]
    out["allocation.all.freed"] = raw["num_frees"]
    out["segment.all.current"] = raw["num_segment_allocs"] - raw["num_segment_frees"]
    out["segment.all.allocated"] = raw["num_segment_allocs"]
    out["segment.all.freed"] = raw["num_segment_frees"]
    out["num_alloc_retries"] = raw["num_retries"]
    out["num_ooms"] = raw["num_ooms"]
    out["num_device_alloc"] = raw["num_segment_allocs"]
    out["num_device_free"] = raw["num_segment_frees"]
    # PyTorch counts the times its allocator stalled on the GPU; cuheap's
    # counterpart is every time it made the CPU wait (an event or the device).
    out["num_sync_all_streams"] = raw["num_cpu_waits"]
    # cuheap's own figures, under a prefix no torch key uses.
    out["cuheap.pending_bytes.current"], out["cuheap.pending_bytes.peak"] = raw["pending"]
    out["cuheap.cache_hits"] = raw["num_cache_hits"]
    out["cuheap.largest_free_extent"] = raw["largest_free_extent"]
    out["cuheap.num_free_extents"] = raw["num_free_extents"]
    out["cuheap.limit"] = raw["limit"]
    out["cuheap.workspace"] = raw["workspace"]
    return out


def _device_index(device):
    if device is None:
        import torch
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is None:
        import torch
        return torch.cuda.current_device()
    return index


# Counters that torch.cuda.reset_accumulated_memory_stats() sets back to 0:
# cuheap's own keep counting (its reports show totals), so the reset is a
# baseline per device that these figures are taken from.
_ACCUMULATED = ("allocation.all.allocated", "allocation.all.freed", "segment.all.allocated", "segment.all.freed",
                "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams",
                "cuheap.cache_hits")
_baselines = {}


def memory_stats(device=None):
    """Like torch.cuda.memory_stats(device), filled from cuheap."""
    d = _device_index(device)
    stats = torch_stats_from(_raw_stats(d))
    for key, value in _baselines.get(d, {}).items():
        stats[key] -= value
    return stats


def reset_accumulated_memory_stats(device=None):
    """Like torch.cuda.reset_accumulated_memory_stats(device): the counters of
    allocations, frees, segments, retries and OOMs start again from 0."""
    d = _device_index(device)
    stats = torch_stats_from(_raw_stats(d))
    _baselines[d] = {key: stats[key] for key in _ACCUMULATED}


def reset_peak_memory_stats(device=None):
    """Like torch.cuda.reset_peak_memory_stats(device): peaks become the
    current values (cuheap's own peaks, in its reports too)."""
    d = _device_index(device)
    if _load().cuheap_reset_peaks(d) != 0:
        raise RuntimeError("cuheap_reset_peaks: %s" % last_error())


def _nested(flat):
    """The nested dict torch._C._cuda_memoryStats returns, from flat keys."""
    out = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _gib(n):
    return "%.2f GiB" % (n / 2.0 ** 30)


def memory_summary(device=None, abbreviated=False):
    """A short text summary, like torch.cuda.memory_summary(), with cuheap's
    fragmentation figures (`abbreviated` is accepted for its sake and changes
    nothing)."""
    d = _device_index(device)
    r = _raw_stats(d)
    lines = ["cuheap memory summary, device %d" % d,
             "%-18s %12s %12s" % ("", "current", "peak")]
    for name in ("requested", "allocated", "reserved", "cached", "pending"):
        lines.append("%-18s %12s %12s" % (name, _gib(r[name][0]), _gib(r[name][1])))
    frag = 1.0 - r["largest_free_extent"] / r["cached"][0] if r["cached"][0] else 0.0
    lines.append("allocations %d, frees %d, cache hits %d, segments %d, retries %d, OOMs %d"
                 % (r["num_allocs"], r["num_frees"], r["num_cache_hits"], r["num_segment_allocs"],
                    r["num_retries"], r["num_ooms"]))
    lines.append("free extents %d, largest %s (1 - largest/cached = %.3f)"
                 % (r["num_free_extents"], _gib(r["largest_free_extent"]), frag))
    return "\n".join(lines) + "\n"


def dump_report(path, format=None):
    """Writes cuheap's report of every device to path (%p becomes the process
    id): format 'json', 'html' or 'text', by default from the path's ending."""
    formats = {"text": 0, "json": 1, "html": 2}
    if format is None:
        format = next((f for f in ("json", "html") if str(path).endswith("." + f)), "text")
    if format not in formats:
        raise ValueError("format must be 'json', 'html' or 'text', not %r" % (format,))
    rc = _load().cuheap_dump_report(os.fsencode(path), formats[format])
    if rc != 0:
        raise OSError("cuheap_dump_report(%s): %s" % (path, last_error()))


# ---- after an import -----------------------------------------------------------

class _AfterImport:
    """A meta-path finder that calls `then(module)` right after the module
    `name` has been imported, once."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module, then = spec.loader.exec_module, self.then

        def exec_then(module):
            exec_module(module)
            then(module)

        spec.loader.exec_module = exec_then
        return spec


def _after_import(name, then):
    """Calls then(module) now if `name` is imported, else right after its import."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


# ---- memory snapshots -------------------------------------------------------------

def _snapshot_blocks(extents, classes, lo, hi):
    """PyTorch's blocks for cuheap's extents, clipped to [lo, hi)."""
    blocks = []
    for x in extents:
        start, end = max(x["addr"], lo), min(x["addr"] + x["size"], hi)
        if start >= end:
            continue
        if x["kind"] == "block":
            requested, state = x["requested"], "active_allocated"
        elif x["kind"] == "slab":
            # A slab of small objects is one block: its requested size is
            # what its live objects take.
            requested = x["live"] * classes[x["size_class"]]["size"]
            state = "active_allocated" if x["live"] else "inactive"
        else:
            requested, state = 0, "inactive"
        blocks.append({"address": start, "size": end - start, "requested_size": requested, "state": state,
                       "frames": []})
    return blocks


def _snapshot_segment(device, address, size, blocks, expandable):
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": address, "total_size": size, "allocated_size": active,
            "active_size": active, "requested_size": sum(b["requested_size"] for b in blocks), "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": [],
            "blocks": blocks}


def memory_snapshot():
    """The dictionary torch.cuda.memory._snapshot() returns ("segments",
    "device_traces"), made from cuheap's report of every device: a plain
    segment is a segment; under vmm:1 each mapped range of the reservation is
    one (is_expandable), so total_size adds up to the reserved bytes. Blocks
    are cuheap's blocks, its slabs of small objects (one block each) and its
    free extents ("inactive"). No stack frames and no traces: PyTorch's plugin
    interface passes no allocation events (record a trace with
    CUHEAP_CONF=trace:PATH instead)."""
    import json
    import tempfile
    fd, path = tempfile.mkstemp(prefix="cuheap-snapshot-", suffix=".json")
    os.close(fd)
    try:
        dump_report(path, "json")
        with open(path) as f:
            report = json.load(f)
    finally:
        os.unlink(path)
    segments, devices = [], 0
    for dev in report["devices"]:
        d, classes = dev["device"], dev["size_classes"]
        devices = max(devices, d + 1)
        for g in dev["segments"]:
            if g["virtual"]:
                for address, size in g.get("mapped_runs", []):
                    blocks = _snapshot_blocks(g["extents"], classes, address, address + size)
                    segments.append(_snapshot_segment(d, address, size, blocks, True))
            else:
                blocks = _snapshot_blocks(g["extents"], classes, g["base"], g["base"] + g["size"])
                segments.append(_snapshot_segment(d, g["base"], g["size"], blocks, False))
    return {"segments": sorted(segments, key=lambda g: (g["device"], g["address"])),
            "device_traces": [[] for _ in range(devices)], "allocator_settings": {}}


_HISTORY_NOTICE = (
    "cuheap: torch.cuda.memory._record_memory_history() records no history with cuheap as PyTorch's allocator "
    "(PyTorch's pluggable-allocator interface passes no allocation events); snapshots "
    "(torch.cuda.memory._snapshot(), _dump_snapshot()) show cuheap's segments and blocks without traces. "
    "CUHEAP_CONF=trace:PATH records every allocation and free, for cuheap-replay\n")
_history_noticed = False


def _record_no_history(enabled="all", *args, **kwargs):
    global _history_noticed
    if enabled is not None and enabled is not False and not _history_noticed:
        _history_noticed = True
        sys.stderr.write(_HISTORY_NOTICE)


# ---- out-of-memory observers --------------------------------------------------------
#
# torch._C._cuda_attach_out_of_memory_observer(fn) is how PyTorch's memory
# guide, and frameworks such as Megatron-LM, dump a snapshot at the moment
# memory runs out; a pluggable allocator refuses it. Installed, cuheap calls
# each observer as PyTorch's allocator would: fn(device, bytes asked for, the
# most the device may hold (the limit, or its memory), its free bytes), after
# its explanation on stderr and before the exception, from the allocating
# thread.

_oom_observers = []
_oom_callback = None


def _call_oom_observers(device, requested, allowed, free):
    for observer in list(_oom_observers):
        observer(device, requested, allowed, free)


def _attach_oom_observer(observer):
    global _oom_callback
    if _oom_callback is None:
        prototype = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
        _oom_callback = prototype(_call_oom_observers)   # kept: the library holds its address
        _load().cuheap_torch_set_oom_observer(_oom_callback)
    _oom_observers.append(observer)


# ---- torch.cuda's statistics ---------------------------------------------------
#
# torch.cuda.memory_stats(), memory_allocated(), max_memory_allocated(),
# memory_reserved(), max_memory_reserved(), reset_peak_memory_stats() and
# reset_accumulated_memory_stats() reach the allocator through three functions
# of torch._C, which PyTorch's pluggable allocator answers with "does not yet
# support getDeviceStats" (2.11): a training script that logs its peak memory,
# and torch.compile's kernel tuning, would stop there. Once installed, cuheap
# answers them with its own figures, the keys of memory_stats() above (pool
# keys such as "allocated_bytes.large_pool.current" stay absent: cuheap has no
# such pools), and torch.cuda.memory_summary(), which reads those pool keys,
# becomes memory_summary() above. Snapshots (torch.cuda.memory_snapshot(),
# memory._snapshot(), _dump_snapshot()) become memory_snapshot() above,
# memory._record_memory_history(), which would raise, says once that there is
# no history to record, and out-of-memory observers are called (above).

def _replace_in_torch_c(functions):
    """Puts each of `functions` (name -> function) in torch._C in place of
    PyTorch's own, where this PyTorch has one by that name."""
    import torch
    torch_c = getattr(torch, "_C", None)
    for name, function in functions.items():
        if torch_c is not None and hasattr(torch_c, name):
            setattr(torch_c, name, function)


def _answer_torch_statistics():
    import torch
    _replace_in_torch_c({
        "_cuda_memoryStats": lambda device: _nested(memory_stats(device)),
        "_cuda_resetPeakMemoryStats": reset_peak_memory_stats,
        "_cuda_resetAccumulatedMemoryStats": reset_accumulated_memory_stats,
        "_cuda_memorySnapshot": lambda *args, **kwargs: memory_snapshot(),
        "_cuda_record_memory_history": _record_no_history,
        "_cuda_record_memory_history_legacy": _record_no_history,
        "_cuda_attach_out_of_memory_observer": _attach_oom_observer,
    })
    cuda = getattr(torch, "cuda", None)
    for owner in (cuda, getattr(cuda, "memory", None)):
        if owner is not None and hasattr(owner, "memory_summary"):
            owner.memory_summary = memory_summary


# ---- torch.compile's CUDA graphs ----------------------------------------------
#
# torch.compile(mode="reduce-overhead") records CUDA graphs through "CUDA-graph
# trees", which save and restore the caching allocator's books of a graph pool
# (torch._C._cuda_getCheckpointState, _cuda_setCheckpointPoolState) and check
# them (_cuda_checkPoolLiveAllocations). PyTorch's pluggable-allocator
# interface has none of these (2.11: "pluggable does not yet support
# checkPoolLiveAllocations"), so with any plugin installed that mode fails at
# its first call. Inductor's other way, plain CUDA graphs over a private pool
# (torch._inductor.config.triton.cudagraph_trees = False), needs only what
# cuheap implements: once installed, cuheap selects it. Setting it back to True
# reaches the functions below, which then say so.

_TREES_REFUSED = (
    "cuheap: torch._C.%s is not available with a pluggable allocator such as cuheap: torch.compile's "
    "CUDA-graph trees (mode='reduce-overhead' with torch._inductor.config.triton.cudagraph_trees=True) "
    "need it. cuheap sets cudagraph_trees=False when it is installed, so that reduce-overhead records "
    "plain CUDA graphs; something set it back to True. Leave it False, compile with "
    "mode='max-autotune-no-cudagraphs', or run the job with LD_PRELOAD=libcuheap.so instead "
    "(PyTorch keeps its own allocator there, and cuheap serves its device memory)")


def _plain_cuda_graphs(config):
    config.triton.cudagraph_trees = False


def _refusal(name):
    def refuse(*args, **kwargs):
        raise RuntimeError(_TREES_REFUSED % name)
    return refuse


def _use_plain_cuda_graphs():
    _replace_in_torch_c({name: _refusal(name) for name in (
        "_cuda_checkPoolLiveAllocations", "_cuda_getCheckpointState", "_cuda_setCheckpointPoolState")})
    # Importing inductor takes seconds: its settings are changed when the
    # program imports them, not before.
    _after_import("torch._inductor.config", _plain_cuda_graphs)


# ---- activation by environment ------------------------------------------------

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def environment_asks():
    """Whether CUHEAP_TORCH turns cuheap on. A value that is neither on nor off
    is said on stderr, not silently taken for off."""
    value = os.environ.get("CUHEAP_TORCH", "")
    if value.strip().lower() in _ON:
        return True
    if value.strip().lower() not in _OFF:
        sys.stderr.write("cuheap: CUHEAP_TORCH=%r is neither on (%s) nor off (%s); cuheap is not installed\n"
                         % (value, ", ".join(_ON), ", ".join(v for v in _OFF if v) + " or empty"))
    return False


def activate_from_environment():
    """With CUHEAP_TORCH=1, installs cuheap when torch is imported."""
    if not environment_asks():
        return
    _answer_to_old_name()
    # Right after `import torch` finishes, before the program can make a
    # CUDA tensor.
    _after_import("torch", lambda module: install())


def status():
    """What `python -m cuheap` says: the library, whether it loads, and how
    cuheap would be turned on here. Returns 0 when the library loads."""
    import importlib.util
    path = library_path()
    lines = ["package: %s" % _HERE,
             "library: %s%s" % (path, " (from CUHEAP_LIB)" if os.environ.get("CUHEAP_LIB") else "")]
    rc = 0
    try:
        _load()
        lines.append("library loads: yes")
    except (OSError, RuntimeError) as e:
        lines.append("library loads: no (%s)" % e)
        rc = 1
    asked = environment_asks()
    lines.append("CUHEAP_TORCH=%s: %s" % (os.environ.get("CUHEAP_TORCH", ""),
                                         "cuheap becomes PyTorch's allocator when torch is imported" if asked
                                         else "PyTorch keeps its own allocator"))
    lines.append("CUHEAP_CONF=%s" % os.environ.get("CUHEAP_CONF", ""))
    lines.append("torch: %s" % ("importable" if importlib.util.find_spec("torch") else "not found"))
    lines.append("turn it on: CUHEAP_TORCH=1 python train.py, python -m cuheap train.py, "
                 "or cuheap.install() before the first CUDA tensor")
    sys.stdout.write("\n".join(lines) + "\n")
    return rc


def main(argv, prog="cuheap"):
    """python -m cuheap [script.py args...]: runs the script with cuheap
    installed; with no script, says what it would do (status())."""
    if len(argv) < 2:
        return status()
    if argv[1] in ("-h", "--help") or argv[1].startswith("-"):
        sys.stderr.write("usage: python -m %s [SCRIPT [ARGS...]]\n"
                         "  with SCRIPT: runs it with cuheap as PyTorch's allocator\n"
                         "  without: says which library would be loaded, and how cuheap is turned on\n" % prog)
        return 0 if argv[1] in ("-h", "--help") else 2
    import torch  # noqa: F401  (install needs it)
    # The script's own `import cuheap` finds this module (python -m runs
    # __main__.py, which imported it as cuheap), and install() puts it under
    # the old name too: no second copy tries to install again.
    install()
    script = argv[1]
    sys.argv = argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0
