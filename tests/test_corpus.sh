#!/usr/bin/env bash
# test_corpus.sh BUILD_DIR - the corpus and the tools that judge a heap policy
# on it: cuheap-replay --way (each way in with its own defaults), the header
# lines of a corpus trace in the replay's JSON, cuheap-corpus on a small corpus
# made here (its table, JSON, summaries, the rule's verdict against a baseline,
# a broken manifest), and, with the plain build, the corpus of
# bench/traces/corpus itself: its manifest and its traces agree, every trace
# carries its header, and `cuheap-corpus` replays all of it.
set -u
BUILD=${1:?usage: tests/test_corpus.sh BUILD_DIR}
BIN=$BUILD/cuheap-replay
CORPUS=$BUILD/cuheap-corpus
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cuh_test_corpus.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/harness.sh"

py() { python3 -c "$@"; }

# ---- a small corpus ---------------------------------------------------------
# Two jobs, each in both ways. Job "churn" frees and reallocates blocks of
# changing sizes on two streams, so that the ways and settings differ; job
# "steady" is one allocation. PyTorch's figures are made up and known.
mkdir -p "$TMP/c"
header() {   # JOB WAY NATIVE EXPAND ASYNC
    printf '# trace v1 source=cuheap-0.1.0 pid=1\n# corpus job=%s way=%s steps=2 seed=0\n' "$1" "$2"
    printf '# pytorch mode=native peak_reserved=%s peak_allocated=1 total_ms=10\n' "$3"
    printf '# pytorch mode=expandable peak_reserved=%s peak_allocated=1 total_ms=11\n' "$4"
    printf '# pytorch mode=async peak_reserved=%s peak_allocated=1 total_ms=12\n' "$5"
}
churn() {
    py '
import random
r = random.Random(7)
t, live, i = 0, [], 0
for step in range(40):
    print("# mark %d step %d" % (t, step))
    for k in range(30):
        t += 1
        size = r.choice([3 << 20, 5 << 20, 9 << 20, 17 << 20, 40 << 20]) + r.randrange(0, 1 << 20)
        print("a %d %d %d %d" % (t, i, size, k % 2))
        live.append(i); i += 1
    r.shuffle(live)
    for _ in range(20):
        t += 1
        print("f %d %d" % (t, live.pop()))
print("# end allocs=%d frees=0 live_at_end=0" % i)
'
}
{ header churn plugin 3000000000 2600000000 2700000000; churn; } >"$TMP/c/churn_plugin.trace.gz"
{ header churn preload 3000000000 2600000000 2700000000; churn; } >"$TMP/c/churn_preload.trace.gz"
for w in plugin preload; do
    { header steady $w 1073741824 1073741824 1073741824; printf 'a 1 0 1000000000 0\n'; } >"$TMP/c/steady_${w}.trace.gz"
done
printf '# job set\nchurn tuning\nsteady held-out\n' >"$TMP/c/MANIFEST"

