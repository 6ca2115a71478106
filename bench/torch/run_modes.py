"""run_modes.py - runs training jobs under several allocator modes side by side.

    python bench/torch/run_modes.py --jobs resnet50,gpt2 --modes native,cuheap --out results.json

Each (job, mode) runs in its own process (bench/torch/train_job.py) with the
environment that selects the mode; jobs run in the order given, modes
interleaved, so the machine's drift touches all modes alike. Prints a table:
step time (the median step from the fourth on) and the total time of every
step after the first, each as a ratio to native in the same run, peak reserved, peak reserved
over peak live, the peak on the device (peak reserved plus what the process
holds outside its allocator: under LD_PRELOAD cuheap also serves what
libraries such as cuBLAS take with cudaMalloc themselves, which PyTorch's
modes do not count in their reserved), and whether the losses equal native's
bit for bit.

Modes: native, native-again (native once more: where losses are not bitwise
reproducible - cuDNN's attention backward is not deterministic - the losses
of the other modes are judged against the spread between the two native
runs), expandable (expandable_segments:True), async
(backend:cudaMallocAsync), nocache (PYTORCH_NO_CUDA_MEMORY_CACHING=1), cuheap
(CUHEAP_TORCH=1 with scripts/ on PYTHONPATH: environment only; as PyTorch's
allocator cuheap runs with vmm:1 unless told otherwise), cuheap-vmm (the same
with CUHEAP_CONF=vmm:1 said), cuheap-plain (CUHEAP_CONF=vmm:0: plain segments), preload (LD_PRELOAD=build/libcuheap.so with
PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is a cudaMalloc served by
cuheap), preload-caching (LD_PRELOAD with PyTorch's caching left on).

Any mode with "-limit" appended (native-limit, expandable-limit,
cuheap-limit, cuheap-vmm-limit, ...) runs under a memory limit of
--limit-live times the peak live bytes of the job's native run in the same
invocation (so native must come first): PyTorch's own modes through
set_per_process_memory_fraction, cuheap's through CUHEAP_CONF limit:BYTES.
An out-of-memory there is a result (the step it happened at), and the
allocator's cache-release retries are shown beside it.

CUHEAP_BENCH_CONF=key:value,... adds settings to cuheap's modes (an
experiment: --modes preload with CUHEAP_BENCH_CONF=wait_before_grow:0); the
caller's own CUHEAP_CONF never reaches a mode. A variant of one cuheap mode
runs beside the plain one as MODE@key:value+key:value (for example
cuheap-vmm@vmm_page:8M or cuheap-vmm-limit@vmm_page:8M): the settings after
"@" ("+" between them) are added to that mode's CUHEAP_CONF.

Another build of the library runs beside the tree's own, in the same rounds,
as preload=PATH (LD_PRELOAD=PATH, PyTorch's cache off) or cuheap=PATH (the
plugin with CUHEAP_LIB=PATH), settings after it as above
(preload=/tmp/before/libcuheap.so@thread_cache:0): a change to the library
is judged on a job against the build before it, the machine's drift shared.

CUHEAP_BENCH_STRICT=1 makes every kernel deterministic in every mode
(train_job.py: attention on PyTorch's math path, no warn_only): two native
runs of GPT-2 and BERT then agree bit for bit, and so must every allocator.

--repeat N runs every (job, mode) N times in rounds (each round all modes
in order, so drift touches them alike): a row's step time is the median of
its rounds, with their range beside it; a *-limit mode keeps the limit of
the first round's native run.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

ROOT = os.path.dirname(os.path.dirname(HERE))


def split_variant(mode):
    """(base mode, extra CUHEAP_CONF settings or None) of MODE@key:value+key:value."""
    base, sep, extra = mode.partition("@")
    if not sep:
        return mode, None
    if not extra or not (base.startswith("cuheap") or base.startswith("preload")):
        raise SystemExit("mode %s: settings after '@' need a cuheap or preload mode and at least one key:value" % mode)
    return base, extra.replace("+", ",")


OTHER_BUILD_MODES = ("preload", "cuheap")   # MODE=PATH: that mode with another libcuheap.so


def split_build(mode):
    """(mode, another build's libcuheap.so or None) of preload=PATH and cuheap=PATH."""
    base, sep, path = mode.partition("=")
    if not sep:
        return mode, None
    if base not in OTHER_BUILD_MODES or not path:
        raise SystemExit("mode %s: another build is MODE=PATH with MODE one of %s" % (mode, ", ".join(OTHER_BUILD_MODES)))
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise SystemExit("mode %s: %s is not a file (a libcuheap.so built elsewhere)" % (mode, path))
    return base, path


def environment(mode, limit=None):
    """The environment of `mode`; a *-limit mode needs `limit` (bytes)."""
    mode, variant = split_variant(mode)
    if variant:
        env = environment(mode, limit)
        env["CUHEAP_CONF"] = (env["CUHEAP_CONF"] + "," if "CUHEAP_CONF" in env else "") + variant
        return env
    mode, other = split_build(mode)
    if other:
        env = environment(mode, limit)
        env["LD_PRELOAD" if mode == "preload" else "CUHEAP_LIB"] = other
        return env
    if mode.endswith("-limit"):
        if limit is None:
            raise SystemExit("mode %s needs a limit: run native first, with --limit-live" % mode)
        env = environment(mode[:-len("-limit")])
        env["CUHEAP_BENCH_LIMIT"] = str(int(limit))
        if "CUHEAP_TORCH" in env or "LD_PRELOAD" in env:
            conf = env.get("CUHEAP_CONF")
            env["CUHEAP_CONF"] = (conf + "," if conf else "") + "limit:%d" % int(limit)
        return env
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING", "CUHEAP_TORCH", "CUHEAP_CONF", "LD_PRELOAD",
              "CUHEAP_BENCH_LIMIT", "CUHEAP_LIB"):
        env.pop(k, None)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"   # deterministic cuBLAS
    env["PYTHONUNBUFFERED"] = "1"
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif mode == "async":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    elif mode == "nocache":
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    elif mode in ("cuheap", "cuheap-vmm", "cuheap-plain"):
        env["CUHEAP_TORCH"] = "1"
        env["PYTHONPATH"] = os.path.join(ROOT, "scripts") + os.pathsep + env.get("PYTHONPATH", "")
        if mode == "cuheap-vmm":
            env["CUHEAP_CONF"] = "vmm:1"
        elif mode == "cuheap-plain":
            env["CUHEAP_CONF"] = "vmm:0"
    elif mode in ("preload", "preload-caching"):
        env["LD_PRELOAD"] = os.path.join(ROOT, "build", "libcuheap.so")
        if mode == "preload":
            env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    elif mode not in ("native", "native-again"):
        raise SystemExit("unknown mode %s" % mode)
    extra = os.environ.get("CUHEAP_BENCH_CONF")
    if extra and ("CUHEAP_TORCH" in env or "LD_PRELOAD" in env):
        env["CUHEAP_CONF"] = (env["CUHEAP_CONF"] + "," if "CUHEAP_CONF" in env else "") + extra
    return env


