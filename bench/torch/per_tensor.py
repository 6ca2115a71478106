"""per_tensor.py - what one tensor costs through PyTorch in each allocator mode (issue 45).

    python bench/torch/per_tensor.py --rounds 2 --out per_tensor.json    # every mode, side by side
    python bench/torch/per_tensor.py --results per_tensor.json           # the table again, no torch needed
    python bench/torch/per_tensor.py --child                             # one mode: the one its environment selects

A child times `torch.empty(n, dtype=torch.uint8, device="cuda")` + `del` in a
Python loop, Python's own cost included, for 512 B, 64 KiB, 1 MiB and 64 MiB,
and a mixed live set (MIXED_WINDOW tensors live, MIXED_SIZES in turn, each new
one made before the oldest is freed): microseconds per tensor. Each size is
warmed up, then timed --repeat times in a rotating order; a size's figure is
the median of its repeats, with the CPU time beside it (below the wall
time: the thread waited) and, where cuheap serves, its waits for the GPU and
new segments during the timed loops. The child prints one JSON line.

The driver runs each mode in a process of its own, all modes in each of
--rounds rounds (at least 2), the order reversed every other round, so that
the machine's drift touches all modes alike (before the first round, one
child of the first mode runs and is not counted: on an H100 the first child
of a call ran slow at every size, 30-90% over its later rounds; --no-warm-up
skips it), and prints a row per mode: the
median of the rounds and their range. Below it, the cuheap rows over the
floor of the same way in (bench/torch/floor.h: an allocator that only hands
out memory taken once, so its row is what the way in costs by itself).

Modes (environment() of run_modes.py for those it knows): native,
expandable, async, cuheap (the plugin, vmm:1 by default), cuheap-plain (the
plugin, vmm:0), preload (LD_PRELOAD=build/libcuheap.so, PyTorch's cache off),
floor-plugin (BUILD/floor/libfloor_plugin.so as PyTorch's allocator),
floor-preload (LD_PRELOAD=BUILD/floor/libfloor_preload.so, PyTorch's cache
off), floor-preload-fenced (the same with FLOOR_FENCE=1: cudaFree records a
device-wide fence and the next cudaMalloc queries it, the least a cudaFree
that keeps its promise without a CPU wait costs). `make floor` builds the
floor; FLOOR_ARENA sizes its arena (default 8G).
preload=PATH is the preload mode with another build of libcuheap.so (the
library before a change, say), so that two builds run side by side in the
same rounds:

    python bench/torch/per_tensor.py --modes preload,preload=/tmp/before.so,floor-preload --rounds 3
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_modes  # noqa: E402  (environment() of the modes it knows; torch is not imported)

ROOT = run_modes.ROOT

# (mode, the table's name for it), in the table's order.
MODES = [
    ("native", "PyTorch native"),
    ("expandable", "PyTorch expandable_segments"),
    ("async", "PyTorch cudaMallocAsync"),
    ("cuheap", "cuheap plugin (default, vmm:1)"),
    ("cuheap-plain", "cuheap plugin, vmm:0"),
    ("preload", "cuheap LD_PRELOAD, PyTorch's cache off"),
    ("floor-plugin", "floor plugin"),
    ("floor-preload", "floor LD_PRELOAD, PyTorch's cache off"),
    ("floor-preload-fenced", "floor LD_PRELOAD, fenced (FLOOR_FENCE=1), PyTorch's cache off"),
]
LABELS = dict(MODES)
# The floor of each cuheap mode's way in.
FLOOR_OF = {"cuheap": "floor-plugin", "cuheap-plain": "floor-plugin", "preload": "floor-preload"}

# (key in the results, column). The mixed live set matches bench/bench_per_tensor.c.
SIZES = [("512", "512 B"), ("65536", "64 KiB"), ("1048576", "1 MiB"), ("67108864", "64 MiB"),
         ("mixed", "mixed live set")]
MIXED_SIZES = [512, 4096, 65536, 512, 262144, 1 << 20, 512, 16384, 4 << 20, 512, 65536, 1 << 20, 2048, 16 << 20,
               512, 64 << 20]
MIXED_WINDOW = 32

FLOOR_ENV = "CUHEAP_BENCH_FLOOR_PLUGIN"   # the child installs this library as the floor plugin
OTHER_BUILD = "preload="                   # a mode's prefix: LD_PRELOAD of another libcuheap.so


def known(mode):
    return mode in LABELS or (mode.startswith(OTHER_BUILD) and len(mode) > len(OTHER_BUILD))


def label(mode):
    if mode.startswith(OTHER_BUILD):
        return "cuheap LD_PRELOAD, PyTorch's cache off, %s" % mode[len(OTHER_BUILD):]
    return LABELS.get(mode, mode)


def floor_of(mode):
    """The floor mode of `mode`'s way in, or None."""
    return "floor-preload" if mode.startswith(OTHER_BUILD) else FLOOR_OF.get(mode)


