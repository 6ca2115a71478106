/* test_heap_holds.c - held blocks and graph captures (src/heap_holds.c): a
 * block record_stream named waits for every stream that used it; during a
 * capture the heap makes no event call, gives nothing back and moves pages
 * without one; a captured block waits for its pool's release, and for both
 * pools when it is freed in another pool's capture.
 */
#include "heap_test.h"

/* ---- record_stream ------------------------------------------------------- */

static void test_record_stream_holds_the_block_until_every_user_finished(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t big = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t small = must_alloc(t.heap, 2000, S1);
    assert_int_equal(cuh_heap_record_stream(t.heap, big, S2), CUHEAP_OK);
    assert_int_equal(cuh_heap_record_stream(t.heap, small, S2), CUHEAP_OK);
    assert_int_equal(cuh_heap_record_stream(t.heap, big, S2), CUHEAP_OK);   /* twice: one entry */
    must_free(t.heap, big, S1);
    must_free(t.heap, small, S1);
    /* S2 still reads them: not even S1 may have them back. */
    uintptr_t b2 = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t s2 = must_alloc(t.heap, 2000, S1);
    assert_false(heap_model_overlap(big, 8 * MiB, b2, 8 * MiB));
    assert_true(s2 != small);
    assert_int_equal(cuh_heap_free(t.heap, big, S1), CUHEAP_ERR_DOUBLE_FREE);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_true(st.pending.current >= 8 * MiB + 2048);
    heap_ok(t.heap);
    /* Once S2's work is done they are S1's again. */
    cuh_sim_complete_stream(t.dev, S2);
    must_free(t.heap, b2, S1);   /* a free polls the holds */
    must_free(t.heap, s2, S1);
    uintptr_t again = must_alloc(t.heap, 8 * MiB, S1);
    assert_true(again == big || again == b2);
    cuh_heap_stats(t.heap, &st);
    /* Nothing held: at most the other block, fenced on S1 when its free left
     * its segment idle, waits for S1's work. */
    assert_true(st.pending.current <= 8 * MiB);
    heap_ok(t.heap);
    cuh_sim_complete_all(t.dev);
    cuh_heap_poll(t.heap);
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 0);
    must_free(t.heap, again, S1);
    assert_int_equal(cuh_heap_record_stream(t.heap, 0x1234000, S2), CUHEAP_ERR_NOT_OWNED);
    test_heap_free(&t);
}

/* ---- graph captures and their pools -------------------------------------- */