def run(job, mode, steps, seed, timeout, limit=None):
    cmd = [sys.executable, os.path.join(HERE, "train_job.py"), "--job", job, "--steps", str(steps),
           "--seed", str(seed)]
    if split_variant(mode)[0].endswith("-limit") and limit is None:
        return {"job": job, "mode": mode, "error": "no limit: the job's native run (first, with --limit-live) failed "
                "or did not run", "returncode": None}
    p = subprocess.run(cmd, env=environment(mode, limit), capture_output=True, text=True, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"job": job, "mode": mode, "error": (p.stderr or p.stdout)[-2000:], "returncode": p.returncode}
    r = json.loads(lines[-1])
    if mode == "native-again" and r["mode"] == "native":
        r["mode"] = mode
    base = split_build(split_variant(mode)[0])[0]
    if r["mode"] != base:
        r["error"] = "asked for mode %s, the job ran in %s" % (base, r["mode"])
    r["mode"] = mode
    return r


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def total_after_first(r):
    """The time of every step after the first, in ms: the slow steps (new
    shapes, page moves) are what a user waits for, and a median hides them."""
    return sum(r.get("step_ms_each", [])[1:])


def combine(results):
    """One result per (job, mode) from the rounds of --repeat (here and in
    run_ddp.py), or from a mode listed more than once: the first run (its
    losses and peaks) with step_ms the median over the runs that ran and
    step_ms_rounds every run's; a run that failed makes the row failed."""
    combined, order = {}, []
    for r in results:
        key = (r["job"], r["mode"])
        if key not in combined:
            order.append(key)
            combined[key] = dict(r, step_ms_rounds=[])
        c = combined[key]
        if "error" in r and "error" not in c:
            combined[key] = c = dict(r, step_ms_rounds=c["step_ms_rounds"])
        if "error" not in r and r.get("step_ms"):
            c["step_ms_rounds"].append(r["step_ms"])
            c.setdefault("total_ms_rounds", []).append(total_after_first(r))
    for key in order:
        c = combined[key]
        if c["step_ms_rounds"] and "error" not in c:
            c["step_ms"] = median(c["step_ms_rounds"])
            c["total_ms"] = median(c["total_ms_rounds"])
    return [combined[k] for k in order]


