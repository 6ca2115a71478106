"""torch_checks.py - cuheap as PyTorch's allocator, on a real GPU: each check
runs a fresh Python process (an allocator is chosen once per process) and
prints PASS or FAIL with what it saw; a Markdown table ends the output.

  env      CUHEAP_TORCH=1 serves an unmodified script (no cuheap import in it)
  late     install() after the first CUDA tensor fails with an explanation
  oom      an out-of-memory shows cuheap's cause on stderr, and PyTorch raises
           a RuntimeError saying "CUDA out of memory." and the cause
  cache    torch.cuda.empty_cache() releases cuheap's cached segments
  fraction set_per_process_memory_fraction() becomes cuheap's limit
  stats    memory_stats() carries torch's keys with cuheap's numbers
  torchapi torch.cuda.memory_allocated(), max_memory_allocated(), the resets
           and memory_summary() answer from cuheap (PyTorch's own raise for a
           pluggable allocator)
  oomobserver an observer attached with torch._C._cuda_attach_out_of_memory_observer
           is called at an out-of-memory with PyTorch's arguments and can take
           a snapshot there
  snapshot torch.cuda.memory._snapshot() and _dump_snapshot() give cuheap's
           segments and blocks in PyTorch's form (every live tensor in an
           active block, the segments adding up to memory_reserved()), which
           torch.cuda._memory_viz renders; _record_memory_history() notes
           once that there is no history instead of raising
  report   a training-like loop pushed past limit:6G gets cause "limit", and
           report:PATH writes its JSON and HTML reports (copied to $OUT, when
           set, to be opened in a browser)
  compile  torch.compile(mode="reduce-overhead") (CUDA graphs, two input
           shapes) trains with the same losses natively, with cuheap as
           plugin (plain CUDA graphs: cuheap_torch turns graph trees off) and
           under LD_PRELOAD (graph trees, PyTorch's allocator over cuheap)
  preloadoom under LD_PRELOAD without PyTorch's cache, an out-of-memory after a
           matrix product raises an error saying out of memory, and cuheap's line on
           stderr names PyTorch's library and cuBLAS's as holding memory;
           its report (written at the failure) has the device's free bytes and
           cuBLAS among the callers; a run without an out-of-memory writes
           its report at exit, saying it did not ask the device
  ipc      a CUDA tensor sent to a child process (torch.multiprocessing,
           spawn): under LD_PRELOAD with ipc_safe:1 the child reads it and
           writes through it; with the default settings it works or is
           refused with a message naming ipc_safe; as plugin PyTorch refuses
           to share (its plugin interface has no IPC); never wrong data

`python3 torch_checks.py NAME...` runs only the checks named.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(code, timeout=180, script=None, **env_extra):
    """Runs `code` (or the file `script`) in a fresh Python with the scripts
    folder on PYTHONPATH and env_extra in its environment: (rc, stdout, stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "scripts") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    argv = [sys.executable, script] if script else [sys.executable, "-c", code]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


CHECKS = []


def check(name):
    def deco(fn):
        CHECKS.append((name, fn))
        return fn
    return deco


@check("env")
def env_activation():
    rc, out, err = run("import torch, sys\n"
                       "x = torch.randn(1 << 20, device='cuda')\n"
                       "m = sys.modules.get('cuheap_torch')\n"
                       "print(bool(m and m.installed()), m.memory_stats()['allocated_bytes.all.current'] if m else 0)",
                       CUHEAP_TORCH="1")
    ok = rc == 0 and out.startswith("True") and int(out.split()[1]) >= 4 << 20
    return ok, out or err[-300:]


@check("late")
def too_late():
    rc, out, err = run("import torch, cuheap_torch\n"
                       "x = torch.randn(10, device='cuda')\n"
                       "cuheap_torch.install()")
    return rc != 0 and "came too late" in err, err.splitlines()[-1][:200] if err else out


@check("oom")
def oom():
    # The test tools that shrink the batch on an out-of-memory apply (Hugging
    # Face accelerate's find_executable_batch_size, Lightning's batch-size
    # finder): a RuntimeError with one argument naming "CUDA out of memory.".
    rc, out, err = run("import torch\n"
                       "try:\n"
                       "    torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\n"
                       "except Exception as e:\n"
                       "    print(type(e).__name__, isinstance(e, RuntimeError) and len(e.args) == 1\n"
                       "          and 'CUDA out of memory.' in e.args[0] and 'cause: limit' in e.args[0])\n",
                       CUHEAP_TORCH="1", CUHEAP_CONF="limit:2G")
    line = next((l for l in err.splitlines() if "cuheap: CUDA out of memory" in l), "")
    return rc == 0 and out == "RuntimeError True" and "cause: limit" in line, (out + " | " + line)[:300]