def floors_of(mode):
    """Every floor `mode` is shown over: its way in's, and for LD_PRELOAD the
    fenced floor too (what keeping cudaFree's promise adds)."""
    floor = floor_of(mode)
    return [floor, "floor-preload-fenced"] if floor == "floor-preload" else [floor] if floor else []


def floor_library(build, way):
    return os.path.join(os.path.abspath(build), "floor", "libfloor_%s.so" % way)


def environment(mode, build=os.path.join(ROOT, "build")):
    """The environment of `mode`: run_modes.environment() for the modes it
    knows (preload=PATH included), the floor's from its native (or cache-off)
    one."""
    if not known(mode):
        raise SystemExit("unknown mode %s (modes: %s, preload=PATH)" % (mode, ", ".join(m for m, _ in MODES)))
    env = run_modes.environment({"floor-plugin": "native", "floor-preload": "nocache",
                                 "floor-preload-fenced": "nocache"}.get(mode, mode))
    env.pop(FLOOR_ENV, None)   # the caller's never reaches a mode
    env.pop("FLOOR_FENCE", None)
    if mode == "floor-plugin":
        env[FLOOR_ENV] = floor_library(build, "plugin")
    elif mode in ("floor-preload", "floor-preload-fenced"):
        env["LD_PRELOAD"] = floor_library(build, "preload")
        if mode == "floor-preload-fenced":
            env["FLOOR_FENCE"] = "1"
    return env


# ---- the child: one mode, in this process ------------------------------------------

def install_floor(torch):
    """The floor plugin as PyTorch's allocator, before any CUDA tensor."""
    path = os.environ[FLOOR_ENV]
    if not os.path.exists(path):
        raise SystemExit("%s not found: build it with `make floor`" % path)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "floor_alloc", "floor_free")
    torch.cuda.memory.change_current_allocator(allocator)


def mode_now():
    """The mode this process runs in, as the allocator in place shows it."""
    if os.environ.get(FLOOR_ENV):
        return "floor-plugin"
    if "libfloor_preload" in os.environ.get("LD_PRELOAD", ""):
        with open("/proc/self/maps") as maps:
            mapped = "libfloor_preload" in maps.read()
        if mapped and os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
            return "floor-preload-fenced" if os.environ.get("FLOOR_FENCE") == "1" else "floor-preload"
        return "floor-preload not in effect"
    import train_job   # the other modes, as the training jobs tell them
    return train_job.base_mode_name()


def timed(torch, size, n):
    """(wall, CPU) microseconds per tensor over n tensors of `size` bytes, or
    of the mixed live set (size "mixed"). CPU time below wall time is time the
    thread waited (for the driver, the GPU, a lock)."""
    import collections
    import time
    empty, u8 = torch.empty, torch.uint8
    torch.cuda.synchronize()
    if size == "mixed":
        sizes, k, window = MIXED_SIZES, len(MIXED_SIZES), collections.deque()
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for i in range(n):
            window.append(empty(sizes[i % k], dtype=u8, device="cuda"))
            if len(window) > MIXED_WINDOW:
                window.popleft()
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        window.clear()
    else:
        nbytes = int(size)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(n):
            t = empty(nbytes, dtype=u8, device="cuda")
            del t
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
    torch.cuda.synchronize()
    return (t1 - t0) / n / 1e3, (c1 - c0) / n / 1e3


