/* test_torch_model.c - the model of PyTorch's CUDA caching allocator.
 *
 * Small traces built in memory, each aimed at one rule of torch_model.c:
 * rounding and segment sizes, the split thresholds, best fit, streams, the
 * release and retry at a full device, expandable segments' pages, the order
 * in which they are taken and their unmapping on release, and the search for
 * the smallest device. The bundled traces check the model as a whole against
 * what PyTorch reserved on an H200 (tests/test_replay_cli.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "torch_model.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define MAX_EVENTS 64

/* A trace under construction: alloc(id, size, stream) and release(id). */
typedef struct builder_s {
    cuh_trace_t t;
    cuh_trace_event_t ev[MAX_EVENTS];
    uint64_t live;
} builder_t;

static void start(builder_t *b)
{
    memset(b, 0, sizeof *b);
    b->t.events = b->ev;
    b->t.path = (char *)"test";
}

static void alloc_on(builder_t *b, uint64_t id, uint64_t size, uint64_t stream)
{
    assert_true(b->t.num_events < MAX_EVENTS);
    b->ev[b->t.num_events] = (cuh_trace_event_t){.id = id, .size = size, .stream = stream,
                                                  .match = CUH_TRACE_NO_MATCH, .kind = CUH_TRACE_ALLOC};
    b->t.num_events++;
    b->t.num_allocs++;
    b->live += size;
    if (b->live > b->t.peak_live)
        b->t.peak_live = b->live;
}

static void alloc(builder_t *b, uint64_t id, uint64_t size) { alloc_on(b, id, size, 0); }

static void release(builder_t *b, uint64_t id)
{
    size_t a = b->t.num_events;
    while (a-- > 0)
        if (b->ev[a].kind == CUH_TRACE_ALLOC && b->ev[a].id == id && b->ev[a].match == CUH_TRACE_NO_MATCH)
            break;
    assert_true(a < b->t.num_events);
    assert_true(b->t.num_events < MAX_EVENTS);
    b->ev[a].match = b->t.num_events;
    b->ev[b->t.num_events] = (cuh_trace_event_t){.id = id, .size = b->ev[a].size, .stream = b->ev[a].stream,
                                                  .match = a, .kind = CUH_TRACE_FREE};
    b->t.num_events++;
    b->t.num_frees++;
    b->live -= b->ev[a].size;
}

/* The model on an 80 GiB device of which the process may have `usable`
 * bytes (the rest used by others): expandable ranges span 90 GiB. */
static cuh_torch_result_t run_model(builder_t *b, cuh_torch_mode_t mode, uint64_t usable)
{
    cuh_torch_result_t r;
    char err[256] = "";
    cuh_torch_device_t d = {.capacity = 80 * GiB, .external = 80 * GiB - usable};
    assert_int_equal(cuh_torch_model_run(&b->t, mode, &d, &r, err, sizeof err), 0);
    return r;
}

/* A job several tests share: 60 MiB freed, then 20 MiB kept (cutting what
 * the 60 left) and 50 MiB more. Native needs a 110 MiB device for it (the
 * 60 MiB segment cannot go back while the 20 MiB block is in it);
 * expandable segments need 80 (the free end grows by a page). */
static void cut_then_grow(builder_t *b)
{
    start(b);
    alloc(b, 1, 60 * MiB);
    release(b, 1);
    alloc(b, 2, 20 * MiB);
    alloc(b, 3, 50 * MiB);
}

/* cuh_torch_model_min_capacity for b on device d, after the run on d. */
static int min_capacity(builder_t *b, cuh_torch_mode_t mode, cuh_torch_device_t d, uint64_t *cap)
{
    cuh_torch_result_t top;
    char err[256];
    int found = 0;
    assert_int_equal(cuh_torch_model_run(&b->t, mode, &d, &top, err, sizeof err), 0);
    assert_int_equal(cuh_torch_model_min_capacity(&b->t, mode, &d, &top, 2 * MiB, cap, &found, err, sizeof err), 0);
    return found;
}

