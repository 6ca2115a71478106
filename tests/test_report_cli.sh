#!/usr/bin/env bash
# test_report_cli.sh - tests of the cuheap-report program, end to end.
#
# cuheap-replay writes reports of gpt2 replayed on plain segments (vmm:0) with an out-of-memory (26.4G,
# cause fragmentation), without one (80G) and with vmm:1; cuheap-report reads
# them back. Round trips: --json of a report reproduces the file byte for
# byte (every field survived), and --text equals the text report of the same
# replay but for the header's pid and time, which are the JSON's own. The
# HTML page refers to nothing outside itself and names the cause; --compare
# names both causes and shows the ratio of the reserved peaks; devices
# present in one report only are listed as such; --merge sets three reports
# in one table with exact sums and names the out-of-memory. The pinned host
# memory section ("pinned_host", added to a replay's report as the library
# writes it) and the device memory by caller ("callers", after it) round-trip
# and are rendered after the devices in text and HTML; a report without them
# gets none. Broken inputs: a truncated
# file, bad JSON, a wrong schema or version, a missing or mistyped field,
# pinned_host and callers included (status 1, with file:line:column or the
# field's JSON path; a library with more bytes live than its peak, more
# libraries than a report can hold); parts that contradict each other (extents that do not tile their
# segment, overlapping segments, more requested than a block holds, a plain
# segment not mapped whole, a timeline out of order or with more live than
# reserved, a reserved total other than the segments', free bytes with
# free_unknown), each named; a report that did not ask the device
# (free_unknown) says so and claims no memory used outside cuheap; 200
# seeded edits of a report that keep it valid JSON, each rendered
# or refused naming the field; usage errors
# (status 2). Run from the repository root:
#     tests/test_report_cli.sh BUILD_DIR
# BUILD_DIR/cuheap-report is tested (the sanitized one for build/san); the
# reports come from BUILD_DIR/cuheap-replay, or build/cuheap-replay. The last
# line is "test_report_cli: N passed, M failed"; the status is non-zero on a
# failure.
set -u

BUILD=${1:?usage: tests/test_report_cli.sh BUILD_DIR}
BIN=$BUILD/cuheap-report
REPLAY=$BUILD/cuheap-replay
[ -x "$REPLAY" ] || REPLAY=build/cuheap-replay
GPT2=bench/traces/gpt2.trace.gz
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cuh_test_report_cli.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

. "$(dirname "$0")/harness.sh"

for prog in "$BIN" "$REPLAY"; do
    if [ ! -x "$prog" ]; then
        not_ok "$prog exists" "build it first (make tools)"
        finish test_report_cli
    fi
done
if [ ! -e "$GPT2" ]; then
    not_ok "bundled trace $GPT2" "run from the repository root"
    finish test_report_cli
fi

# ---- the reports: each state written as JSON, then (same replay again: the
# heap is deterministic) as text and HTML -------------------------------------
declare -A OPTS=([oom]="--conf vmm:0 --capacity 26.4G" [ok]="--conf vmm:0" [vmm]="--conf vmm:1 --capacity 26.4G")
for name in oom ok vmm; do
    for ext in json txt html; do
        # shellcheck disable=SC2086
        if ! "$REPLAY" ${OPTS[$name]} --report "$TMP/$name.$ext" "$GPT2" >/dev/null 2>"$TMP/replay.err"; then
            not_ok "cuheap-replay ${OPTS[$name]} --report $name.$ext" "$(cat "$TMP/replay.err")"
            finish test_report_cli
        fi
    done
done
if grep -q '"cause":"fragmentation"' "$TMP/oom.json" && grep -q '"oom":null' "$TMP/ok.json" &&
    grep -q '"vmm":1' "$TMP/vmm.json"; then
    ok "the replays wrote an out-of-memory (fragmentation), a clean and a vmm:1 report"
else
    not_ok "the replays wrote the expected reports" "$(head -c 400 "$TMP/oom.json")"
fi

# ---- round trips ---------------------------------------------------------------
for name in oom ok vmm; do
    run "$name.json" --json "$TMP/$name.json"
    if [ "$rc" -eq 0 ] && cmp -s "$TMP/$name.json.out" "$TMP/$name.json"; then
        ok "$name: --json reproduces the report byte for byte"
    else
        not_ok "$name: --json reproduces the report" "status $rc: $(cat "$TMP/$name.json.err")
$(cmp "$TMP/$name.json.out" "$TMP/$name.json" 2>&1)"
    fi

    # The header carries the report's own pid and time; the rest is the text
    # report the replay wrote for the same heap.
    header=$(python3 -c '
import json, sys, time
d = json.load(open(sys.argv[1]))
print("cuheap %s report, pid %d, %s" % (d["cuheap"], d["pid"], time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(d["time"]))))
' "$TMP/$name.json")
    run "$name.txt" --text "$TMP/$name.json"
    if [ "$rc" -ne 0 ]; then
        not_ok "$name: --text exits 0" "status $rc: $(cat "$TMP/$name.txt.err")"
    elif [ "$(head -n 1 "$TMP/$name.txt.out")" != "$header" ]; then
        not_ok "$name: --text header has the JSON's pid and time" "got:      $(head -n 1 "$TMP/$name.txt.out")
