#!/usr/bin/env bash
# test_cuheap_torch.sh BUILD_DIR - scripts/cuheap_torch.py and
# scripts/sitecustomize.py without a GPU: a stand-in `torch` package records
# what the helper asks of PyTorch's pluggable-allocator API, so the three ways
# of turning cuheap on (install(), CUHEAP_TORCH=1, python -m cuheap_torch),
# the hook wiring, the too-late error, the statistics mapping and the switch of
# torch.compile to plain CUDA graphs are all checked against the real
# libcuheap.so.
set -uo pipefail
build=${1:-build}
[ -e "$build/libcuheap.so" ] || build=build
lib=$(cd "$build" && pwd)/libcuheap.so
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/harness.sh"

mkdir -p "$tmp/fake/torch/cuda"
cat > "$tmp/fake/torch/__init__.py" <<'PY'
"""A stand-in for torch: records what cuheap_torch does with the allocator API."""
import ctypes, os
from . import cuda, _C
__version__ = "fake"
PY
cat > "$tmp/fake/torch/_C.py" <<'PY'
"""What torch.cuda's statistics and CUDA-graph trees call on PyTorch's side.
Under a pluggable allocator the real statistics functions raise, as here; the
graph-tree ones raise too (here they answer, to show they were replaced)."""
def _plugin_refuses(what):
    raise RuntimeError("CUDAPluggableAllocator does not yet support %s. If you need it, please file an issue "
                       "describing your use case." % what)
def _cuda_memoryStats(device):
    _plugin_refuses("getDeviceStats")
def _cuda_resetPeakMemoryStats(device):
    _plugin_refuses("resetPeakStats")
def _cuda_resetAccumulatedMemoryStats(device):
    _plugin_refuses("resetAccumulatedStats")
def _cuda_memorySnapshot(mempool_id):
    _plugin_refuses("snapshot")
def _cuda_record_memory_history(enabled, *args):
    _plugin_refuses("recordHistory")
def _cuda_attach_out_of_memory_observer(observer):
    _plugin_refuses("attachOutOfMemoryObserver")
def _cuda_checkPoolLiveAllocations(device, pool, ptrs):
    return True
def _cuda_getCheckpointState(device, pool):
    return object()
def _cuda_setCheckpointPoolState(device, state, stale, add_deleters):
    return None
PY
mkdir -p "$tmp/fake/torch/_inductor"
: > "$tmp/fake/torch/_inductor/__init__.py"
cat > "$tmp/fake/torch/_inductor/config.py" <<'PY'
"""Inductor's settings, as far as CUDA graphs go."""
class triton:
    cudagraph_trees = True
PY
cat > "$tmp/fake/torch/cuda/__init__.py" <<'PY'
from . import memory
from .memory import (memory_stats, memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
                     reset_peak_memory_stats, reset_accumulated_memory_stats, memory_summary, memory_snapshot)
def current_device():
    return 0
PY
cat > "$tmp/fake/torch/cuda/memory.py" <<'PY'
import ctypes, os, sys
LOG = []
class _Backend:
    def __getattr__(self, name):
        if not name.startswith("set_"):
            raise AttributeError(name)
        return lambda ptr: LOG.append((name, ptr))
class CUDAPluggableAllocator:
    def __init__(self, path, alloc, free):
        lib = ctypes.CDLL(path)
        self.alloc = ctypes.cast(getattr(lib, alloc), ctypes.c_void_p).value
        self.free = ctypes.cast(getattr(lib, free), ctypes.c_void_p).value
        LOG.append(("create", path, alloc, free))
    def allocator(self):
        return _Backend()
def change_current_allocator(a):
    if os.environ.get("FAKE_TOO_LATE"):
        raise RuntimeError("Can't swap an already initialized allocator")
    LOG.append(("change", a.alloc is not None and a.free is not None))
# torch.cuda's statistics, written as PyTorch 2.11 writes them: through torch._C.
import torch
def memory_stats_as_nested_dict(device=None):
    return torch._C._cuda_memoryStats(0 if device is None else device)