static void test_graph_capture_makes_no_event_call_and_holds_its_blocks(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t before = must_alloc(t.heap, 4 * MiB, S2);
    must_free(t.heap, before, S2);   /* S2's private memory: S1 would need a fence */
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    cuh_heap_capture_begin(t.heap, 7);
    uintptr_t in_graph = must_alloc(t.heap, 4 * MiB, S1);
    uintptr_t tmp = must_alloc(t.heap, 4 * MiB, S1);
    must_free(t.heap, tmp, S1);   /* freed inside the capture */
    cuh_heap_capture_end(t.heap);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.events_recorded, c0.events_recorded);
    assert_int_equal(c1.event_waits, c0.event_waits);
    assert_false(heap_model_overlap(in_graph, 4 * MiB, before, 4 * MiB));
    /* After the capture neither block is reused while the graph lives. */
    must_free(t.heap, in_graph, S1);
    for (int i = 0; i < 4; i++) {
        uintptr_t x = must_alloc(t.heap, 4 * MiB, S1);
        assert_false(heap_model_overlap(x, 4 * MiB, in_graph, 4 * MiB));
        assert_false(heap_model_overlap(x, 4 * MiB, tmp, 4 * MiB));
        must_free(t.heap, x, S1);
    }
    heap_ok(t.heap);
    cuh_heap_release_pool(t.heap, 7);
    cuh_sim_counters(t.dev, &c1);
    assert_true(c1.synchronizes > c0.synchronizes);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.allocated.current, 0);
    /* The pool's blocks are S1's again. */
    uintptr_t x = must_alloc(t.heap, 4 * MiB, S1), y = must_alloc(t.heap, 4 * MiB, S1);
    assert_true(heap_model_overlap(x, 4 * MiB, in_graph, 4 * MiB) || heap_model_overlap(x, 4 * MiB, tmp, 4 * MiB));
    assert_true(heap_model_overlap(y, 4 * MiB, in_graph, 4 * MiB) || heap_model_overlap(y, 4 * MiB, tmp, 4 * MiB));
    must_free(t.heap, x, S1);
    must_free(t.heap, y, S1);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_device_wide_free_of_a_graph_block_waits_for_its_pool(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    cuh_heap_capture_begin(t.heap, 9);
    uintptr_t in_graph = 0, tmp = 0;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 4 * MiB, &in_graph), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 4 * MiB, &tmp), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, tmp), CUHEAP_OK);   /* freed inside the capture */
    cuh_heap_capture_end(t.heap);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.events_recorded, c0.events_recorded);   /* no event call during a capture */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, in_graph), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, in_graph), CUHEAP_ERR_DOUBLE_FREE);
    /* The GPU finishing its work is not enough: replays of the graph still
     * write these blocks until its pool is released. */
    cuh_sim_complete_all(t.dev);
    for (int i = 0; i < 4; i++) {
        uintptr_t x = 0;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 4 * MiB, &x), CUHEAP_OK);
        assert_false(heap_model_overlap(x, 4 * MiB, in_graph, 4 * MiB));
        assert_false(heap_model_overlap(x, 4 * MiB, tmp, 4 * MiB));
        assert_int_equal(cuh_heap_free_device_wide(t.heap, x), CUHEAP_OK);
        cuh_sim_complete_all(t.dev);
    }
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_true(st.pending.current >= 8 * MiB);
    heap_ok(t.heap);
    cuh_heap_release_pool(t.heap, 9);
    cuh_sim_complete_all(t.dev);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 0);
    assert_int_equal(st.allocated.current, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* empty_cache during a capture gives nothing back (a segment freed, or the
 * CPU waiting for frees first, would invalidate the capture); after it, all. */
static void test_release_cached_during_a_capture_gives_nothing_back(void **state)
{
    (void)state;
    static const char *const confs[] = {NULL, "vmm:1"};
    for (int c = 0; c < 2; c++) {
        test_heap_t t = test_heap_new(GiB, confs[c]);
        cuh_sim_hold_events(t.dev, 1);
        uintptr_t a = must_alloc(t.heap, 8 * MiB, S1), b = 0;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 8 * MiB, &b), CUHEAP_OK);
        must_free(t.heap, a, S1);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
        cuh_sim_complete_all(t.dev);
        cuh_heap_poll(t.heap);   /* all of it free for every stream: it could go back */
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        cuh_heap_capture_begin(t.heap, 5);
        assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        assert_false(heap_model_capture_broken(&c0, &c1));
        cuh_heap_capture_end(t.heap);
        cuh_sim_complete_all(t.dev);
        assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
        cuheap_stats_t st;
        cuh_heap_stats(t.heap, &st);
        assert_int_equal(st.reserved.current, 0);
        heap_ok(t.heap);
        test_heap_free(&t);
    }
}

/* Under vmm:1 the page bookkeeping makes no event call during a capture
 * either: what the heap has not yet seen done stays where it is. Three ways
 * in, each found by tests/fuzz/fuzz_heap.c (the sizes are the ones it found):
 *  - a block needing pages, while pages cudaFree gave back carry a take-back
 *    generation still running (settled_gen_locked);
 *  - a block needing pages, while memory another stream freed was handed
 *    over before its work ran (reuse_across_streams; settle_unsettled_locked);
 *  - a poll, while pages a stream lent its own next block leave their old
 *    mappings to drain (drains_poll_locked). */
