#!/usr/bin/env bash
# fuzz.sh [BUILD] - what `make fuzz` runs: builds every target of tests/fuzz
# with clang's libFuzzer, AddressSanitizer and UBSan, and runs each for
# FUZZ_SECONDS (default 60) on its corpus, then prints one table.
#
#   heap    random operations on the heap and the simulated GPU, every rule
#           of DESIGN.md checked after each step (tests/fuzz/fuzz_heap.c)
#   faults  the same under fault plans: device calls fail on purpose, one,
#           at random or sticky from some call on (tests/fuzz/fuzz_faults.c)
#   trace   trace files (cuheap's format, gzip, RMM's CSV)
#   json    the JSON reader
#   config  CUHEAP_CONF strings
#   report  JSON reports given to cuheap-report
#
# FUZZ_TARGETS picks targets (default every tests/fuzz/fuzz_*.c,
# comma-separated); FUZZ_SOURCES, set by the Makefile, names the library's
# and the tools' sources the targets link. Each corpus
# starts from tests/fuzz/corpus/TARGET.tar.gz and the inputs of
# tests/fuzz/regressions/TARGET, and grows in BUILD/fuzz/corpus/TARGET
# (FUZZ_SAVE=1 writes its smallest equivalent back into the tarball);
# an input that breaks a rule is written to BUILD/fuzz/artifacts/TARGET/ and
# the script exits 1. To see what such an input does, step by step:
#   FUZZ_HEAP_VERBOSE=1 BUILD/fuzz/libfuzzer/fuzz_heap FILE
# and to keep it as a regression test, copy it into tests/fuzz/regressions/
# TARGET under a name that says what broke (`make test` replays every
# corpus and every regression, with and without the sanitizers).
set -euo pipefail
BUILD="${1:-build}"
cd "$(dirname "$0")/.."
SECONDS_EACH="${FUZZ_SECONDS:-60}"
if [ -z "${FUZZ_SOURCES:-}" ]; then
    echo "fuzz.sh: run it as make fuzz (the Makefile names the sources to build)" >&2
    exit 2
fi
all_targets=$(ls tests/fuzz/fuzz_*.c | sed 's|tests/fuzz/fuzz_||; s|\.c$||' | paste -sd,)
IFS=, read -r -a targets <<< "${FUZZ_TARGETS:-$all_targets}"

scripts/install-deps.sh fuzz

out="$BUILD/fuzz/libfuzzer"
mkdir -p "$out/obj"
CFLAGS=(-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Iinclude -Isrc -Itests/fuzz
        -isystem "$BUILD/jemalloc-5.3.0/include" -pthread)
SAN=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
objs=()
for src in $FUZZ_SOURCES; do
    obj="$out/obj/$(basename "$src" .c).o"
    if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$(find src -name '*.h' -newer "$obj")" ]; then
        clang "${CFLAGS[@]}" "${SAN[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
    fi
    objs+=("$obj")
done

rc=0
rows=()
for t in "${targets[@]}"; do
    clang "${CFLAGS[@]}" "${SAN[@]}" -fsanitize=fuzzer "tests/fuzz/fuzz_$t.c" "${objs[@]}" \
        "$BUILD/jemalloc-5.3.0/lib/libjemalloc_pic.a" -lz -ldl -lm -o "$out/fuzz_$t"
    corpus="$BUILD/fuzz/corpus/$t"
    artifacts="$BUILD/fuzz/artifacts/$t"
    mkdir -p "$corpus" "$artifacts"
    tar -C "$corpus" -xzf "tests/fuzz/corpus/$t.tar.gz"
    [ -d "tests/fuzz/regressions/$t" ] && cp tests/fuzz/regressions/"$t"/* "$corpus"/
    case "$t" in
        heap|faults) max_len=4096 ;;
        report) max_len=80000 ;;
        *) max_len=8192 ;;
    esac
    log="$BUILD/fuzz/$t.log"
    echo "fuzz: $t for $SECONDS_EACH s (log: $log)"
    stamp="$BUILD/fuzz/$t.start"
    touch "$stamp"   # inputs written before this run are not this run's findings
    status=0
    extra=()
    [ "$t" = report ] && extra=(-close_fd_mask=2)   # the tool's refusals; crash reports still show
    # A heap input is a run of operations: long ones from the start, where
    # libFuzzer would grow the length limit slowly (the states worth reaching
    # take hundreds of operations).
    case "$t" in heap|faults) extra=(-len_control=0) ;; esac
    "$out/fuzz_$t" -max_total_time="$SECONDS_EACH" -max_len="$max_len" "${extra[@]}" \
        -artifact_prefix="$artifacts/" "$corpus" > "$log" 2>&1 || status=$?
    runs=$(grep -o 'Done [0-9]* runs' "$log" | grep -o '[0-9]*' || echo "?")
    found=$(find "$artifacts" -type f -newer "$stamp" | wc -l)
    if [ "$status" -ne 0 ]; then
        rc=1
        grep -m1 -E 'fuzz_heap:|ERROR: ' "$log" || true
    fi
    rows+=("| $t | $SECONDS_EACH | $runs | $(ls "$corpus" | wc -l) | $found | $status |")
    if [ "${FUZZ_SAVE:-0}" = 1 ]; then
        # The corpus kept in the tree: the fewest inputs that reach what this
        # one reaches, those of 8 KiB or less.
        rm -rf "$corpus.min" && mkdir -p "$corpus.min"
        "$out/fuzz_$t" -merge=1 -close_fd_mask=2 "$corpus.min" "$corpus" >/dev/null 2>&1
        find "$corpus.min" -type f -size +8k -delete
        tar -C "$corpus.min" --sort=name --mtime=@0 --owner=0 --group=0 -cf - . | gzip -n -9 \
            > "tests/fuzz/corpus/$t.tar.gz"
        echo "fuzz: tests/fuzz/corpus/$t.tar.gz now holds $(ls "$corpus.min" | wc -l) inputs"
    fi
done

printf '\n| target | seconds | runs | corpus | inputs that broke a rule | exit |\n|---|---|---|---|---|---|\n'
printf '%s\n' "${rows[@]}"
exit $rc