/* ---- native ---------------------------------------------------------------- */

static void test_segment_sizes(void **state)
{
    (void)state;
    builder_t b;
    start(&b);
    alloc(&b, 1, 10 * MiB);           /* 10 MiB and up: rounded to 2 MiB */
    alloc(&b, 2, 11 * MiB + 1);       /* 12 MiB */
    alloc(&b, 3, MiB + 1);            /* over 1 MiB, under 10: 20 MiB */
    alloc(&b, 4, 1);                  /* small pool: a 2 MiB segment */
    alloc(&b, 5, 0);                  /* nothing */
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_NATIVE, 80 * GiB);
    assert_int_equal(r.peak_reserved, (2 + 20 + 10 + 12) * MiB);
    assert_int_equal(r.device_allocs, 4);
    assert_false(r.oom);
}

static void test_small_blocks_share_a_segment(void **state)
{
    (void)state;
    builder_t b;
    start(&b);
    for (uint64_t i = 0; i < 4; i++)
        alloc(&b, i, 500 * 1024);     /* four 500 KiB blocks fit one 2 MiB segment */
    alloc(&b, 9, 100);                /* and a 512-byte one in what is left */
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_NATIVE, 80 * GiB);
    assert_int_equal(r.peak_reserved, 2 * MiB);
    assert_int_equal(r.device_allocs, 1);
}

static void test_native_split_threshold(void **state)
{
    (void)state;
    /* A 20 MiB segment for 6 MiB leaves 14 MiB free: the next 6 MiB fits. */
    builder_t b;
    start(&b);
    alloc(&b, 1, 6 * MiB);
    alloc(&b, 2, 6 * MiB);
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_NATIVE, 80 * GiB);
    assert_int_equal(r.peak_reserved, 20 * MiB);

    /* 11 MiB from a free 12 MiB segment leaves 1 MiB: no split in the large
     * pool (it must be more than 1 MiB), so a request for the rest needs a
     * segment of its own. */
    start(&b);
    alloc(&b, 1, 12 * MiB);
    release(&b, 1);
    alloc(&b, 2, 11 * MiB);
    alloc(&b, 3, MiB + 512);
    r = run_model(&b, CUH_TORCH_NATIVE, 80 * GiB);
    assert_int_equal(r.peak_reserved, (12 + 20) * MiB);
    assert_int_equal(r.device_allocs, 2);

    /* With expandable segments any 512 bytes left are split off. */
    r = run_model(&b, CUH_TORCH_EXPANDABLE, 80 * GiB);
    assert_int_equal(r.peak_reserved, 20 * MiB);
}

static void test_best_fit(void **state)
{
    (void)state;
    /* Free 30 MiB and 12 MiB segments: 11 MiB takes the 12 (no split: 1 MiB
     * left), so 29 MiB still finds the 30 and nothing grows. */
    builder_t b;
    start(&b);
    alloc(&b, 1, 30 * MiB);
    alloc(&b, 2, 12 * MiB);
    release(&b, 1);
    release(&b, 2);
    alloc(&b, 3, 11 * MiB);
    alloc(&b, 4, 29 * MiB);
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_NATIVE, 80 * GiB);
    assert_int_equal(r.peak_reserved, 42 * MiB);
    assert_int_equal(r.device_allocs, 2);
}

static void test_streams_do_not_share(void **state)
{
    (void)state;
    builder_t b;
    start(&b);
    alloc_on(&b, 1, 30 * MiB, 0);
    release(&b, 1);
    alloc_on(&b, 2, 30 * MiB, 7);     /* another stream: a segment of its own */
    alloc_on(&b, 3, 30 * MiB, 0);     /* the first stream's block again */
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_NATIVE, 80 * GiB);
    assert_int_equal(r.peak_reserved, 60 * MiB);
    assert_int_equal(r.device_allocs, 2);
}