def memory_stats(device=None):
    result = []
    def add(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                add(prefix + "." + k if prefix else k, v)
        else:
            result.append((prefix, obj))
    add("", memory_stats_as_nested_dict(device))
    return dict(sorted(result))
def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)
def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)
def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)
def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)
def reset_peak_memory_stats(device=None):
    return torch._C._cuda_resetPeakMemoryStats(0 if device is None else device)
def reset_accumulated_memory_stats(device=None):
    return torch._C._cuda_resetAccumulatedMemoryStats(0 if device is None else device)
def memory_summary(device=None, abbreviated=False):
    stats = memory_stats(device)
    return "large pool %d" % stats["allocated_bytes.large_pool.current"]
def memory_snapshot(mempool_id=None):
    return torch._C._cuda_memorySnapshot(mempool_id)["segments"]
def _snapshot(device=None):
    return torch._C._cuda_memorySnapshot(None)
def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=1 << 62):
    torch._C._cuda_record_memory_history(enabled, context, stacks, max_entries)
PY
export CUHEAP_LIB="$lib"
py() { PYTHONPATH="$root/scripts:$tmp/fake" python3 "$@" 2>&1; }

out=$(py -c '
import cuheap_torch, torch
cuheap_torch.install()
from torch.cuda.memory import LOG
names = [e[0] for e in LOG]
assert names[0] == "create" and LOG[0][2:] == ("cuheap_torch_alloc", "cuheap_torch_free"), LOG[0]
for s in ("set_reset_fn", "set_memory_fraction_fn", "set_record_stream_fn", "set_begin_allocate_to_pool",
          "set_end_allocate_to_pool_fn", "set_release_pool"):
    assert s in names, s
assert all(e[1] for e in LOG if e[0].startswith("set_")), "a hook address is NULL"
assert ("change", True) in LOG
assert cuheap_torch.installed()
cuheap_torch.install()   # twice is harmless
assert names.count("create") == 1
print("ok")')
check "install() wires alloc, free and every hook, once (got: $out)" '[ "$out" = ok ]'

out=$(FAKE_TOO_LATE=1 py -c '
import cuheap_torch
try:
    cuheap_torch.install()
except RuntimeError as e:
    print(e)')
check "install() after the first CUDA allocation explains itself" 'echo "$out" | grep -q "came too late"'

cat > "$tmp/train.py" <<'PY'
import sys, torch
print("installed" if sys.modules["cuheap_torch"].installed() else "not installed")
PY
out=$(CUHEAP_TORCH=1 py "$tmp/train.py")
check "CUHEAP_TORCH=1 installs when the unmodified script imports torch (got: $out)" '[ "$out" = installed ]'
out=$(py -c 'import sys, torch; print("cuheap_torch" in sys.modules)')
check "without CUHEAP_TORCH nothing is installed (got: $out)" '[ "$out" = False ]'
out=$(CUHEAP_TORCH=On py "$tmp/train.py")
check "CUHEAP_TORCH=On installs too (got: $out)" '[ "$out" = installed ]'
out=$(CUHEAP_TORCH=0 py -c 'import sys, torch; print("cuheap_torch" in sys.modules)')
check "CUHEAP_TORCH=0 leaves everything alone (got: $out)" '[ "$out" = False ]'
out=$(CUHEAP_TORCH=enable PYTHONPATH="$root/scripts:$tmp/fake" python3 -c \
    'import sys, torch; m = sys.modules.get("cuheap_torch"); print(bool(m and m.installed()))' 2>"$tmp/err")
check "CUHEAP_TORCH=enable is named on stderr, not silently taken for off (got: $out; $(cat "$tmp/err"))" \
    '[ "$out" = False ] && grep -q "CUHEAP_TORCH=.enable. is neither on" "$tmp/err"'
out=$(PYTHONPATH="$root/scripts:$tmp/fake" python3 -m cuheap_torch "$tmp/train.py" 2>&1)
check "python -m cuheap_torch script.py runs it installed (got: $out)" '[ "$out" = installed ]'
out=$(py -m cuheap_torch 2>&1); rc=$?
check "python -m cuheap_torch with no script is a usage error" '[ $rc -eq 2 ] && echo "$out" | grep -q usage'

size=$(printf '#include <cuheap.h>\n#include <stdio.h>\nint main(void){printf("%%zu",sizeof(cuheap_stats_t));return 0;}\n' |
       ${CC:-cc} -Iinclude -x c - -o "$tmp/sz" && "$tmp/sz")
out=$(py -c 'import ctypes, cuheap_torch; print(ctypes.sizeof(cuheap_torch._Stats))')
check "the ctypes mirror of cuheap_stats_t has its size ($size vs $out)" '[ "$size" = "$out" ]'

out=$(py -c '
import cuheap_torch
raw = {"requested": (10, 20), "allocated": (12, 24), "reserved": (30, 40), "cached": (18, 25), "pending": (1, 2),
       "num_allocs": 7, "num_frees": 5, "num_segment_allocs": 3, "num_segment_frees": 1, "num_cache_hits": 4,
       "num_retries": 2, "num_ooms": 1, "largest_free_extent": 9, "num_free_extents": 3, "limit": 0,
       "workspace": 0, "device_total": 100, "num_cpu_waits": 6}
s = cuheap_torch.torch_stats_from(raw)
assert s["allocated_bytes.all.current"] == 12 and s["allocated_bytes.all.peak"] == 24
assert s["reserved_bytes.all.peak"] == 40 and s["requested_bytes.all.current"] == 10
assert s["num_alloc_retries"] == 2 and s["num_ooms"] == 1
assert s["num_sync_all_streams"] == 6   # the CPU waits for the GPU
assert s["allocation.all.current"] == 2 and s["segment.all.current"] == 2
assert not any(k.startswith(("allocated_bytes.small", "allocated_bytes.large")) for k in s)
real = cuheap_torch.memory_stats(0)   # no GPU, device unused: zeros, same keys
assert set(real) == set(s) and real["reserved_bytes.all.current"] == 0
assert "cuheap memory summary" in cuheap_torch.memory_summary(0)
print("ok")')
check "memory_stats() has torch.cuda.memory_stats() keys filled from cuheap (got: $out)" '[ "$out" = ok ]'

out=$(py -c "
import cuheap_torch
cuheap_torch.dump_report('$tmp/r.json')
import json; r = json.load(open('$tmp/r.json')); assert r['schema'] == 'cuheap-report'
try:
    cuheap_torch.dump_report('$tmp/no/such/dir/r.txt')
except OSError as e:
    print('ok' if 'no/such/dir' in str(e) else e)")
check "dump_report() writes JSON and reports a bad path (got: $out)" '[ "$out" = ok ]'

# Steps: an installed cuheap marks one after every optimizer step, through
# torch.optim's global post-step hook, whether the optimizer module is imported
# before or after install(); the hook calls the library (mark_step).
mkdir -p "$tmp/fake/torch/optim"
: > "$tmp/fake/torch/optim/__init__.py"
cat > "$tmp/fake/torch/optim/optimizer.py" <<'PY'
"""torch.optim.optimizer's global post-step hooks."""
HOOKS = []
def register_optimizer_step_post_hook(hook):
    HOOKS.append(hook)
PY
out=$(LD_LIBRARY_PATH="$(dirname "$lib")/fake" py -c '
import ctypes, json, sys, cuheap_torch, torch
cuheap_torch.install()
import torch.optim.optimizer as o
assert len(o.HOOKS) == 1, o.HOOKS
lib = cuheap_torch._load()
alloc, free = lib.cuheap_torch_alloc, lib.cuheap_torch_free
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
for step in range(3):   # three optimizer steps, each with a block of its own
    a = alloc((step + 1) << 21, 0, None)
    free(a, (step + 1) << 21, 0, None)
    o.HOOKS[0](object(), (), {})
import cuheap
assert "mark_step" in cuheap.__all__ and cuheap.mark_step() is None
cuheap.dump_report(sys.argv[1])
st = json.load(open(sys.argv[1]))["devices"][0]["steps"]
print(st["marked"], [x["page_maps"] > 0 for x in st["last"]])' "$tmp/steps.json")
check "installed, torch.optim imported after: every optimizer step is a step of the report (got: $out)" \
    '[ "$out" = "4 [True, True, True, False]" ]'
out=$(py -c '
import torch, torch.optim.optimizer as o, cuheap_torch
cuheap_torch.install()
print(len(o.HOOKS))')
check "installed, torch.optim imported before: its hook is registered once (got: $out)" '[ "$out" = 1 ]'

# torch.compile(mode="reduce-overhead"): CUDA-graph trees need allocator
# checkpoints a plugin cannot give, so an installed cuheap selects plain CUDA
# graphs, whether inductor's settings are imported before or after, and the
# checkpoint functions then explain themselves instead of PyTorch's bare error.
out=$(py -c '
import cuheap_torch, torch
cuheap_torch.install()
import torch._inductor.config as c
print(c.triton.cudagraph_trees)')
check "installed, inductor imported after: plain CUDA graphs (got: $out)" '[ "$out" = False ]'
out=$(py -c '
import torch, torch._inductor.config as c, cuheap_torch
before = c.triton.cudagraph_trees
cuheap_torch.install()
print(before, c.triton.cudagraph_trees)')
check "installed, inductor imported before: plain CUDA graphs (got: $out)" '[ "$out" = "True False" ]'
out=$(CUHEAP_TORCH=1 py -c '
import torch, torch._inductor.config as c
print(c.triton.cudagraph_trees)')
check "CUHEAP_TORCH=1: plain CUDA graphs too (got: $out)" '[ "$out" = False ]'
out=$(py -c '
import cuheap_torch, torch, torch._inductor.config as c
print(c.triton.cudagraph_trees, torch._C._cuda_checkPoolLiveAllocations(0, (0, 1), set()))')
check "not installed: inductor and torch._C untouched (got: $out)" '[ "$out" = "True True" ]'
out=$(py -c '
import cuheap_torch, torch
cuheap_torch.install()
for name in ("_cuda_checkPoolLiveAllocations", "_cuda_getCheckpointState", "_cuda_setCheckpointPoolState"):
    try:
        getattr(torch._C, name)(0, (0, 1), set(), [])
        print("no error from", name)
    except RuntimeError as e:
        m = str(e)
        print("ok" if name in m and "cudagraph_trees" in m and "LD_PRELOAD" in m else m)')
check "installed: the graph-tree checkpoint calls name the way out (got: $out)" '[ "$out" = "$(printf "ok\nok\nok")" ]'

# torch.cuda's statistics: PyTorch's pluggable allocator raises for them, so a
# script that logs max_memory_allocated() would stop; installed, cuheap
# answers with its figures. Real blocks, on the fake driver, through the
# plugin's own entry points.
out=$(LD_LIBRARY_PATH="$(dirname "$lib")/fake" py -c '
import ctypes, cuheap_torch, torch
try:
    torch.cuda.max_memory_allocated(0)
    print("no error before install")
except RuntimeError as e:
    assert "getDeviceStats" in str(e)
cuheap_torch.install()
lib = cuheap_torch._load()
alloc, free = lib.cuheap_torch_alloc, lib.cuheap_torch_free
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
a, b = alloc(3 << 20, 0, None), alloc(5 << 20, 0, None)
assert a and b
cuda = torch.cuda
assert cuda.memory_allocated(0) == 8 << 20, cuda.memory_allocated(0)
assert cuda.max_memory_allocated(0) == 8 << 20
assert cuda.memory_reserved(0) >= 8 << 20 and cuda.max_memory_reserved(0) >= cuda.memory_reserved(0)
free(b, 5 << 20, 0, None)
assert cuda.memory_allocated(0) == 3 << 20 and cuda.max_memory_allocated(0) == 8 << 20
cuda.reset_peak_memory_stats(0)
assert cuda.max_memory_allocated(0) == 3 << 20, cuda.max_memory_allocated(0)
s = cuda.memory_stats(0)
assert s["allocation.all.allocated"] == 2 and s["allocation.all.freed"] == 1 and s["allocation.all.current"] == 1
cuda.reset_accumulated_memory_stats(0)
s = cuda.memory_stats(0)
assert s["allocation.all.allocated"] == 0 and s["allocation.all.freed"] == 0 and s["allocation.all.current"] == 1
c = alloc(1 << 20, 0, None)
s = cuda.memory_stats(0)
assert s["allocation.all.allocated"] == 1 and s["allocation.all.current"] == 2, s
assert s == cuheap_torch.memory_stats(0)
assert "cuheap memory summary" in cuda.memory_summary(0) and "cuheap memory summary" in cuda.memory.memory_summary()
print("ok")')
check "installed: torch.cuda.memory_stats, max_memory_allocated, resets and memory_summary answer from cuheap (got: $out)" '[ "$out" = ok ]'

# Snapshots: PyTorch's raises for a plugin; installed, cuheap's blocks in
# PyTorch's format, on plain segments and under vmm:1 (one segment per mapped
# range), and _record_memory_history() says once that it records nothing.
for conf in vmm:0 vmm:1; do
    out=$(CUHEAP_CONF=$conf LD_LIBRARY_PATH="$(dirname "$lib")/fake" PYTHONPATH="$root/scripts:$tmp/fake" python3 -c '
import ctypes, cuheap_torch, torch
cuheap_torch.install()
lib = cuheap_torch._load()
alloc, free = lib.cuheap_torch_alloc, lib.cuheap_torch_free
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
a, b, c = alloc(3 << 20, 0, None), alloc(5 << 20, 0, None), alloc(1000, 0, None)
free(b, 5 << 20, 0, None)
snap = torch.cuda.memory._snapshot()
segs = snap["segments"]
assert segs and snap["device_traces"] == [[]], snap["device_traces"]
assert torch.cuda.memory_snapshot() == segs
for g in segs:
    at = g["address"]
    for x in g["blocks"]:
        assert x["address"] == at, (g, x)    # the blocks tile the segment
        at += x["size"]
    assert at == g["address"] + g["total_size"]
    assert g["allocated_size"] == sum(x["size"] for x in g["blocks"] if x["state"] == "active_allocated")
    assert g["is_expandable"] == ("vmm:1" in __import__("os").environ["CUHEAP_CONF"])
assert sum(g["total_size"] for g in segs) == torch.cuda.memory_reserved(0)
blocks = [x for g in segs for x in g["blocks"]]
used = {x["address"]: x for x in blocks if x["state"] == "active_allocated"}
assert a in used and used[a]["requested_size"] == 3 << 20 and used[a]["size"] >= 3 << 20
assert b not in used and any(x["address"] <= b < x["address"] + x["size"] for x in blocks if x["state"] == "inactive")
slab = [x for x in used.values() if x["address"] <= c < x["address"] + x["size"]]
assert len(slab) == 1 and slab[0]["requested_size"] >= 1000, slab
torch.cuda.memory._record_memory_history()
torch.cuda.memory._record_memory_history()
torch.cuda.memory._record_memory_history(None)
print("ok")' 2>"$tmp/snap.err")
    notices=$(grep -c "records no history" "$tmp/snap.err")
    check "$conf: torch.cuda.memory._snapshot() shows cuheap's blocks in PyTorch's form; history: one notice (got: $out, $notices notices; $(tail -c 300 "$tmp/snap.err"))" \
        '[ "$out" = ok ] && [ "$notices" = 1 ]'
done

# Out-of-memory observers (PyTorch's guide dumps a snapshot from one): called
# with the device, the bytes asked for, the limit and the device's free
# bytes, before the failure returns; one may take a snapshot from inside.
# Python has no C++ runtime here, so the failed allocation returns NULL.
out=$(CUHEAP_CONF=limit:4M LD_LIBRARY_PATH="$(dirname "$lib")/fake" PYTHONPATH="$root/scripts:$tmp/fake" python3 -c '
import ctypes, cuheap_torch, torch
cuheap_torch.install()
seen = []
def observer(device, alloc, allowed, free):
    seen.append((device, alloc, allowed, free > 0, len(torch.cuda.memory._snapshot()["segments"]) > 0))
torch._C._cuda_attach_out_of_memory_observer(observer)
lib = cuheap_torch._load()
alloc = lib.cuheap_torch_alloc
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
assert alloc(1 << 20, 0, None) and not seen
assert alloc(64 << 20, 0, None) is None
print(seen)' 2>"$tmp/oom.err")
check "installed: an out-of-memory calls the attached observers, which may take a snapshot (got: $out; $(tail -c 200 "$tmp/oom.err"))" \
    '[ "$out" = "[(0, 67108864, 4194304, True, True)]" ]'

finish test_cuheap_torch
