#!/usr/bin/env bash
# test_bench_harness.sh BUILD_DIR - the PyTorch job harness's own logic,
# without torch or a GPU: bench/torch/run_modes.py and run_ddp.py choose each
# mode's environment (the *-limit modes' byte limit, NCCL's settings) and
# turn results into the tables docs/benchmarks.md carries. A wrong environment or a
# misread result would put wrong figures there, so they are checked here on
# made-up results.
set -uo pipefail
. "$(dirname "$0")/harness.sh"
out=$(cd bench/torch && python3 - <<'PY' 2>&1
import os, sys
sys.path.insert(0, ".")
import run_modes, run_ddp

def expect(cond, what):
    print(("ok " if cond else "FAIL ") + what)

os.environ["CUHEAP_CONF"] = "stale:1"          # the caller's settings never leak into a mode
env = run_modes.environment("cuheap-vmm-limit", 1234567.0)
expect(env.get("CUHEAP_CONF") == "vmm:1,limit:1234567", "cuheap-vmm-limit: CUHEAP_CONF vmm:1,limit:BYTES")
expect(env.get("CUHEAP_BENCH_LIMIT") == "1234567" and env.get("CUHEAP_TORCH") == "1",
       "cuheap-vmm-limit: the job sees the limit and activates cuheap")
env = run_modes.environment("cuheap-limit", 2e9)
expect(env.get("CUHEAP_CONF") == "limit:2000000000", "cuheap-limit: CUHEAP_CONF limit:BYTES alone")
env = run_modes.environment("cuheap")
expect(env.get("CUHEAP_TORCH") == "1" and "CUHEAP_CONF" not in env, "cuheap: the plugin with its own defaults (vmm:1)")
env = run_modes.environment("cuheap-plain")
expect(env.get("CUHEAP_TORCH") == "1" and env.get("CUHEAP_CONF") == "vmm:0", "cuheap-plain: the plugin on plain segments")
env = run_modes.environment("native-limit", 5e8)
expect("CUHEAP_CONF" not in env and "CUHEAP_TORCH" not in env and "LD_PRELOAD" not in env
       and env.get("CUHEAP_BENCH_LIMIT") == "500000000", "native-limit: only the limit, no cuheap")
env = run_modes.environment("preload-limit", 3e9)
expect(env.get("CUHEAP_CONF") == "limit:3000000000" and env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
       "preload-limit: the preload's heap gets the limit")
env = run_modes.environment("native")
expect("CUHEAP_BENCH_LIMIT" not in env and "CUHEAP_CONF" not in env, "native: no limit, no cuheap settings")
os.environ["CUHEAP_BENCH_CONF"] = "wait_before_grow:0"
env = run_modes.environment("cuheap-vmm-limit", 1e9)
expect(env.get("CUHEAP_CONF") == "vmm:1,wait_before_grow:0,limit:1000000000",
       "CUHEAP_BENCH_CONF joins a cuheap mode's settings")
expect("CUHEAP_CONF" not in run_modes.environment("native"), "CUHEAP_BENCH_CONF stays out of native modes")
del os.environ["CUHEAP_BENCH_CONF"]
env = run_modes.environment("cuheap-vmm-limit@vmm_page:8M+vmm_margin:0.2", 1e9)
expect(env.get("CUHEAP_CONF") == "vmm:1,limit:1000000000,vmm_page:8M,vmm_margin:0.2"
       and env.get("CUHEAP_BENCH_LIMIT") == "1000000000", "MODE@settings adds settings to that mode only")
for bad in ("native@vmm_page:8M", "cuheap@"):
    try:
        run_modes.environment(bad)
        expect(False, "%s is refused" % bad)
    except SystemExit:
        expect(True, "%s is refused" % bad)
try:
    run_modes.environment("native-limit")
    expect(False, "a *-limit mode without a limit is refused")
except SystemExit:
    expect(True, "a *-limit mode without a limit is refused")
r = run_modes.run("gpt2", "cuheap-vmm-limit", 1, 0, 1, None)
expect("error" in r and "native" in r["error"], "a *-limit mode whose native run failed is an error row, not a run")
r = run_modes.run("gpt2", "cuheap-vmm-limit@vmm_page:8M", 1, 0, 1, None)
expect("error" in r and "native" in r["error"], "... and so is a variant of one")

hexes = lambda xs: [float(x).hex() for x in xs]
results = [
    {"job": "j", "mode": "native", "step_ms": 100.0, "losses": hexes([1, 2]), "peak_reserved": 2 << 30,
     "peak_live": 1 << 30},
    {"job": "j", "mode": "native-again", "step_ms": 101.0, "losses": hexes([1, 2.001]), "peak_reserved": 2 << 30,
     "peak_live": 1 << 30},
    {"job": "j", "mode": "cuheap-vmm-limit", "step_ms": 150.0, "losses": hexes([1, 2.0005]),
     "peak_reserved": 1 << 30, "peak_live": 1 << 30, "limit": 1.05 * (1 << 30), "retries": 0},
    {"job": "j", "mode": "native-limit", "step_ms": None, "losses": hexes([1]), "peak_reserved": 1 << 30,
     "peak_live": 1 << 30, "limit": 1.05 * (1 << 30), "retries": 2,
     "oom": {"step": 1, "error": "CUDA out of memory. Tried to allocate 2.13 GiB."}},
]
t = run_modes.table(results)
rows = {line.split("|")[2].strip(): line for line in t.splitlines()[2:]}
expect("| 1.500 |" in rows["cuheap-vmm-limit"], "step time as a ratio to native in the same run")
expect("within native spread" in rows["cuheap-vmm-limit"], "losses judged against two native runs' spread")
expect("limit 1.050 GiB" in rows["cuheap-vmm-limit"], "the limit is shown")
expect("| 2.000 | 2.000 | - |" in rows["native"], "no device peak where NVML could not say")
t2 = run_modes.table([dict(results[0], device_peak=(2 << 30) + (512 << 20)), dict(results[2], device_peak=None)])
rows2 = {line.split("|")[2].strip(): line for line in t2.splitlines()[2:]}
expect("peak on the device GiB" in t2.splitlines()[0] and "| 2.000 | 2.000 | 2.500 |" in rows2["native"],
       "the device peak beside peak reserved and reserved / live")
expect("OUT OF MEMORY at step 1" in rows["native-limit"] and "2 cache-release retries" in rows["native-limit"]
       and "| - |" in rows["native-limit"], "an out-of-memory is a result: its step, no step time, the retries")

rounds = [dict(results[0], step_ms=s) for s in (100.0, 110.0, 90.0)] + \
    [dict(results[2], step_ms=s) for s in (150.0, 200.0, 130.0)]
t = run_modes.table(run_modes.combine(rounds))
rows = {line.split("|")[2].strip(): line for line in t.splitlines()[2:]}
expect("median of 3 rounds" in t.splitlines()[0] and "| 150.0 (130.0-200.0) | 1.500 |" in rows["cuheap-vmm-limit"],
       "--repeat: the median of the rounds, their range, and the ratio of medians")

env = run_ddp.environment("preload-caching", "0")
expect(env.get("NCCL_NVLS_ENABLE") == "0" and env.get("NCCL_CUMEM_ENABLE") == "0"
       and env.get("LD_PRELOAD", "").endswith("build/libcuheap.so"), "DDP: multicast off, NCCL buffers by cudaMalloc")
env = run_ddp.environment("cuheap", "default")
expect(env.get("NCCL_NVLS_ENABLE") == "0" and "NCCL_CUMEM_ENABLE" not in env, "DDP: NCCL's own default for cuMem")
ranks = lambda a, b: {"losses_all_ranks": [hexes(a), hexes(b)]}
n, again, same = ranks([1, 2], [1, 2]), ranks([1, 2.01], [1, 2]), ranks([1, 2], [1, 2.5])
expect(run_ddp.losses_vs_native(same, n, again).startswith("OUTSIDE"),
       "DDP: a difference on any rank beyond the native spread is named")
expect(run_ddp.losses_vs_native(ranks([1, 2], [1, 2]), n, again) == "bitwise", "DDP: bitwise on every rank")
env = run_ddp.environment("preload@CUHEAP_CONF=wait_before_grow:0@X=1", "default")
expect(env.get("CUHEAP_CONF") == "wait_before_grow:0" and env.get("X") == "1"
       and env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1", "DDP: a mode's variant sets its variables")
try:
    run_ddp.split_mode("preload@novalue")
    expect(False, "DDP: a variant without NAME=VALUE is refused")
except SystemExit as e:
    expect("@NAME=VALUE" in str(e), "DDP: a variant without NAME=VALUE is refused")
def ddp(mode, step, losses=(1, 2), err=None):
    r = {"job": "gpt2", "mode": mode, "step_ms": step, "peak_reserved": 2 << 30, "peak_live": 1 << 30,
         "ranks": [{"retries": 0}], "losses_all_ranks": [hexes(losses)]}
    if err:
        r["error"] = err
    return r
rounds = [ddp("native", 100), ddp("preload", 130), ddp("native", 90), ddp("preload", 99),
          ddp("native", 110), ddp("preload", 100)]
c = run_modes.combine(rounds)
expect([r["mode"] for r in c] == ["native", "preload"] and c[0]["step_ms"] == 100 and c[1]["step_ms"] == 100,
       "DDP --repeat: one row per mode, step time the median of the rounds")
t = run_ddp.table(c)
rows = {line.split("|")[2].strip(): line for line in t.splitlines()[2:]}
expect("median of 3 rounds" in t and "100.0 (99.0-130.0)" in rows["preload"] and "| 1.000 |" in rows["preload"],
       "DDP --repeat: the range of the rounds is shown and the ratio is of medians")
c = run_modes.combine([ddp("native", 100), ddp("preload", 100), ddp("native", 100), ddp("preload", None, err="boom")])
expect("failed" in run_ddp.table(c).splitlines()[3], "DDP --repeat: a round that failed fails the row")
PY
)
while IFS= read -r line; do
    case "$line" in
    "ok "*) ok "${line#ok }" ;;
    "FAIL "*) not_ok "${line#FAIL }" ;;
    *) not_ok "unexpected output" "$line" ;;
    esac
done <<<"$out"
[ -n "$out" ] || not_ok "the harness test printed nothing"
echo "test_bench_harness: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