@check("preloadoom")
def preload_oom():
    import json
    import tempfile
    folder = tempfile.mkdtemp()
    lib = os.path.join(ROOT, "build", "libcuheap.so")
    matmul = ("import torch\n"
              "a = torch.randn(1024, 1024, device='cuda')\n"
              "b = a @ a\n"
              "torch.cuda.synchronize()\n")
    rc, out, err = run(matmul + "try:\n"
                       "    torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\n"
                       "except Exception as e:\n"
                       "    print(type(e).__name__, 'out of memory' in str(e).lower())\n",
                       LD_PRELOAD=lib, PYTORCH_NO_CUDA_MEMORY_CACHING="1",
                       CUHEAP_CONF="limit:2G,report:%s/oom.json" % folder)
    line = next((l for l in err.splitlines() if "cuheap: CUDA out of memory" in l), "")
    named = line.split("device memory live by calling library (every device):")[-1] if "calling library" in line else ""
    # Without an out-of-memory the report is written at exit, asking the device nothing.
    rc2, _, err2 = run(matmul, LD_PRELOAD=lib, PYTORCH_NO_CUDA_MEMORY_CACHING="1",
                       CUHEAP_CONF="report:%s/exit.json" % folder)
    reports = {}
    for name in ("oom", "exit"):
        try:
            r = json.load(open("%s/%s.json" % (folder, name)))
            reports[name] = (r["devices"][0]["device_memory"], {c["library"] for c in r.get("callers", [])})
        except (OSError, ValueError, KeyError, IndexError) as e:
            reports[name] = ({"error": repr(e)}, set())
    oom_mem, oom_libs = reports["oom"]
    exit_mem, exit_libs = reports["exit"]
    ok = (rc == 0 and out.endswith(" True") and "cause: limit" in line and "libc10_cuda.so" in named
          and "libcublas" in named and oom_mem.get("free", 0) > 0 and "free_unknown" not in oom_mem
          and any(l.startswith("libcublas") for l in oom_libs) and rc2 == 0 and exit_mem.get("free_unknown") is True
          and exit_mem.get("free") == 0 and any(l.startswith("libcublas") for l in exit_libs))
    return ok, "%s | named:%s | device_memory at the OOM %s, at exit %s%s" % (
        out, named[:110], oom_mem, exit_mem, "" if rc2 == 0 else " | exit run failed: " + err2[-150:])


@check("cache")
def empty_cache():
    rc, out, err = run("import torch, sys\n"
                       "m = sys.modules['cuheap_torch']\n"
                       "x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del x\n"
                       "before = m.memory_stats()['reserved_bytes.all.current']\n"
                       "torch.cuda.empty_cache()\n"
                       "print(before, m.memory_stats()['reserved_bytes.all.current'])",
                       CUHEAP_TORCH="1")
    ok = rc == 0 and len(out.split()) == 2 and int(out.split()[0]) >= 1 << 30 and int(out.split()[1]) == 0
    return ok, out or err[-300:]


@check("fraction")
def fraction():
    rc, out, err = run("import torch, sys\n"
                       "m = sys.modules['cuheap_torch']\n"
                       "torch.cuda.set_per_process_memory_fraction(0.5)\n"
                       "x = torch.empty(16, device='cuda')\n"
                       "total = torch.cuda.get_device_properties(0).total_memory\n"
                       "print(m.memory_stats()['cuheap.limit'], total // 2)",
                       CUHEAP_TORCH="1")
    parts = out.split()
    ok = rc == 0 and len(parts) == 2 and abs(int(parts[0]) - int(parts[1])) < (64 << 20)
    return ok, out or err[-300:]


@check("stats")
def stats():
    rc, out, err = run("import torch, sys\n"
                       "m = sys.modules['cuheap_torch']\n"
                       "x = torch.empty(3 << 20, dtype=torch.uint8, device='cuda')\n"
                       "s = m.memory_stats()\n"
                       "print(s['requested_bytes.all.current'], s['allocated_bytes.all.peak'] >= 3 << 20, s['num_ooms'])",
                       CUHEAP_TORCH="1")
    return rc == 0 and out == "%d True 0" % (3 << 20), out or err[-300:]


@check("torchapi")
def torch_api_statistics():
    rc, out, err = run("import torch\n"
                       "x = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\n"
                       "a, p = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()\n"
                       "del x\n"
                       "b = torch.cuda.memory_allocated()\n"
                       "torch.cuda.reset_peak_memory_stats()\n"
                       "q = torch.cuda.max_memory_allocated()\n"
                       "torch.cuda.reset_accumulated_memory_stats()\n"
                       "n = torch.cuda.memory_stats()['allocation.all.allocated']\n"
                       "print(a - b == 64 << 20, p >= a, q == b, n == 0, torch.cuda.memory_reserved() >= a,\n"
                       "      'cuheap memory summary' in torch.cuda.memory_summary(), a, b)",
                       CUHEAP_TORCH="1")
    return rc == 0 and out.startswith("True True True True True True"), out or err[-300:]


