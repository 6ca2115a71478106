#!/usr/bin/env bash
# test_bench_harness.sh BUILD_DIR - the PyTorch job harness's own logic,
# without torch or a GPU: bench/torch/run_modes.py, run_ddp.py and
# per_tensor.py choose each mode's environment (the *-limit modes' byte limit,
# NCCL's settings, the floor's libraries) and turn results into the tables
# docs/benchmarks.md carries. A wrong environment or a
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
lib = os.path.abspath("../../README.md")      # any file stands for another build here
env = run_modes.environment("preload=../../README.md@thread_cache:0")
expect(env.get("LD_PRELOAD") == lib and env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
       and env.get("CUHEAP_CONF") == "thread_cache:0", "preload=PATH: that build preloaded, cache off, settings after @")
env = run_modes.environment("cuheap=../../README.md")
expect(env.get("CUHEAP_LIB") == lib and env.get("CUHEAP_TORCH") == "1" and "LD_PRELOAD" not in env,
       "cuheap=PATH: the plugin from that build")
os.environ["CUHEAP_LIB"] = "/stale.so"
expect("CUHEAP_LIB" not in run_modes.environment("cuheap"), "the caller's CUHEAP_LIB never reaches a mode")
del os.environ["CUHEAP_LIB"]
for bad in ("native=../../README.md", "preload=", "preload=/no/such/libcuheap.so"):
    try:
        run_modes.environment(bad)
        expect(False, "%s is refused" % bad)
    except SystemExit as e:
        expect("mode" in str(e), "%s is refused, naming the mode" % bad)
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

# ---- per_tensor.py: one tensor through PyTorch in each mode, beside the floor ----
import contextlib, io, json, re, subprocess, tempfile
import per_tensor
os.environ["CUHEAP_CONF"] = "stale:1"
os.environ[per_tensor.FLOOR_ENV] = "/stale/floor.so"
env = per_tensor.environment("floor-plugin", "/b")
expect(env.get(per_tensor.FLOOR_ENV) == "/b/floor/libfloor_plugin.so" and "LD_PRELOAD" not in env
       and "CUHEAP_TORCH" not in env and "CUHEAP_CONF" not in env and "PYTORCH_NO_CUDA_MEMORY_CACHING" not in env,
       "per-tensor floor-plugin: the floor plugin of BUILD/floor, PyTorch's cache and cuheap out of the way")
env = per_tensor.environment("floor-preload", "/b")
expect(env.get("LD_PRELOAD") == "/b/floor/libfloor_preload.so" and env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
       and per_tensor.FLOOR_ENV not in env and "CUHEAP_CONF" not in env,
       "per-tensor floor-preload: the floor preloaded, PyTorch's cache off")
env = per_tensor.environment("floor-preload-fenced", "/b")
expect(env.get("LD_PRELOAD") == "/b/floor/libfloor_preload.so" and env.get("FLOOR_FENCE") == "1"
       and env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1" and per_tensor.FLOOR_ENV not in env,
       "per-tensor floor-preload-fenced: the floor preloaded with its fence, PyTorch's cache off")
os.environ["FLOOR_FENCE"] = "1"
expect("FLOOR_FENCE" not in per_tensor.environment("floor-preload", "/b"),
       "per-tensor floor-preload: a FLOOR_FENCE in the caller's environment does not fence the plain floor")
del os.environ["FLOOR_FENCE"]
expect(per_tensor.floors_of("preload") == ["floor-preload", "floor-preload-fenced"]
       and per_tensor.floors_of("cuheap") == ["floor-plugin"] and per_tensor.floors_of("native") == [],
       "per-tensor: LD_PRELOAD is shown over both preload floors, the plugin over its own, native over none")
env = per_tensor.environment("cuheap-plain")
expect(env.get("CUHEAP_TORCH") == "1" and env.get("CUHEAP_CONF") == "vmm:0" and per_tensor.FLOOR_ENV not in env,
       "per-tensor cuheap-plain: run_modes.py's plugin on plain segments, no stale floor")
env = per_tensor.environment("preload")
expect(env.get("LD_PRELOAD", "").endswith("build/libcuheap.so") and env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
       "per-tensor preload: run_modes.py's, PyTorch's cache off")
