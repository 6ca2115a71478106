#!/usr/bin/env bash
# test_report.sh BUILD_DIR - the three report forms, from cuheap-replay runs
# that end without and with an out-of-memory: the JSON validates against
# include/cuheap_report.schema.json, with its optional pinned_host too; a
# replay uses no pinned host memory, so no form has that section; the text
# names the cause; the HTML page
# refers to nothing outside itself and, rendered by headless Chromium, is not
# blank and shows the out-of-memory panel exactly when there was one.
set -uo pipefail
build=${1:-build}
[ -x "$build/cuheap-replay" ] || build=build
replay=$build/cuheap-replay
report_tool=$build/cuheap-report
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/harness.sh"

"$replay" --report "$tmp/ok.json" bench/traces/resnet50.trace.gz >/dev/null
"$replay" --conf vmm:0 --capacity 26.4G --report "$tmp/frag.json" bench/traces/gpt2.trace.gz >/dev/null
"$replay" --capacity 100M --report "$tmp/cap.json" bench/traces/gpt2.trace.gz >/dev/null
"$replay" --conf vmm:1 --capacity 26.4G --report "$tmp/vmm.json" bench/traces/gpt2.trace.gz >/dev/null
"$replay" --external 10G --capacity 30G --report "$tmp/ext.json" bench/traces/gpt2.trace.gz >/dev/null
"$replay" --conf limit:20G --report "$tmp/lim.json" bench/traces/gpt2.trace.gz >/dev/null
"$replay" --conf vmm:0 --capacity 26.4G --report "$tmp/frag.txt" bench/traces/gpt2.trace.gz >/dev/null
"$replay" --conf vmm:0 --capacity 26.4G --report "$tmp/frag.html" bench/traces/gpt2.trace.gz >/dev/null
"$replay" --report "$tmp/ok.html" bench/traces/resnet50.trace.gz >/dev/null

# A validator for the subset of JSON Schema the schema uses.
cat > "$tmp/validate.py" <<'PY'
import json, sys
schema = json.load(open(sys.argv[1]))
def resolve(s):
    while "$ref" in s:
        node = schema
        for part in s["$ref"].lstrip("#/").split("/"):
            node = node[part]
        s = node
    return s
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
def ok_type(v, t):
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, TYPES[t])
def check(v, s, path):
    s = resolve(s)
    if "oneOf" in s:
        good = [alt for alt in s["oneOf"] if not list(errors(v, alt, path))]
        if len(good) != 1:
            yield "%s: matches %d of oneOf" % (path, len(good))
        return
    if "const" in s and v != s["const"]:
        yield "%s: %r is not %r" % (path, v, s["const"])
    if "enum" in s and v not in s["enum"]:
        yield "%s: %r not in %r" % (path, v, s["enum"])
    if "type" in s and not ok_type(v, s["type"]):
        yield "%s: %r is not %s" % (path, v, s["type"])
        return
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                yield "%s: missing %s" % (path, k)
        for k, sub in s.get("properties", {}).items():
            if k in v:
                yield from check(v[k], sub, path + "." + k)
    if isinstance(v, list) and "items" in s:
        for i, item in enumerate(v):
            yield from check(item, s["items"], "%s[%d]" % (path, i))
def errors(v, s, path):
    return check(v, s, path)
bad = list(errors(json.load(open(sys.argv[2])), schema, "$"))
print("\n".join(bad[:5]) if bad else "valid")
PY
# Under vmm:1 with 32 MiB pages, GPT-2 on 25.6 GiB runs out of memory with
# free memory stuck in pages that blocks partly use.
"$replay" --conf vmm:1,vmm_page:32M --capacity 25.6G --report "$tmp/pages.json" bench/traces/gpt2.trace.gz >/dev/null
"$replay" --conf vmm:1,vmm_page:32M --capacity 25.6G --report "$tmp/pages.txt" bench/traces/gpt2.trace.gz >/dev/null
for r in ok frag cap vmm ext lim pages; do
    out=$(python3 "$tmp/validate.py" include/cuheap_report.schema.json "$tmp/$r.json")
    check "$r.json validates against the schema ($out)" '[ "$out" = valid ]'
