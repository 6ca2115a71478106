"""run_ddp.py - runs DistributedDataParallel training jobs under several allocator modes side by side.

    python bench/torch/run_ddp.py --jobs gpt2,resnet50 --nproc 2 --out ddp.json

Each (job, mode) runs bench/torch/ddp_job.py under torchrun (one process per
GPU, --nproc of them) with the environment that selects the mode, taken from
run_modes.py: native, native-again (native once more, so that losses that are
not bitwise reproducible are judged against the spread of two native runs),
cuheap (CUHEAP_TORCH=1 with scripts/ on PYTHONPATH: environment only),
preload-caching (LD_PRELOAD=build/libcuheap.so with PyTorch's caching on),
preload (the same with PYTORCH_NO_CUDA_MEMORY_CACHING=1), or any other mode
of run_modes.py but the *-limit ones. Jobs run in the order given, modes
interleaved, as in run_modes.py.

NCCL_NVLS_ENABLE=0 is always set: NVLink multicast stays off. Other NCCL_
variables of the caller's environment are passed on; --nccl-cumem 0 sets
NCCL_CUMEM_ENABLE=0, so that NCCL's own buffers come from cudaMalloc, which
the preload modes serve (and count), rather than from cuMemCreate.

Prints a table: step time (the slowest rank's median) as a ratio to native in
the same run, peak reserved (the largest rank's), peak reserved over peak live,
and whether every rank's losses equal native's bit for bit. Exit status 1 if
any run failed.
"""

import argparse
import json
import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_modes  # noqa: E402

MODES = "native,native-again,cuheap,preload-caching,preload"


def split_mode(mode):
    """A mode and the variables of its variant: "preload@CUHEAP_CONF=wait_before_grow:0"
    is the preload mode with CUHEAP_CONF set so (several: "@A=1@B=2")."""
    base, *assignments = mode.split("@")
    extra = {}
    for a in assignments:
        name, eq, value = a.partition("=")
        if not name or not eq:
            raise SystemExit("mode %s: a variant is @NAME=VALUE, not @%s" % (mode, a))
        extra[name] = value
    return base, extra


def environment(mode, nccl_cumem):
    base, extra = split_mode(mode)
    env = run_modes.environment(base)
    env.update(extra)
    env["NCCL_NVLS_ENABLE"] = "0"
    if nccl_cumem == "0":
        env["NCCL_CUMEM_ENABLE"] = "0"
    return env