with tempfile.NamedTemporaryFile(suffix=".so") as other:
    env = per_tensor.environment("preload=" + other.name)
    expect(env.get("LD_PRELOAD") == other.name and env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
           and per_tensor.FLOOR_ENV not in env and per_tensor.floor_of("preload=" + other.name) == "floor-preload",
           "per-tensor preload=PATH: that build preloaded, PyTorch's cache off, beside the preload floor")
try:
    per_tensor.environment("preload=/no/such/libcuheap.so")
    expect(False, "per-tensor preload=PATH of a missing file is refused")
except SystemExit as e:
    expect("/no/such/libcuheap.so" in str(e), "per-tensor preload=PATH of a missing file is refused, naming it")
del os.environ[per_tensor.FLOOR_ENV]
for bad in (["--rounds", "1"], ["--modes", "native,bogus"], ["--iterations", "0"], ["--modes", "preload="]):
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            per_tensor.arguments(bad)
        expect(False, "per-tensor %s is refused" % " ".join(bad))
    except SystemExit:
        expect(True, "per-tensor %s is refused" % " ".join(bad))
src = open(os.path.join(per_tensor.ROOT, "bench", "bench_per_tensor.c")).read()
c_sizes = eval("[" + re.search(r"mixed_sizes\[\] = \{([^}]*)\}", src).group(1) + "]")
c_window = int(re.search(r"#define MIXED_WINDOW (\d+)", src).group(1))
expect(c_sizes == per_tensor.MIXED_SIZES and c_window == per_tensor.MIXED_WINDOW,
       "per-tensor: the mixed live set is the one bench_per_tensor.c makes")

answers = {"native": (0, {"mode": "native"}), "cuheap": (0, {"mode": "native"}), "preload": (1, None)}
def fake_child(cmd, env=None, **kwargs):
    mode = "cuheap" if env.get("CUHEAP_TORCH") else "preload" if env.get("LD_PRELOAD") else "native"
    rc, line = answers[mode]
    return subprocess.CompletedProcess(cmd, rc, json.dumps(dict(line, us={})) + "\n" if line else "", "Boom: no GPU\n")
real_run, per_tensor.subprocess.run = per_tensor.subprocess.run, fake_child
r = per_tensor.run("cuheap", "/b", 10, 1, 5)
expect("error" in r and "asked for mode cuheap, the child ran in native" in r["error"],
       "per-tensor: a child that ran in another mode is a failed row")
r = per_tensor.run("preload", "/b", 10, 1, 5)
expect(r.get("error") == "Boom: no GPU", "per-tensor: a child that failed is a failed row with its last words")
answers["preload"] = (0, {"mode": "preload"})
with tempfile.NamedTemporaryFile(suffix=".so") as other:
    r = per_tensor.run("preload=" + other.name, "/b", 10, 1, 5)
expect("error" not in r and r["mode"] == "preload=" + other.name,
       "per-tensor: a preload=PATH child runs as preload and keeps its own row")
per_tensor.subprocess.run = real_run
order = []
real_child_run = per_tensor.run
per_tensor.run = lambda mode, *a: order.append(mode) or {"mode": mode, "us": {"512": 1.0}}
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    rc = per_tensor.main(["--modes", "native,cuheap,floor-plugin", "--rounds", "3", "--no-warm-up"])
expect(order == ["native", "cuheap", "floor-plugin", "floor-plugin", "cuheap", "native", "native", "cuheap",
                "floor-plugin"] and rc == 0, "per-tensor: every mode in every round, the order reversed every other round")
order = []
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    rc = per_tensor.main(["--modes", "native,cuheap", "--rounds", "2"])
per_tensor.run = real_child_run
expect(order == ["native", "native", "cuheap", "cuheap", "native"] and rc == 0 and "median of 2 rounds" in out.getvalue(),
       "per-tensor: a warm-up child of the first mode runs first and is not counted in the rounds")

us = lambda x: {"512": x, "65536": x, "1048576": x, "67108864": x, "mixed": x}
t = per_tensor.table(per_tensor.combine([{"mode": "preload", "us": us(2.5)}, {"mode": "preload=/old.so", "us": us(2.75)},
                                         {"mode": "floor-preload", "us": us(2.0)}]))
