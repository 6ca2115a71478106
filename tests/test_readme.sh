#!/usr/bin/env bash
# test_readme.sh BUILD_DIR - the README and docs/ stay true: docs/settings.md
# is what scripts/settings-doc.sh writes from the code's option table
# (cuheap-replay --settings), so it carries that table exactly and names every
# key; the README stays short, its first set-up commands are make demo and
# make test, and .ci/run runs the README's test command; every relative link
# in README.md and docs/*.md reaches a file that exists, and every #anchor a
# heading of that file; no page repeats a heading (an anchor would be
# ambiguous).
set -uo pipefail
build=${1:-build}
[ -x "$build/cuheap-replay" ] || build=build
. "$(dirname "$0")/harness.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

table=$("$build/cuheap-replay" --settings)
scripts/settings-doc.sh "$build" >"$TMP/settings.md"
check "docs/settings.md is what scripts/settings-doc.sh writes (run make settings-doc): $(diff docs/settings.md "$TMP/settings.md" | head -3)" \
    'cmp -s docs/settings.md "$TMP/settings.md"'
check "docs/settings.md carries the settings table exactly as the code prints it" \
    'python3 -c "import sys; sys.exit(0 if sys.argv[1] in open(\"docs/settings.md\").read() else 1)" "$table"'
keys=$(echo "$table" | awk -F'`' 'NR>2 {print $2}')
check "the code prints a table of settings (got $(echo $keys | wc -w) keys)" '[ "$(echo $keys | wc -w)" -ge 10 ]'
for k in $keys; do
    check "docs/settings.md mentions key $k" 'grep -q "\`$k\`" docs/settings.md'
done
check "one settings table in README.md and docs/ (in docs/settings.md)" \
    '[ "$(cat README.md docs/*.md | grep -c "^| key | default | meaning |")" = 1 ] && grep -q "^| key | default | meaning |" docs/settings.md'

size=$(wc -c <README.md)
check "README.md is under 25,000 bytes (got $size)" '[ "$size" -lt 25000 ]'
check "the first commands in README are make demo and make test" \
    '[ "$(grep -m2 -oE "^make (demo|test)" README.md | tr "\n" " ")" = "make demo make test " ]'
check ".ci/run runs make test" 'grep -q "^make test" .ci/run'
for page in README.md docs/*.md; do
    repeated=$(grep -E "^#{1,4} " "$page" | sort | uniq -d)
    check "every heading of $page appears once (repeated: $repeated)" '[ -z "$repeated" ]'
done

# Links: [text](target) and ![alt](target) outside code, relative targets
# only; an anchor must be the slug of a heading of the target, as GitHub
# makes it (lower case, punctuation dropped, spaces to hyphens).
links=$(python3 - README.md docs/*.md <<'PY'
import os, re, sys

def slugs(path):
    out, fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"#{1,6} +(.*?) *#* *$", line)
        if m:
            s = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n, base = 1, s
            while s in out:
                s, n = "%s-%d" % (base, n), n + 1
            out.add(s)
    return out

count = 0
for page in sys.argv[1:]:
    fence = False
    for no, line in enumerate(open(page, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):
                continue
            count += 1
            file, _, anchor = target.partition("#")
            path = os.path.normpath(os.path.join(os.path.dirname(page), file)) if file else page
            where = "%s:%d: %s" % (page, no, target)
            if not os.path.exists(path) or os.path.relpath(path).startswith(".."):
                print("BROKEN " + where + " (no such file)")
            elif anchor and (not path.endswith(".md") or anchor not in slugs(path)):
                print("BROKEN " + where + " (no such heading)")
print("checked %d" % count)
PY
)
broken=$(echo "$links" | grep '^BROKEN' || true)
checked=$(echo "$links" | sed -n 's/^checked //p')
check "README.md and docs/*.md have relative links to check (got ${checked:-none})" '[ "${checked:-0}" -gt 20 ]'
check "every relative link in README.md and docs/*.md resolves, anchors included: $broken" '[ -z "$broken" ]'
for page in docs/*.md; do
    check "README.md links to $page" 'grep -q "(${page}[)#]" README.md'
done
finish test_readme
