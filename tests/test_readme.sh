#!/usr/bin/env bash
# test_readme.sh BUILD_DIR - the README stays true: its CUHEAP_CONF table is
# exactly what the code's option table prints (cuheap-replay --settings), its
# first set-up commands are make demo and make test, and .ci/run runs the
# README's test command.
set -uo pipefail
build=${1:-build}
[ -x "$build/cuheap-replay" ] || build=build
. "$(dirname "$0")/harness.sh"

table=$("$build/cuheap-replay" --settings)
check "README carries the settings table exactly as the code prints it" \
    'python3 -c "import sys; sys.exit(0 if sys.argv[1] in open(\"README.md\").read() else 1)" "$table"'
keys=$(echo "$table" | awk -F'`' 'NR>2 {print $2}')
for k in $keys; do
    check "README mentions key $k" 'grep -q "\`$k\`" README.md'
done
check "the first commands in README are make demo and make test" \
    '[ "$(grep -m2 -oE "^make (demo|test)" README.md | tr "\n" " ")" = "make demo make test " ]'
check ".ci/run runs make test" 'grep -q "^make test" .ci/run'
repeated=$(grep -E "^#{2,3} " README.md | sort | uniq -d)
check "every heading of README appears once (repeated: $repeated)" '[ -z "$repeated" ]'
check "README carries one settings table" '[ "$(grep -c "^| key | default | meaning |" README.md)" = 1 ]'
finish test_readme
