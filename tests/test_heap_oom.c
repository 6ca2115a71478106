/* test_heap_oom.c - the out-of-memory record (src/heap_oom.c): each cause
 * (memory used outside cuheap, the driver refusing memory it reports free,
 * fragmentation, memory pending on other streams)
 * with its proof: stranded segments, partly used pages under large pages, the
 * streams with the most pending bytes.
 */
#include "heap_test.h"

static void test_oom_cause_external(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(64 * MiB, NULL);
    cuh_sim_set_external(t.dev, 48 * MiB);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc(t.heap, 32 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    cuh_oom_info_t o;
    assert_true(cuh_heap_last_oom(t.heap, &o));
    assert_int_equal(o.cause, CUH_OOM_EXTERNAL);
    assert_int_equal(o.external, 48 * MiB);
    assert_int_equal(o.device_total, 64 * MiB);
    test_heap_free(&t);
}

/* The driver refuses memory it reports free (a fault plan's out-of-memory on
 * an empty device): not fragmentation, nor any other cause of cuheap's
 * layout, but the driver's refusal, said as such. */
static void test_oom_cause_device_refused(void **state)
{
    (void)state;
    for (int vmm = 0; vmm < 2; vmm++) {
        fault_heap_t t = fault_heap_new(64 * MiB, vmm ? "vmm:1" : "vmm:0");
        cuh_fault_random(t.dev, vmm ? CUH_FAULT_VM_CREATE : CUH_FAULT_MEM_ALLOC, 1.0, 1, CUH_DEV_OOM);
        uintptr_t x;
        assert_int_equal(cuh_heap_malloc(t.heap, 8 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
        cuh_oom_info_t o;
        assert_true(cuh_heap_last_oom(t.heap, &o));
        assert_int_equal(o.cause, CUH_OOM_DEVICE_REFUSED);
        assert_int_equal(o.device_free, 64 * MiB);
        assert_non_null(strstr(cuheap_last_error(), "cause: device_refused"));
        assert_non_null(strstr(cuheap_last_error(), "the driver refused 8.00 MiB while it reported 64.00 MiB free"));
        fault_heap_free(&t);
    }
}

/* On heap h of a 64 MiB device: 32 blocks of 2 MiB, every other one freed (a
 * checkerboard: 32 MiB free in 2 MiB holes), then a 4 MiB request, which must
 * fail; the out-of-memory record it leaves. The blocks are freed after. */
static cuh_oom_info_t checkerboard_oom_on(cuh_heap_t *h)
{
    uintptr_t a[32];
    for (int i = 0; i < 32; i++)
        a[i] = must_alloc(h, 2 * MiB, 0);
    for (int i = 0; i < 32; i += 2)
        must_free(h, a[i], 0);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc(h, 4 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    cuh_oom_info_t o;
    assert_true(cuh_heap_last_oom(h, &o));
    heap_ok(h);
    for (int i = 1; i < 32; i += 2)
        must_free(h, a[i], 0);
    return o;
}

/* The same on a simulated 64 MiB device with settings `conf`. */
static cuh_oom_info_t checkerboard_oom(const char *conf)
{
    test_heap_t t = test_heap_new(64 * MiB, conf);
    cuh_oom_info_t o = checkerboard_oom_on(t.heap);
    test_heap_free(&t);
    return o;
}

static void test_oom_cause_fragmentation_with_its_proof(void **state)
{
    (void)state;
    /* The whole device is the workspace: the 4 MiB request has no extent to
     * fit in. */
    cuh_oom_info_t o = checkerboard_oom("workspace:64M,small_max:0");
    assert_int_equal(o.cause, CUH_OOM_FRAGMENTATION);
    assert_true(o.largest_free < o.request);
    assert_true(o.request <= o.cached + o.device_free);
    assert_int_equal(o.largest_free, 2 * MiB);
    /* What helps with scattered free memory: pages that move, or measured
     * memory; not a workspace, where best fit fragments too. */
    assert_non_null(strstr(o.action, "vmm:1"));
    assert_non_null(strstr(o.action, "cuheap-replay --min-capacity"));
    assert_non_null(strstr(o.action, "drop vmm:0"));   /* plain segments were asked for */
    assert_null(strstr(o.action, "workspace"));
    assert_true(strlen(o.action) + 1 < sizeof o.action);   /* not cut short */
}

/* vmm:1 asked for, but the device gave no virtual memory (here its address
 * space reservation fails; the whole device is the workspace): the heap runs
 * on plain segments, and the advice for their fragmentation says so instead
 * of naming a setting already set. */
static void test_fragmentation_without_the_virtual_memory_asked_for_says_so(void **state)
{
    (void)state;
    fault_heap_t t = fault_heap_new(64 * MiB, "vmm:1,workspace:64M,small_max:0");
    cuh_fault_nth(t.dev, CUH_FAULT_VM_RESERVE, 1, CUH_DEV_ERROR);
    cuh_oom_info_t o = checkerboard_oom_on(t.heap);
    assert_int_equal(cuh_fault_injected(t.dev, CUH_FAULT_VM_RESERVE), 1);
    assert_int_equal(o.cause, CUH_OOM_FRAGMENTATION);
    assert_non_null(strstr(o.action, "gave no CUDA virtual memory"));
    assert_null(strstr(o.action, "vmm:0"));
    fault_heap_free(&t);
}

/* A block freed from a segment it nearly filled leaves the segment to the
 * small block that best fit its tail: the out-of-memory record names the
 * memory stranded that way, the blocks that hold it, and whether the
 * request would have fit had they been elsewhere. */
static void test_oom_names_memory_stranded_in_mostly_empty_segments(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(2 * GiB, NULL);
    uintptr_t big = must_alloc(t.heap, GiB - MiB, 0);          /* a segment of 1 GiB */
    uintptr_t small = must_alloc(t.heap, 512 * KiB, 0);        /* best fit: the segment's last MiB */
    assert_true(small > big && small < big + GiB);
    must_free(t.heap, big, 0);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc(t.heap, GiB + GiB / 2, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    cuh_oom_info_t o;
    assert_true(cuh_heap_last_oom(t.heap, &o));
    assert_int_equal(o.cause, CUH_OOM_FRAGMENTATION);
    assert_int_equal(o.stranded.segments, 1);
    assert_int_equal(o.stranded.bytes, GiB);
    assert_int_equal(o.stranded.free, GiB - 512 * KiB);
    assert_int_equal(o.stranded.blocks, 1);
    assert_int_equal(o.stranded.block_bytes, 512 * KiB);
    assert_int_equal(o.stranded.top_base, big);
    assert_int_equal(o.stranded.top_size, GiB);
    assert_int_equal(o.stranded.top_blocks, 1);
    assert_int_equal(o.stranded.num_top_holders, 1);
    assert_int_equal(o.stranded.top_holders[0].addr, small);
    assert_int_equal(o.stranded.top_holders[0].size, 512 * KiB);
    assert_true(o.stranded.would_fit);   /* 1 GiB free on the device + the 1 GiB segment */
    assert_non_null(strstr(cuheap_last_error(), "1 mostly empty segment, held there by 1 block"));
    assert_non_null(strstr(cuheap_last_error(), "without them the request would have fit"));
    assert_non_null(strstr(cuheap_last_error(), o.action));   /* the message is whole, advice and all */
    /* And so it does once the small block is gone. */
    must_free(t.heap, small, 0);
    must_free(t.heap, must_alloc(t.heap, GiB + GiB / 2, 0), 0);
    heap_ok(t.heap);
    test_heap_free(&t);

    /* The stranded segment is too small to make room: named, without the
     * claim. 1 GiB live, a 64 MiB segment held by 512 KiB, a 256 MiB one
     * half used, 100 MiB left on the device, and a 200 MiB request. */
    t = test_heap_new(GiB + 420 * MiB, NULL);
    uintptr_t live = must_alloc(t.heap, GiB, 0);
    uintptr_t b2 = must_alloc(t.heap, 31 * MiB, 0);            /* a 64 MiB segment (grow_fraction) */
    uintptr_t s2 = must_alloc(t.heap, 512 * KiB, 0);
    must_free(t.heap, b2, 0);
    must_free(t.heap, must_alloc(t.heap, 256 * MiB, 0), 0);
    uintptr_t d1 = must_alloc(t.heap, 128 * MiB, 0);
    must_free(t.heap, must_alloc(t.heap, 128 * MiB, 0), 0);
    assert_int_equal(cuh_heap_malloc(t.heap, 200 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    assert_true(cuh_heap_last_oom(t.heap, &o));
    assert_int_equal(o.cause, CUH_OOM_FRAGMENTATION);
    assert_int_equal(o.device_free, 100 * MiB);
    assert_int_equal(o.stranded.segments, 1);
    assert_int_equal(o.stranded.bytes, 64 * MiB);
    assert_int_equal(o.stranded.top_holders[0].addr, s2);
    assert_false(o.stranded.would_fit);
    assert_non_null(strstr(cuheap_last_error(), "mostly empty segment"));
    assert_null(strstr(cuheap_last_error(), "would have fit"));
    must_free(t.heap, live, 0);
    must_free(t.heap, s2, 0);
    must_free(t.heap, d1, 0);
    heap_ok(t.heap);
    test_heap_free(&t);

    /* Free memory scattered through a well used workspace strands nothing
     * (the workspace never goes back to the device anyway). */
    cuh_oom_info_t c = checkerboard_oom("workspace:64M,small_max:0");
    assert_int_equal(c.stranded.segments, 0);
    assert_false(c.stranded.would_fit);
}

/* Under vmm:1 with pages larger than the device's granularity, free memory can
 * still be stranded in pages that blocks partly use: the advice is the page
 * size, not vmm:1. */
static void test_oom_cause_fragmentation_under_large_pages_names_vmm_page(void **state)
{
    (void)state;
    cuh_oom_info_t o = checkerboard_oom("vmm:1,vmm_page:8M,small_max:0");
    assert_int_equal(o.cause, CUH_OOM_FRAGMENTATION);
    assert_non_null(strstr(o.action, "vmm_page"));
    assert_null(strstr(o.action, "vmm:1 in"));
    /* The record says how much: every 8 MiB page holds two live 2 MiB
     * blocks and two free ones, so all 32 MiB free lie in 8 pages that
     * cannot move; no plain segment strands anything. */
    assert_true(o.partial_pages.known);
    assert_int_equal(o.partial_pages.pages, 8);
    assert_int_equal(o.partial_pages.free, 32 * MiB);
    assert_int_equal(o.stranded.segments, 0);
    /* A free extent that starts in one page and ends in the next counts in
     * both: 6, 4 and 6 MiB blocks over two 8 MiB pages, the middle one
     * freed, then 10 MiB asked of a device with one page left. */
    test_heap_t v = test_heap_new(24 * MiB, "vmm:1,vmm_page:8M,small_max:0");
    uintptr_t b6 = must_alloc(v.heap, 6 * MiB, 0), b4 = must_alloc(v.heap, 4 * MiB, 0);
    uintptr_t c6 = must_alloc(v.heap, 6 * MiB, 0);
    assert_int_equal(b4, b6 + 6 * MiB);
    assert_int_equal(c6, b4 + 4 * MiB);
    must_free(v.heap, b4, 0);
    uintptr_t y;
    assert_int_equal(cuh_heap_malloc(v.heap, 10 * MiB, 0, &y), CUHEAP_ERR_OUT_OF_MEMORY);
    cuh_oom_info_t w;
    assert_true(cuh_heap_last_oom(v.heap, &w));
    assert_int_equal(w.partial_pages.pages, 2);
    assert_int_equal(w.partial_pages.free, 4 * MiB);
    must_free(v.heap, b6, 0);
    must_free(v.heap, c6, 0);
    heap_ok(v.heap);
    test_heap_free(&v);
}

/* Runs the sequence of the test below under `conf` on an 18 MiB device and
 * returns the out-of-memory of its last request (cause NONE if it fit). */
static cuh_oom_info_t units_oom(const char *conf)
{
    test_heap_t t = test_heap_new(18 * MiB, conf);
    uintptr_t a = must_alloc(t.heap, 8 * MiB, 0), b = must_alloc(t.heap, 2 * MiB, 0);
    uintptr_t c = must_alloc(t.heap, 8 * MiB, 0);
    assert_int_equal(b, a + 8 * MiB);
    assert_int_equal(c, b + 2 * MiB);
    must_free(t.heap, a, 0);
    must_free(t.heap, c, 0);
    uintptr_t d = must_alloc(t.heap, 2 * MiB, 0), e = 0;
    assert_int_equal(d, a);
    cuh_oom_info_t o;
    memset(&o, 0, sizeof o);
    if (cuh_heap_malloc(t.heap, 10 * MiB, 0, &e) == CUHEAP_ERR_OUT_OF_MEMORY)
        assert_true(cuh_heap_last_oom(t.heap, &o));
    else
        must_free(t.heap, e, 0);
    must_free(t.heap, d, 0);
    must_free(t.heap, b, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
    return o;
}

/* A unit of several pages (vmm_unit) moves only whole: its free pages
 * strand while a block still lies on one of them. 8, 2 and 8 MiB blocks fill
 * an 18 MiB device (units of 4, 1 and 4 pages at vmm_unit:8M); the two 8 MiB
 * ones are freed and a 2 MiB block takes the first unit's first page. A 10
 * MiB request then lacks a page past the last unit, and the only free pages
 * that could move there lie in the first unit: the record names the unit
 * and its 6 MiB, and the advice vmm_unit:2M. With a unit a page, the same
 * request fits. */
static void test_oom_names_free_pages_stranded_in_partly_used_units(void **state)
{
    (void)state;
    cuh_oom_info_t o = units_oom("vmm:1,vmm_unit:8M,vmm_margin:0,small_max:0");
    assert_int_equal(o.cause, CUH_OOM_FRAGMENTATION);
    assert_true(o.partial_units.known);
    assert_int_equal(o.partial_units.units, 1);
    assert_int_equal(o.partial_units.free, 6 * MiB);
    assert_int_equal(o.partial_pages.pages, 0);
    assert_non_null(strstr(o.action, "vmm_unit:2M"));
    assert_non_null(strstr(cuh_get_error(), "6291456 in whole free pages of 1 unit that blocks partly use"));
    o = units_oom("vmm:1,vmm_unit:2M,vmm_margin:0,small_max:0");
    assert_int_equal(o.cause, CUH_OOM_NONE);
}

/* MiB freed on each of ten streams (test below), in no order. */
static const size_t o_streams_pending[] = {8, 2, 20, 14, 4, 18, 6, 12, 10, 16};

static void test_oom_cause_stream_pending_with_its_proof(void **state)
{
    (void)state;
    /* S1 frees 40 MiB; during a graph capture S2 may not wait for S1's work,
     * so 40 MiB more does not fit a 64 MiB device, though it would after. */
    test_heap_t t = test_heap_new(64 * MiB, "grow_fraction:0");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a = must_alloc(t.heap, 40 * MiB, S1);
    must_free(t.heap, a, S1);
    cuh_heap_capture_begin(t.heap, 1);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc(t.heap, 40 * MiB, S2, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    cuh_heap_capture_end(t.heap);
    cuh_oom_info_t o;
    assert_true(cuh_heap_last_oom(t.heap, &o));
    assert_int_equal(o.cause, CUH_OOM_STREAM_PENDING);
    assert_int_equal(o.pending, 40 * MiB);
    assert_int_equal(o.num_pending_streams, 1);
    assert_int_equal(o.pending_by_stream[0].stream, S1);
    assert_int_equal(o.pending_by_stream[0].pending, 40 * MiB);
    assert_true(o.cached + o.device_free - o.pending < o.request);
    assert_true(o.request <= o.cached + o.device_free);
    assert_non_null(strstr(o.action, "synchronize"));
    /* After the capture the same request waits for S1 and succeeds. */
    must_free(t.heap, must_alloc(t.heap, 40 * MiB, S2), S2);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* With more streams holding pending memory than the record has room for,
 * it keeps the ones with the most, largest first: ten streams free 2 to 20
 * MiB each, then a capture asks for more than the device has left. */
static void test_oom_record_keeps_the_streams_with_the_most_pending(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(256 * MiB, "grow_fraction:0,small_max:0");
    cuh_sim_hold_events(t.dev, 1);
    const size_t num = sizeof o_streams_pending / sizeof o_streams_pending[0];
    uintptr_t blocks[sizeof o_streams_pending / sizeof o_streams_pending[0]];
    /* All allocated before any is freed: a growth to a new peak would wait
     * for the earlier frees and give their segments back. */
    for (size_t i = 0; i < num; i++) {
        cuh_stream_t s = (cuh_stream_t)(0x5000 + i * 0x100);
        assert_int_equal(cuh_heap_register_stream(t.heap, s), CUHEAP_OK);
        blocks[i] = must_alloc(t.heap, o_streams_pending[i] * MiB, s);
    }
    for (size_t i = 0; i < num; i++)
        must_free(t.heap, blocks[i], (cuh_stream_t)(0x5000 + i * 0x100));
    cuh_heap_capture_begin(t.heap, 1);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc(t.heap, 200 * MiB, S2, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    cuh_heap_capture_end(t.heap);
    cuh_oom_info_t o;
    assert_true(cuh_heap_last_oom(t.heap, &o));
    const size_t kept = sizeof o.pending_by_stream / sizeof o.pending_by_stream[0];
    assert_int_equal(o.num_pending_streams, kept);
    for (size_t k = 0; k < kept; k++)   /* 20, 18, ... 6 MiB: the 2 and 4 MiB streams left out */
        assert_int_equal(o.pending_by_stream[k].pending, (20 - 2 * k) * MiB);
    assert_int_equal(o.pending_by_stream[0].stream, 0x5000 + 2 * 0x100);   /* the 20 MiB one */
    heap_ok(t.heap);
    test_heap_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_cause_external),
        cmocka_unit_test(test_oom_cause_device_refused),
        cmocka_unit_test(test_oom_cause_fragmentation_with_its_proof),
        cmocka_unit_test(test_fragmentation_without_the_virtual_memory_asked_for_says_so),
        cmocka_unit_test(test_oom_names_memory_stranded_in_mostly_empty_segments),
        cmocka_unit_test(test_oom_cause_fragmentation_under_large_pages_names_vmm_page),
        cmocka_unit_test(test_oom_names_free_pages_stranded_in_partly_used_units),
        cmocka_unit_test(test_oom_cause_stream_pending_with_its_proof),
        cmocka_unit_test(test_oom_record_keeps_the_streams_with_the_most_pending),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