expected: $header"
    elif ! grep -Eq '^cuheap [^ ]+ report, pid [0-9]+, [0-9-]+ [0-9:]+ UTC$' "$TMP/$name.txt"; then
        not_ok "$name: the replay's text report has the usual header" "$(head -n 1 "$TMP/$name.txt")"
    elif ! diff <(tail -n +2 "$TMP/$name.txt.out") <(tail -n +2 "$TMP/$name.txt") >"$TMP/diff" 2>&1; then
        not_ok "$name: --text equals the replay's text report" "$(cat "$TMP/diff")"
    else
        ok "$name: --text equals the replay's text report ($(wc -l <"$TMP/$name.txt") lines; header from the JSON)"
    fi

    run "$name.default" "$TMP/$name.json"
    run "$name.o" "$TMP/$name.json" -o "$TMP/$name.o.txt"
    if [ "$rc" -eq 0 ] && [ ! -s "$TMP/$name.o.out" ] && cmp -s "$TMP/$name.default.out" "$TMP/$name.txt.out" &&
        cmp -s "$TMP/$name.o.txt" "$TMP/$name.txt.out"; then
        ok "$name: text is the default, and -o writes the same to a file"
    else
        not_ok "$name: default format and -o" "status $rc: $(cat "$TMP/$name.o.err")"
    fi
done

run stdin --json - <"$TMP/oom.json"
if [ "$rc" -eq 0 ] && cmp -s "$TMP/stdin.out" "$TMP/oom.json"; then
    ok "- reads the report from standard input"
else
    not_ok "- reads standard input" "status $rc: $(cat "$TMP/stdin.err")"
fi

# Several devices: the report round-trips with both, in order.
python3 - "$TMP/oom.json" "$TMP/two.json" <<'PY'
import sys
raw = open(sys.argv[1]).read()
head, sep, rest = raw.partition('"devices":[{"device":0,')
dev = '{"device":0,' + rest[:rest.rindex("]}")]
open(sys.argv[2], "w").write(head + '"devices":[' + dev + "," + dev.replace('{"device":0,', '{"device":1,', 1) + "]}\n")
PY
run two_json --json "$TMP/two.json"
run two_text "$TMP/two.json"
if [ "$rc" -eq 0 ] && cmp -s "$TMP/two_json.out" "$TMP/two.json" && grep -q '^== device 0 (sim) ==$' "$TMP/two_text.out" &&
    grep -q '^== device 1 (sim) ==$' "$TMP/two_text.out"; then
    ok "a report of two devices round-trips and renders both"
else
    not_ok "a report of two devices" "status $rc: $(cat "$TMP/two_json.err" "$TMP/two_text.err")"
fi

