"""record.py - records the corpus (bench/corpus/jobs.py) on a GPU, and
assembles what came back into bench/traces/corpus.

On the GPU machine, from the repository root, with build/libcuheap.so built:

    python3 bench/corpus/record.py smoke --out DIR     every job for 2 steps in each
                                                       way (native, plugin, preload), 3 at once
    python3 bench/corpus/record.py time --out DIR      PyTorch's three modes, every job
    python3 bench/corpus/record.py traces --out DIR    both traces of every job

Then here, without a GPU:

    python3 bench/corpus/record.py assemble --times DIR --traces DIR

`time` runs two processes one after the other: one runs every job under
PyTorch's native allocator and then under expandable_segments (switched in the
process, its cache emptied between jobs), the other every job under
backend:cudaMallocAsync. Each job's peak reserved and peak allocated are
PyTorch's own figures, and its time is the total over every step after the
first (the slow steps are what users feel), every step synchronized.

`traces` records each job twice, each in a process of its own: as PyTorch's
allocator (CUHEAP_TORCH=1: every tensor's allocation and stream-ordered free)
and under LD_PRELOAD with PyTorch's cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1:
every tensor a cudaMalloc and a cudaFree), with CUHEAP_CONF=trace:PATH and a
mark before each step (cuheap_trace_mark). A trace holds what the program asked
for, not what an allocator did with it, so several jobs record at once, as
many as fit in memory beside each other (a job marked big runs alone).

`assemble` writes bench/traces/corpus/JOB_plugin.trace.gz and
JOB_preload.trace.gz, each with the job's header: what the job is, and
PyTorch's three modes as measured by `time`.
"""

import argparse
import ctypes
import datetime
import fcntl
import gzip
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GiB = 1 << 30


def jobs_module():
    sys.path.insert(0, HERE)
    import jobs
    return jobs


# ---- inside one process: a job, timed -----------------------------------------

def tidy():
    """Everything a finished job held goes back, and the peaks start again."""
    import gc
    import torch
    gc.collect()
    torch.cuda.synchronize()
    try:
        torch._C._cuda_clearCublasWorkspaces()
    except AttributeError:
        pass
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def cuheap_lib():
    """The cuheap library serving this process (plugin or LD_PRELOAD), or None."""
    if "cuheap_torch" in sys.modules and sys.modules["cuheap_torch"].installed():
        return sys.modules["cuheap_torch"]._load()
    if "libcuheap" in os.environ.get("LD_PRELOAD", ""):
        lib = ctypes.CDLL(None)
        return lib if hasattr(lib, "cuheap_get_stats") else None
    return None


def marker():
    """mark(label) writes label into the trace being recorded, if any."""
    lib = cuheap_lib()
    if lib is None or "trace:" not in os.environ.get("CUHEAP_CONF", "") or not hasattr(lib, "cuheap_trace_mark"):
        return None
    lib.cuheap_trace_mark.argtypes = [ctypes.c_char_p]

    def mark(label):
        lib.cuheap_trace_mark(label.encode())
    return mark


def run_job(job, steps, seed, mark=None):
    """Builds `job` and runs `steps` steps; returns its figures (no tidying)."""
    import torch
    t0 = time.perf_counter()
    step = job.make(seed)
    torch.cuda.synchronize()
    build_ms = (time.perf_counter() - t0) * 1e3
    times, losses = [], []
    for i in range(steps):
        if mark:
            mark("step %d" % i)
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = step(i)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
        losses.append(float(loss.detach()) if hasattr(loss, "detach") else float(loss))
    if mark:
        mark("end")
    r = {"job": job.name, "about": job.about, "steps": steps, "build_ms": round(build_ms, 1),
         "steps_ms": [round(t, 2) for t in times], "total_ms": round(sum(times[1:]), 2),
         "losses": [x.hex() for x in losses]}
    cleanup = getattr(step, "cleanup", None)
    return step, cleanup, r


class BigLock:
    """At most one big job at a time on the GPU among processes that share `path`."""

    def __init__(self, path, big):
        self.path, self.big, self.f = path, big, None

    def __enter__(self):
        if self.big and self.path:
            self.f = open(self.path, "w")
            fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.f:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()