static void test_pages_move_during_a_capture_without_an_event_call(void **state)
{
    (void)state;
    cuh_sim_counters_t c0, c1;
    {
        test_heap_t t = test_heap_new(GiB, "vmm:1,vmm_margin:0");
        cuh_sim_hold_events(t.dev, 1);
        uintptr_t x = 0;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 4838017, &x), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, x), CUHEAP_OK);
        uintptr_t y = must_alloc(t.heap, 9947905, S1);   /* takes it back while its work runs */
        cuh_sim_counters(t.dev, &c0);
        cuh_heap_capture_begin(t.heap, 3);
        uintptr_t big = must_alloc(t.heap, 32 * MiB, S1);
        cuh_sim_counters(t.dev, &c1);
        assert_false(heap_model_capture_broken(&c0, &c1));
        cuh_heap_capture_end(t.heap);
        must_free(t.heap, big, S1);
        must_free(t.heap, y, S1);
        cuh_heap_release_pool(t.heap, 3);
        cuh_sim_complete_all(t.dev);
        all_freed(t.heap);
        test_heap_free(&t);
    }
    {
        test_heap_t t = test_heap_new(GiB, "vmm:1,vmm_margin:0,reuse_across_streams:1,workspace:32M");
        cuh_sim_hold_events(t.dev, 1);
        uintptr_t x = must_alloc(t.heap, 4831105, S2), z = 0;
        must_free(t.heap, x, S2);
        uintptr_t y = must_alloc(t.heap, 1430449, S1);   /* S2's frees, handed over early */
        cuh_sim_counters(t.dev, &c0);
        cuh_heap_capture_begin(t.heap, 2);
        assert_int_equal(cuh_heap_malloc_shareable(t.heap, 1, &z), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        assert_false(heap_model_capture_broken(&c0, &c1));
        cuh_heap_capture_end(t.heap);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, z), CUHEAP_OK);
        must_free(t.heap, y, S1);
        cuh_heap_release_pool(t.heap, 2);
        cuh_sim_complete_all(t.dev);
        all_freed(t.heap);
        test_heap_free(&t);
    }
    {
        test_heap_t t = test_heap_new(GiB, "vmm:1");
        cuh_sim_hold_events(t.dev, 1);
        uintptr_t a = must_alloc(t.heap, 24 * MiB, S1);
        assert_int_equal(cuh_heap_record_stream(t.heap, a, S2), CUHEAP_OK);
        uintptr_t b = must_alloc(t.heap, 12 * MiB, 0);
        must_free(t.heap, b, 0);
        must_free(t.heap, a, S1);
        uintptr_t c = must_alloc(t.heap, 22 * MiB, 0);   /* lent its own pages: old mappings drain */
        cuh_sim_counters(t.dev, &c0);
        cuh_heap_capture_begin(t.heap, 3);
        cuh_heap_poll(t.heap);
        cuh_sim_counters(t.dev, &c1);
        assert_false(heap_model_capture_broken(&c0, &c1));
        cuh_heap_capture_end(t.heap);
        must_free(t.heap, c, 0);
        cuh_sim_complete_all(t.dev);
        all_freed(t.heap);
        test_heap_free(&t);
    }
}

/* A graph pool released while another graph is being captured cannot wait
 * for the device: its blocks stay held until the capture ends, and only
 * then become free. */
