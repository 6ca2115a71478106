#!/usr/bin/env bash
# replay-identical.sh - a refactor changed nothing the heap does: proof by
# replay. Every trace in the repository (bench/traces, at any depth, and
# tests' *.trace / *.trace.gz) is replayed by cuheap-replay --json built from
# a baseline revision and from the working tree, in every mode the tests use
# (tests/test_replay_cli.sh) and a few settings besides that steer the heap
# down other paths (thread caches off, ipc_safe, a workspace, reuse across
# streams, no slabs), and the JSON lines are compared byte for byte.
#
#   scripts/replay-identical.sh [--base REV] [--build DIR] [--jobs N] [--full] [--keep]
#
#   --base REV   the baseline (default main; HEAD~3 and the like work too).
#                Built once from `git archive` into
#                build/replay-identical/COMMIT/ and kept for the next run.
#   --build DIR  the working tree's build folder (default build); its
#                cuheap-replay, cuheap-report and fuzz/fuzz_heap are made
#                first (make -j N).
#   --jobs N     replays at once (default 2).
#   --full       every mode on every trace; by default the job corpus
#                (bench/traces/corpus: 54 traces) gets the core modes only
#                (those marked * in this script's list: 14, the ways in and
#                out-of-memory among them), the other traces every mode.
#   --keep       keep the outputs (the folder is named at the end).
#
# Only what varies between two runs of one build is removed first, and
# nothing else: ns_per_op in the --json lines; in JSON reports the writer's
# pid and time, the heap's uptime and every sample's t (in the timeline and
# the out-of-memory record).
#
# Compared beside the --json lines:
#   - the JSON report the heap writes (--report PATH.json) in some modes, and
#     its renderings by cuheap-report (--text, --html, --json, --compare,
#     --merge), byte for byte;
#   - fuzz_heap over tests/fuzz/corpus/heap and tests/fuzz/regressions/heap
#     with FUZZ_HEAP_VERBOSE=1: every step of graph captures, record_stream,
#     limits and IPC-safe blocks that no trace exercises, the frees naming
#     the addresses the heap handed out;
#   - every input of tests/fuzz/corpus/trace replayed as a trace: standard
#     output, error and exit status;
#   - every input of tests/fuzz/corpus/report given to cuheap-report (--text,
#     --html, --json, --compare with itself, --merge with itself): what it
#     prints or refuses, and its exit status.
# Exit status: 0 identical; 1 a difference (each named by trace and mode,
# with the first fields that differ); 2 usage or build error.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
base=main
build=build
jobs=2
keep=0
full=0
usage() { sed -n '10,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --base) [ $# -ge 2 ] || usage; base=$2; shift 2 ;;
    --build) [ $# -ge 2 ] || usage; build=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || usage; jobs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --full) full=1; shift ;;
    -h | --help) usage ;;
    *) echo "replay-identical: unknown option $1" >&2; usage ;;
    esac