over = t.split("over the floor")[-1]
expect("| cuheap LD_PRELOAD, PyTorch's cache off | floor LD_PRELOAD" in over and "+0.50" in over
       and "| cuheap LD_PRELOAD, PyTorch's cache off, /old.so | floor LD_PRELOAD" in over and "+0.75" in over,
       "per-tensor: a preload=PATH row has its own line over the preload floor")

fixed = [
    {"mode": "native", "round": 0, "us": {"512": 2.17, "65536": 3.39, "1048576": 2.21, "67108864": 2.17, "mixed": 1.87}},
    {"mode": "cuheap", "round": 0, "us": {"512": 3.49, "65536": 3.98, "1048576": 3.75, "67108864": 3.36, "mixed": 3.21}},
    {"mode": "floor-plugin", "round": 0, "us": {"512": 2.0, "65536": 2.0, "1048576": 2.0, "67108864": 2.0, "mixed": 1.7}},
    {"mode": "preload", "round": 0, "error": "Traceback (most recent call last):\nRuntimeError: CUDA error"},
    {"mode": "floor-plugin", "round": 1, "us": {"512": 2.2, "65536": 2.1, "1048576": 2.0, "67108864": 2.0, "mixed": 1.9}},
    {"mode": "cuheap", "round": 1, "us": {"512": 3.59, "65536": 3.88, "1048576": 3.65, "67108864": 3.46, "mixed": 3.11},
     "cpu_us": {"512": 3.5, "65536": 3.8, "1048576": 3.6, "67108864": 1.0, "mixed": 3.1},
     "cuheap": {"512": {"cpu_waits": 0, "segments": 0}, "67108864": {"cpu_waits": 2, "segments": 1}}},
    {"mode": "native", "round": 1, "us": {"512": 2.27, "65536": 3.29, "1048576": 2.31, "67108864": 2.07, "mixed": 1.97}},
]
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(fixed, f)
p = subprocess.run([sys.executable, "per_tensor.py", "--results", f.name], capture_output=True, text=True)
os.unlink(f.name)
lines = p.stdout.splitlines()
rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ") and "---" not in line}
expect(p.returncode == 1 and lines[0].endswith("median of 2 rounds (range)") and
       lines[2] == "| mode | 512 B | 64 KiB | 1 MiB | 64 MiB | mixed live set |",
       "per-tensor --results: the table of a results file, without torch; a failed row fails the run")
expect(rows["PyTorch native"] == "| PyTorch native | 2.22 (2.17-2.27) | 3.34 (3.29-3.39) | 2.26 (2.21-2.31) | "
       "2.12 (2.07-2.17) | 1.92 (1.87-1.97) |", "per-tensor: a row is the median of the rounds and their range")
expect([l.split("|")[1].strip() for l in lines[4:8]] == ["PyTorch native", "cuheap plugin (default, vmm:1)",
       "cuheap LD_PRELOAD, PyTorch's cache off", "floor plugin"], "per-tensor: rows in the modes' order, named")
expect(rows["cuheap LD_PRELOAD, PyTorch's cache off"].count("|") == 7 and
       "failed: RuntimeError: CUDA error" in rows["cuheap LD_PRELOAD, PyTorch's cache off"],
       "per-tensor: a failed mode is a row that says why")
expect([l for l in lines if l.startswith("- ")] ==
       ["- cuheap plugin (default, vmm:1), 64 MiB: 1.00 of 3.41 us on the CPU, the rest waiting",
        "- cuheap plugin (default, vmm:1), 64 MiB: cuheap waited for the GPU 2 times and took 1 segments while timed"],
       "per-tensor: a loop that waited, and cuheap's waits and segments while timed, are named under the table")
over = [l for l in lines if l.startswith("| cuheap plugin (default, vmm:1) | floor plugin |")]
expect(over == ["| cuheap plugin (default, vmm:1) | floor plugin | +1.44 | +1.88 | +1.70 | +1.41 | +1.36 |"],
       "per-tensor: the cuheap plugin over the floor plugin, size by size")
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
