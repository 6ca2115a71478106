#!/usr/bin/env bash
# test_torch_snapshot.sh BUILD_DIR - scripts/torch_snapshot_to_trace.py on
# snapshots made here with the shape torch.cuda.memory._dump_snapshot()
# writes (plain dicts in a pickle): the trace it writes replays in
# cuheap-replay with the right counts, live peak, streams and PyTorch's peak
# reserved; bad input gets a clear error, and a pickle that names a class
# or function (which could run code as it loads) is refused unloaded.
set -uo pipefail
build=${1:-build}
[ -x "$build/cuheap-replay" ] || build=build
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/harness.sh"
conv="python3 scripts/torch_snapshot_to_trace.py"

python3 - "$tmp" <<'PY'
import pickle, sys
d = sys.argv[1]
M = 1 << 20
trace = [
    {"action": "segment_alloc", "addr": 0x7000, "size": 40 * M, "stream": 0, "time_us": 1000},
    {"action": "alloc", "addr": 0x7000, "size": 10 * M, "stream": 0, "time_us": 1001},
    {"action": "alloc", "addr": 0x8000, "size": 20 * M, "stream": 77, "time_us": 1002},
    {"action": "free_requested", "addr": 0x7000, "size": 10 * M, "stream": 0, "time_us": 1003},
    {"action": "free_completed", "addr": 0x7000, "size": 10 * M, "stream": 0, "time_us": 1004},
    {"action": "alloc", "addr": 0x7000, "size": 15 * M, "stream": 0, "time_us": 1005},
    {"action": "segment_alloc", "addr": 0x9000, "size": 20 * M, "stream": 0, "time_us": 1006},
    {"action": "free_requested", "addr": 0x1234, "size": 1 * M, "stream": 0, "time_us": 1007},
    {"action": "free_requested", "addr": 0x8000, "size": 20 * M, "stream": 77, "time_us": 1008},
    {"action": "segment_free", "addr": 0x9000, "size": 20 * M, "stream": 0, "time_us": 1009},
]
pickle.dump({"segments": [], "device_traces": [trace]}, open(d + "/snap.pickle", "wb"))
pickle.dump({"segments": []}, open(d + "/nosnap.pickle", "wb"))
bad = list(trace); bad[2] = {"action": "alloc", "addr": 1}
pickle.dump({"device_traces": [bad]}, open(d + "/bad.pickle", "wb"))
open(d + "/garbage.pickle", "wb").write(b"not a pickle")
# A pickle that would run a command while it loads: it must not run.
class Runs:
    def __reduce__(self):
        import os
        return (os.system, ("touch " + d + "/it-ran",))
pickle.dump({"device_traces": [trace], "x": Runs()}, open(d + "/evil.pickle", "wb"))
# One that names a harmless class is refused the same way.
import collections
pickle.dump({"device_traces": [trace], "x": collections.OrderedDict()}, open(d + "/class.pickle", "wb"))
PY
$conv "$tmp/snap.pickle" "$tmp/job.trace.gz" 2>"$tmp/err"; rc=$?
check "converts a snapshot (rc $rc: $(cat "$tmp/err"))" '[ $rc -eq 0 ]'
check "says it left out a free of a block allocated before recording" 'grep -q "1 frees of blocks allocated before" "$tmp/err"'
out=$("$build/cuheap-replay" --json "$tmp/job.trace.gz" | python3 -c "
import json,sys; r=json.loads(sys.stdin.read())
print(r['allocs'], r['frees'], r['peak_live'] >> 20, r['pytorch_peak_reserved'] >> 20)")
check "the trace replays: 3 allocations, 2 frees, live peak 35 MiB, PyTorch's peak 60 MiB (got $out)" '[ "$out" = "3 2 35 60" ]'
check "streams are numbered: 0 stays 0, 77 becomes 1" 'zcat "$tmp/job.trace.gz" | grep -q "^a 2 1 20971520 1$"'
check "times start at 0" 'zcat "$tmp/job.trace.gz" | grep -q "^a 1 0 10485760 0$"'
$conv "$tmp/snap.pickle" "$tmp/job.trace" 2>/dev/null
check "plain output when the name does not end in .gz" 'head -c 7 "$tmp/job.trace" | grep -q "# trace"'
err=$($conv "$tmp/nosnap.pickle" "$tmp/x.trace" 2>&1); rc=$?
check "a pickle without device_traces is refused, saying so" '[ $rc -eq 1 ] && echo "$err" | grep -q "no device_traces"'
err=$($conv "$tmp/bad.pickle" "$tmp/x.trace" 2>&1); rc=$?
check "an entry missing a field is refused with its index" '[ $rc -eq 1 ] && echo "$err" | grep -q "device_traces\[0\]\[2\] (alloc): no .size."'
err=$($conv "$tmp/garbage.pickle" "$tmp/x.trace" 2>&1); rc=$?
check "a file that is no pickle is refused" '[ $rc -eq 1 ] && echo "$err" | grep -q "cannot read a pickle"'
err=$($conv "$tmp/evil.pickle" "$tmp/x.trace" 2>&1); rc=$?
check "a pickle that would run a command is refused and runs nothing ($err)" \
    '[ $rc -eq 1 ] && [ ! -e "$tmp/it-ran" ] && echo "$err" | grep -q "refers to posix.system"'
err=$($conv "$tmp/class.pickle" "$tmp/x.trace" 2>&1); rc=$?
check "a pickle that names any class is refused, naming it" \
    '[ $rc -eq 1 ] && echo "$err" | grep -q "refers to collections.OrderedDict"'
err=$($conv "$tmp/snap.pickle" "$tmp/x.trace" --device 3 2>&1); rc=$?
check "a device the snapshot lacks is refused" '[ $rc -eq 1 ] && echo "$err" | grep -q "has 1 device"'
finish test_torch_snapshot