# ---- cuheap-replay --way ------------------------------------------------------
run way_plugin --json --way plugin "$TMP/c/churn_plugin.trace.gz"
run conf_vmm --json --conf vmm:1 "$TMP/c/churn_plugin.trace.gz"
check "--way plugin replays with the plugin's vmm:1 (as --conf vmm:1 does)" \
    '[ $rc = 0 ] && py "import json; a = json.load(open(\"$TMP/way_plugin.out\")); b = json.load(open(\"$TMP/conf_vmm.out\")); \
assert a[\"peak_reserved\"] == b[\"peak_reserved\"] and a[\"device_calls\"][\"page_maps\"] > 0, (a, b)"'
run way_plugin_plain --json --way plugin --conf vmm:0 "$TMP/c/churn_plugin.trace.gz"
run capi --json "$TMP/c/churn_plugin.trace.gz"
check "the C API's defaults are the plugin's: vmm:1" \
    'py "import json; a = json.load(open(\"$TMP/way_plugin.out\")); b = json.load(open(\"$TMP/capi.out\")); \
assert a[\"peak_reserved\"] == b[\"peak_reserved\"] and b[\"device_calls\"][\"page_maps\"] > 0, (a, b)"'
run capi_plain --json --conf vmm:0 "$TMP/c/churn_plugin.trace.gz"
check "--conf goes over the way's defaults, whatever the order (vmm:0 after --way plugin = the C API's with vmm:0)" \
    'py "import json; a = json.load(open(\"$TMP/way_plugin_plain.out\")); b = json.load(open(\"$TMP/capi_plain.out\")); \
assert a[\"peak_reserved\"] == b[\"peak_reserved\"] and a[\"device_calls\"][\"page_maps\"] == 0, (a, b)"'
run conf_first --json --conf vmm:0 --way plugin "$TMP/c/churn_plugin.trace.gz"
check "--conf before --way still wins" 'cmp -s "$TMP/conf_first.out" "$TMP/way_plugin_plain.out" || \
    py "import json; a = json.load(open(\"$TMP/conf_first.out\")); b = json.load(open(\"$TMP/way_plugin_plain.out\")); \
assert a[\"peak_reserved\"] == b[\"peak_reserved\"]"'
run way_preload --json --way preload "$TMP/c/churn_preload.trace.gz"
run cudafree --json --cudafree 1000 --streams 32 --conf reuse_across_streams:1 "$TMP/c/churn_preload.trace.gz"
check "--way preload replays cudaFree's at lag 1000 with 32 idle streams and LD_PRELOAD's defaults" \
    '[ $rc = 0 ] && py "import json; a = json.load(open(\"$TMP/way_preload.out\")); b = json.load(open(\"$TMP/cudafree.out\")); \
assert a[\"peak_reserved\"] == b[\"peak_reserved\"] and a[\"device_calls\"] == b[\"device_calls\"], (a, b)"'
run way_bad --way fast "$TMP/c/churn_plugin.trace.gz"
check "--way with an unknown way is a usage error naming the ways" \
    '[ $rc = 2 ] && grep -q "bad --way value .fast. (expected capi, plugin or preload)" "$TMP/way_bad.err"'
run way_mix --way plugin --cudafree 10 "$TMP/c/churn_plugin.trace.gz"
check "--way plugin with --cudafree is refused" '[ $rc = 2 ] && grep -q "stream-ordered" "$TMP/way_mix.err"'
run way_lag --way preload --lag 10 "$TMP/c/churn_plugin.trace.gz"
check "--way preload with --lag is refused" '[ $rc = 2 ] && grep -q "give its lag with --cudafree" "$TMP/way_lag.err"'
check "a corpus trace's header reaches the JSON: job, PyTorch's measured modes, marks" \
    'py "import json; a = json.load(open(\"$TMP/way_plugin.out\")); \
assert a[\"job\"] == \"churn\" and a[\"marks\"] == 40 and a[\"pytorch_cache\"] is None, a; \
m = a[\"measured\"]; assert m[\"native\"][\"peak_reserved\"] == 3000000000 and m[\"async\"][\"total_ms\"] == 12, m; \
assert abs(m[\"expandable\"][\"ratio\"] - 2600000000 / a[\"peak_live\"]) < 1e-3, m"'
run moves_all --json --way plugin --conf vmm_margin:0 "$TMP/c/churn_plugin.trace.gz" "$TMP/c/steady_plugin.trace.gz"
check "after_step1: the page maps and unmaps from step 2's mark on, within the run's, and null without marks" \
    'py "
