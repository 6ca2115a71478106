#!/usr/bin/env bash
# test_fuzz_corpus.sh BUILD_DIR - replays every fuzz target's inputs through
# the target built without libFuzzer (BUILD_DIR/fuzz/fuzz_TARGET): the inputs
# that once broke a rule (tests/fuzz/regressions/TARGET, one file each, named
# for what broke) and the corpus the fuzzers grew, which reaches the code
# they found (tests/fuzz/corpus/TARGET.tar.gz). A rule broken again fails the
# test with the target's message. Run by `make test` plain and under the
# sanitizers; `make fuzz` searches for new inputs.
set -uo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
passed=0; failed=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for src in tests/fuzz/fuzz_*.c; do
    t=$(basename "$src" .c)
    t=${t#fuzz_}
    mkdir -p "$work/$t"
    if ! tar -C "$work/$t" -xzf "tests/fuzz/corpus/$t.tar.gz" || [ -z "$(ls "$work/$t")" ]; then
        echo "test_fuzz_corpus: tests/fuzz/corpus/$t.tar.gz is missing or empty"
        failed=$((failed + 1))
        continue
    fi
    inputs=("$work/$t")
    [ -d "tests/fuzz/regressions/$t" ] && inputs+=("tests/fuzz/regressions/$t")
    if "$build/fuzz/fuzz_$t" "${inputs[@]}" >"$work/$t.log" 2>&1; then
        passed=$((passed + 1))
    else
        echo "test_fuzz_corpus: $t: an input broke a rule:"
        grep -v '^cuheap-report: ' "$work/$t.log" | tail -n 20
        echo "(FUZZ_HEAP_VERBOSE=1 $build/fuzz/fuzz_heap INPUT shows a heap input step by step)"
        failed=$((failed + 1))
    fi
done
echo "test_fuzz_corpus: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
