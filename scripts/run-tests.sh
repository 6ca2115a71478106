#!/usr/bin/env bash
# run-tests.sh BUILD_DIR LABEL TEST... - runs every unit test binary and the
# command-line tests against the tools in BUILD_DIR (with UNIT_ONLY=1 the
# unit tests only), then prints one summary line. Exits non-zero if anything
# failed.
set -uo pipefail
build=$1; label=$2; shift 2
passed=0; failed=0; failed_names=()
for t in "$@"; do
    if "$build/tests/$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); failed_names+=("$t"); fi
done
for t in tests/test_*.sh; do
    [ -e "$t" ] && [ "${UNIT_ONLY:-0}" != 1 ] || continue
    if bash "$t" "$build"; then passed=$((passed + 1)); else failed=$((failed + 1)); failed_names+=("$t"); fi
done
[ "$failed" -eq 0 ] || echo "$label: failed: ${failed_names[*]}"
echo "$label: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