static void test_native_release_and_retry(void **state)
{
    (void)state;
    /* On a 40 MiB device a freed 30 MiB segment goes back so 36 MiB fits. */
    builder_t b;
    start(&b);
    alloc(&b, 1, 30 * MiB);
    release(&b, 1);
    alloc(&b, 2, 36 * MiB);
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_NATIVE, 40 * MiB);
    assert_false(r.oom);
    assert_int_equal(r.releases, 1);
    assert_int_equal(r.peak_reserved, 36 * MiB);

    /* A segment that still holds a block cannot go back: 60 MiB is cut to
     * 20 MiB live and 40 MiB free, and 50 MiB does not fit in 100 MiB. */
    cut_then_grow(&b);
    r = run_model(&b, CUH_TORCH_NATIVE, 100 * MiB);
    assert_true(r.oom);
    assert_int_equal(r.oom_event, 3);
    assert_int_equal(r.oom_request, 50 * MiB);
    assert_int_equal(r.oom_reserved, 60 * MiB);
    assert_int_equal(r.oom_live, 20 * MiB);
    assert_int_equal(r.releases, 1);
    /* At 110 MiB it runs. */
    r = run_model(&b, CUH_TORCH_NATIVE, 110 * MiB);
    assert_false(r.oom);
    assert_int_equal(r.peak_reserved, 110 * MiB);
}

/* ---- expandable segments --------------------------------------------------- */

static void test_expandable_pages(void **state)
{
    (void)state;
    builder_t b;
    start(&b);
    alloc(&b, 1, 30 * MiB);           /* two pages of 20 MiB */
    alloc(&b, 2, 5 * MiB);            /* the 10 MiB left over */
    alloc(&b, 3, 100);                /* small pool: one page of 2 MiB */
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_EXPANDABLE, 80 * GiB);
    assert_int_equal(r.peak_reserved, 42 * MiB);
    assert_int_equal(r.device_allocs, 3);
}

static void test_expandable_takes_the_growing_block_last(void **state)
{
    (void)state;
    /* One page: A (9 MiB), B (4 MiB), and 7 MiB free at the end, just below
     * unmapped space. A is freed. A 7 MiB request fits the end block exactly,
     * but that block counts as large as it could grow, so PyTorch takes A
     * (9 MiB) instead; an 8 MiB request after it then fits nowhere and maps a
     * page. Plain best fit would have served both from the one page. */
    builder_t b;
    start(&b);
    alloc(&b, 1, 9 * MiB);
    alloc(&b, 2, 4 * MiB);
    release(&b, 1);
    alloc(&b, 3, 7 * MiB);
    alloc(&b, 4, 8 * MiB);
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_EXPANDABLE, 80 * GiB);
    assert_int_equal(r.peak_reserved, 40 * MiB);
    assert_int_equal(r.device_allocs, 2);

    /* Two free 5 MiB blocks, one in the middle and one at the end of the
     * mapped range: a 5 MiB request takes the middle one, and the end stays
     * whole for the 15 MiB after it. */
    start(&b);
    alloc(&b, 1, 5 * MiB);
    alloc(&b, 2, 10 * MiB);
    alloc(&b, 3, 5 * MiB);            /* one page: 5 + 10 + 5 = 20 MiB */
    alloc(&b, 4, 5 * MiB);            /* a second page, 15 MiB of it free */
    release(&b, 1);
    alloc(&b, 5, 5 * MiB);
    alloc(&b, 6, 15 * MiB);
    r = run_model(&b, CUH_TORCH_EXPANDABLE, 80 * GiB);
    assert_int_equal(r.peak_reserved, 40 * MiB);
    assert_int_equal(r.device_allocs, 2);
}

static void test_expandable_grows_from_a_free_end(void **state)
{
    (void)state;
    /* 60 MiB cut to 20 live and 40 free at the end: 50 MiB extends the free
     * end by one page instead of needing a segment of its own, so the job
     * fits in 80 MiB where native needs 110. */
    builder_t b;
    cut_then_grow(&b);
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_EXPANDABLE, 80 * MiB);
    assert_false(r.oom);
    assert_int_equal(r.peak_reserved, 80 * MiB);
    assert_int_equal(r.releases, 0);
}