def cuheap_counters(torch):
    """cuheap's CPU waits and segments so far, where cuheap serves this
    process (a wait or a new segment per tensor would show where time goes);
    None in the other modes."""
    mode = mode_now()
    if mode.startswith("cuheap"):
        stats = sys.modules["cuheap_torch"].memory_stats()
        return {"cpu_waits": stats["num_sync_all_streams"], "segments": stats["segment.all.allocated"]}
    if mode.startswith("preload"):
        import train_job
        st = train_job.preload_stats()
        return {"cpu_waits": st.num_cpu_waits, "segments": st.num_segment_allocs}
    return None


def child(iterations, repeat):
    import statistics
    import torch
    if os.environ.get(FLOOR_ENV):
        install_floor(torch)
    torch.empty(1, device="cuda")   # CUDA's start, outside every timing
    keys = [k for k, _ in SIZES]
    for k in keys:
        timed(torch, k, max(1, iterations // 10))
    rounds = {k: [] for k in keys}
    cpu = {k: [] for k in keys}
    counted = {k: {"cpu_waits": 0, "segments": 0} for k in keys}
    for r in range(repeat):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            before = cuheap_counters(torch)
            wall, on_cpu = timed(torch, k, iterations)
            after = cuheap_counters(torch)
            rounds[k].append(round(wall, 4))
            cpu[k].append(round(on_cpu, 4))
            for name in counted[k] if before else ():
                counted[k][name] += after[name] - before[name]
    result = {"mode": mode_now(), "torch": torch.__version__, "iterations": iterations,
              "us": {k: statistics.median(v) for k, v in rounds.items()}, "us_repeats": rounds,
              "cpu_us": {k: statistics.median(v) for k, v in cpu.items()}}
    if cuheap_counters(torch) is not None:
        result["cuheap"] = counted   # over the timed loops of each size
    print(json.dumps(result), flush=True)


# ---- the driver ---------------------------------------------------------------------

def run(mode, build, iterations, repeat, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--iterations", str(iterations),
           "--repeat", str(repeat)]
    try:
        p = subprocess.run(cmd, env=environment(mode, build), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "error": "timed out after %d s" % timeout}
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "error": (p.stderr or p.stdout or "no output").strip()[-2000:],
                "returncode": p.returncode}
    r = json.loads(lines[-1])
    if r.get("mode") != ("preload" if mode.startswith(OTHER_BUILD) else mode):
        r["error"] = "asked for mode %s, the child ran in %s" % (mode, r.get("mode"))
    r["mode"] = mode
    return r


def combine(results):
    """One row per mode, in the order first seen: per size the median of the
    rounds that ran and every round's figure ("rounds"), the median CPU time
    ("cpu_us") and cuheap's waits and segments added up ("cuheap"); a failed
    round makes the row failed."""
    rows, order = {}, []
    for r in results:
        mode = r["mode"]
        if mode not in rows:
            order.append(mode)
            rows[mode] = {"mode": mode, "rounds": {k: [] for k, _ in SIZES}}
        row = rows[mode]
        if "error" in r:
            row.setdefault("error", r["error"])
            continue
        for k, _ in SIZES:
            if r.get("us", {}).get(k) is not None:
                row["rounds"][k].append(r["us"][k])
        for name in ("cpu_us", "cuheap"):
            if name in r:
                row.setdefault(name + "_rounds", []).append(r[name])
    for mode in order:
        row = rows[mode]
        row["us"] = {k: run_modes.median(v) if v else None for k, v in row["rounds"].items()}
        cpu = row.pop("cpu_us_rounds", [])
        if cpu:
            seen = {k: [c[k] for c in cpu if c.get(k) is not None] for k, _ in SIZES}
            row["cpu_us"] = {k: run_modes.median(v) if v else None for k, v in seen.items()}
        counted = row.pop("cuheap_rounds", [])
        if counted:
            row["cuheap"] = {k: {n: sum(c.get(k, {}).get(n, 0) for c in counted) for n in ("cpu_waits", "segments")}
                             for k, _ in SIZES}
    return [rows[m] for m in order]


def cell(row, key):
    us, rounds = row["us"].get(key), row["rounds"].get(key, [])
    if us is None:
        return "-"
    if len(rounds) > 1:
        return "%.2f (%.2f-%.2f)" % (us, min(rounds), max(rounds))
    return "%.2f" % us


def table(results):
    """The table of combined results: microseconds per tensor; a note where a
    loop spent less than 90% of its time on the CPU, or cuheap waited for the
    GPU or took segments while timed; then the cuheap rows over their way
    in's floor, where both ran."""
    rounds = max((len(v) for r in results for v in r["rounds"].values()), default=0)
    head = "microseconds per tensor (torch.empty + del), " + (
        "median of %d rounds (range)" % rounds if rounds > 1 else "one round" if rounds else "no round ran")
    lines = [head, "",
             "| mode | " + " | ".join(c for _, c in SIZES) + " |",
             "|---|" + "---|" * len(SIZES)]
    for r in results:
        name = label(r["mode"])
        if "error" in r:
            last = r["error"].strip().splitlines()[-1] if r["error"].strip() else "failed"
            lines.append("| %s | failed: %s |" % (name, last[:160]) + " |" * (len(SIZES) - 1))
        else:
            lines.append("| %s | " % name + " | ".join(cell(r, k) for k, _ in SIZES) + " |")
    notes = []
    for r in results:
        for k, c in SIZES:
            wall, cpu = r.get("us", {}).get(k), r.get("cpu_us", {}).get(k)
            if wall and cpu is not None and cpu < 0.9 * wall:
                notes.append("%s, %s: %.2f of %.2f us on the CPU, the rest waiting" % (
                    label(r["mode"]), c, cpu, wall))
            counted = r.get("cuheap", {}).get(k, {})
            if counted.get("cpu_waits") or counted.get("segments"):
                notes.append("%s, %s: cuheap waited for the GPU %d times and took %d segments while timed" % (
                    label(r["mode"]), c, counted.get("cpu_waits", 0), counted.get("segments", 0)))
    if notes:
        lines += [""] + ["- " + n for n in notes]
    by_mode = {r["mode"]: r for r in results if "error" not in r}
    over = [(m, f) for m in by_mode for f in floors_of(m) if f in by_mode]
    if over:
        lines += ["", "over the floor of the same way in (microseconds per tensor, medians)", "",
                  "| mode | floor | " + " | ".join(c for _, c in SIZES) + " |",
                  "|---|---|" + "---|" * len(SIZES)]
        for m, f in over:
            diffs = []
            for k, _ in SIZES:
                a, b = by_mode[m]["us"].get(k), by_mode[f]["us"].get(k)
                diffs.append("-" if a is None or b is None else "%+.2f" % (a - b))
            lines.append("| %s | %s | " % (label(m), label(f)) + " | ".join(diffs) + " |")
    return "\n".join(lines)


def arguments(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=",".join(m for m, _ in MODES),
                    help="comma-separated, in the table's order (default: every mode)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every mode (at least 2)")
    ap.add_argument("--iterations", type=int, default=20000, help="tensors per timed loop")
    ap.add_argument("--repeat", type=int, default=5, help="timed loops per size in a child (the median)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per child")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="where the floor was built (BUILD/floor)")
    ap.add_argument("--out", help="write every round's results here (JSON)")
    ap.add_argument("--results", help="print the table of a results file written by --out, and run nothing")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="count the first child too (by default one child of the first mode runs first, not counted)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes:
        if not known(m):
            ap.error("unknown mode %s (modes: %s, preload=PATH)" % (m, ", ".join(m for m, _ in MODES)))
    if not args.child and not args.results and args.rounds < 2:
        ap.error("--rounds must be at least 2: one round cannot show the machine's drift")
    if args.iterations < 1 or args.repeat < 1:
        ap.error("--iterations and --repeat must be at least 1")
    return args


def main(argv=None):
    args = arguments(argv)
    if args.child:
        child(args.iterations, args.repeat)
        return 0
    if args.results:
        with open(args.results) as f:
            results = json.load(f)
    else:
        results = []
        if args.warm_up and args.modes:
            warm = run(args.modes[0], args.build, args.iterations, args.repeat, args.timeout)
            print(json.dumps(dict(warm, round="warm-up, not counted")), file=sys.stderr, flush=True)
        for r in range(args.rounds):
            for mode in args.modes if r % 2 == 0 else list(reversed(args.modes)):
                result = run(mode, args.build, args.iterations, args.repeat, args.timeout)
                result["round"] = r
                print(json.dumps(result), file=sys.stderr, flush=True)
                results.append(result)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    order = {m: i for i, m in enumerate(args.modes)}
    rows = combine(sorted(results, key=lambda r: order.get(r["mode"], len(order))))
    print(table(rows))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