done
case $build in /*) ;; *) build=$root/$build ;; esac

commit=$(git -C "$root" rev-parse --verify --quiet "$base^{commit}") || {
    echo "replay-identical: $base is not a revision" >&2
    exit 2
}
short=$(git -C "$root" rev-parse --short "$commit")

# ---- the two builds -----------------------------------------------------------
tools=(cuheap-replay cuheap-report fuzz/fuzz_heap)
cache=$root/build/replay-identical/$commit
if [ ! -e "$cache/done" ]; then
    echo "replay-identical: building $base ($short) in $cache"
    rm -rf "$cache"
    mkdir -p "$cache/src" "$cache/build"
    git -C "$root" archive --format=tar "$commit" | tar -x -C "$cache/src" || exit 2
    # jemalloc is built from Debian's source, the same on both sides: a copy
    # saves building it again (the Makefile builds it only when missing).
    [ -d "$build/jemalloc-5.3.0/lib" ] && cp -a "$build/jemalloc-5.3.0" "$cache/build/"
    if ! make -s -C "$cache/src" BUILD="$cache/build" -j"$jobs" "${tools[@]/#/$cache/build/}" \
        >"$cache/make.log" 2>&1; then
        tail -n 30 "$cache/make.log" >&2
        echo "replay-identical: building $base failed (log: $cache/make.log)" >&2
        exit 2
    fi
    touch "$cache/done"
fi
if ! make -s -C "$root" BUILD="$build" -j"$jobs" "${tools[@]/#/$build/}" >/dev/null; then
    echo "replay-identical: building the working tree in $build failed" >&2
    exit 2
fi
A=$cache/build
B=$build

work=$(mktemp -d "${TMPDIR:-/tmp}/replay-identical.XXXXXX") || exit 2
if [ "$keep" = 1 ]; then
    trap 'echo "replay-identical: outputs kept in $work"' EXIT
else
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/a" "$work/b" "$work/diff"

# ---- what is replayed -----------------------------------------------------------
mapfile -t traces < <(cd "$root" && { find bench/traces -name '*.trace.gz' -o -name '*.trace';
                                     find tests -name '*.trace.gz' -o -name '*.trace'; } 2>/dev/null | sort)
[ ${#traces[@]} -gt 0 ] || { echo "replay-identical: no traces found" >&2; exit 2; }

# name|options. A mode whose name starts with report_ also writes the heap's
# JSON report (compared, and rendered again); * marks a core mode.
modes=(
    "*default|"
    "*vmm1|--conf vmm:1"
    "vmm0|--conf vmm:0"
    "cudafree0|--cudafree 0"
    "cudafree100|--cudafree 100"
    "*cudafree1000_s32|--cudafree 1000 --streams 32"
    "cudafree100_s32_nodf|--cudafree 100 --streams 32 --conf device_fences:0"
    "busy16|--cudafree 100 --streams 64 --busy-streams 16"
    "busy16_nodf|--cudafree 100 --streams 64 --busy-streams 16 --conf device_fences:0"
    "*cudafree_vmm|--cudafree 1000 --streams 32 --conf vmm:1"
    "cudafree_vmm_margin|--cudafree 0 --streams 32 --conf vmm:1,vmm_margin:0.03"
    "cudafree_nowait|--cudafree 100 --streams 32 --conf wait_before_grow:0"
    "strict140|--cudafree 100 --streams 32 --capacity 140G"
    "lag10|--lag 10"
    "*lag300|--lag 300"
    "lag1000|--lag 1000"
    "*lag1000_vmm|--lag 1000 --conf vmm:1"
    "lag10_vmm0|--lag 10 --conf vmm:0"
    "lag200_vmm|--lag 200 --conf vmm:1"
    "*reuse|--lag 300 --conf reuse_across_streams:1"
    "reuse_vmm|--lag 300 --conf vmm:1,reuse_across_streams:1"
    "reuse_cudafree|--cudafree 1000 --streams 32 --conf reuse_across_streams:1"
    "vmm_page8|--conf vmm:1,vmm_page:8M"
    "cap26|--capacity 26.4G"
    "cap25_vmm|--conf vmm:1 --capacity 25G"
    "*cap20|--capacity 20G"
    "cap1g|--capacity 1G"
    "external|--capacity 30G --external 4G"
    "limit25|--conf limit:25G --capacity 80G"
    "*limit6|--conf limit:6.5G"
    "limit_vmm|--conf vmm:1,limit:28378064005"
    "limit_vmm_page8|--conf vmm:1,vmm_page:8M,limit:28378064005"
    "ipc_safe|--conf ipc_safe:1"
    "workspace|--conf workspace:4G"
    "no_slabs|--conf small_max:0,grow_fraction:0,segment_min:64M"
    "*no_tcache|--lag 300 --conf thread_cache:0"
    "mincap|--min-capacity"
    "mincap_1g|--min-capacity --capacity 1G"
    "mincap_vmm_lag|--lag 200 --min-capacity --conf vmm:1"
    "*report_default|"
    "report_peak|--report-at peak"
    "*report_oom|--capacity 26.4G"
    "report_vmm_lag|--lag 1000 --conf vmm:1"
    "report_cudafree|--cudafree 1000 --streams 32"
    "report_cudafree_vmm|--cudafree 100 --streams 32 --conf vmm:1,limit:20G"
)
# The ways in (--way), each with its own defaults, where both builds know them.
if "$A/cuheap-replay" --help 2>&1 | grep -q -- '--way' && "$B/cuheap-replay" --help 2>&1 | grep -q -- '--way'; then
    modes+=("*way_plugin|--way plugin" "way_plugin_lag|--way plugin --lag 300" "*way_preload|--way preload"
            "way_preload_vmm|--way preload --conf vmm:1")
fi

# One job a line: kind|id|options|trace (options may be empty).
jobs_file=$work/jobs
: >"$jobs_file"
n=0
core_only=0
for t in "${traces[@]}"; do
    core=0
    case $t in bench/traces/corpus/*) [ "$full" = 1 ] || core=1 ;; esac
    core_only=$((core_only + core))
    for m in "${modes[@]}"; do
        [ "$core" = 1 ] && [ "${m:0:1}" != "*" ] && continue
        m=${m#\*}
        printf 'replay|%s|%s|%s\n' "$((n += 1))_${m%%|*}" "${m#*|}" "$t" >>"$jobs_file"
    done
done
# The trace reader's fuzz corpus: the inputs that are traces replay.
mkdir -p "$work/trace_corpus" "$work/heap_corpus" "$work/report_corpus"
tar -C "$work/trace_corpus" -xzf "$root/tests/fuzz/corpus/trace.tar.gz" 2>/dev/null
for f in "$work"/trace_corpus/*; do
    [ -f "$f" ] || continue
    for m in "default|" "vmm1|--conf vmm:1"; do
        printf 'corpus|%s|%s|%s\n' "$((n += 1))_${m%%|*}" "${m#*|}" "$f" >>"$jobs_file"
    done
done

# cuheap-report's fuzz corpus: reports valid and broken, rendered or refused.
tar -C "$work/report_corpus" -xzf "$root/tests/fuzz/corpus/report.tar.gz" 2>/dev/null
for f in "$work"/report_corpus/*; do
    [ -f "$f" ] || continue
    for m in "text|--text" "html|--html" "json|--json" "compare|--compare SELF" "merge|--merge SELF"; do
        printf 'report|%s|%s|%s\n' "$((n += 1))_${m%%|*}" "${m#*|}" "$f" >>"$jobs_file"
    done
done

# ---- one job: both builds, then the comparison -------------------------------------
# The --json lines without their timing.
strip_json() { sed -E 's/,"ns_per_op":[^,}]*//g' "$1"; }
# A JSON report without the writer's pid and time, the uptime and the samples' t.
strip_report() {
    python3 -c '
import json, sys
from collections import OrderedDict
r = json.load(open(sys.argv[1]), object_pairs_hook=OrderedDict)
r.pop("pid", None); r.pop("time", None)
for d in r.get("devices", []):
    d.pop("uptime", None)
    for s in d.get("timeline", []):
        s.pop("t", None)
    if isinstance(d.get("oom"), dict):
        d["oom"].pop("t", None)
    # Steps: their ends and lengths come from the host clock, as the timeline does.
    steps = d.get("steps") if isinstance(d.get("steps"), dict) else {}
    for s in steps.get("last", []) + [steps.get("most_maps") or {}]:
        s.pop("end", None); s.pop("seconds", None)
print(json.dumps(r, separators=(",", ":")))
' "$1"
}
# What differs between two JSON texts: the first few fields, by path.
json_diff() {
    python3 -c '
import json, sys
def flat(o, p=""):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from flat(v, p + "." + k)
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from flat(v, "%s[%d]" % (p, i))
    else:
        yield p, o
def load(path):
    out = []
    for line in open(path).read().splitlines():
        try:
            out.append(dict(flat(json.loads(line))))
        except ValueError:
            out.append({"(not JSON)": line[:200]})
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
shown = 0
if len(a) != len(b):
    print("    %d lines before, %d now" % (len(a), len(b)))
for i, (x, y) in enumerate(zip(a, b)):
    for k in list(x) + [k for k in y if k not in x]:
        if x.get(k, "(none)") != y.get(k, "(none)") and shown < 6:
            print("    line %d %s: %s before, %s now" % (i + 1, k, x.get(k, "(none)"), y.get(k, "(none)")))
            shown += 1
' "$1" "$2"
}
# differs ID WHAT FILE_A FILE_B [json]: records a difference.
differs() {
    {
        echo "DIFFERENT: $2"
        if [ "${5:-}" = json ]; then
            json_diff "$3" "$4"
        else
            diff "$3" "$4" | head -n 8 | cut -c1-300 | sed 's/^/    /'
        fi
    } >"$work/diff/$1"
}