static void test_expandable_release_unmaps_free_pages(void **state)
{
    (void)state;
    /* A (40 MiB) and B (40 MiB) fill 80 MiB of a 100 MiB device; A is freed.
     * 60 MiB needs three new pages: refused; the release unmaps A's two pages
     * and the retry maps three pages after B. */
    builder_t b;
    start(&b);
    alloc(&b, 1, 40 * MiB);
    alloc(&b, 2, 40 * MiB);
    release(&b, 1);
    alloc(&b, 3, 60 * MiB);
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_EXPANDABLE, 100 * MiB);
    assert_false(r.oom);
    assert_int_equal(r.releases, 1);
    assert_int_equal(r.peak_reserved, 100 * MiB);
    assert_int_equal(r.device_allocs, 2 + 2 + 3);

    /* The lowest run of free and unmapped space is tried first, as in
     * PyTorch, even where the end of the range would have done: on 120 MiB,
     * after the above, B and the 60 MiB block are freed (100 MiB free, mapped,
     * above A's unmapped 40). 110 MiB first tries the run from A's hole,
     * whose two pages the device refuses; the release unmaps everything, the
     * range goes back, and a new one maps six pages. Extending the free end
     * by one page would have fitted without a release. */
    start(&b);
    alloc(&b, 1, 40 * MiB);
    alloc(&b, 2, 40 * MiB);
    release(&b, 1);
    alloc(&b, 3, 60 * MiB);
    release(&b, 2);
    release(&b, 3);
    alloc(&b, 4, 110 * MiB);
    r = run_model(&b, CUH_TORCH_EXPANDABLE, 120 * MiB);
    assert_false(r.oom);
    assert_int_equal(r.releases, 2);
    assert_int_equal(r.peak_reserved, 120 * MiB);
    assert_int_equal(r.device_allocs, 2 + 2 + 3 + 6);
}

static void test_expandable_release_keeps_partial_pages(void **state)
{
    (void)state;
    /* A (5 MiB) stays; B (55 MiB) after it fills the first three pages and is
     * freed. On 70 MiB, 70 MiB more is refused; the release unmaps only the
     * two pages wholly inside B (the first page also holds A), and the retry,
     * from B's mapped 15 MiB head on, would need three pages again: out of
     * memory with 20 MiB reserved. */
    builder_t b;
    start(&b);
    alloc(&b, 1, 5 * MiB);
    alloc(&b, 2, 55 * MiB);
    release(&b, 2);
    alloc(&b, 3, 70 * MiB);
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_EXPANDABLE, 70 * MiB);
    assert_true(r.oom);
    assert_int_equal(r.releases, 1);
    assert_int_equal(r.oom_reserved, 20 * MiB);
    assert_int_equal(r.peak_reserved, 60 * MiB);
}

static void test_expandable_out_of_memory(void **state)
{
    (void)state;
    builder_t b;
    start(&b);
    alloc(&b, 1, 50 * MiB);           /* three pages: 60 MiB */
    alloc(&b, 2, 50 * MiB);           /* 10 MiB left plus 40 more: 100 MiB */
    alloc(&b, 3, 30 * MiB);           /* nothing free to unmap */
    cuh_torch_result_t r = run_model(&b, CUH_TORCH_EXPANDABLE, 100 * MiB);
    assert_true(r.oom);
    assert_int_equal(r.oom_event, 2);
    assert_int_equal(r.oom_request, 30 * MiB);
    assert_int_equal(r.oom_reserved, 100 * MiB);
}