def measure(job, mode, steps, seed, big_lock=None):
    """One job in one mode of this process, tidied before and after. Mode
    "warm-up" runs the job once untimed first: a process's first run of a job
    pays for what it meets first (kernels chosen and compiled for each new
    shape, libraries' plans), which the modes timed after it in the same
    process would not, and that would be charged to the first mode."""
    import torch
    if mode in ("native", "expandable", "warm-up"):
        torch.cuda.memory._set_allocator_settings("expandable_segments:%s" % (mode == "expandable"))
    tidy()
    r = {"job": job.name, "mode": mode}
    step = cleanup = None
    with BigLock(big_lock, job.big):
        try:
            step, cleanup, figures = run_job(job, steps, seed, marker())
            r.update(figures)
            r["peak_reserved"] = torch.cuda.max_memory_reserved()
            r["peak_allocated"] = torch.cuda.max_memory_allocated()
        except Exception as e:   # a failed job is a result; the next one runs
            lines = str(e).strip().splitlines() or [""]
            r["error"] = "%s: %s" % (type(e).__name__, lines[0][:300])
            r["oom"] = isinstance(e, torch.OutOfMemoryError)
        finally:
            if cleanup:
                cleanup()
            del step, cleanup
            tidy()
    r["left_allocated"] = torch.cuda.memory_allocated()
    return r


def cmd_run(args):
    """Runs jobs in modes in this process (the environment chose the allocator),
    appending a JSON line per (job, mode) to --out as it goes."""
    import torch
    jobs = jobs_module().JOBS
    names = args.jobs.split(",") if args.jobs else list(jobs)
    modes = args.modes.split(",")
    backend = torch.cuda.memory.get_allocator_backend()
    if "async" in modes and backend != "cudaMallocAsync":
        raise SystemExit("mode async needs PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (backend is %s)" % backend)
    with open(args.out, "a") as out:
        for name in names:
            if args.warm_up:
                measure(jobs[name], "warm-up" if backend == "native" else "as-is", args.steps, args.seed,
                        args.big_lock)
            for mode in modes:
                r = measure(jobs[name], mode, args.steps, args.seed, args.big_lock)
                r["warm_up"] = bool(args.warm_up)
                r.update(torch=torch.__version__, gpu=torch.cuda.get_device_name(), backend=backend,
                         pytorch_cache=os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1")
                out.write(json.dumps(r) + "\n")
                out.flush()
                print("%-20s %-10s %s" % (name, mode, r.get("error") or "%.1f ms, %.3f GiB reserved, %.3f GiB live" % (
                    r["total_ms"], r["peak_reserved"] / GiB, r["peak_allocated"] / GiB)), flush=True)


# ---- orchestration --------------------------------------------------------------

def environment(way, trace=None, cache_on=False):
    """The environment of a way in; cache_on keeps PyTorch's cache under LD_PRELOAD."""
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "CUHEAP_TORCH", "CUHEAP_CONF", "LD_PRELOAD"):
        env.pop(k, None)
    env["PYTHONUNBUFFERED"] = "1"
    if way == "async":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    elif way == "plugin":
        env["CUHEAP_TORCH"] = "1"
        env["PYTHONPATH"] = os.path.join(ROOT, "scripts") + os.pathsep + env.get("PYTHONPATH", "")
    elif way == "preload":
        env["LD_PRELOAD"] = os.path.join(ROOT, "build", "libcuheap.so")
        if not cache_on:
            env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    if trace and way in ("plugin", "preload"):
        env["CUHEAP_CONF"] = "trace:" + trace
    return env


def done_jobs(path):
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {json.loads(l)["job"] for l in f if l.strip()}


