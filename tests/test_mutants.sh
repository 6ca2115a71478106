#!/usr/bin/env bash
# test_mutants.sh BUILD_DIR - the faults fuzz target must catch the heap's
# mistakes in handling a failed device call. Each mutant below breaks one
# such rule in a copy of one source file (a rollback skipped, an error
# swallowed, a lost device served); the script builds fuzz_faults against
# the library with that file replaced and replays the target's corpus and
# regressions (tests/fuzz/corpus/faults.tar.gz, tests/fuzz/regressions/
# faults). A mutant that passes them is a rule nobody tests: the test fails.
# A mutant whose text is no longer in its file fails the test too (the
# source changed: update the mutant, do not drop it).
#
# Plain build only (BUILD_DIR/obj and BUILD_DIR/libcuheap.a); the
# sanitized run skips it. MUTANT_TOOL_OBJS, set by the Makefile, names the
# tools' objects the target links.
set -uo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
case "$build" in
    */san | */tsan) echo "test_mutants: plain build only, skipped for $build"; exit 0 ;;
esac
if [ -z "${MUTANT_TOOL_OBJS:-}" ] || [ ! -f "$build/libcuheap.a" ]; then
    echo "test_mutants: run it through make test (MUTANT_TOOL_OBJS unset or $build/libcuheap.a missing)"
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
tar -C "$work/corpus" -xzf tests/fuzz/corpus/faults.tar.gz || exit 1
inputs=("$work/corpus")
[ -d tests/fuzz/regressions/faults ] && inputs+=(tests/fuzz/regressions/faults)

CFLAGS=(-std=c11 -D_GNU_SOURCE -Iinclude -Isrc -pthread -O1 -fPIC -fvisibility=hidden)
passed=0; failed=0

# mutant NAME FILE OLD NEW: FILE with OLD (found exactly once) replaced by NEW.
mutant() {
    local name=$1 file=$2 old=$3 new=$4
    local text
    text=$(<"$file")
    if [[ "$text" != *"$old"* || "${text#*"$old"}" == *"$old"* ]]; then
        echo "test_mutants: $name: its text is not in $file once (update the mutant)"
        failed=$((failed + 1))
        return
    fi
    local dir="$work/$name"
    mkdir -p "$dir"
    printf '%s\n' "${text/"$old"/"$new"}" > "$dir/$(basename "$file")"
    cp "$build/libcuheap.a" "$dir/libcuheap.a"
    local obj
    obj="$dir/$(basename "$file" .c).o"
    # -iquote src: the copy's own #include "x.h" finds the originals.
    if ! cc "${CFLAGS[@]}" -iquote src -c "$dir/$(basename "$file")" -o "$obj" ||
       ! ar r "$dir/libcuheap.a" "$obj" 2>/dev/null ||
       ! cc "${CFLAGS[@]}" -DFUZZ_MAIN -Itests/fuzz -o "$dir/fuzz_faults" tests/fuzz/fuzz_faults.c \
            $MUTANT_TOOL_OBJS "$dir/libcuheap.a" -lz -ldl -lm; then
        echo "test_mutants: $name: does not build"
        failed=$((failed + 1))
        return
    fi
    local rc=0
    # (the shell's own "Aborted" line, for a rule the target found broken, is not news)
    { "$dir/fuzz_faults" "${inputs[@]}" > "$dir/log" 2>&1 || rc=$?; } 2>/dev/null
    if [ "$rc" -eq 0 ]; then
        echo "test_mutants: $name: survived (the faults corpus does not catch it)"
        failed=$((failed + 1))
    else
        echo "test_mutants: $name: caught: $(grep -m1 -E '^fuzz_heap: |ERROR' "$dir/log" | cut -c1-200)"
        passed=$((passed + 1))
    fi
}

# A map that failed after its physical unit was created or moved: the unit must go
# back to the device (and out of the heap's count).
mutant map-rollback-skipped src/heap_pages.c \
'            unit_release_locked(h, u->handle, u->pages);
            *why = GROW_ERROR;' \
'            *why = GROW_ERROR;'

# An event that could not be recorded behind a stream's frees: the heap must
# wait for the device instead, not trust the event.
mutant fence-record-error-swallowed src/heap_streams.c \
'    if (h->dev->ops->event_record(h->dev, ev, st->handle) != CUH_DEV_OK) {
        cuh_hp_event_put_locked(h, ev);
        goto fallback;
    }' \
'    (void)h->dev->ops->event_record(h->dev, ev, st->handle);'

# A fence whose query failed: not a completed fence.
mutant fence-query-error-taken-as-done src/heap_streams.c \
'        if (rc != CUH_DEV_OK) {
            failed = 1;
            break;
        }' \
'        (void)failed;'

# An event that cannot be waited for: the device is waited for instead.
mutant event-wait-error-swallowed src/heap_streams.c \
'    if (h->dev->ops->event_wait(h->dev, e) == CUH_DEV_OK)
        return CUH_DEV_OK;' \
'    (void)h->dev->ops->event_wait(h->dev, e);
    return CUH_DEV_OK;'

# A segment the driver would not take back stays in the books.
mutant refused-segment-free-dropped src/heap_segments.c \
'        cuh_log("device %d: returning a segment of %zu bytes failed, kept: %s", h->dev->ordinal, s->size,
                cuh_dev_error_text(h->dev));
        return 0;' \
'        cuh_arena_remove_segment(&h->arena, s);
        return 1;'

# A device that met a sticky error serves no allocation.
mutant lost-device-served src/heap.c \
'    *addr = 0;
    if (cuh_unlikely(atomic_load_explicit(&h->dev->lost, memory_order_relaxed)))
        return refuse_lost(h);' \
'    *addr = 0;'

echo "test_mutants: $passed caught, $failed not"
[ "$failed" -eq 0 ]