@check("snapshot")
def snapshot():
    rc, out, err = run("import torch, os, pickle, tempfile\n"
                       "from torch.cuda import _memory_viz\n"
                       "torch.cuda.memory._record_memory_history()\n"
                       "m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()\n"
                       "x = torch.randn(512, 1024, device='cuda')\n"
                       "m(x).sum().backward()\n"
                       "small = torch.ones(7, device='cuda')\n"
                       "snap = torch.cuda.memory._snapshot()\n"
                       "segs = snap['segments']\n"
                       "blocks = [b for g in segs for b in g['blocks'] if b['state'] == 'active_allocated']\n"
                       "inside = lambda p: any(b['address'] <= p < b['address'] + b['size'] for b in blocks)\n"
                       "live = [x, small] + [p for p in m.parameters()] + [p.grad for p in m.parameters()]\n"
                       "path = os.path.join(tempfile.mkdtemp(), 's.pickle')\n"
                       "torch.cuda.memory._dump_snapshot(path)\n"
                       "again = pickle.load(open(path, 'rb'))\n"
                       "html = _memory_viz.segment_plot(again)\n"
                       "print(len(segs), sum(g['total_size'] for g in segs) == torch.cuda.memory_reserved(),\n"
                       "      all(inside(t.data_ptr()) for t in live), all(g['is_expandable'] for g in segs),\n"
                       "      len(again['segments']) == len(segs), len(html) > 1000)",
                       CUHEAP_TORCH="1")
    notice = "records no history" in err
    return rc == 0 and notice and out.endswith("True True True True True"), (out or err[-300:]) + (
        "; history notice" if notice else "; no history notice")


@check("oomobserver")
def oom_observer():
    rc, out, err = run("import torch\n"
                       "seen = []\n"
                       "def observer(device, alloc, allowed, free):\n"
                       "    seen.append((device, alloc, allowed, free > 0, len(torch.cuda.memory._snapshot()['segments']) > 0))\n"
                       "torch._C._cuda_attach_out_of_memory_observer(observer)\n"
                       "x = torch.empty(1 << 20, device='cuda')\n"
                       "try:\n"
                       "    torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\n"
                       "except RuntimeError:\n"
                       "    pass\n"
                       "print(seen)",
                       CUHEAP_TORCH="1", CUHEAP_CONF="limit:2G")
    return rc == 0 and out == "[(0, %d, %d, True, True)]" % (3 << 30, 2 << 30), out or err[-300:]


@check("report")
def oom_report():
    import json
    import shutil
    import tempfile
    d = tempfile.mkdtemp()
    code = ("import torch\n"
            "model = torch.nn.Linear(4096, 4096).cuda()\n"
            "keep = []\n"
            "try:\n"
            "    for i in range(64):\n"
            "        keep.append(model(torch.randn(65536, 4096, device='cuda')))\n"
            "except RuntimeError:\n"
            "    print('oom after', len(keep))\n")
    results = []
    for ext in ("json", "html"):
        rc, out, err = run(code, CUHEAP_TORCH="1", CUHEAP_CONF="limit:6G,report:%s/oom.%s" % (d, ext))
        results.append((rc, out, err))
    try:
        report = json.load(open(os.path.join(d, "oom.json")))
        oom = report["devices"][0]["oom"]
        html = open(os.path.join(d, "oom.html")).read()
    except (OSError, ValueError, KeyError, IndexError) as e:
        return False, "no report: %r; %s" % (e, results[0][2][-200:])
    if os.environ.get("OUT"):
        shutil.copy(os.path.join(d, "oom.html"), os.path.join(os.environ["OUT"], "torch_oom.html"))
        shutil.copy(os.path.join(d, "oom.json"), os.path.join(os.environ["OUT"], "torch_oom.json"))
    ok = (oom is not None and oom["cause"] == "limit" and "oom after" in results[0][1]
          and 'class=cause>limit' in html)
    return ok, "%s; cause %s, request %s, live %s" % (results[0][1], oom and oom["cause"], oom and oom["request"],
                                                     oom and oom["live"])