def run_until_done(names, modes, way, steps, out, seed, big_lock=None, trace=None, log=None, warm_up=False):
    """Runs `names` in one process; if it dies (a sticky CUDA error), the job
    it was on is written down as failed and a new process takes the rest."""
    while True:
        left = [n for n in names if n not in done_jobs(out)]
        if not left:
            return
        cmd = [sys.executable, os.path.abspath(__file__), "run", "--jobs", ",".join(left), "--modes", modes,
               "--steps", str(steps), "--seed", str(seed), "--out", out]
        if big_lock:
            cmd += ["--big-lock", big_lock]
        if warm_up:
            cmd += ["--warm-up"]
        p = subprocess.run(cmd, env=environment(way, trace), stdout=log, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            now = [n for n in names if n not in done_jobs(out)]
            if now:
                with open(out, "a") as f:
                    for m in modes.split(","):
                        f.write(json.dumps({"job": now[0], "mode": m, "way": way,
                                            "error": "the process died (exit %d)" % p.returncode}) + "\n")


def cmd_smoke(args):
    """Every job for 2 steps in each way, the three ways at once, a trace each."""
    os.makedirs(args.out, exist_ok=True)
    names = args.jobs.split(",") if args.jobs else list(jobs_module().JOBS)
    procs = []
    for way in ("native", "plugin", "preload"):
        log = open(os.path.join(args.out, "smoke_%s.log" % way), "w")
        out = os.path.join(args.out, "smoke_%s.jsonl" % way)
        trace = os.path.join(args.out, "smoke_%s_%%p.trace" % way)
        cmd = [sys.executable, os.path.abspath(__file__), "run", "--jobs", ",".join(names), "--modes", "as-is",
               "--steps", "2", "--out", out, "--big-lock", "/tmp/cuheap-corpus-big.lock"]
        procs.append(subprocess.Popen(cmd, env=environment(way, trace), stdout=log, stderr=subprocess.STDOUT))
    for p in procs:
        p.wait()
    print(summary([os.path.join(args.out, "smoke_%s.jsonl" % w) for w in ("native", "plugin", "preload")]))


def cmd_time(args):
    os.makedirs(args.out, exist_ok=True)
    names = args.jobs.split(",") if args.jobs else list(jobs_module().JOBS)
    log = open(os.path.join(args.out, "time.log"), "a")
    run_until_done(names, "native,expandable", "native", args.steps, os.path.join(args.out, "time_native.jsonl"),
                   args.seed, log=log, warm_up=True)
    run_until_done(names, "async", "async", args.steps, os.path.join(args.out, "time_async.jsonl"), args.seed,
                   log=log, warm_up=True)
    print(summary([os.path.join(args.out, f) for f in ("time_native.jsonl", "time_async.jsonl")]))


def cmd_traces(args):
    """Both traces of every job, several processes at once within a memory budget."""
    os.makedirs(args.out, exist_ok=True)
    jobs = jobs_module().JOBS
    names = args.jobs.split(",") if args.jobs else list(jobs)
    need = {}
    if args.times:
        with open(args.times) as f:
            for l in f:
                r = json.loads(l)
                if "peak_allocated" in r:
                    need[r["job"]] = max(need.get(r["job"], 0), r["peak_allocated"] * 1.25 + 2 * GiB)
    queue = [(n, w) for n in names for w in ("plugin", "preload")]
    queue.sort(key=lambda nw: -need.get(nw[0], 20 * GiB))
    running = []   # (popen, name, way, bytes)
    budget = args.budget * GiB
    while queue or running:
        for r in list(running):
            if r[0].poll() is not None:
                running.remove(r)
        used = sum(r[3] for r in running)
        started = False
        for nw in list(queue):
            n, w = nw
            b = budget if jobs[n].big else need.get(n, 20 * GiB)
            if len(running) < args.parallel and (not running or used + b <= budget):
                queue.remove(nw)
                log = open(os.path.join(args.out, "%s_%s.log" % (n, w)), "w")
                trace = os.path.join(args.out, "%s_%s.trace" % (n, w))
                cmd = [sys.executable, os.path.abspath(__file__), "run", "--jobs", n, "--modes", "as-is",
                       "--steps", str(args.steps), "--seed", str(args.seed),
                       "--out", os.path.join(args.out, "%s_%s.jsonl" % (n, w))]
                cache_on = w == "preload" and jobs[n].preload_cache is not None
                running.append((subprocess.Popen(cmd, env=environment(w, trace, cache_on), stdout=log,
                                                 stderr=subprocess.STDOUT), n, w, b))
                started = True
                break
        if not started:
            time.sleep(0.5)
    files = sorted(f for f in os.listdir(args.out) if f.endswith(".jsonl"))
    print(summary([os.path.join(args.out, f) for f in files]))
    for f in sorted(os.listdir(args.out)):
        if f.endswith(".trace"):
            subprocess.run(["gzip", "-9f", os.path.join(args.out, f)], check=True)


def summary(paths):
    rows = []
    for p in paths:
        if not os.path.exists(p):
            rows.append("%s: missing" % os.path.basename(p))
            continue
        with open(p) as f:
            for l in f:
                r = json.loads(l)
                tag = os.path.basename(p).replace(".jsonl", "")
                if "error" in r:
                    rows.append("%-28s %-20s %-10s FAILED %s" % (tag, r["job"], r["mode"], r["error"][:160]))
                else:
                    rows.append("%-28s %-20s %-10s %9.1f ms %8.3f GiB rsvd %8.3f GiB live" % (
                        tag, r["job"], r["mode"], r["total_ms"], r["peak_reserved"] / GiB,
                        r["peak_allocated"] / GiB))
    return "\n".join(rows)


# ---- assembling the corpus (no GPU) -------------------------------------------------

def cmd_assemble(args):
    """Writes each job's two traces with its header into --dest."""
    measured = {}
    for name in ("time_native.jsonl", "time_async.jsonl"):
        with open(os.path.join(args.times, name)) as f:
            for l in f:
                r = json.loads(l)
                measured.setdefault(r["job"], {})[r["mode"]] = r
    os.makedirs(args.dest, exist_ok=True)
    written = 0
    for job in sorted(measured):
        modes = measured[job]
        ok = [m for m in ("native", "expandable", "async") if m in modes and "error" not in modes[m]]
        if len(ok) < 3:
            print("%s: PyTorch's modes incomplete (%s); not assembled" % (
                job, ", ".join("%s: %s" % (m, modes.get(m, {}).get("error", "missing"))
                               for m in ("native", "expandable", "async") if m not in ok)), file=sys.stderr)
            continue
        any_mode = modes["native"]
        for way in ("plugin", "preload"):
            src = os.path.join(args.traces, "%s_%s.trace.gz" % (job, way))
            res = os.path.join(args.traces, "%s_%s.jsonl" % (job, way))
            if not os.path.exists(src) or not os.path.exists(res):
                print("%s: no %s trace" % (job, way), file=sys.stderr)
                continue
            with open(res) as f:
                run = json.loads(f.readline())
            if "error" in run:
                print("%s: the %s recording failed: %s" % (job, way, run["error"]), file=sys.stderr)
                continue
            cache = (" pytorch_cache=" + ("on" if run["pytorch_cache"] else "off")) if way == "preload" else ""
            header = ["# corpus job=%s way=%s%s steps=%d seed=%d torch=%s gpu=%s recorded=%s" % (
                job, way, cache, run["steps"], args.seed, any_mode["torch"], any_mode["gpu"].replace(" ", "_"),
                args.date),
                "# about " + any_mode["about"]]
            for m in ("native", "expandable", "async"):
                r = modes[m]
                header.append("# pytorch mode=%s peak_reserved=%d peak_allocated=%d total_ms=%.2f warm_up=%s "
                              "steps_ms=%s" % (m, r["peak_reserved"], r["peak_allocated"], r["total_ms"],
                                               "yes" if r.get("warm_up") else "no",
                                               ",".join("%.2f" % t for t in r["steps_ms"])))
            with gzip.open(src, "rt") as f:
                lines = f.read().splitlines(True)
            if not lines or not lines[0].startswith("# trace v1"):
                raise SystemExit("%s: not a trace written by cuheap" % src)
            dest = os.path.join(args.dest, "%s_%s.trace.gz" % (job, way))
            with open(dest, "wb") as raw:
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
                    gz.write("".join([lines[0]] + [h + "\n" for h in header] + lines[1:]).encode())
            written += 1
    print("assembled %d traces into %s" % (written, args.dest))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "smoke", "time", "traces"):
        p = sub.add_parser(name)
        p.add_argument("--jobs", default="")
        p.add_argument("--steps", type=int, default=10)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", required=True)
        if name == "run":
            p.add_argument("--modes", required=True)
            p.add_argument("--big-lock")
            p.add_argument("--warm-up", action="store_true", help="run each job once untimed before its modes")
        if name == "traces":
            p.add_argument("--times", help="time_native.jsonl, for each job's memory")
            p.add_argument("--parallel", type=int, default=6)
            p.add_argument("--budget", type=int, default=120, help="GiB the jobs running at once may need")
    p = sub.add_parser("assemble")
    p.add_argument("--times", required=True)
    p.add_argument("--traces", required=True)
    p.add_argument("--dest", default=os.path.join(ROOT, "bench", "traces", "corpus"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--date", default=datetime.date.today().isoformat())
    args = ap.parse_args()
    {"run": cmd_run, "smoke": cmd_smoke, "time": cmd_time, "traces": cmd_traces, "assemble": cmd_assemble}[args.cmd](args)


if __name__ == "__main__":
    main()