def gib(n):
    return "-" if n is None else "%.3f" % (n / 2 ** 30)


def max_loss_diff(a, b):
    xs = [float.fromhex(x) for x in a["losses"]]
    ys = [float.fromhex(y) for y in b["losses"]]
    return max(abs(x - y) for x, y in zip(xs, ys)) if len(xs) == len(ys) else float("inf")


def losses_vs_native(r, n, again, key="losses", diff=max_loss_diff):
    """bitwise, or the largest step-wise difference beside the native spread
    (`key` names the losses to compare, `diff` measures their difference)."""
    if r[key] == n[key]:
        return "bitwise"
    d = diff(r, n)
    if not again:
        return "differ by up to %.3g" % d
    spread = diff(again, n)
    return "%s: differ by up to %.3g, two native runs by %.3g" % (
        "within native spread" if d <= spread else "OUTSIDE native spread", d, spread)


def table(results):
    rounds = max((len(r.get("step_ms_rounds", [])) for r in results), default=1)
    rows = ["| job | mode | step ms%s | vs native | total ms after step 1 | vs native | peak reserved GiB | "
            "reserved / live | peak on the device GiB | losses vs native | notes |" % (
                " (median of %d rounds; range)" % rounds if rounds > 1 else ""),
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    native = {r["job"]: r for r in results if r["mode"] == "native" and "error" not in r}
    again = {r["job"]: r for r in results if r["mode"] == "native-again" and "error" not in r}
    for r in results:
        if "error" in r:
            rows.append("| %s | %s | failed | | | | | | %s |" % (r["job"], r["mode"], r["error"].strip().splitlines()[-1][:120]))
            continue
        n = native.get(r["job"])
        ratio = "%.3f" % (r["step_ms"] / n["step_ms"]) if n and r.get("step_ms") else "-"
        total = r.get("total_ms", total_after_first(r) if r.get("step_ms_each") else None)
        native_total = n.get("total_ms", total_after_first(n)) if n else None
        total_ratio = "%.3f" % (total / native_total) if total and native_total else "-"
        same = "-" if not n or r is n or r.get("oom") else losses_vs_native(r, n, again.get(r["job"]))
        frag = "%.3f" % (r["peak_reserved"] / r["peak_live"]) if r["peak_reserved"] and r["peak_live"] else "-"
        notes = []
        if "mismatches" in r:
            notes.append("graph replay mismatches: %d" % r["mismatches"])
        if r.get("limit"):
            notes.append("limit %s GiB" % gib(r["limit"]))
        if r.get("oom"):
            notes.append("OUT OF MEMORY at step %d: %s" % (r["oom"]["step"], r["oom"]["error"][:80]))
        if r.get("retries"):
            notes.append("%d cache-release retries" % r["retries"])
        step = "%.1f" % r["step_ms"] if r.get("step_ms") else "-"
        if len(r.get("step_ms_rounds", [])) > 1:
            step += " (%.1f-%.1f)" % (min(r["step_ms_rounds"]), max(r["step_ms_rounds"]))
        total_text = "-" if not total else "%.0f" % total
        if len(r.get("total_ms_rounds", [])) > 1:
            total_text += " (%.0f-%.0f)" % (min(r["total_ms_rounds"]), max(r["total_ms_rounds"]))
        rows.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["job"], r["mode"], step, ratio, total_text, total_ratio, gib(r["peak_reserved"]), frag,
            gib(r.get("device_peak")), same, "; ".join(notes)))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="resnet50,gpt2,bert_varlen")
    ap.add_argument("--modes", default="native,cuheap")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--limit-live", type=float, default=1.05,
                    help="*-limit modes: the limit as a multiple of the native run's peak live bytes")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds: every (job, mode) runs once a round, in order; the table shows the median of "
                         "the rounds and their range")
    ap.add_argument("--out", help="write every result (every round's) as JSON here")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    modes = args.modes.split(",")
    for m in modes:
        split_build(split_variant(m)[0])
    results, limits = [], {}
    for _ in range(args.repeat):
        for job in args.jobs.split(","):
            for mode in modes:
                limited = split_variant(mode)[0].endswith("-limit")
                r = run(job, mode, args.steps, args.seed, args.timeout, limits.get(job) if limited else None)
                if mode == "native" and job not in limits and "error" not in r and r.get("peak_live"):
                    limits[job] = args.limit_live * r["peak_live"]
                print(json.dumps(r), file=sys.stderr, flush=True)
                results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    results = combine(results)
    print(table(results))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