import json
a, b = (json.loads(l) for l in open(\"$TMP/moves_all.out\"))
s, d = a[\"after_step1\"], a[\"device_calls\"]
assert s[\"steps\"] == 39 and 0 < s[\"page_unmaps\"] <= d[\"page_unmaps\"] and 0 < s[\"page_maps\"] < d[\"page_maps\"], a
assert b[\"marks\"] == 0 and b[\"after_step1\"] is None, b
"'
check "worst_step: the step after the first that made the most map calls, no fewer than the mean, null without marks" \
    'py "
import json
a, b = (json.loads(l) for l in open(\"$TMP/moves_all.out\"))
w, s = a[\"worst_step\"], a[\"after_step1\"]
calls = s[\"page_maps\"] + s[\"page_unmaps\"]
assert 2 <= w[\"step\"] <= 40 and calls / s[\"steps\"] <= w[\"map_calls\"] <= calls, (w, s)
assert w[\"page_unmaps\"] <= w[\"map_calls\"], w
assert b[\"worst_step\"] is None, b
"'
run plain_text "$TMP/c/churn_plugin.trace.gz"
check "the text output says what PyTorch measured when the trace was recorded" \
    'grep -q "PyTorch measured when the trace was recorded.*native [0-9.]*, expandable [0-9.]*, async [0-9.]*" "$TMP/plain_text.out"'

# ---- a steady step laid out in advance (step_plan.h) -------------------------
# Job "rep" repeats its step: weights live throughout, an activation freed in
# the step, a gradient freed in the next one. Its plan: the weights plus one
# activation beside one gradient (they meet at the step's start), each step
# the same, against a live peak one gradient higher in step 1.
mkdir -p "$TMP/r"
rep() {
    py '
t, i = 0, 1
print("a 0 0 100000000 0")
prev = None
for step in range(6):
    print("# mark %d step %d" % (t, step))
    t += 1; print("a %d %d 30000000 0" % (t, i)); act = i; i += 1
    if prev is not None:
        t += 1; print("f %d %d" % (t, prev))
    t += 1; print("a %d %d 50000000 0" % (t, i)); prev = i; i += 1
    t += 1; print("f %d %d" % (t, act))
print("# mark %d end" % t)
'
}
for w in plugin preload; do
    { header rep $w 1073741824 1073741824 1073741824; rep; } >"$TMP/r/rep_${w}.trace.gz"
done
printf '# job set\nrep tuning\n' >"$TMP/r/MANIFEST"
run plan_rep --json --way plugin "$TMP/r/rep_plugin.trace.gz"
run plan_churn --json --way plugin "$TMP/c/churn_plugin.trace.gz"
run plan_steady --json --way plugin "$TMP/c/steady_plugin.trace.gz"
check "plan: step 3 of a repeating trace laid out in advance; its steps differ in churn; null without marks" \
    'py "
import json
a = json.load(open(\"$TMP/plan_rep.out\"))
p = a[\"plan\"]
assert p[\"step\"] == 3 and p[\"repeats\"] and p[\"blocks\"] == 2, p
assert p[\"persistent\"] == 100000256 and p[\"step_peak\"] == 30000128 + 50000384, p   # rounded to 512 B
assert p[\"window\"] == 39 << 21, p    # 80000256 bytes rounded up to 2 MiB pages
assert abs(p[\"ratio\"] - (p[\"persistent\"] + p[\"window\"]) / a[\"peak_live\"]) < 1e-4, (p, a[\"peak_live\"])
c = json.load(open(\"$TMP/plan_churn.out\"))[\"plan\"]
assert c[\"step\"] == 3 and not c[\"repeats\"] and c[\"window\"] >= c[\"step_peak\"] > 0, c
assert json.load(open(\"$TMP/plan_steady.out\"))[\"plan\"] is None
"'
run plan_text --way plugin "$TMP/r/rep_plugin.trace.gz"
check "plan: the text output says what step 3 laid out in advance holds" \
    'grep -q "step 3 laid out in advance (the next step repeats it): 95.37 MiB live through it + 78.00 MiB for its 2 blocks = " "$TMP/plan_text.out"'
BIN=$CORPUS
run plan_corpus --dir "$TMP/r" --replay "$BUILD/cuheap-replay" --json
check "cuheap-corpus: a repeating job's plan per row, and the plan beside the replay in the summary" \
    '[ $rc = 0 ] && py "
import json
rows = [json.loads(l) for l in open(\"$TMP/plan_corpus.out\")]
r = {o[\"way\"]: o for o in rows if \"job\" in o}
a = json.load(open(\"$TMP/plan_rep.out\"))
assert r[\"plugin\"][\"plan_repeats\"] and abs(r[\"plugin\"][\"plan_ratio\"] - a[\"plan\"][\"ratio\"]) < 1e-4, r
s = [o[\"summary\"] for o in rows if \"summary\" in o][0]
assert s[\"repeating\"] == 1 and s[\"plan_median\"] == s[\"plan_worst\"] == r[\"plugin\"][\"plan_ratio\"], s
assert s[\"heap_median_repeating\"] == r[\"plugin\"][\"ratio\"], s
"'
run plan_table --dir "$TMP/r" --replay "$BUILD/cuheap-replay"
run plan_churn_table --dir "$TMP/c" --replay "$BUILD/cuheap-replay"
check "cuheap-corpus: the plan column, varies where steps differ, and the summary line of repeating jobs" \
    'grep -qE "^rep +tuning +plugin .* [01][.][0-9]{4}$" "$TMP/plan_table.out" && \
     grep -q "^tuning   plugin   1 of 1 jobs repeat their steps: a steady step laid out in advance holds median" "$TMP/plan_table.out" && \
     grep -qE "^churn +tuning +plugin .* varies$" "$TMP/plan_churn_table.out" && \
     ! grep -q "jobs repeat their steps" "$TMP/plan_churn_table.out"'

# ---- cuheap-corpus ----------------------------------------------------------
run table --dir "$TMP/c" --replay "$BUILD/cuheap-replay"
check "cuheap-corpus prints a row per job and way, tuning first, then the held-out set" \
    '[ $rc = 0 ] && [ "$(grep -cE "^(churn|steady) " "$TMP/table.out")" = 4 ] && \
     grep -n "^steady " "$TMP/table.out" | sed -n 1p | cut -d: -f1 | { read s; c=$(grep -n "^churn " "$TMP/table.out" | tail -1 | cut -d: -f1); [ "$s" -gt "$c" ]; }'
check "a summary line per set and way, held-out on its own" \
    'grep -q "^tuning   plugin   1 jobs: ratio median" "$TMP/table.out" && grep -q "^held-out preload  1 jobs" "$TMP/table.out"'
run json --dir "$TMP/c" --replay "$BUILD/cuheap-replay" --json
check "--json: rows agree with cuheap-replay --way, PyTorch's best mode and libraries' bytes" \
    '[ $rc = 0 ] && py "
import json
rows = [json.loads(l) for l in open(\"$TMP/json.out\")]
r = {(o[\"job\"], o[\"way\"]): o for o in rows if \"job\" in o}
w = json.load(open(\"$TMP/way_plugin.out\"))
c = r[(\"churn\", \"plugin\")]
assert c[\"peak_reserved\"] == w[\"peak_reserved\"] and c[\"set\"] == \"tuning\", c
assert c[\"pytorch\"] == {\"native\": 3000000000, \"expandable\": 2600000000, \"async\": 2700000000}, c
assert c[\"min_ratio\"] and c[\"min_ratio\"] <= c[\"ratio\"] + 1e-9, c
assert r[(\"churn\", \"preload\")][\"libs\"] == 0 and r[(\"steady\", \"plugin\")][\"set\"] == \"held-out\"
s = [o[\"summary\"] for o in rows if \"summary\" in o]
assert len(s) == 4 and s[0][\"set\"] == \"tuning\" and s[0][\"worst_job\"] == \"churn\", s
assert s[2][\"below_best\"] == 1 and s[2][\"with_measured\"] == 1, s   # 1e9 bytes live, 1 GiB measured
"'
run moves --dir "$TMP/c" --replay "$BUILD/cuheap-replay" --json --conf vmm_margin:0
check "--json: map calls a step after the first, per job (null without marks) and per set" \
    '[ $rc = 0 ] && py "
import json
rows = [json.loads(l) for l in open(\"$TMP/moves.out\")]
r = {(o[\"job\"], o[\"way\"]): o for o in rows if \"job\" in o}
a = json.loads(open(\"$TMP/moves_all.out\").readline())[\"after_step1\"]
assert abs(r[(\"churn\", \"plugin\")][\"calls_per_step\"] - (a[\"page_maps\"] + a[\"page_unmaps\"]) / a[\"steps\"]) < 0.051, (r, a)
assert r[(\"steady\", \"plugin\")][\"calls_per_step\"] is None
s = [o[\"summary\"] for o in rows if \"summary\" in o]
assert s[0][\"median_calls\"] == r[(\"churn\", \"plugin\")][\"calls_per_step\"] and s[0][\"most_calls_job\"] == \"churn\", s
assert s[2][\"median_calls\"] is None, s
c = r[(\"churn\", \"plugin\")]   # native total_ms=10 over the 39 steps after the first
assert abs(c[\"move_time\"] / (c[\"calls_per_step\"] * 0.0275 / (10.0 / 38)) - 1) < 0.01, c
assert r[(\"steady\", \"plugin\")][\"move_time\"] is None and s[0][\"median_move_time\"] == c[\"move_time\"], s
w = json.loads(open(\"$TMP/moves_all.out\").readline())[\"worst_step\"]
assert c[\"worst_step_calls\"] == w[\"map_calls\"] and r[(\"steady\", \"plugin\")][\"worst_step_calls\"] is None, c
assert s[0][\"most_in_a_step\"] == c[\"worst_step_calls\"] and s[0][\"most_in_a_step_job\"] == \"churn\", s
"'
check "the table has map-call, worst-step and plan columns and the summary names the job that makes the most" \
    'grep -q " calls   worst   +time    plan\$" "$TMP/table.out" && grep -q "^tuning   plugin   1 jobs: .*map calls a step after the first: median [0-9]*, most [0-9]* (churn), in one step [0-9]* (churn)" "$TMP/table.out"'
run tuning --dir "$TMP/c" --replay "$BUILD/cuheap-replay" --tuning
check "--tuning leaves the held-out set out" '[ $rc = 0 ] && ! grep -q "^steady\|^held-out" "$TMP/tuning.out"'

# --bounds: each job's three replays (stream-ordered, cudaFree's at lags 0 and
# 1000) against issue 42's bounds, each figure the replay's own, each verdict
# the bound's arithmetic, and the counts per set.
run bounds --dir "$TMP/c" --replay "$BUILD/cuheap-replay" --json --bounds
BIN=$BUILD/cuheap-replay
run lag0 --json --min-capacity --way preload --cudafree 0 "$TMP/c/churn_preload.trace.gz"
BIN=$CORPUS
check "--bounds: three replays a job, the lag-0 one the replay's own, verdicts by the bounds, counts per set" \
    '[ $rc = 0 ] && py "
import json
lines = [json.loads(l) for l in open(\"$TMP/bounds.out\")]
b = {(o[\"bound\"][\"job\"], o[\"bound\"][\"replay\"]): o[\"bound\"] for o in lines if \"bound\" in o}
assert sorted(b) == sorted((j, r) for j in (\"churn\", \"steady\")
                           for r in (\"stream-ordered\", \"cudaFree lag 0\", \"cudaFree lag 1000\")), sorted(b)
rows = {(o[\"job\"], o[\"way\"]): o for o in lines if \"job\" in o and \"ratio\" in o}
z = json.load(open(\"$TMP/lag0.out\"))
assert abs(b[(\"churn\", \"cudaFree lag 0\")][\"ratio\"] - z[\"peak_reserved\"] / z[\"peak_live\"]) < 1e-5, (b, z)
assert abs(b[(\"churn\", \"cudaFree lag 1000\")][\"ratio\"] - rows[(\"churn\", \"preload\")][\"ratio\"]) < 1e-5
assert abs(b[(\"churn\", \"stream-ordered\")][\"ratio\"] - rows[(\"churn\", \"plugin\")][\"ratio\"]) < 1e-5
for (job, replay), o in b.items():
    live = rows[(job, \"plugin\" if replay == \"stream-ordered\" else \"preload\")][\"peak_live\"]
    if replay == \"cudaFree lag 0\":
        live = z[\"peak_live\"] if job == \"churn\" else live
    assert o[\"reserved_ok\"] == (o[\"ratio\"] * live <= max(1.03 * live, live + (64 << 20)) + 1), o
    assert o[\"min_ok\"] == (o[\"min_ratio\"] is not None and o[\"min_ratio\"] <= 1.02 + 1e-9), o
s = {o[\"bounds_summary\"][\"set\"]: o[\"bounds_summary\"] for o in lines if \"bounds_summary\" in o}
for name, job in ((\"tuning\", \"churn\"), (\"held-out\", \"steady\")):
    mine = [o for (j, _), o in b.items() if j == job]
    assert s[name][\"replays\"] == 3 and s[name][\"met\"] == sum(o[\"reserved_ok\"] and o[\"min_ok\"] for o in mine), s
assert b[(\"steady\", \"stream-ordered\")][\"reserved_ok\"], b   # one block: nothing to hold beyond it
"'
run bounds_text --dir "$TMP/c" --replay "$BUILD/cuheap-replay" --bounds
check "--bounds in the table: a line per job with its three replays, and a count per set" \
    '[ $rc = 0 ] && grep -qE "^churn +tuning +[0-9.]+ [0-9.]+ (ok|MISSES)" "$TMP/bounds_text.out" && \
     grep -qE "^tuning   bounds: [0-3] of 3 replays meet both" "$TMP/bounds_text.out"'

# The rule: against itself nothing improves (not kept); against a baseline
# made worse by 1% everywhere, both summaries improve and no job is worse.
py "
import json
with open('$TMP/worse.json', 'w') as f:
    for l in open('$TMP/json.out'):
        o = json.loads(l)
        if 'ratio' in o:
            o['ratio'] *= 1.01
        f.write(json.dumps(o) + '\n')
with open('$TMP/better.json', 'w') as f:
    for l in open('$TMP/json.out'):
        o = json.loads(l)
        if 'ratio' in o:
            o['ratio'] /= 1.01
        f.write(json.dumps(o) + '\n')
"
run same --dir "$TMP/c" --replay "$BUILD/cuheap-replay" --baseline "$TMP/json.out"
check "against the same figures the change is not kept (nothing improved), status 3" \
    '[ $rc = 3 ] && grep -q "not both improved" "$TMP/same.out" && grep -q "the change is NOT KEPT" "$TMP/same.out"'
run kept --dir "$TMP/c" --replay "$BUILD/cuheap-replay" --baseline "$TMP/worse.json"
check "against a worse baseline the change is kept, status 0, and each job's change is shown" \
    '[ $rc = 0 ] && grep -q "the change is KEPT" "$TMP/kept.out" && grep -qE "^churn .* -0\.99%" "$TMP/kept.out"'
run worse --dir "$TMP/c" --replay "$BUILD/cuheap-replay" --baseline "$TMP/better.json"
check "a job worse by over 0.5% is named and the change is not kept" \
    '[ $rc = 3 ] && grep -q "churn is worse by 1.00% (over the 0.5% bound)" "$TMP/worse.out"'
run json_base --dir "$TMP/c" --json --baseline "$TMP/json.out"
check "--baseline with --json is a usage error" '[ $rc = 2 ]'

printf 'churn tuning\nchurn held-out\n' >"$TMP/c/MANIFEST"
run twice --dir "$TMP/c" --replay "$BUILD/cuheap-replay"
check "a job listed twice in the manifest is an error naming the line" \
    '[ $rc = 1 ] && grep -q "MANIFEST:2: job churn listed twice" "$TMP/twice.err"'
printf 'churn training\n' >"$TMP/c/MANIFEST"
run badset --dir "$TMP/c" --replay "$BUILD/cuheap-replay"
check "an unknown set is an error" '[ $rc = 1 ] && grep -q "MANIFEST:1: expected .JOB SET. with SET tuning or held-out" "$TMP/badset.err"'
printf 'churn tuning\nghost tuning\n' >"$TMP/c/MANIFEST"
run ghost --dir "$TMP/c" --replay "$BUILD/cuheap-replay"
check "a job without its traces: status 1, the missing file named, the others still replayed" \
    '[ $rc = 1 ] && grep -q "ghost_plugin.trace.gz: No such file" "$TMP/ghost.err" && grep -q "^churn .*plugin" "$TMP/ghost.out"'
printf 'a 1 0 10 0\nx\n' >"$TMP/c/churn_plugin.trace.gz"
run broken --dir "$TMP/c" --replay "$BUILD/cuheap-replay"
check "a malformed trace: status 1, cuheap-replay's message on stderr" \
    '[ $rc = 1 ] && grep -q "churn_plugin.trace.gz:2: unknown record kind" "$TMP/broken.err"'

# ---- the corpus itself (once, with the plain build) ---------------------------
if [ "$BUILD" = build ]; then
    dir=bench/traces/corpus
    check "the manifest and the corpus's traces agree, and at least 24 jobs" 'py "
import os, re
jobs = [l.split()[0] for l in open(\"$dir/MANIFEST\") if l.strip() and not l.startswith(\"#\")]
files = sorted(f for f in os.listdir(\"$dir\") if f.endswith(\".trace.gz\"))
want = sorted(\"%s_%s.trace.gz\" % (j, w) for j in jobs for w in (\"plugin\", \"preload\"))
assert files == want, (set(files) ^ set(want))
assert len(jobs) >= 24, len(jobs)
held = [l for l in open(\"$dir/MANIFEST\") if l.split()[1:2] == [\"held-out\"]]
assert 4 * len(held) >= len(jobs) - 3 and 4 * len(held) <= len(jobs) + 4, len(held)
"'
    check "every corpus trace names its job and way and carries PyTorch's three modes, marks and its end" 'py "
import gzip, os, re
d = \"$dir\"
for f in sorted(os.listdir(d)):
    if not f.endswith(\".trace.gz\"):
        continue
    job, way = f[:-len(\".trace.gz\")].rsplit(\"_\", 1)
    text = gzip.open(os.path.join(d, f), \"rt\").read()
    head = text[:4000]
    assert re.search(r\"^# corpus job=%s way=%s \" % (job, way), head, re.M), f
    for m in (\"native\", \"expandable\", \"async\"):
        assert re.search(r\"^# pytorch mode=%s peak_reserved=[0-9]+ peak_allocated=[0-9]+ total_ms=\" % m, head, re.M), (f, m)
    assert text.count(\"\n# mark \") >= 10, f
    assert re.search(r\"\n# end allocs=[0-9]+ frees=[0-9]+ live_at_end=[0-9]+\n\$\", text), f
"'
    BIN=$CORPUS
    run real --json
    check "make corpus replays every job of the corpus in both ways (cuheap-corpus --json)" \
        '[ $rc = 0 ] && py "
import json
rows = [json.loads(l) for l in open(\"$TMP/real.out\")]
jobs = [l.split()[0] for l in open(\"$dir/MANIFEST\") if l.strip() and not l.startswith(\"#\")]
assert len([o for o in rows if o.get(\"ok\")]) == 2 * len(jobs), rows
assert len([o for o in rows if \"summary\" in o]) == 4
"'
fi

finish test_corpus