static void test_a_pool_released_during_another_capture_waits_for_its_end(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    cuh_heap_capture_begin(t.heap, 1);
    uintptr_t in_graph = must_alloc(t.heap, 4 * MiB, S1);
    cuh_heap_capture_end(t.heap);
    must_free(t.heap, in_graph, S1);   /* held for pool 1 */
    cuh_heap_capture_begin(t.heap, 3);
    uintptr_t in_graph3 = must_alloc(t.heap, 6 * MiB, S1);
    cuh_heap_capture_end(t.heap);
    must_free(t.heap, in_graph3, S1);   /* held for pool 3 */
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    cuh_heap_capture_begin(t.heap, 2);
    cuh_heap_release_pool(t.heap, 1);
    cuh_heap_release_pool(t.heap, 3);
    cuh_heap_release_pool(t.heap, 1);   /* twice: still one release */
    cuh_sim_counters(t.dev, &c1);
    assert_false(heap_model_capture_broken(&c0, &c1));
    uintptr_t during = must_alloc(t.heap, 4 * MiB, S1);
    assert_false(heap_model_overlap(during, 4 * MiB, in_graph, 4 * MiB));   /* still held */
    cuh_heap_capture_end(t.heap);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.synchronizes, c0.synchronizes + 1);   /* both pools' replays, waited for once */
    uintptr_t after = must_alloc(t.heap, 4 * MiB, S1);
    assert_int_equal(after, in_graph);   /* free again */
    uintptr_t after3 = must_alloc(t.heap, 6 * MiB, S1);
    assert_int_equal(after3, in_graph3);
    must_free(t.heap, after, S1);
    must_free(t.heap, after3, S1);
    must_free(t.heap, during, S1);
    cuh_heap_release_pool(t.heap, 2);
    cuh_sim_complete_all(t.dev);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A block of one graph's pool freed while another graph is captured is
 * held until both pools are released, in either order: the first graph's
 * replays write it, the second's captured work used it before the free
 * (found by tests/fuzz/fuzz_heap.c, with pool 1 released during the
 * capture of pool 2). */
static void test_a_pool_block_freed_in_another_capture_waits_for_both_pools(void **state)
{
    (void)state;
    for (int order = 0; order < 2; order++) {
        test_heap_t t = test_heap_new(GiB, NULL);
        cuh_sim_hold_events(t.dev, 1);
        cuh_heap_capture_begin(t.heap, 1);
        uintptr_t a = must_alloc(t.heap, 4 * MiB, S1);
        cuh_heap_capture_end(t.heap);
        cuh_heap_capture_begin(t.heap, 2);
        if (order == 0)
            cuh_heap_release_pool(t.heap, 1);   /* takes effect at the capture's end */
        must_free(t.heap, a, S1);
        cuh_heap_capture_end(t.heap);
        cuh_heap_release_pool(t.heap, order == 0 ? 3 : 2);   /* another pool: no effect on a */
        cuh_sim_complete_all(t.dev);
        uintptr_t x = must_alloc(t.heap, 4 * MiB, S1);
        assert_false(heap_model_overlap(x, 4 * MiB, a, 4 * MiB));   /* one pool still holds it */
        must_free(t.heap, x, S1);
        cuh_heap_release_pool(t.heap, order == 0 ? 2 : 1);
        if (order == 1)
            cuh_heap_release_pool(t.heap, 2);
        cuh_sim_complete_all(t.dev);
        uintptr_t y = must_alloc(t.heap, 4 * MiB, S1);
        assert_int_equal(y, a);   /* both released: free again */
        must_free(t.heap, y, S1);
        cuh_sim_complete_all(t.dev);
        all_freed(t.heap);
        test_heap_free(&t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_stream_holds_the_block_until_every_user_finished),
        cmocka_unit_test(test_graph_capture_makes_no_event_call_and_holds_its_blocks),
        cmocka_unit_test(test_device_wide_free_of_a_graph_block_waits_for_its_pool),
        cmocka_unit_test(test_release_cached_during_a_capture_gives_nothing_back),
        cmocka_unit_test(test_pages_move_during_a_capture_without_an_event_call),
        cmocka_unit_test(test_a_pool_released_during_another_capture_waits_for_its_end),
        cmocka_unit_test(test_a_pool_block_freed_in_another_capture_waits_for_both_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
