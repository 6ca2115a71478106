/* test_heap_streams.c - stream-ordered reuse (src/heap_streams.c,
 * src/heap_small.c): a block freed on a stream is reused at once on that
 * stream and elsewhere only after its event completes, small objects and new
 * slabs included; the CPU waits only when memory runs out, for the device
 * when an event wait fails (and a device that cannot be waited for is
 * lost); a retired stream
 * is never touched again; a fence for memory outside the heap is one
 * device-wide event.
 */
#include "heap_test.h"

/* ---- stream-ordered reuse --------------------------------------------------- */

static void test_same_stream_reuses_a_freed_block_at_once(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);   /* the GPU never finishes anything */
    uintptr_t big = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t small = must_alloc(t.heap, 3000, S1);
    must_free(t.heap, big, S1);
    must_free(t.heap, small, S1);
    assert_int_equal(must_alloc(t.heap, 8 * MiB, S1), big);
    assert_int_equal(must_alloc(t.heap, 3000, S1), small);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_other_stream_reuses_only_after_the_event_completes(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t small = must_alloc(t.heap, 3000, S1);
    must_free(t.heap, a, S1);
    must_free(t.heap, small, S1);

    /* S1's work may still read them: S2 must get other memory. */
    uintptr_t b = must_alloc(t.heap, 8 * MiB, S2);
    uintptr_t b_small = must_alloc(t.heap, 3000, S2);
    assert_false(heap_model_overlap(a, 8 * MiB, b, 8 * MiB));
    assert_true(b_small != small);
    cuh_sim_counters_t c;
    cuh_sim_counters(t.dev, &c);
    assert_true(c.events_recorded >= 1);   /* a fence was recorded on S1 */
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_true(s.pending.current >= 8 * MiB);
    heap_ok(t.heap);

    /* Once S1's work has finished, S2 may have it. */
    cuh_sim_complete_stream(t.dev, S1);
    uintptr_t c2 = must_alloc(t.heap, 8 * MiB, S2);
    assert_int_equal(c2, a);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.pending.current, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_small_objects_cross_streams_only_after_the_event(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    enum { N = 200 };
    uintptr_t mine[N], theirs[N];
    for (int i = 0; i < N; i++)
        mine[i] = must_alloc(t.heap, 1024, S1);
    for (int i = 0; i < N; i++)
        must_free(t.heap, mine[i], S1);
    for (int i = 0; i < N; i++) {
        theirs[i] = must_alloc(t.heap, 1024, S2);
        for (int k = 0; k < N; k++)
            if (theirs[i] == mine[k])
                fail_msg("stream S2 got object %d freed on S1 before S1's work finished", k);
    }
    heap_ok(t.heap);
    for (int i = 0; i < N; i++)
        must_free(t.heap, theirs[i], S2);
    cuh_sim_complete_all(t.dev);
    cuh_heap_release_cached(t.heap);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_waiting_for_memory_blocks_on_the_event_not_before(void **state)
{
    (void)state;
    /* Room for one 8 MiB segment only: S2 can be served only by waiting for
     * S1's work (a host wait, counted by the device). */
    test_heap_t t = test_heap_new(10 * MiB, "grow_fraction:0");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
    must_free(t.heap, a, S1);
    cuh_sim_counters_t before, after;
    cuh_sim_counters(t.dev, &before);
    assert_int_equal(before.event_waits, 0);
    uintptr_t b = must_alloc(t.heap, 8 * MiB, S2);
    cuh_sim_counters(t.dev, &after);
    assert_int_equal(b, a);
    assert_true(after.event_waits > before.event_waits);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* The same wait failing: an event that cannot be waited for is answered by
 * waiting for the whole device. If that fails too, the device is lost
 * (device.h): the malloc that met it gives its block back and answers the
 * device's error, and the heap refuses new work from then on. */
static void test_a_failed_wait_waits_for_the_device_and_a_failed_synchronize_loses_it(void **state)
{
    (void)state;
    for (int sync_fails = 0; sync_fails < 2; sync_fails++) {
        fault_heap_t t = fault_heap_new(10 * MiB, "grow_fraction:0");
        cuh_device_t *sim = t.sim, *dev = t.dev;
        cuh_heap_t *h = t.heap;
        cuh_sim_hold_events(sim, 1);
        uintptr_t a = must_alloc(h, 8 * MiB, S1), b = 0;
        must_free(h, a, S1);
        cuh_sim_counters_t before, after;
        cuh_sim_counters(sim, &before);
        cuh_fault_nth(dev, CUH_FAULT_EVENT_WAIT, 1, CUH_DEV_ERROR);
        if (sync_fails)
            cuh_fault_nth(dev, CUH_FAULT_SYNCHRONIZE, 1, CUH_DEV_ERROR);
        cuheap_status_t rc = cuh_heap_malloc(h, 8 * MiB, S2, &b);
        cuh_sim_counters(sim, &after);
        assert_int_equal(cuh_fault_injected(dev, CUH_FAULT_EVENT_WAIT), 1);
        if (!sync_fails) {
            assert_int_equal(rc, CUHEAP_OK);
            assert_int_equal(b, a);
            assert_int_equal(after.synchronizes, before.synchronizes + 1);   /* the device waited for instead */
            must_free(h, b, S2);
        } else {
            assert_int_equal(rc, CUHEAP_ERR_DEVICE);
            assert_int_equal(b, 0);
            assert_non_null(strstr(cuheap_last_error(), "synchronize failed: injected"));
            assert_non_null(strstr(cuheap_last_error(), "is lost (error 700"));
            assert_int_equal(cuh_heap_malloc(h, 4 * KiB, S1, &b), CUHEAP_ERR_DEVICE);
            cuheap_stats_t st;
            cuh_heap_stats(h, &st);
            assert_int_equal(st.requested.current, 0);   /* the block went back */
            heap_ok(h);
        }
        fault_heap_free(&t);
    }
}

static void test_a_retired_stream_is_never_touched_again(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
    must_free(t.heap, a, S1);
    cuh_heap_retire_stream(t.heap, S1);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(c0.events_recorded, 1);   /* the last fence, at retirement */
    /* A new stream that happens to get the same handle is a different stream:
     * the old stream's work may still use the block. */
    uintptr_t b = must_alloc(t.heap, 8 * MiB, S1);
    assert_false(heap_model_overlap(a, 8 * MiB, b, 8 * MiB));
    must_free(t.heap, b, S1);
    /* Settling waits on the old fence but records nothing on the old stream. */
    cuh_heap_release_cached(t.heap);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.events_recorded, c0.events_recorded + 1);   /* only the new S1's fence */
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* Fences for memory outside the heap (pinned host memory) are one
 * device-wide event too, and pass only once every stream's work issued
 * before them is done, that of streams the heap never heard of included. */
static void test_a_fence_is_one_device_wide_event(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    register_pool_streams(t.heap);
    cuh_sim_hold_events(t.dev, 1);
    cuh_sim_enqueue_work(t.dev, 0x9000);   /* unknown to the heap */
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    cuh_heap_fence_t *f = cuh_heap_fence(t.heap);
    cuh_sim_counters(t.dev, &c1);
    assert_non_null(f);
    assert_int_equal(c1.events_recorded - c0.events_recorded, 1);
    assert_int_equal(c1.events_recorded_all - c0.events_recorded_all, 1);
    cuh_sim_complete_stream(t.dev, 0);
    for (uintptr_t i = 0; i < 32; i++)
        cuh_sim_complete_stream(t.dev, (cuh_stream_t)(0x10000 + i * 0x100));
    assert_false(cuh_heap_fence_passed(t.heap, f, 0));
    cuh_sim_complete_stream(t.dev, 0x9000);
    assert_true(cuh_heap_fence_passed(t.heap, f, 0));
    cuh_heap_fence_free(t.heap, f);
    test_heap_free(&t);
}

static void test_a_new_slab_never_comes_from_a_streams_pending_frees(void **state)
{
    (void)state;
    /* S1 frees the heap's only segment while its kernel still uses it, then
     * asks for a small object: a new slab. Its other objects are free for
     * every stream at once, so it may not be cut from that memory before the
     * kernel is done; S2's object of the same class comes from the slab. */
    test_heap_t t = test_heap_new(GiB, "limit:2M");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t big = must_alloc(t.heap, 2 * MiB, S1);
    uint64_t pos = cuh_sim_enqueue_work(t.dev, S1);
    must_free(t.heap, big, S1);
    uintptr_t a = must_alloc(t.heap, 40 * KiB, S1);
    uintptr_t b = must_alloc(t.heap, 40 * KiB, S2);
    if (heap_model_overlap(b, 40 * KiB, big, 2 * MiB))
        assert_true(cuh_sim_stream_waits_for(t.dev, S2, S1, pos));
    heap_ok(t.heap);
    must_free(t.heap, a, S1);
    must_free(t.heap, b, S2);
    test_heap_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_stream_reuses_a_freed_block_at_once),
        cmocka_unit_test(test_other_stream_reuses_only_after_the_event_completes),
        cmocka_unit_test(test_small_objects_cross_streams_only_after_the_event),
        cmocka_unit_test(test_waiting_for_memory_blocks_on_the_event_not_before),
        cmocka_unit_test(test_a_failed_wait_waits_for_the_device_and_a_failed_synchronize_loses_it),
        cmocka_unit_test(test_a_retired_stream_is_never_touched_again),
        cmocka_unit_test(test_a_fence_is_one_device_wide_event),
        cmocka_unit_test(test_a_new_slab_never_comes_from_a_streams_pending_frees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