static void test_memory_fraction(void **state)
{
    (void)state;
    /* set_per_process_memory_fraction refuses by a native segment's size
     * before any device call: with expandable segments 12 MiB after 30 MiB
     * needs one more page (10 MiB are free at the end of the two mapped), so
     * 60 MiB would be reserved, but it is refused at a limit of 51 MiB:
     * 40 reserved and a 12 MiB segment would pass it. */
    builder_t b;
    start(&b);
    alloc(&b, 1, 30 * MiB);           /* two pages: 40 MiB, 10 free at the end */
    alloc(&b, 2, 12 * MiB);           /* 2 MiB short: one more page */
    cuh_torch_device_t d = {.capacity = 80 * GiB, .limit = 60 * MiB};
    cuh_torch_result_t r;
    char err[256];
    assert_int_equal(cuh_torch_model_run(&b.t, CUH_TORCH_EXPANDABLE, &d, &r, err, sizeof err), 0);
    assert_false(r.oom);              /* 40 + 12 rounded (a 12 MiB segment) <= 60 */
    assert_int_equal(r.peak_reserved, 60 * MiB);
    d.limit = 51 * MiB;               /* 40 + 12 > 51: refused, though one page would fit */
    assert_int_equal(cuh_torch_model_run(&b.t, CUH_TORCH_EXPANDABLE, &d, &r, err, sizeof err), 0);
    assert_true(r.oom);
    assert_int_equal(r.oom_event, 1);
    /* Native: the same check is the device's own. */
    d.limit = 41 * MiB;
    assert_int_equal(cuh_torch_model_run(&b.t, CUH_TORCH_NATIVE, &d, &r, err, sizeof err), 0);
    assert_true(r.oom);
    assert_int_equal(r.oom_reserved, 30 * MiB);
    d.limit = 42 * MiB;
    assert_int_equal(cuh_torch_model_run(&b.t, CUH_TORCH_NATIVE, &d, &r, err, sizeof err), 0);
    assert_false(r.oom);
}

/* ---- the smallest device --------------------------------------------------- */

static void test_min_capacity(void **state)
{
    (void)state;
    builder_t b;
    cut_then_grow(&b);
    uint64_t cap = 0;
    assert_true(min_capacity(&b, CUH_TORCH_NATIVE, (cuh_torch_device_t){.capacity = GiB}, &cap));
    assert_int_equal(cap, 110 * MiB);
    assert_true(min_capacity(&b, CUH_TORCH_EXPANDABLE, (cuh_torch_device_t){.capacity = GiB}, &cap));
    assert_int_equal(cap, 80 * MiB);
    /* Not enough even at the top: nothing found. */
    assert_false(min_capacity(&b, CUH_TORCH_NATIVE, (cuh_torch_device_t){.capacity = 100 * MiB}, &cap));
    /* Others' memory counts: with 30 MiB used by others the device must be
     * 30 MiB larger. */
    assert_true(min_capacity(&b, CUH_TORCH_NATIVE, (cuh_torch_device_t){.capacity = GiB, .external = 30 * MiB}, &cap));
    assert_int_equal(cap, 140 * MiB);
}

static void test_mode_names(void **state)
{
    (void)state;
    assert_string_equal(cuh_torch_mode_name(CUH_TORCH_NATIVE), "native");
    assert_string_equal(cuh_torch_mode_name(CUH_TORCH_EXPANDABLE), "expandable");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segment_sizes),
        cmocka_unit_test(test_small_blocks_share_a_segment),
        cmocka_unit_test(test_native_split_threshold),
        cmocka_unit_test(test_best_fit),
        cmocka_unit_test(test_streams_do_not_share),
        cmocka_unit_test(test_native_release_and_retry),
        cmocka_unit_test(test_expandable_pages),
        cmocka_unit_test(test_expandable_takes_the_growing_block_last),
        cmocka_unit_test(test_expandable_grows_from_a_free_end),
        cmocka_unit_test(test_expandable_release_unmaps_free_pages),
        cmocka_unit_test(test_expandable_release_keeps_partial_pages),
        cmocka_unit_test(test_expandable_out_of_memory),
        cmocka_unit_test(test_memory_fraction),
        cmocka_unit_test(test_min_capacity),
        cmocka_unit_test(test_mode_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