run_job() {
    local kind id opts trace
    IFS='|' read -r kind id opts trace <<<"$1"
    local a=$work/a/$id b=$work/b/$id what
    what="$trace, mode ${id#*_}${opts:+ ($opts)}"
    if [ "$kind" = report ]; then
        # SELF: the report again (--compare and --merge take two)
        local args=${opts/SELF/$trace}
        # shellcheck disable=SC2086
        { "$A/cuheap-report" $args "$trace" 2>&1; echo "exit $?"; } >"$a.out"
        # shellcheck disable=SC2086
        { "$B/cuheap-report" $args "$trace" 2>&1; echo "exit $?"; } >"$b.out"
        cmp -s "$a.out" "$b.out" || differs "$id" "$trace: cuheap-report $opts" "$a.out" "$b.out"
        return
    fi
    if [ "$kind" = corpus ]; then
        # shellcheck disable=SC2086
        (cd "$root" && "$A/cuheap-replay" --json $opts "$trace" >"$a.out" 2>"$a.err"; echo $? >"$a.rc")
        # shellcheck disable=SC2086
        (cd "$root" && "$B/cuheap-replay" --json $opts "$trace" >"$b.out" 2>"$b.err"; echo $? >"$b.rc")
        strip_json "$a.out" >"$a.json"
        strip_json "$b.out" >"$b.json"
        if ! cmp -s "$a.json" "$b.json"; then
            differs "$id" "$what: --json output" "$a.json" "$b.json" json
        elif ! cmp -s "$a.err" "$b.err" || ! cmp -s "$a.rc" "$b.rc"; then
            differs "$id" "$what: messages or exit status" <(cat "$a.err" "$a.rc") <(cat "$b.err" "$b.rc")
        fi
        return
    fi
    local report=()
    case $id in *_report_*) report=(--report "$a.report.json") ;; esac
    # shellcheck disable=SC2086
    (cd "$root" && "$A/cuheap-replay" --json $opts "${report[@]}" "$trace" >"$a.out" 2>"$a.err"; echo $? >"$a.rc")
    [ ${#report[@]} -gt 0 ] && report=(--report "$b.report.json")
    # shellcheck disable=SC2086
    (cd "$root" && "$B/cuheap-replay" --json $opts "${report[@]}" "$trace" >"$b.out" 2>"$b.err"; echo $? >"$b.rc")
    if [ "$(cat "$a.rc")" != 0 ]; then
        differs "$id" "$what: the baseline exits $(cat "$a.rc") (a mode the baseline does not know?)" "$a.err" "$a.err"
        return
    fi
    strip_json "$a.out" >"$a.json"
    strip_json "$b.out" >"$b.json"
    if ! cmp -s "$a.json" "$b.json"; then
        differs "$id" "$what: --json line" "$a.json" "$b.json" json
        return
    fi
    if ! cmp -s "$a.err" "$b.err" || ! cmp -s "$a.rc" "$b.rc"; then
        differs "$id" "$what: messages or exit status" <(cat "$a.err" "$a.rc") <(cat "$b.err" "$b.rc")
        return
    fi
    [ ${#report[@]} -gt 0 ] || return
    strip_report "$a.report.json" >"$a.report.stripped"
    strip_report "$b.report.json" >"$b.report.stripped"
    if ! cmp -s "$a.report.stripped" "$b.report.stripped"; then
        differs "$id" "$what: the heap's JSON report" "$a.report.stripped" "$b.report.stripped" json
        return
    fi
    # cuheap-report renders the same file (the baseline build's report) alike.
    local f
    for f in --text --html --json; do
        "$A/cuheap-report" $f "$a.report.json" >"$a.render$f" 2>&1
        "$B/cuheap-report" $f "$a.report.json" >"$b.render$f" 2>&1
        if ! cmp -s "$a.render$f" "$b.render$f"; then
            differs "$id" "$what: cuheap-report $f of its report" "$a.render$f" "$b.render$f"
            return
        fi
    done
}
export -f run_job strip_json strip_report json_diff differs
export work A B root

echo "replay-identical: $base ($short) against the working tree ($B): $(wc -l <"$jobs_file") runs" \
     "(${#traces[@]} traces, $core_only of them in the core modes only, ${#modes[@]} modes; the trace and" \
     "report fuzz corpora) on $jobs jobs"
xargs -P "$jobs" -d '\n' -n 1 bash -c 'run_job "$1"' _ <"$jobs_file"

# ---- what needs several jobs' outputs, and fuzz_heap ---------------------------------
reports=()
for r in "$work"/a/*_report_default.report.json; do
    [ -e "$r" ] && reports+=("$r")
done
if [ ${#reports[@]} -ge 2 ]; then
    for args in "--compare ${reports[0]} ${reports[1]}" "--compare --json ${reports[0]} ${reports[1]}" \
                "--merge ${reports[*]}" "--merge --json ${reports[*]}"; do
        # shellcheck disable=SC2086
        "$A/cuheap-report" $args >"$work/a/render_many" 2>&1
        # shellcheck disable=SC2086
        "$B/cuheap-report" $args >"$work/b/render_many" 2>&1
        cmp -s "$work/a/render_many" "$work/b/render_many" ||
            differs "many_${args%% *}_$RANDOM" "cuheap-report ${args%% /*} (of the reports of every trace)" \
                "$work/a/render_many" "$work/b/render_many"
    done
fi

tar -C "$work/heap_corpus" -xzf "$root/tests/fuzz/corpus/heap.tar.gz" 2>/dev/null
fuzz_inputs=("$work/heap_corpus")
[ -d "$root/tests/fuzz/regressions/heap" ] && fuzz_inputs+=("$root/tests/fuzz/regressions/heap")
# Named alike on both sides: it prints its own name.
FUZZ_HEAP_VERBOSE=1 bash -c 'exec -a fuzz_heap "$0" "$@"' "$A/fuzz/fuzz_heap" "${fuzz_inputs[@]}" >"$work/a/fuzz_heap" 2>&1
echo "rc $?" >>"$work/a/fuzz_heap"
FUZZ_HEAP_VERBOSE=1 bash -c 'exec -a fuzz_heap "$0" "$@"' "$B/fuzz/fuzz_heap" "${fuzz_inputs[@]}" >"$work/b/fuzz_heap" 2>&1
echo "rc $?" >>"$work/b/fuzz_heap"
if ! cmp -s "$work/a/fuzz_heap" "$work/b/fuzz_heap"; then
    differs fuzz_heap "fuzz_heap's steps over tests/fuzz/corpus/heap and regressions (FUZZ_HEAP_VERBOSE=1)" \
        "$work/a/fuzz_heap" "$work/b/fuzz_heap"
fi

# ---- verdict ------------------------------------------------------------------------
mapfile -t found < <(find "$work/diff" -type f | sort -V)
if [ ${#found[@]} -gt 0 ]; then
    for f in "${found[@]:0:20}"; do cat "$f"; done
    [ ${#found[@]} -gt 20 ] && echo "... and $((${#found[@]} - 20)) more"
    echo "replay-identical: ${#found[@]} difference(s) between $base ($short) and the working tree"
    exit 1
fi
echo "replay-identical: identical: $(wc -l <"$jobs_file") runs (replays, their reports and renderings," \
     "cuheap-report on its corpus), and $(grep -c '^input ' "$work/b/fuzz_heap") fuzz_heap inputs step by step"