done
bad=$(python3 "$tmp/validate.py" include/cuheap_report.schema.json <(python3 -c "
import json,sys; r=json.load(open('$tmp/frag.json')); r['devices'][0]['oom']['cause']='bogus'; print(json.dumps(r))"))
check "the validator rejects a report with an unknown cause" '[ "$bad" != valid ]'

# pinned_host: absent from a job that used no pinned memory, in every form;
# when present (as the library writes it: tests/test_api.c checks real ones),
# every field is described and typed by the schema.
check "a replay's reports have no pinned host memory section (JSON, text, HTML)" \
    '! grep -q "\"pinned_host\"" $tmp/ok.json $tmp/frag.json && ! grep -q "pinned host memory" $tmp/frag.txt &&
     ! grep -q "id=pinned" $tmp/frag.html $tmp/ok.html'
cat > "$tmp/pinned.py" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
stat = lambda c, p: {"current": c, "peak": p}
r["pinned_host"] = {"requested": stat(5000, 1053576), "allocated": stat(8192, 1056768),
                    "reserved": stat(1 << 26, 1 << 26), "pending": stat(0, 8192), "num_allocs": 7, "num_frees": 6,
                    "num_chunks": 2, "num_chunk_allocs": 2, "num_waits": 0, "num_ooms": 0, "chunk_size": 1 << 25}
if len(sys.argv) > 2:
    exec(sys.argv[2])
print(json.dumps(r))
PY
out=$(python3 "$tmp/validate.py" include/cuheap_report.schema.json <(python3 "$tmp/pinned.py" "$tmp/ok.json"))
check "a report with pinned_host validates against the schema ($out)" '[ "$out" = valid ]'
for broken in 'r["pinned_host"]["num_waits"] = "4"' 'del r["pinned_host"]["chunk_size"]' \
    'r["pinned_host"]["reserved"] = 5' 'r["pinned_host"] = []'; do
    out=$(python3 "$tmp/validate.py" include/cuheap_report.schema.json <(python3 "$tmp/pinned.py" "$tmp/ok.json" "$broken"))
    check "the schema rejects a malformed pinned_host ($broken: $out)" '[ "$out" != valid ]'
done
described=$(python3 -c "
import json
s = json.load(open('include/cuheap_report.schema.json'))
p = s['properties']['pinned_host']
print(sorted(p['required']) == sorted(p['properties']) and 'description' in p and 'pinned_host' not in s['required'])")
check "the schema's pinned_host is optional and requires every field it describes" '[ "$described" = True ]'
cause() { python3 -c "import json,sys; o=json.load(open(sys.argv[1]))['devices'][0]['oom']; print(o['cause'] if o else 'none')" "$1"; }
check "no OOM: oom is null" '[ "$(cause $tmp/ok.json)" = none ]'
check "gpt2 at 26.4 GiB: fragmentation" '[ "$(cause $tmp/frag.json)" = fragmentation ]'
check "gpt2 (first request 147 MiB) on 100 MiB: capacity" '[ "$(cause $tmp/cap.json)" = capacity ]'
check "gpt2 at 26.4 GiB with vmm:1: no OOM" '[ "$(cause $tmp/vmm.json)" = none ]'
check "gpt2 at 30 GiB of which 10 used by others: external" '[ "$(cause $tmp/ext.json)" = external ]'
check "gpt2 under limit:20G on 80 GiB: limit" '[ "$(cause $tmp/lim.json)" = limit ]'
proof=$(python3 -c "
import json; o=json.load(open('$tmp/ext.json'))['devices'][0]['oom']
print(o['allocated'] + o['block'] <= o['device_total'] and o['allocated'] + o['block'] > o['device_total'] - o['external'])")
check "external's proof: it would fit without the memory used by others" '[ "$proof" = True ]'
proof=$(python3 -c "
import json; o=json.load(open('$tmp/lim.json'))['devices'][0]['oom']
print(o['allocated'] + o['block'] > o['limit'] and o['device_free'] >= o['block'])")
check "limit's proof: over the limit, while the device has room" '[ "$proof" = True ]'
proof=$(python3 -c "
import json; o=json.load(open('$tmp/frag.json'))['devices'][0]['oom']
print(o['largest_free'] < o['request'] <= o['cached'] + o['device_free'])")
check "fragmentation's proof: largest free < request <= cached + device free" '[ "$proof" = True ]'
# gpt2 at 26.4 GiB fails because a few small blocks hold a segment the logits
# would need: the record says how much they strand, which blocks hold the most
# (blocks of that segment in the report's own listing), and that the
# request would have fit without them, which its figures prove.
stranded=$(python3 -c "
import json
d = json.load(open('$tmp/frag.json'))['devices'][0]
o, x = d['oom'], d['oom']['stranded']
g = [g for g in d['segments'] if g['base'] == x['top']['base']][0]
used = {e['addr']: e['size'] for e in g['extents'] if e['kind'] in ('block', 'slab')}
holders = all(used.get(a) == n for a, n in x['top']['holders']) and len(x['top']['holders']) == min(4, len(used))
elsewhere = o['cached'] - x['free']
spill = -(-max(0, x['block_bytes'] - elsewhere) // (2 << 20)) * (2 << 20)
fits = o['device_free'] + x['bytes'] >= -(-o['block'] // (2 << 20)) * (2 << 20) + spill
print(x['segments'] >= 1, x['free'] + x['block_bytes'] == x['bytes'], x['free'] > 0,
      g['size'] == x['top']['size'] and sum(used.values()) == x['top']['used'] <= g['size'] // 8, holders,
      x['would_fit'] == fits == True)")
check "fragmentation: the stranded memory, its holders (as listed) and the would-fit claim check out ($stranded)" \
    '[ "$stranded" = "True True True True True True" ]'
python3 -c "
import json
r = json.load(open('$tmp/frag.json'))
r['devices'][0]['oom']['stranded']['free'] += 1
json.dump(r, open('$tmp/frag-bad.json', 'w'))
r = json.load(open('$tmp/frag.json'))
del r['devices'][0]['oom']['stranded']
json.dump(r, open('$tmp/frag-old.json', 'w'))"
out=$("$report_tool" "$tmp/frag-bad.json" 2>&1); rc=$?
check "cuheap-report refuses a stranded record whose bytes do not add up (rc $rc: $out)" \
    '[ $rc -eq 1 ] && echo "$out" | grep -q "stranded"'
"$report_tool" --json "$tmp/frag.json" -o "$tmp/frag-again.json" && "$report_tool" --json "$tmp/frag-old.json" -o "$tmp/frag-old-again.json"
rc=$?
kept=$(python3 -c "
import json
o = lambda p: json.load(open(p))['devices'][0]['oom']
print(o('$tmp/frag.json')['stranded'] == o('$tmp/frag-again.json')['stranded'], 'stranded' not in o('$tmp/frag-old-again.json'))")
check "cuheap-report keeps the stranded record, and a report written before it renders again without one (rc $rc, $kept)" \
    '[ $rc -eq 0 ] && [ "$kept" = "True True" ] && ! "$report_tool" "$tmp/frag-old.json" | grep -q "stranded:"'
partial=$(python3 -c "
import json
d = json.load(open('$tmp/pages.json'))['devices'][0]
o, g = d['oom'], [g for g in d['segments'] if g['virtual']][0]
page = g['page_size']
mapped = set()
for a, n in g['mapped_runs']:
    mapped.update(range((a - g['base']) // page, (a + n - g['base']) // page))
pages, free = set(), 0
for e in g['extents']:
    if e['kind'] != 'free':
        continue
    for p in sorted({(e['addr'] - g['base']) // page, (e['addr'] + e['size'] - 1 - g['base']) // page}):
        lo, hi = g['base'] + p * page, g['base'] + (p + 1) * page
        if p in mapped and not (e['addr'] <= lo and hi <= e['addr'] + e['size']):
            pages.add(p)
            free += min(hi, e['addr'] + e['size']) - max(lo, e['addr'])
print(o['cause'], o['partial_pages'] == {'pages': len(pages), 'free': free}, len(pages) > 0,
      'partial_pages' not in json.load(open('$tmp/frag.json'))['devices'][0]['oom'])")
check "vmm:1: the OOM record's free bytes in partly used pages, recomputed from the segment ($partial)" \
    '[ "$partial" = "fragmentation True True True" ] && grep -q "in partly used pages: .* free in [0-9]* pages that blocks partly use" $tmp/pages.txt'
"$report_tool" --json "$tmp/pages.json" -o "$tmp/pages-again.json"
check "cuheap-report keeps partial_pages when it writes a report again" 'cmp -s "$tmp/pages.json" "$tmp/pages-again.json"'
python3 -c "
import json
r = json.load(open('$tmp/pages.json'))
o = r['devices'][0]['oom']
o['partial_units'] = {'units': 1, 'free': o['cached'] - o['partial_pages']['free'] + 1}
json.dump(r, open('$tmp/units-bad.json', 'w'))"
out=$("$report_tool" "$tmp/units-bad.json" 2>&1); rc=$?
check "vmm:1: the OOM record has partial_units; cuheap-report refuses one whose bytes exceed the cached (rc $rc: $out)" \
    '[ $rc -eq 1 ] && echo "$out" | grep -q "partial_units: .* free bytes in 1 units do not fit the record" && grep -q "\"partial_units\":{\"units\":" "$tmp/pages.json"'

# Every report marks the segments that strand memory, as the record counts
# them: at the OOM, the marked segments are those of the record's totals.
marked=$(python3 -c "
import json, re
d = json.load(open('$tmp/frag.json'))['devices'][0]
mostly_empty = [g['base'] for g in d['segments'] if not g['workspace'] and not g['virtual'] and
                0 < sum(e['size'] for e in g['extents'] if e['kind'] != 'free') <= g['size'] // 8]
text = [int(m, 16) for m in re.findall(r'^    0x([0-9a-f]+) .*; stranded$', open('$tmp/frag.txt').read(), re.M)]
html = [int(m, 16) for m in re.findall(r'0x([0-9a-f]+) [^<]* <span class=stranded>', open('$tmp/frag.html').read())]
print(len(mostly_empty) == d['oom']['stranded']['segments'] and mostly_empty == text == html)")
check "text and HTML mark exactly the segments at most 1/8 used, those the OOM record counts ($marked)" '[ "$marked" = True ]'
n_stranded=$(python3 -c "import json; print(json.load(open('$tmp/frag.json'))['devices'][0]['oom']['stranded']['segments'])")
check "the summary line counts the stranded segments ($n_stranded)" \
    'grep -q "^  fragmentation: .*; stranded [0-9.]* [KMG]iB in $n_stranded mostly empty segments\?$" $tmp/frag.txt &&
     grep -q "<span class=stranded>stranded</span> [0-9.]* [KMG]iB in $n_stranded mostly empty segments\?" $tmp/frag.html'
check "the text and HTML reports show the stranded memory and its holders" \
    'grep -q "stranded: .* free in [0-9]* mostly empty segment.*the request would have fit" $tmp/frag.txt &&
     grep -q "the most in 0x[0-9a-f]* (.*): [0-9]* block" $tmp/frag.txt &&
     grep -q "<b>Stranded:</b> .* block.*: 0x[0-9a-f]* ([0-9.]* [KMG]iB)" $tmp/frag.html'
"$replay" --conf vmm:1 --capacity 26.4G --report "$tmp/vmm.txt" bench/traces/gpt2.trace.gz >/dev/null
moves=$(python3 -c "
import json
g = [g for g in json.load(open('$tmp/vmm.json'))['devices'][0]['segments'] if g['virtual']][0]
print(g['page_size'] == 2 << 20 and g['page_maps'] >= g['page_moves'] > 0 and g['mapped'] <= g['page_maps'] * g['page_size'])")
check "vmm:1 at 26.4 GiB: the report counts the pages mapped and moved (the device calls the replay made)" \
    '[ "$moves" = True ] && grep -q "of them moved from free memory" $tmp/vmm.txt'
# Under vmm:1 the reservation's mapped ranges: in order, inside it, adding up
# to its mapped bytes, and every block on them (a block never lacks a page).
runs=$(python3 -c "
import json
g = [g for g in json.load(open('$tmp/vmm.json'))['devices'][0]['segments'] if g['virtual']][0]
runs = g['mapped_runs']
ordered = all(a[0] + a[1] <= b[0] for a, b in zip(runs, runs[1:]))
inside = all(g['base'] <= r[0] and r[0] + r[1] <= g['base'] + g['size'] for r in runs)
def on_runs(x):
    return any(r[0] <= x['addr'] and x['addr'] + x['size'] <= r[0] + r[1] for r in runs)
used = [x for x in g['extents'] if x['kind'] != 'free']
print(len(runs) > 0 and ordered and inside and sum(r[1] for r in runs) == g['mapped'] and len(used) > 0
      and all(map(on_runs, used)))")
check "vmm:1: mapped_runs are ordered, inside the reservation, add up to mapped, and hold every block" '[ "$runs" = True ]'
# The HTML page washes out, over the reservation's bar, each stretch of
# address space between its mapped ranges: as many as the JSON's ranges
# leave, within the part of the bar drawn (up to the last used extent).
"$replay" --conf vmm:1 --capacity 26.4G --report "$tmp/vmm.html" bench/traces/gpt2.trace.gz >/dev/null
gaps=$(python3 -c "
import json
g = [g for g in json.load(open('$tmp/vmm.json'))['devices'][0]['segments'] if g['virtual']][0]
last = g['extents'][-1]
end = (last['addr'] if last['kind'] == 'free' else g['base'] + g['size'])
at, gaps = g['base'], 0
for addr, size in g['mapped_runs'] + [[end, 0]]:
    gaps += min(addr, end) > at
    at = addr + size
    if at >= end:
        break
print(gaps)")
drawn=$(grep -o 'class="unmapped"' "$tmp/vmm.html" | wc -l)
check "vmm:1 HTML: every unmapped stretch of the reservation is washed out ($drawn drawn, $gaps in the JSON)" \
    '[ "$gaps" -gt 0 ] && [ "$drawn" -eq "$gaps" ] && grep -q "no memory behind it (vmm:1)" "$tmp/vmm.html"'
nruns=$(python3 -c "
import json
print([len(g['mapped_runs']) for g in json.load(open('$tmp/vmm.json'))['devices'][0]['segments'] if g['virtual']][0])")
check "vmm:1 text report: the mapped bytes lie in as many ranges as the JSON lists ($nruns)" \
    'grep -q "mapped ($nruns ranges) in pages of" "$tmp/vmm.txt"'
"$report_tool" --json "$tmp/vmm.json" -o "$tmp/vmm-again.json"
same=$(python3 -c "
import json
runs = lambda p: [g.get('mapped_runs') for g in json.load(open(p))['devices'][0]['segments']]
print(runs('$tmp/vmm.json') == runs('$tmp/vmm-again.json'))")
check "cuheap-report keeps mapped_runs when it writes a report again" '[ "$same" = True ]'
python3 -c "
import json
r = json.load(open('$tmp/vmm.json'))
g = [g for g in r['devices'][0]['segments'] if g['virtual']][0]
g['mapped_runs'][0][1] += 2 << 20
json.dump(r, open('$tmp/vmm-bad.json', 'w'))"
out=$("$report_tool" "$tmp/vmm-bad.json" 2>&1); rc=$?
check "cuheap-report refuses mapped_runs that do not add up to mapped (rc $rc: $out)" \
    '[ $rc -eq 1 ] && echo "$out" | grep -q "mapped_runs"'
python3 -c "
import json
r = json.load(open('$tmp/vmm.json'))
for g in r['devices'][0]['segments']:
    g.pop('mapped_runs', None)
json.dump(r, open('$tmp/vmm-old.json', 'w'))"
"$report_tool" --json "$tmp/vmm-old.json" -o "$tmp/vmm-old-again.json" && "$report_tool" --json "$tmp/vmm-old-again.json" -o "$tmp/vmm-old-third.json"
rc=$?
absent=$(python3 -c "
import json
print(all('mapped_runs' not in g for g in json.load(open('$tmp/vmm-old-third.json'))['devices'][0]['segments']))")
check "a report written before mapped_runs renders again, twice, without them (rc $rc, absent: $absent)" \
    '[ $rc -eq 0 ] && [ "$absent" = True ]'
"$replay" --json --conf vmm:0 --capacity 26.4G --report "$tmp/waits.json" bench/traces/gpt2.trace.gz >"$tmp/waits.line"
waits=$(python3 -c "
import json
line = json.loads(open('$tmp/waits.line').readline())['device_calls']
st = json.load(open('$tmp/waits.json'))['devices'][0]['stats']
print(st['num_cpu_waits'] == line['cpu_waits'] + line['synchronizes'] > 0)")
check "num_cpu_waits is every CPU wait the replay made (the out-of-memory settled pending frees)" \
    '[ "$waits" = True ] && grep -q "CPU waits for the GPU [1-9]" $tmp/frag.txt'
long="$tmp/$(printf 'a%.0s' $(seq 1 300)).trace"
"$replay" --conf "trace:$long" --report "$tmp/long.txt" bench/traces/resnet50.trace.gz >/dev/null
check "the settings line of a report is whole: every key, a 300-character trace path last" \
    'grep "^settings: " $tmp/long.txt | grep -q "reuse_across_streams:0,.*pinned_chunk:[0-9]*,trace:$long\$"'
check "the text report names the cause and what would help" 'grep -q "cause fragmentation" $tmp/frag.txt && grep -q "what would help" $tmp/frag.txt'
# Steps: a trace's marks are the steps of its replay's reports (the library's
# own marks, cuheap_mark_step, are tested in test_api.c and test_heap_vmm.c).
# Every step's counts add up to the heap's totals when the last mark ends the
# trace; a report keeps the last 32 steps; cuheap-report reads them back the
# same and refuses steps that cannot be.
llama=bench/traces/corpus/llama_ckpt_plugin.trace.gz
"$replay" --way plugin --report "$tmp/steps.json" "$llama" >/dev/null
"$replay" --way plugin --report "$tmp/steps.txt" "$llama" >/dev/null
out=$(python3 "$tmp/validate.py" include/cuheap_report.schema.json "$tmp/steps.json")
check "a report with steps validates against the schema ($out)" '[ "$out" = valid ]'
sums=$(python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))['devices'][0]; st = d['steps']; seg = d['segments'][0]
tot = lambda k: sum(x[k] for x in st['last'])
print(st['marked'], len(st['last']), tot('page_maps') == seg['page_maps'] > 0, tot('page_moves') == seg['page_moves'] > 0,
      tot('map_calls') == seg['map_calls'] > 0,
      tot('device_allocs') == d['stats']['num_segment_allocs'], tot('cpu_waits') == d['stats']['num_cpu_waits'],
      st['most_maps']['page_maps'] == max(x['page_maps'] for x in st['last']))" "$tmp/steps.json")
marks=$(zcat "$llama" | grep -c '^# mark ')
check "every mark of the trace is a step, and the steps add up to the heap's totals ($sums; $marks marks)" \
    '[ "$sums" = "$marks $marks True True True True True True" ]'
check "the text report lists the steps and the busiest one" \
    'grep -q "steps marked: $marks" $tmp/steps.txt && grep -q "most pages mapped in one step" $tmp/steps.txt'
python3 -c "
import sys
print('# trace v1')
for i in range(40):
    print('# mark %d step %d' % (10 * i, i + 1))
    print('a %d %d 4194304 0' % (10 * i + 1, i + 1))
    print('f %d %d' % (10 * i + 2, i + 1))
print('# mark 400 end')" > "$tmp/forty.trace"
"$replay" --report "$tmp/forty.json" "$tmp/forty.trace" >/dev/null
kept=$(python3 -c "
import json, sys
st = json.load(open(sys.argv[1]))['devices'][0]['steps']
print(st['marked'], [x['index'] for x in st['last']] == list(range(10, 42)))" "$tmp/forty.json")
check "41 marks: the report keeps the last 32 steps, in order ($kept)" '[ "$kept" = "41 True" ]'
"$report_tool" --json "$tmp/steps.json" > "$tmp/steps2.json"
check "cuheap-report reads the steps back the same" 'cmp -s "$tmp/steps.json" "$tmp/steps2.json"'
for broken in "st['last'][3]['index'] = 7|where step 4 belongs" \
    "st['last'][2]['page_moves'] = 99999|a moved page is a mapped one" \
    "st['last'][2]['page_maps'] = 5; st['last'][2]['page_moves'] = 0; st['last'][2]['map_calls'] = 0|in no map call" \
    "st['last'][1]['seconds'] = -1|a negative time" \
    "st['most_maps']['index'] = 12; st['most_maps']['page_moves'] = 0|after the last step marked" \
    "st['most_maps'] = None|null, but step" \
    "st['last'] = st['last'] * 4; st['marked'] = 44|at most 32"; do
    python3 -c "
import json, sys
r = json.load(open(sys.argv[1])); st = r['devices'][0]['steps']
exec(sys.argv[2])
json.dump(r, open(sys.argv[3], 'w'))" "$tmp/steps.json" "${broken%%|*}" "$tmp/broken.json"
    said=$("$report_tool" "$tmp/broken.json" 2>&1 >/dev/null)
    check "cuheap-report refuses steps that cannot be (${broken%%|*}): $said" \
        '[ -n "$said" ] && [[ "$said" == *"${broken##*|}"* ]] && [[ "$said" == *"steps"* ]]'
done
python3 -c "
import json, sys
r = json.load(open(sys.argv[1])); del r['devices'][0]['steps']; json.dump(r, open(sys.argv[2], 'w'))" "$tmp/steps.json" "$tmp/older.json"
check "a report from before steps were marked is read (no steps section)" \
    '"$report_tool" "$tmp/older.json" > "$tmp/older.txt" && ! grep -q "steps marked" "$tmp/older.txt"'
python3 -c "
import json, sys
r = json.load(open(sys.argv[1])); st = r['devices'][0]['steps']
for x in st['last'] + [st['most_maps']]:
    del x['map_calls']
json.dump(r, open(sys.argv[2], 'w'))" "$tmp/steps.json" "$tmp/nocalls.json"
check "a report from before steps counted map calls is read" \
    '"$report_tool" "$tmp/nocalls.json" > "$tmp/nocalls.txt" && grep -q "map calls" "$tmp/nocalls.txt"'
calls=$(python3 -c "
import json, sys
st = json.load(open(sys.argv[1]))['devices'][0]['steps']
print(all(0 < x['map_calls'] for x in st['last'] if x['page_maps']), sum(x['map_calls'] for x in st['last']) > 0)" "$tmp/steps.json")
check "each step that mapped pages counts its map calls ($calls)" '[ "$calls" = "True True" ]'
check "the HTML page loads nothing from outside" '! grep -Eqi "(src|href)=|https?:|<script|@import|url\(" $tmp/frag.html'

# Render both pages; decode the PNGs with the standard library.
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
    not_ok "chromium is not installed (make test installs it)"
else
    for page in frag ok; do
        timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
            --disable-background-networking --disable-component-update --disable-sync \
            --user-data-dir="$tmp/profile-$page" --window-size=1100,900 --screenshot="$tmp/$page.png" \
            "file://$tmp/$page.html" >/dev/null 2>&1
    done
    cat > "$tmp/png.py" <<'PY'
import struct, sys, zlib
def pixels(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
            bpp = {2: 3, 6: 4}[color]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line); prev = line
    return [tuple(r[x * bpp:x * bpp + 3]) for r in rows for x in range(w)]
px = pixels(sys.argv[1])
colors = len(set(px))
panel = sum(1 for p in px if abs(p[0] - 253) <= 2 and abs(p[1] - 242) <= 2 and abs(p[2] - 240) <= 2)
print(colors, panel)
PY
    read -r colors panel < <(python3 "$tmp/png.py" "$tmp/frag.png" 2>/dev/null || echo "0 0")
    check "the OOM page renders, not blank ($colors colours)" '[ "$colors" -gt 20 ]'
    check "the OOM page shows the out-of-memory panel ($panel panel pixels)" '[ "$panel" -gt 20000 ]'
    read -r colors panel < <(python3 "$tmp/png.py" "$tmp/ok.png" 2>/dev/null || echo "0 0")
    check "the page without OOM renders ($colors colours) and has no panel ($panel)" '[ "$colors" -gt 20 ] && [ "$panel" -lt 100 ]'
fi
finish test_report