# ---- HTML --------------------------------------------------------------------------
for name in oom ok vmm; do
    run "$name.html" --html "$TMP/$name.json"
    if [ "$rc" -ne 0 ]; then
        not_ok "$name: --html exits 0" "status $rc: $(cat "$TMP/$name.html.err")"
    elif grep -Eqi "(src|href)=|https?:|<script|@import|url\(" "$TMP/$name.html.out"; then
        not_ok "$name: the HTML page loads nothing from outside" \
            "$(grep -Eoi ".{30}((src|href)=|https?:|<script|@import|url\().{30}" "$TMP/$name.html.out")"
    elif ! grep -q '^<!DOCTYPE html>' "$TMP/$name.html.out" || ! grep -q '</html>$' "$TMP/$name.html.out"; then
        not_ok "$name: --html writes a whole page" "$(head -c 300 "$TMP/$name.html.out")"
    else
        ok "$name: --html writes a whole page that loads nothing from outside"
    fi
done
if grep -q '<span class=cause>fragmentation</span>' "$TMP/oom.html.out" && grep -q 'What would help' "$TMP/oom.html.out"; then
    ok "oom: the HTML page shows the out-of-memory panel with cause fragmentation"
else
    not_ok "oom: the HTML page names the cause" "$(grep -o 'class=oom.\{0,200\}' "$TMP/oom.html.out")"
fi
if ! grep -q 'class=oom' "$TMP/ok.html.out"; then
    ok "ok: the HTML page has no out-of-memory panel"
else
    not_ok "ok: the HTML page has no out-of-memory panel"
fi
# The page is the replay's own but for the header and the timing of the timeline.
if diff <(grep -v -e '<h1>' -e 'class="axis">[0-9.]* m\?s<' -e '<polyline' -e 'stroke="#8e44ad"' \
        -e 's after the heap was created' "$TMP/oom.html.out") \
    <(grep -v -e '<h1>' -e 'class="axis">[0-9.]* m\?s<' -e '<polyline' -e 'stroke="#8e44ad"' \
        -e 's after the heap was created' "$TMP/oom.html") >"$TMP/diff" 2>&1; then
    ok "oom: --html equals the replay's page but for pid, time and timings"
else
    not_ok "oom: --html equals the replay's page but for pid, time and timings" "$(cat "$TMP/diff")"
fi

# ---- pinned host memory ----------------------------------------------------------
# No replay uses pinned memory: none of its forms has the section.
if ! grep -q '"pinned_host"' "$TMP/ok.json" "$TMP/ok.json.out" && ! grep -q 'pinned host memory' "$TMP/ok.txt.out" &&
    ! grep -q 'id=pinned' "$TMP/ok.html.out"; then
    ok "a report without pinned memory has no pinned section (JSON, text, HTML)"
else
    not_ok "a report without pinned memory has no pinned section" "$(grep -l 'pinned' "$TMP"/ok.*)"
fi
# A section after the devices, as the library writes it: with_section NAME
# KEY FRAGMENT BASE writes $TMP/NAME.json, BASE's report with FRAGMENT (the
# top-level member KEY) added at its end, and checks that --json reproduces
# it byte for byte.
with_section() {
    local name=$1 key=$2 fragment=$3 base=$4
    sed '$ s/}$/,'"$fragment"'}/' "$base" >"$TMP/$name.json"
    run "${name}_json" --json "$TMP/$name.json"
    if [ "$rc" -eq 0 ] && cmp -s "$TMP/${name}_json.out" "$TMP/$name.json" &&
        [[ "$(tail -n 1 "$TMP/$name.json")" == *",$fragment}" ]]; then
        ok "$name: --json reproduces a report with $key byte for byte"
    else
        not_ok "$name: --json reproduces $key" "status $rc: $(cat "$TMP/${name}_json.err")
$(cmp "$TMP/${name}_json.out" "$TMP/$name.json" 2>&1)"
    fi
}

# text_is NAME WHAT FILE...: cuheap-report --text on $TMP/NAME.json exits 0
# and prints exactly the FILEs one after another (WHAT says what they are).
text_is() {
    local name=$1 what=$2
    shift 2
    run "${name}_text" --text "$TMP/$name.json"
    if [ "$rc" -ne 0 ]; then
        not_ok "$name: --text exits 0" "status $rc: $(cat "$TMP/${name}_text.err")"
    elif ! diff <(cat "$@") "$TMP/${name}_text.out" >"$TMP/diff" 2>&1; then
        not_ok "$name: --text is $what" "$(cat "$TMP/diff")"
    else
        ok "$name: --text is $what with every figure"
    fi
}

# merge_and_compare_read NAME KEY: --merge and --compare read $TMP/NAME.json.
merge_and_compare_read() {
    local name=$1 key=$2 merge_rc
    run "${name}_merge" --merge "$TMP/$name.json" "$TMP/oom.json"
    merge_rc=$rc
    run "${name}_cmp" --compare "$TMP/$name.json" "$TMP/ok.json"
    if [ "$merge_rc" -eq 0 ] && [ "$rc" -eq 0 ]; then
        ok "$name: --merge and --compare read a report with $key"
    else
        not_ok "$name: --merge and --compare read a report with $key" \
            "$(cat "$TMP/${name}_merge.err" "$TMP/${name}_cmp.err")"
    fi
}
# Renders $TMP/NAME.json as HTML (run NAME_html) into $card, the card
# <section class=card id=ID>; true when it exits 0, the card holds each
# STRING as written, and the page without the card is BEFORE without it.
html_card() {
    local name=$1 id=$2 before=$3 want
    shift 3
    run "${name}_html" --html "$TMP/$name.json"
    card=$(sed -n "/<section class=card id=$id>/,/<\/section>/p" "$TMP/${name}_html.out")
    [ "$rc" -eq 0 ] || return 1
    for want; do
        grep -qF -- "$want" <<<"$card" || return 1
    done
    diff <(grep -v "id=$id" "$before") <(sed "/<section class=card id=$id>/,/<\/section>/d" "$TMP/${name}_html.out") >/dev/null
}
# The object as the library writes it, after the devices (tests/test_api.c
# checks a report of real pinned allocations).
pinned='"pinned_host":{"requested":{"current":5000,"peak":1053576},"allocated":{"current":8192,"peak":1056768},'
pinned+='"reserved":{"current":67108864,"peak":67108864},"pending":{"current":1048576,"peak":1048576},"num_allocs":7,'
pinned+='"num_frees":6,"num_chunks":2,"num_chunk_allocs":3,"num_waits":4,"num_ooms":1,"chunk_size":33554432}'
with_section pinned pinned_host "$pinned" "$TMP/ok.json"
row() { printf '  %-22s %14s %14s\n' "$@"; }
{
    echo "== pinned host memory =="
    echo "reserved in 2 chunks of 32.00 MiB or more; 3 taken from CUDA in all"
    echo
    row "" current peak
    row "requested (live)" "4.88 KiB" "1.00 MiB"
    row allocated "8.00 KiB" "1.01 MiB"
    row reserved "64.00 MiB" "64.00 MiB"
    row pending "1.00 MiB" "1.00 MiB"
    echo
    echo "  allocations 7, frees 6, waits for GPU work 4, OOMs 1"
    echo
} >"$TMP/pinned.want"
text_is pinned "the report's text, then the pinned section" "$TMP/ok.txt.out" "$TMP/pinned.want"
if html_card pinned pinned "$TMP/ok.html.out" '<h2>Pinned host memory</h2>' \
    'reserved in 2 chunks of 32.00 MiB or more; 3 taken from CUDA in all' \
    '<tr><td>reserved</td><td>64.00 MiB</td><td>64.00 MiB</td></tr>' \
    '<tr><td>pending</td><td>1.00 MiB</td><td>1.00 MiB</td></tr>' \
    'waits for GPU work 4 &middot; out-of-memory 1' &&
    [ "$(grep -n 'id=pinned' "$TMP/pinned_html.out" | cut -d: -f1)" -gt "$(grep -n '<h2>Streams</h2>' "$TMP/pinned_html.out" | cut -d: -f1)" ]; then
    ok "pinned: --html adds the pinned card after the devices, and nothing else"
else
    not_ok "pinned: --html shows the pinned card after the devices" "status $rc: $(cat "$TMP/pinned_html.err")
$card"
fi
merge_and_compare_read pinned pinned_host

# ---- device memory by caller -------------------------------------------------------
# A replay has no callers: no section in any form. The array as the library
# writes it under LD_PRELOAD (tests/test_preload.sh checks one a program
# wrote), after the devices and pinned_host.
if ! grep -q '"callers"' "$TMP/ok.json" "$TMP/ok.json.out" && ! grep -q 'by caller' "$TMP/ok.txt.out" &&
    ! grep -q 'id=callers' "$TMP/ok.html.out"; then
    ok "a report without callers has no callers section (JSON, text, HTML)"
else
    not_ok "a report without callers has no callers section" "$(grep -l 'callers' "$TMP"/ok.*)"
fi
callers='"callers":[{"library":"libc10_cuda.so","live":25769803776,"peak":26306674688,"allocs":29131},'
callers+='{"library":"libcublasLt.so.13","live":67108864,"peak":67108864,"allocs":8}]'
with_section callers callers "$callers" "$TMP/pinned.json"
{
    echo "== device memory by caller (LD_PRELOAD) =="
    printf '  %-40s %14s %14s %12s\n' library live peak allocations
    printf '  %-40s %14s %14s %12s\n' libc10_cuda.so "24.00 GiB" "24.50 GiB" 29131
    printf '  %-40s %14s %14s %12s\n' libcublasLt.so.13 "64.00 MiB" "64.00 MiB" 8
    echo
} >"$TMP/callers.want"
text_is callers "the report's text, the pinned section, then the callers" "$TMP/ok.txt.out" "$TMP/pinned.want" \
    "$TMP/callers.want"
if html_card callers callers "$TMP/pinned_html.out" '<h2>Device memory by caller (LD_PRELOAD)</h2>' \
    '<tr><td>libc10_cuda.so</td><td>24.00 GiB</td><td>24.50 GiB</td><td>29131</td></tr>' \
    '<tr><td>libcublasLt.so.13</td><td>64.00 MiB</td><td>64.00 MiB</td><td>8</td></tr>'; then
    ok "callers: --html adds the callers card after the pinned one, and nothing else"
else
    not_ok "callers: --html shows the callers card" "status $rc: $(cat "$TMP/callers_html.err")
$card"
fi
merge_and_compare_read callers callers

# ---- --compare ---------------------------------------------------------------------
run cmp_text --compare "$TMP/oom.json" "$TMP/ok.json"
ratio=$(python3 -c '
import json, sys
a, b = (json.load(open(f))["devices"][0]["stats"]["reserved"]["peak"] for f in sys.argv[1:])
print("%.3f" % (b / a))
' "$TMP/oom.json" "$TMP/ok.json")
if [ "$rc" -ne 0 ]; then
    not_ok "--compare exits 0" "status $rc: $(cat "$TMP/cmp_text.err")"
elif ! grep -Eq '^  out-of-memory cause +fragmentation +none$' "$TMP/cmp_text.out"; then
    not_ok "--compare names both causes (fragmentation / none)" "$(cat "$TMP/cmp_text.out")"
elif ! grep -Eq "^  reserved peak .* $ratio\$" "$TMP/cmp_text.out"; then
    not_ok "--compare shows the reserved peak ratio B/A $ratio" "$(grep 'reserved' "$TMP/cmp_text.out")"
else
    ok "--compare names both causes (fragmentation / none) and the reserved peak ratio $ratio"
fi
missing=""
for row in "requested current" "requested peak" "allocated peak" "cached current" "pending peak" allocations frees \
    "segments allocated" retries OOMs fragmentation stranded "stranded segments" "peak reserved / peak live"; do
    grep -q "^  $row " "$TMP/cmp_text.out" || missing="$missing [$row]"
done
if [ -z "$missing" ] && grep -q "^== device 0 (sim) ==$" "$TMP/cmp_text.out"; then
    ok "--compare has a row for every statistic and counter"
else
    not_ok "--compare rows" "missing:$missing
$(cat "$TMP/cmp_text.out")"
fi

run cmp_json --compare --json "$TMP/oom.json" "$TMP/ok.json"
if [ "$rc" -eq 0 ] && msg=$(python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
a, b = (json.load(open(f))["devices"][0] for f in sys.argv[2:4])
assert c["schema"] == "cuheap-report-compare", c.get("schema")
assert c["a"]["pid"] == json.load(open(sys.argv[2]))["pid"]
d, = c["devices"]
assert d["device"] == 0 and d["in"] == "both", d
assert d["oom"]["a"]["cause"] == "fragmentation", d["oom"]
assert d["oom"]["b"] is None, d["oom"]
r = d["reserved"]["peak"]
pa, pb = a["stats"]["reserved"]["peak"], b["stats"]["reserved"]["peak"]
assert (r["a"], r["b"], r["diff"]) == (pa, pb, pb - pa), r
assert abs(r["ratio"] - pb / pa) < 1e-6, r
assert d["num_ooms"]["a"] == 1 and d["num_ooms"]["b"] == 0, d["num_ooms"]
assert abs(d["fragmentation"]["a"] - a["stats"]["fragmentation"]) < 1e-6, d["fragmentation"]
def stranded(dev):   # free bytes of plain segments at most 1/8 used, and how many
    out = []
    for g in dev["segments"]:
        used = sum(e["size"] for e in g["extents"] if e["kind"] != "free")
        if not g["workspace"] and not g["virtual"] and 0 < used <= g["size"] // 8:
            out.append(g["size"] - used)
    return sum(out), len(out)
(sa, na), (sb, nb) = stranded(a), stranded(b)
assert (d["stranded_bytes"]["a"], d["stranded_bytes"]["b"]) == (sa, sb), d["stranded_bytes"]
assert (d["stranded_segments"]["a"], d["stranded_segments"]["b"]) == (na, nb) and na >= 1, d["stranded_segments"]
assert sa == a["oom"]["stranded"]["free"], (sa, a["oom"]["stranded"])
for k in ("requested", "allocated", "cached", "pending"):
    assert set(d[k]) == {"current", "peak"}, k
' "$TMP/cmp_json.out" "$TMP/oom.json" "$TMP/ok.json" 2>&1); then
    ok "--compare --json: one object with exact values, differences, ratios and both causes"
else
    not_ok "--compare --json" "status $rc: $(cat "$TMP/cmp_json.err") ${msg:-}"
fi

sed 's/{"device":0,/{"device":1,/' "$TMP/ok.json" >"$TMP/dev1.json"
run cmp_one --compare "$TMP/oom.json" "$TMP/dev1.json"
run cmp_one_json --compare --json "$TMP/oom.json" "$TMP/dev1.json"
if [ "$rc" -eq 0 ] && grep -q "^== device 0 (sim): only in A " "$TMP/cmp_one.out" &&
    grep -q "^== device 1 (sim): only in B " "$TMP/cmp_one.out" &&
    python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
assert [(d["device"], d["in"]) for d in c["devices"]] == [(0, "a"), (1, "b")], c["devices"]
' "$TMP/cmp_one_json.out"; then
    ok "--compare lists devices present in only one report"
else
    not_ok "--compare with devices in one report only" "status $rc: $(cat "$TMP/cmp_one.out" "$TMP/cmp_one.err")"
fi

# ---- --merge: one report per rank ------------------------------------------------
# Three "ranks": the out-of-memory report, the clean one, and the clean one
# as device 1 (a rank on another GPU).
run merge_text --merge "$TMP/oom.json" "$TMP/ok.json" "$TMP/dev1.json"
run merge_json --merge --json "$TMP/oom.json" "$TMP/ok.json" "$TMP/dev1.json"
if [ "$rc" -eq 0 ] && msg=$(python3 - "$TMP/merge_json.out" "$TMP/merge_text.out" "$TMP/oom.json" "$TMP/ok.json" "$TMP/dev1.json" <<'PY' 2>&1
import json, sys
m = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
reports = [json.load(open(f)) for f in sys.argv[3:]]
assert m["schema"] == "cuheap-report-merge", m.get("schema")
rows = [(r["origin"]["file"], d) for r in m["reports"] for d in r["devices"]]
assert [d["device"] for _, d in rows] == [0, 0, 1], rows
want = [rep["devices"][0]["stats"] for rep in reports]
for (_, d), st in zip(rows, want):
    assert d["peak_reserved"] == st["reserved"]["peak"] and d["peak_live"] == st["requested"]["peak"], d
t = m["total"]
assert t["devices"] == 3, t
assert t["peak_reserved_sum"] == sum(st["reserved"]["peak"] for st in want), t
assert t["peak_live_sum"] == sum(st["requested"]["peak"] for st in want), t
assert t["num_ooms"] == 1 and rows[0][1]["oom"]["cause"] == "fragmentation", (t, rows[0])
assert "all (sums)" in text and "largest peak reserved:" in text, text
assert "out of memory: %s, device 0: fragmentation" % sys.argv[3] in text, text
assert text.count("\n  /") == 3, text
PY
); then
    ok "--merge: a row per report and device, exact sums, the largest and the out-of-memory named (text and JSON)"
else
    not_ok "--merge" "status $rc: $(cat "$TMP/merge_text.err" "$TMP/merge_json.err") ${msg:-}"
fi
run merge_clean --merge "$TMP/ok.json" "$TMP/dev1.json"
if [ "$rc" -eq 0 ] && grep -q "^no out-of-memory in any report.$" "$TMP/merge_clean.out"; then
    ok "--merge of clean reports says no out-of-memory"
else
    not_ok "--merge of clean reports" "status $rc: $(cat "$TMP/merge_clean.out" "$TMP/merge_clean.err")"
fi

# ---- broken inputs: status 1 with the place -------------------------------------
head -c 1000 "$TMP/oom.json" >"$TMP/trunc.json"
run trunc "$TMP/trunc.json"
if [ "$rc" -eq 1 ] && grep -q "trunc.json:1:1001: " "$TMP/trunc.err"; then
    ok "a truncated report exits 1 with file:line:column"
else
    not_ok "a truncated report exits 1 with file:line:column" "status $rc: $(cat "$TMP/trunc.err")"
fi

printf '{\n  "schema": "cuheap-report",\n  "version": 1,,\n  "devices": []\n}\n' >"$TMP/badjson.json"
run badjson --json "$TMP/badjson.json"
if [ "$rc" -eq 1 ] && grep -q "badjson.json:3:16: expected a string" "$TMP/badjson.err"; then
    ok "bad JSON on line 3 exits 1 with file:3:16 and what was expected"
else
    not_ok "bad JSON exits 1 with file:line:column" "status $rc: $(cat "$TMP/badjson.err")"
fi

sed 's/"schema":"cuheap-report"/"schema":"torch-memory-snapshot"/' "$TMP/oom.json" >"$TMP/schema.json"
run schema "$TMP/schema.json"
if [ "$rc" -eq 1 ] && grep -q '"torch-memory-snapshot"' "$TMP/schema.err" && grep -q '"cuheap-report"' "$TMP/schema.err"; then
    ok "a wrong schema exits 1 naming what was found and what was expected"
else
    not_ok "a wrong schema exits 1 naming it" "status $rc: $(cat "$TMP/schema.err")"
fi

sed 's/"version":1,/"version":2,/' "$TMP/oom.json" >"$TMP/version.json"
run version "$TMP/version.json"
if [ "$rc" -eq 1 ] && grep -q "version 2" "$TMP/version.err"; then
    ok "an unknown version exits 1 naming it"
else
    not_ok "an unknown version exits 1 naming it" "status $rc: $(cat "$TMP/version.err")"
fi

printf '[1, 2]\n' >"$TMP/array.json"
run array "$TMP/array.json"
if [ "$rc" -eq 1 ] && grep -q "not a cuheap report" "$TMP/array.err"; then
    ok "a document that is not an object exits 1"
else
    not_ok "a document that is not an object exits 1" "status $rc: $(cat "$TMP/array.err")"
fi

python3 - "$TMP/oom.json" "$TMP" <<'PY'
import json, sys
src, tmp = sys.argv[1], sys.argv[2]
d = json.load(open(src))
del d["devices"][0]["stats"]["reserved"]["peak"]
json.dump(d, open(tmp + "/missing.json", "w"))
d = json.load(open(src))
d["devices"][0]["segments"][1]["extents"][0]["size"] = "big"
json.dump(d, open(tmp + "/mistyped.json", "w"), indent=1)
d = json.load(open(src))
d["devices"][0]["kind"] = "tpu"
json.dump(d, open(tmp + "/kind.json", "w"))
d = json.load(open(src))
d["devices"][0]["oom"]["pending_by_stream"] = [{"stream": 1, "pending": -1}]
json.dump(d, open(tmp + "/negative.json", "w"))
PY
run missing "$TMP/missing.json"
if [ "$rc" -eq 1 ] && grep -q "missing.json: devices\[0\]\.stats\.reserved\.peak: missing" "$TMP/missing.err"; then
    ok "a missing field exits 1 naming its path (devices[0].stats.reserved.peak)"
else
    not_ok "a missing field exits 1 naming its path" "status $rc: $(cat "$TMP/missing.err")"
fi
run mistyped "$TMP/mistyped.json"
if [ "$rc" -eq 1 ] && grep -Eq "mistyped.json:[0-9]+:[0-9]+: devices\[0\]\.segments\[1\]\.extents\[0\]\.size: expected an unsigned integer, found a string" "$TMP/mistyped.err"; then
    ok "a mistyped field exits 1 with file:line:column, its path and the types"
else
    not_ok "a mistyped field exits 1 naming it" "status $rc: $(cat "$TMP/mistyped.err")"
fi
run kind "$TMP/kind.json"
if [ "$rc" -eq 1 ] && grep -q 'devices\[0\]\.kind: "tpu"' "$TMP/kind.err"; then
    ok "an unknown device kind exits 1 naming it"
else
    not_ok "an unknown device kind exits 1" "status $rc: $(cat "$TMP/kind.err")"
fi
run negative "$TMP/negative.json"
if [ "$rc" -eq 1 ] && grep -q 'devices\[0\]\.oom\.pending_by_stream\[0\]\.pending: expected an unsigned integer, found a negative integer' "$TMP/negative.err"; then
    ok "a negative byte count exits 1 naming its path"
else
    not_ok "a negative byte count exits 1" "status $rc: $(cat "$TMP/negative.err")"
fi

# variants SRC: runs the Python lines on stdin with write(NAME, CHANGE) defined:
# each writes $TMP/NAME.json, the report SRC with CHANGE(report) applied.
variants() {
    {
        cat <<'PY'
import json, sys
src, tmp = sys.argv[1], sys.argv[2]
def write(name, change):
    d = json.load(open(src))
    change(d)
    json.dump(d, open(tmp + "/" + name + ".json", "w"), indent=1)
PY
        cat
    } | python3 - "$1" "$TMP"
}

# A malformed pinned_host is named like any other field.
variants "$TMP/pinned.json" <<'PY'
write("pinned_string", lambda d: d["pinned_host"].update(num_waits="many"))
write("pinned_missing", lambda d: d["pinned_host"]["reserved"].pop("peak"))
write("pinned_nokey", lambda d: d["pinned_host"].pop("chunk_size"))
write("pinned_array", lambda d: d.update(pinned_host=[1, 2]))
PY
# refused_naming WHAT CASE...: each CASE is NAME:PATTERN; cuheap-report on
# $TMP/NAME.json must exit 1 with a message that names NAME.json and then
# matches PATTERN (the place in the report and what is wrong there).
refused_naming() {
    local what=$1 case name
    shift
    for case in "$@"; do
        name=${case%%:*}
        run "$name" "$TMP/$name.json"
        if [ "$rc" -eq 1 ] && grep -q "$name.json[:0-9]*: ${case#*:}" "$TMP/$name.err"; then
            ok "$what: $(sed "s|$TMP/||" "$TMP/$name.err")"
        else
            not_ok "$what ($name)" "status $rc: $(cat "$TMP/$name.err")"
        fi
    done
}
refused_naming "a malformed pinned_host exits 1 naming the key" \
    "pinned_string:pinned_host\.num_waits: expected an unsigned integer, found a string" \
    "pinned_missing:pinned_host\.reserved\.peak: missing" \
    "pinned_nokey:pinned_host\.chunk_size: missing" \
    "pinned_array:pinned_host: expected an object, found an array"

# A malformed callers array is named too.
variants "$TMP/callers.json" <<'PY'
write("callers_object", lambda d: d.update(callers={"library": "x"}))
write("callers_above", lambda d: d["callers"][1].update(live=67108865))
write("callers_nolib", lambda d: d["callers"][0].pop("library"))
write("callers_many", lambda d: d.update(callers=[{"library": "l%d" % i, "live": 0, "peak": 1, "allocs": 1}
                                                  for i in range(33)]))
PY
refused_naming "a malformed callers array exits 1 naming the place" \
    "callers_object:callers: expected an array, found an object" \
    "callers_above:callers\[1\]: 67108865 bytes live, above the peak of 67108864" \
    "callers_nolib:callers\[0\]\.library: missing" \
    "callers_many:callers: 33 libraries (at most 32)"

# Parts that contradict each other: refused, naming the place.
python3 - "$TMP/oom.json" "$TMP" <<'PY'
import json, sys
src, tmp = sys.argv[1], sys.argv[2]
def write(name, change):
    d = json.load(open(src))
    change(d["devices"][0])
    json.dump(d, open(tmp + "/" + name + ".json", "w"), indent=1)
def gap(dev):
    x = dev["segments"][2]["extents"][1]
    x["addr"] += 512
    x["size"] -= 512
    if x["kind"] == "block":
        x["requested"] = min(x.get("requested", 0), x["size"])
write("c_gap", gap)
write("c_short", lambda dev: dev["segments"][2]["extents"].pop())
def overlap(dev):
    dev["segments"][3]["base"] = dev["segments"][2]["base"]
write("c_overlap", overlap)
def requested(dev):
    x = next(x for x in dev["segments"][1]["extents"] if x["kind"] == "block")
    x["requested"] = x["size"] + 1
write("c_requested", requested)
def plain_mapped(dev):
    dev["segments"][1]["mapped"] -= 2097152
write("c_mapped", plain_mapped)
def order(dev):
    dev["timeline"][5]["t"] = dev["timeline"][4]["t"] / 2
write("c_time", order)
write("c_reserved", lambda dev: dev["stats"]["reserved"].update(current=dev["stats"]["reserved"]["current"] + 512))
write("c_live", lambda dev: dev["timeline"][3].update(live=dev["timeline"][3]["reserved"] + 1))
write("c_unknown", lambda dev: dev["device_memory"].update(free=4096, free_unknown=True))
write("unasked", lambda dev: dev["device_memory"].update(free=0, free_unknown=True))
write("c_novm", lambda dev: (dev["config"].update(vmm=0), dev["device_memory"].update(no_virtual_memory=True)))
PY
refused_naming "parts that contradict each other exit 1 naming the place" \
    "c_gap:devices\[0\]\.segments\[2\]\.extents\[1\]: starts at 0x[0-9a-f]*, but the extent before it ends at" \
    "c_short:devices\[0\]\.segments\[2\]\.extents: the extents end at 0x[0-9a-f]*, but the segment ends at" \
    "c_overlap:devices\[0\]\.segments\[3\]: starts at 0x[0-9a-f]*, before the segment listed before it ends" \
    "c_requested:devices\[0\]\.segments\[1\]\.extents\[[0-9]*\]: a block of [0-9]* bytes says [0-9]* were requested" \
    "c_mapped:devices\[0\]\.segments\[1\]: [0-9]* bytes mapped in a segment of [0-9]* bytes (a segment that is not" \
    "c_time:devices\[0\]\.timeline\[5\]: a sample at [-0-9.e]* s, before the sample listed before it" \
    "c_reserved:devices\[0\]\.stats\.reserved\.current: [0-9]* bytes, but the segments hold [0-9]*" \
    "c_live:devices\[0\]\.timeline\[3\]: [0-9]* bytes live and [0-9]* cached of [0-9]* reserved" \
    "c_unknown:devices\[0\]\.device_memory\.free: 4096 with free_unknown true" \
    "c_novm:devices\[0\]\.device_memory\.no_virtual_memory: true with vmm 0 in config"

# A report written at exit did not ask the device how much is free: it says
# so, and claims nothing about memory used outside cuheap.
run unasked_text --text "$TMP/unasked.json"
run unasked_html --html "$TMP/unasked.json"
run unasked_json --json "$TMP/unasked.json"
if grep -q "^  device: [0-9.]* [KMG]*i*B; free not asked (a report at exit makes no device call)$" "$TMP/unasked_text.out" &&
    ! grep "^  device: " "$TMP/unasked_text.out" | grep -q "used outside cuheap" &&
    grep -q "free not asked (a report at exit makes no device call)</p>" "$TMP/unasked_html.out" &&
    grep -q '"device_memory":{"free":0,"total":[0-9]*,"free_unknown":true}' "$TMP/unasked_json.out"; then
    ok "a report that did not ask the device says so in text and HTML, and keeps free_unknown in JSON"
else
    not_ok "a report that did not ask the device says so" "$(grep -h "device" "$TMP"/unasked_*.out | head -3)"
fi

# vmm:1 asked for on a device that gives no virtual memory (the simulated
# device has no address space for a 4 TiB device's reservation): the heap
# runs on plain segments, and every form of the report says so.
"$REPLAY" --capacity 4T --report "$TMP/novm.json" bench/traces/resnet50.trace.gz >/dev/null 2>"$TMP/novm.err"
run novm_text --text "$TMP/novm.json"
run novm_html --html "$TMP/novm.json"
run novm_json --json "$TMP/novm.json"
if grep -q "using plain segments" "$TMP/novm.err" &&
    grep -q '"no_virtual_memory":true' "$TMP/novm.json" &&
    grep -q "^virtual memory: vmm:1 asked for, but the device gave none (said on stderr): plain segments$" "$TMP/novm_text.out" &&
    grep -q "vmm:1 asked for, but the device gave no virtual memory: plain segments</p>" "$TMP/novm_html.out" &&
    grep -q '"no_virtual_memory":true' "$TMP/novm_json.out" &&
    ! grep -q "no_virtual_memory\|vmm:1 asked for" "$TMP/ok.json" "$TMP/ok.txt"; then
    ok "vmm:1 without virtual memory: the report says plain segments in text, HTML and JSON (no_virtual_memory), and cuheap-report keeps it"
else
    not_ok "vmm:1 without virtual memory: the report says so" "$(head -c 300 "$TMP/novm.err")"
fi

run nofile "$TMP/no-such-report.json"
if [ "$rc" -eq 1 ] && grep -q "no-such-report.json" "$TMP/nofile.err"; then
    ok "a missing file exits 1 and names it"
else
    not_ok "a missing file exits 1" "status $rc: $(cat "$TMP/nofile.err")"
fi

# ---- mutated reports: rendered, or refused naming the place ---------------------
# 200 seeded edits of the out-of-memory report that keep it valid JSON (a
# number changed, negated, made huge or fractional, a value's type changed, a
# member or an array element removed or doubled): each is rendered (status
# 0, a report on stdout, and as an HTML page too) or refused with status 1 and a message that starts
# with the file's name and names a field; never a crash, a sanitizer's report
# or another status.
mkdir -p "$TMP/mut"
python3 - "$TMP/oom.json" "$TMP/mut" <<'PY'
import json, random, sys
base = json.load(open(sys.argv[1]))
rng = random.Random(20261201)

def places(v, path=()):
    yield path
    if isinstance(v, dict):
        for k, x in v.items():
            yield from places(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from places(x, path + (i,))

def parent(d, path):
    for p in path[:-1]:
        d = d[p]
    return d

all_places = [p for p in places(base) if p]
for n in range(200):
    d = json.loads(json.dumps(base))
    path = rng.choice(all_places)
    box, key = parent(d, path), path[-1]
    old = box[key]
    edit = rng.randrange(7)
    if edit == 0 and isinstance(old, (int, float)) and not isinstance(old, bool):
        box[key] = rng.choice([0, 1, old + 1, old * 2, 2 ** 64 - 1, 2 ** 70])
    elif edit == 1 and isinstance(old, (int, float)) and not isinstance(old, bool):
        box[key] = rng.choice([-old - 1, old + 0.5, -1])
    elif edit == 2:
        box[key] = rng.choice([None, "x", [], {}, True, 3])
    elif edit == 3 and isinstance(box, dict):
        del box[key]
    elif edit == 4 and isinstance(box, list):
        box.insert(key, json.loads(json.dumps(old)))
    elif edit == 5 and isinstance(box, list):
        del box[key]
    else:
        box[key] = rng.choice([None, -5, "", 1e300])
    json.dump(d, open("%s/m%03d.json" % (sys.argv[2], n), "w"))
PY
rendered=0 refused=0 bad=""
for f in "$TMP"/mut/m*.json; do
    "$BIN" --text "$f" >"$TMP/mut.out" 2>"$TMP/mut.err"
    rc=$?
    name=$(basename "$f")
    if [ "$rc" -eq 0 ] && [ -s "$TMP/mut.out" ] && ! grep -q "Sanitizer" "$TMP/mut.err" &&
        "$BIN" --html "$f" >"$TMP/mut.html" 2>>"$TMP/mut.err" && grep -q "</html>" "$TMP/mut.html" &&
        ! grep -q "Sanitizer" "$TMP/mut.err"; then
        rendered=$((rendered + 1))
    elif [ "$rc" -eq 1 ] && grep -q "^cuheap-report: .*$name:[0-9:]* *[a-z_]*[][a-z_0-9.]*: " "$TMP/mut.err" &&
        ! grep -q "Sanitizer" "$TMP/mut.err"; then
        refused=$((refused + 1))
    else
        bad="$bad
$name: status $rc: $(head -c 300 "$TMP/mut.err")"
    fi
done
if [ -z "$bad" ] && [ "$rendered" -gt 0 ] && [ "$refused" -gt 0 ]; then
    ok "200 mutated reports: $rendered rendered, $refused refused with the file and the field"
else
    not_ok "mutated reports are rendered or refused naming the field ($rendered rendered, $refused refused)" "$bad"
fi

# ---- usage errors: status 2 ------------------------------------------------------
run unknown --no-such-option "$TMP/oom.json"
if [ "$rc" -eq 2 ] && grep -q -- "--no-such-option" "$TMP/unknown.err"; then
    ok "an unknown option exits 2 and names it"
else
    not_ok "an unknown option exits 2" "status $rc: $(cat "$TMP/unknown.err")"
fi
for args in "" "--text --html $TMP/oom.json" "--compare $TMP/oom.json" "--compare --html $TMP/oom.json $TMP/ok.json" \
    "$TMP/oom.json $TMP/ok.json" "$TMP/oom.json -o" "--merge $TMP/oom.json" "--merge --html $TMP/oom.json $TMP/ok.json" \
    "--merge --compare $TMP/oom.json $TMP/ok.json" "--merge - -"; do
    # shellcheck disable=SC2086
    run usage $args
    if [ "$rc" -eq 2 ]; then
        ok "usage error exits 2: '${args//$TMP\//}'"
    else
        not_ok "usage error exits 2: '${args//$TMP\//}'" "status $rc: $(cat "$TMP/usage.err")"
    fi
done
run help --help
if [ "$rc" -eq 0 ] && grep -q "^usage:" "$TMP/help.out"; then
    ok "--help prints the usage and exits 0"
else
    not_ok "--help" "status $rc"
fi

finish test_report_cli