def descendants(pid):
    """The ids of pid's descendants, from /proc (torchrun starts each rank in a session of its own)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def stop(p):
    """Stops torchrun and its ranks: SIGTERM to torchrun (it stops the ranks),
    then SIGKILL to whatever of them is left; returns what they wrote."""
    os.killpg(p.pid, signal.SIGTERM)
    try:
        return p.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        pass
    for pid in descendants(p.pid) + [p.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        return p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        return "", "(no output: a process still holds the pipes)"


def failure(job, mode, stderr, returncode):
    summary = [line for line in stderr.splitlines() if line.startswith("ddp_job rank ")]
    r = {"job": job, "mode": mode, "error": stderr[-4000:], "returncode": returncode}
    if summary:
        r["summary"] = summary[0]
    return r


def run(job, mode, args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
           os.path.join(HERE, "ddp_job.py"), "--job", job, "--steps", str(args.steps), "--seed", str(args.seed)]
    p = subprocess.Popen(cmd, env=environment(mode, args.nccl_cumem), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        out, err = stop(p)
        r = failure(job, mode, (err or "") + "\ntimed out after %d s" % args.timeout, None)
        r["summary"] = "timed out after %d s" % args.timeout + ("; " + r["summary"] if "summary" in r else "")
        return r
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        return failure(job, mode, err or out, p.returncode)
    r = json.loads(lines[-1])
    base = split_mode(mode)[0]
    if base == "native-again" and r["mode"] == "native":
        r["mode"] = base
    if r["mode"] != base:
        r["error"] = "asked for mode %s, the job ran in %s" % (base, r["mode"])
    elif r["world_size"] != args.nproc:
        r["error"] = "asked for %d ranks, the job ran on %d" % (args.nproc, r["world_size"])
    r["mode"] = mode
    return r


def max_rank_diff(a, b):
    """The largest step-wise loss difference of a and b over all ranks."""
    xs, ys = a["losses_all_ranks"], b["losses_all_ranks"]
    if len(xs) != len(ys):
        return float("inf")
    return max(run_modes.max_loss_diff({"losses": x}, {"losses": y}) for x, y in zip(xs, ys))


def losses_vs_native(r, n, again):
    """bitwise on every rank, or the largest difference beside the native spread."""
    return run_modes.losses_vs_native(r, n, again, key="losses_all_ranks", diff=max_rank_diff)


def table(results):
    rounds = max((len(r.get("step_ms_rounds", [])) for r in results), default=1)
    rows = ["| job | mode | step ms%s | vs native | peak reserved GiB (max rank) | reserved / live | losses vs native "
            "| notes |" % (" (median of %d rounds; range)" % rounds if rounds > 1 else ""),
            "|---|---|---|---|---|---|---|---|"]
    native = {r["job"]: r for r in results if r["mode"] == "native" and "error" not in r}
    again = {r["job"]: r for r in results if r["mode"] == "native-again" and "error" not in r}
    for r in results:
        if "error" in r:
            note = r.get("summary") or (r["error"].strip().splitlines() or ["?"])[-1]
            rows.append("| %s | %s | failed | | | | | %s |" % (r["job"], r["mode"], note[:160].replace("|", "/")))
            continue
        n = native.get(r["job"])
        ratio = "%.3f" % (r["step_ms"] / n["step_ms"]) if n and r.get("step_ms") and n.get("step_ms") else "-"
        same = "-" if not n or r is n else losses_vs_native(r, n, again.get(r["job"]))
        frag = "%.3f" % (r["peak_reserved"] / r["peak_live"]) if r["peak_reserved"] and r["peak_live"] else "-"
        notes = ["%d cache-release retries" % sum(x["retries"] for x in r["ranks"])] \
            if any(x.get("retries") for x in r["ranks"]) else []
        step = "%.1f" % r["step_ms"] if r.get("step_ms") else "-"
        if len(r.get("step_ms_rounds", [])) > 1:
            step += " (%.1f-%.1f)" % (min(r["step_ms_rounds"]), max(r["step_ms_rounds"]))
        rows.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["job"], r["mode"], step, ratio, run_modes.gib(r["peak_reserved"]), frag, same, "; ".join(notes)))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="gpt2,resnet50")
    ap.add_argument("--modes", default=MODES)
    ap.add_argument("--nproc", type=int, default=2, help="ranks (GPUs) per job")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per torchrun")
    ap.add_argument("--nccl-cumem", choices=("default", "0"), default="default",
                    help="0: NCCL_CUMEM_ENABLE=0 (NCCL's buffers from cudaMalloc)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds: every (job, mode) runs once a round, in order, and the table shows the median "
                         "step time (the machine's noise between launches is several percent)")
    ap.add_argument("--out", help="write every result as JSON here")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if any(m.endswith("-limit") for m in modes):
        ap.error("*-limit modes are not supported here (run_modes.py has them)")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    for m in modes:
        split_mode(m)
    results = []
    for _ in range(args.repeat):
        for job in args.jobs.split(","):
            for mode in modes:
                r = run(job, mode, args)
                print(json.dumps(r), file=sys.stderr, flush=True)
                results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    results = run_modes.combine(results)
    print("%d ranks per job; NCCL_NVLS_ENABLE=0, NCCL_CUMEM_ENABLE=%s" % (
        args.nproc, "0" if args.nccl_cumem == "0" else os.environ.get("NCCL_CUMEM_ENABLE", "NCCL's default")))
    print(table(results))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