COMPILE_JOB = """
import json, sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024),
                            torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model, mode="reduce-overhead")
g = torch.Generator(device="cuda").manual_seed(1)
losses = []
for i in range(12):
    n = 256 if i < 6 else 384   # a second shape: a second recording
    x = torch.randn(n, 512, device="cuda", generator=g)
    y = torch.randint(0, 10, (n,), device="cuda", generator=g)
    loss = torch.nn.functional.cross_entropy(compiled(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
import torch._inductor.config as ic
import cuheap_torch   # on the path: the library it loads is the one preloaded, if any
served = cuheap_torch._raw_stats(0)["num_allocs"]
print(json.dumps([losses, cuheap_torch.installed(), ic.triton.cudagraph_trees, served]))
"""


@check("compile")
def compile_reduce_overhead():
    import json
    lib = os.path.join(ROOT, "build", "libcuheap.so")
    seen, results = [], {}
    for way, env in (("native", {}), ("plugin", {"CUHEAP_TORCH": "1"}), ("preload", {"LD_PRELOAD": lib})):
        rc, out, err = run(COMPILE_JOB, timeout=400, **env)
        try:
            results[way] = json.loads(out.splitlines()[-1])
        except (ValueError, IndexError):
            return False, "%s failed: %s" % (way, err.strip().splitlines()[-1][:200] if err.strip() else rc)
    native, plugin, preload = results["native"], results["plugin"], results["preload"]
    seen.append("plugin installed %s, graph trees %s, %d blocks" % (plugin[1], plugin[2], plugin[3]))
    seen.append("preload %d blocks" % preload[3])
    seen.append("losses as native's: plugin %s, preload %s" % (plugin[0] == native[0], preload[0] == native[0]))
    ok = (plugin[1] and not plugin[2] and plugin[3] > 0 and preload[3] > 0 and native[3] == 0 and
          plugin[0] == native[0] and preload[0] == native[0])
    return ok, "; ".join(seen) + "; last loss %.6f" % native[0][-1]


IPC_JOB = """
import sys
import torch
import torch.multiprocessing as mp


def child(q, r):
    t = q.get()
    r.put(float(t.sum()))
    t.add_(1)
    torch.cuda.synchronize()
    r.put("written")


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q, r = ctx.SimpleQueue(), ctx.Queue()   # SimpleQueue.put pickles (shares) at once, in this thread
    keep = [torch.empty(n, device="cuda") for n in (1000, 300000, 5000000)]  # segments before it
    t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    expect = float(t.sum())
    p = ctx.Process(target=child, args=(q, r))
    p.start()
    try:
        q.put(t)
        seen = r.get(timeout=90)
        r.get(timeout=30)
        p.join(60)
        print("shared", seen == expect, float(t.sum()) - expect == float(1 << 20))
    except Exception as e:
        p.kill()
        print("refused", type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
"""


@check("ipc")
def ipc_tensors():
    import tempfile
    lib = os.path.join(ROOT, "build", "libcuheap.so")
    path = os.path.join(tempfile.mkdtemp(), "ipc_job.py")
    with open(path, "w") as f:
        f.write(IPC_JOB)
    seen, ok = [], True
    for way, env in (("preload ipc_safe:1", {"LD_PRELOAD": lib, "CUHEAP_CONF": "ipc_safe:1"}),
                     ("preload", {"LD_PRELOAD": lib}), ("plugin", {"CUHEAP_TORCH": "1"})):
        rc, stdout, stderr = run(None, timeout=300, script=path, **env)
        out = stdout.splitlines()[-1] if stdout else "no output (exit %d): %s" % (rc, stderr[-200:])
        good = out == "shared True True"
        named = "ipc_safe" in stderr
        if way == "preload ipc_safe:1":
            ok &= good
        elif way == "preload":
            ok &= good or (out.startswith("refused") and named)   # cuheap's guard names the key
        else:
            ok &= good or out.startswith("refused")   # PyTorch's plugin interface has no IPC
        seen.append("%s: %s%s" % (way, out, "; cuheap named ipc_safe" if named and not good else ""))
    return ok, " / ".join(seen)


def main():
    wanted = set(sys.argv[1:])
    unknown = wanted - {name for name, _ in CHECKS}
    if unknown:
        sys.stderr.write("unknown check(s): %s; known: %s\n" % (" ".join(sorted(unknown)),
                                                               " ".join(n for n, _ in CHECKS)))
        return 2
    rows, failed = [], 0
    for name, fn in CHECKS:
        if wanted and name not in wanted:
            continue
        try:
            ok, seen = fn()
        except Exception as e:  # a check that crashes fails, with why
            ok, seen = False, repr(e)
        failed += not ok
        print("%s [%s] %s" % ("PASS" if ok else "FAIL", name, seen), flush=True)
        rows.append("| %s | %s | %s |" % (name, "PASS" if ok else "FAIL", seen.replace("|", "/")[:160]))
    print("\n| torch check | result | seen |\n|---|---|---|\n" + "\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
