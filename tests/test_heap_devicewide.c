/* test_heap_devicewide.c - cudaFree's promise (src/heap_devicewide.c): a
 * block freed device-wide is reused by nobody before every stream finished the
 * work issued before the free, and no such free waits; batches cost events per
 * batch, not per free; take-backs order every stream after the frees on the
 * GPU, with device-wide fences or stream by stream; reuse across streams
 * orders the new user after the free.
 */
#include "heap_test.h"

/* ---- device-wide frees (cudaFree's promise) ---------------------------------- */

static void test_device_wide_free_waits_for_every_stream_without_blocking(void **state)
{
    (void)state;
    for (int device_fences = 0; device_fences <= 1; device_fences++) {
        print_message("case: %s\n", device_fences ? "device-wide fences" : "an event per stream");
        /* Growing rather than waiting, so that the held events stay held. */
        test_heap_t t = test_heap_new(GiB, device_fences ? "wait_before_grow:0" : "wait_before_grow:0,device_fences:0");
        cuh_sim_hold_events(t.dev, 1);
        /* S3 never allocates: the program only launches kernels on it. */
        assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
        cuh_sim_enqueue_work(t.dev, S3);
        /* Three allocations with three streams known: a batch may close (the
         * heap closes at most one per N allocations with N streams known). */
        must_free(t.heap, must_alloc(t.heap, 100, S1), S1);
        uintptr_t big = must_alloc(t.heap, 8 * MiB, S1);
        uintptr_t small = must_alloc(t.heap, 2000, S1);
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, big), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, small), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        /* One event on each of S1, S3 and the default stream, or one over the
         * device; the second free waits in the next batch; the host never
         * waited. */
        assert_int_equal(c1.events_recorded - c0.events_recorded, device_fences ? 1 : 3);
        assert_int_equal(c1.events_recorded_all - c0.events_recorded_all, device_fences ? 1 : 0);
        assert_int_equal(c1.event_waits, c0.event_waits);
        assert_int_equal(c1.synchronizes, c0.synchronizes);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, big), CUHEAP_ERR_DOUBLE_FREE);
        assert_int_equal(cuh_heap_free(t.heap, small, S1), CUHEAP_ERR_DOUBLE_FREE);
        heap_ok(t.heap);

        /* Not even the stream that allocated them gets them back while any
         * stream may still read them. */
        uintptr_t b2 = must_alloc(t.heap, 8 * MiB, S1);
        uintptr_t s2 = must_alloc(t.heap, 2000, S1);
        assert_false(heap_model_overlap(big, 8 * MiB, b2, 8 * MiB));
        assert_true(s2 != small);
        cuh_sim_complete_stream(t.dev, S1);
        cuh_sim_complete_stream(t.dev, 0);
        must_free(t.heap, s2, S1);   /* a free polls the batches */
        cuheap_stats_t st;
        cuh_heap_stats(t.heap, &st);
        assert_true(st.pending.current >= 8 * MiB + 2048);   /* S3 has not finished */
        uintptr_t b3 = must_alloc(t.heap, 8 * MiB, 0);
        assert_false(heap_model_overlap(big, 8 * MiB, b3, 8 * MiB));
        heap_ok(t.heap);

        /* S3 finishes: the first batch is done and the second goes out (with
         * enough allocations since the first closed: x is the fourth). */
        uintptr_t x = must_alloc(t.heap, 100, S1);
        cuh_sim_complete_stream(t.dev, S3);
        must_free(t.heap, b3, 0);
        cuh_heap_stats(t.heap, &st);
        /* b3's 8 MiB waits too: its free left its segment idle, so it was fenced
         * on the default stream, whose work is not done. */
        assert_true(st.pending.current < 16 * MiB);
        cuh_sim_complete_all(t.dev);
        must_free(t.heap, x, S1);
        must_free(t.heap, b2, S1);
        cuh_sim_complete_all(t.dev);   /* b2's segment went idle: fenced */
        cuh_heap_poll(t.heap);
        cuh_heap_stats(t.heap, &st);
        assert_int_equal(st.pending.current, 0);
        assert_int_equal(st.allocated.current, 0);
        heap_ok(t.heap);
        /* Now global: any stream may have it. */
        uintptr_t again = must_alloc(t.heap, 8 * MiB, S2);
        assert_true(again == big || again == b2 || again == b3);
        must_free(t.heap, again, S2);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, 0), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, 0x1234000), CUHEAP_ERR_NOT_OWNED);
        heap_ok(t.heap);
        test_heap_free(&t);
    }
}

static void test_device_wide_frees_cost_events_per_batch_not_per_free(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    enum { N = 500 };
    uintptr_t a[N];
    for (int i = 0; i < N; i++)
        a[i] = must_alloc(t.heap, i % 2 ? 4096 : 3 * MiB, i % 3 ? S1 : S2);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a[i]), CUHEAP_OK);
        if (i % 100 == 99)
            cuh_sim_complete_all(t.dev);   /* the GPU catches up now and then */
    }
    cuh_sim_counters(t.dev, &c1);
    /* Streams S1, S2 and the default stream: 3 events a batch, and a batch
     * goes out only when the previous one is done (5 catch-ups: 6 batches). */
    assert_true(c1.events_recorded - c0.events_recorded <= 6 * 3);
    assert_int_equal(c1.event_waits, c0.event_waits);
    assert_int_equal(c1.synchronizes, c0.synchronizes);
    heap_ok(t.heap);
    /* When memory runs short the ladder waits for the batches rather than fail. */
    uintptr_t big = must_alloc(t.heap, 900 * MiB, S1);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 0);
    must_free(t.heap, big, S1);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_device_wide_malloc_takes_only_memory_every_stream_may_use(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    /* Memory S1 freed is S1's until a fence on S1 completes. */
    uintptr_t big = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t small = must_alloc(t.heap, 2000, S1);
    must_free(t.heap, big, S1);
    must_free(t.heap, small, S1);
    uintptr_t b2 = 0, s2 = 0;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 8 * MiB, &b2), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 2000, &s2), CUHEAP_OK);
    assert_false(heap_model_overlap(big, 8 * MiB, b2, 8 * MiB));
    assert_true(s2 != small);
    assert_int_equal(b2 % 512, 0);
    heap_ok(t.heap);
    /* The GPU finishes S1's work: its memory turns global, and a device-wide
     * request may have it. */
    cuh_sim_complete_all(t.dev);
    uintptr_t b3 = 0;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 8 * MiB, &b3), CUHEAP_OK);
    assert_true(b3 == big);
    uintptr_t zero = 1;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 0, &zero), CUHEAP_OK);
    assert_int_equal(zero, 0);
    /* Device-wide blocks can be freed either way. */
    must_free(t.heap, b2, S2);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, b3), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, s2), CUHEAP_OK);
    cuh_sim_complete_all(t.dev);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.allocated.current, 0);
    assert_int_equal(st.pending.current, 0);
    assert_int_equal(st.num_allocs, 5);
    heap_ok(t.heap);
    /* Out of memory is reported as for any request. */
    uintptr_t x = 1;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 2 * GiB, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    assert_int_equal(x, 0);
    test_heap_free(&t);
}

/* cudaFree then cudaMalloc of the same size while the GPU lags (PyTorch
 * without its cache): rather than reserve a second copy, the allocation
 * takes back the batch that holds the first and every stream waits for it on
 * the GPU. With wait_before_grow:0 it reserves more instead. */
static void test_device_wide_malloc_waits_for_a_batch_rather_than_grow(void **state)
{
    (void)state;
    enum { PER_STREAM, DEVICE_WIDE, NO_WAIT, CASES };
    static const char *names[CASES] = {"an event per stream", "device-wide fences", "wait_before_grow:0"};
    static const char *conf[CASES] = {"device_fences:0", NULL, "wait_before_grow:0"};
    for (int k = PER_STREAM; k < CASES; k++) {
        print_message("case: %s\n", names[k]);
        const int wait = k != NO_WAIT;
        test_heap_t t = test_heap_new(GiB, conf[k]);
        cuh_sim_hold_events(t.dev, 1);
        assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
        uintptr_t a, b, small, small2;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &a), CUHEAP_OK);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 3000, &small), CUHEAP_OK);
        cuheap_stats_t st0, st1;
        cuh_heap_stats(t.heap, &st0);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, small), CUHEAP_OK);
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &b), CUHEAP_OK);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 3000, &small2), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        cuh_heap_stats(t.heap, &st1);
        if (wait) {
            /* The same memory at once: a's batch comes back before the heap
             * would grow; it has an event on S3 and one on the default
             * stream, and each stream waits on the GPU for the other's, or
             * one device-wide event and one device-wide wait. The CPU does
             * not wait. */
            assert_int_equal(c1.event_waits, c0.event_waits);
            assert_int_equal(c1.stream_waits - c0.stream_waits, k == PER_STREAM ? 2 : 0);
            assert_int_equal(c1.waits_all - c0.waits_all, k == DEVICE_WIDE ? 1 : 0);
            assert_int_equal(b, a);
            assert_int_equal(st1.num_segment_allocs, st0.num_segment_allocs);
            assert_int_equal(st1.reserved.current, st0.reserved.current);
        } else {
            assert_int_equal(c1.event_waits, c0.event_waits);
            assert_false(heap_model_overlap(a, 64 * MiB, b, 64 * MiB));
            assert_true(st1.reserved.current > st0.reserved.current);
        }
        assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, small2), CUHEAP_OK);
        heap_ok(t.heap);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}

/* With many streams known (PyTorch's pool: 32, idle) and a GPU that keeps up
 * (events complete at once), a cudaFree must not cost an event on every
 * stream: while free memory lasts (here a 256 MiB workspace), batches close
 * at most once per N allocations with N streams known, so records stay
 * within a few per allocation, not 33 per free. (Before the heap would grow
 * a batch closes at once: a take-back is cheaper than a new segment.) */
static void test_device_wide_frees_with_many_streams_ration_batch_closes(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "workspace:256M");
    register_pool_streams(t.heap);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    const int rounds = 330;
    for (int i = 0; i < rounds; i++) {
        uintptr_t p;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, (size_t)(1 + i % 7) * MiB, &p), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, p), CUHEAP_OK);
    }
    cuh_sim_counters(t.dev, &c1);
    const uint64_t records = c1.events_recorded - c0.events_recorded;
    print_message("%d cudaMalloc+cudaFree pairs with 33 streams: %" PRIu64 " event records\n", rounds, records);
    assert_true(records <= 2 * (uint64_t)rounds);   /* one close per 33 allocations: 33 records each */
    assert_int_equal(c1.event_waits, c0.event_waits);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.reserved.peak, 256 * MiB);   /* and the memory came back all the same */
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* Rationed closes never strand memory: a poll (what cudaMemGetInfo does
 * under LD_PRELOAD) sends the open batch out (at most once a millisecond), and a later poll, once the GPU
 * has passed it, makes it ready. */
static void test_poll_sends_a_rationed_batch_out(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
    uintptr_t a, b;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 8 * MiB, &a), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 8 * MiB, &b), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);   /* closes: two allocations */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);   /* waits in the open batch */
    cuh_sim_complete_all(t.dev);
    usleep(2000);            /* a poll closes a batch at most once a millisecond */
    cuh_heap_poll(t.heap);   /* a's batch is done; b's goes out */
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 8 * MiB);
    cuh_heap_poll(t.heap);   /* the GPU has not passed b's events yet */
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 8 * MiB);
    cuh_sim_complete_all(t.dev);
    cuh_heap_poll(t.heap);
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* cudaFree'd memory comes back before other free memory is cut: the exact
 * hole the program left, not a cut of another block. Fenced stream by stream
 * (device_fences:0, or a driver without device-wide events): with the
 * default stream alone that costs no wait. With other streams, what the GPU
 * has passed comes back with no wait; the rest with a wait on the GPU for
 * each running event by each other stream (an idle stream's event has
 * completed: no wait for it), at most once per N allocations with N streams
 * known, the default stream included (a take-back costs a few calls per
 * stream); in between, the heap serves from other free memory. */
static void test_cudafree_batches_come_back_before_other_free_memory(void **state)
{
    (void)state;
    enum { ALONE, RUNNING, PASSED, IDLE_STREAM, TOO_SOON, CASES };
    static const char *names[CASES] = {"alone", "running", "passed", "idle stream", "too soon"};
    for (int k = ALONE; k < CASES; k++) {
        print_message("case: %s\n", names[k]);
        test_heap_t t = test_heap_new(GiB, "device_fences:0");
        cuh_sim_hold_events(t.dev, 1);
        if (k == IDLE_STREAM)
            cuh_sim_stream_idle(t.dev, S3);
        if (k != ALONE)
            assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
        uintptr_t a, c, b, d = 0, e;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &a), CUHEAP_OK);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 100 * MiB, &c), CUHEAP_OK);
        if (k == TOO_SOON)
            assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &d), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, c), CUHEAP_OK);
        cuh_sim_complete_all(t.dev);
        uintptr_t x[2] = {0, 0};
        if (k == PASSED)   /* two allocations since c's batch closed: a's may close at its free */
            for (int i = 0; i < 2; i++)
                assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 1000, &x[i]), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);   /* c is ready now, a held */
        if (k == PASSED)
            cuh_sim_complete_all(t.dev);
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &b), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        assert_int_equal(b, a);   /* the exact hole, not a cut of c's */
        /* running: S3 waits for the default stream's event and the default
         * stream for S3's; idle: S3 for the default's only. */
        assert_int_equal(c1.stream_waits - c0.stream_waits, k == RUNNING || k == TOO_SOON ? 2 : k == IDLE_STREAM ? 1 : 0);
        assert_int_equal(c1.event_waits, c0.event_waits);   /* never the CPU */
        if (k == TOO_SOON) {
            /* d is freed right after the take-back: the next allocation
             * cuts c's hole rather than make the streams wait again. */
            assert_int_equal(cuh_heap_free_device_wide(t.heap, d), CUHEAP_OK);
            cuh_sim_counters(t.dev, &c0);
            assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &e), CUHEAP_OK);
            cuh_sim_counters(t.dev, &c1);
            assert_true(e >= c && e < c + 100 * MiB);
            assert_int_equal(c1.stream_waits, c0.stream_waits);
            assert_int_equal(cuh_heap_free_device_wide(t.heap, e), CUHEAP_OK);
        }
        assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
        for (int i = 0; i < 2; i++)
            assert_int_equal(cuh_heap_free_device_wide(t.heap, x[i]), CUHEAP_OK);
        heap_ok(t.heap);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}

/* A take-back with many streams running work (PyTorch's stream pool, NCCL's
 * streams): every stream's later work must start after the work every other
 * stream had issued before the frees, as a synchronizing cudaFree promises.
 * A wait per (stream, running event) pair costs the square of the streams
 * (under DDP about 8,000 waits and 1.7 ms of CPU per take-back); joining the
 * running events on one stream costs a wait per stream. */
static void test_take_back_orders_every_stream_after_the_frees_at_linear_cost(void **state)
{
    (void)state;
    enum { K = 12 };
    for (int idle_default = 0; idle_default <= 1; idle_default++) {
        test_heap_t t = test_heap_new(GiB, NULL);
        cuh_sim_hold_events(t.dev, 1);
        cuh_stream_t streams[K + 1];
        streams[0] = 0;
        for (int i = 1; i <= K; i++) {
            streams[i] = (cuh_stream_t)(0x10000 + 0x100 * i);
            assert_int_equal(cuh_heap_register_stream(t.heap, streams[i]), CUHEAP_OK);
        }
        uintptr_t a, b;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &a), CUHEAP_OK);
        uint64_t work[K + 1];
        for (int i = 0; i <= K; i++)
            work[i] = cuh_sim_enqueue_work(t.dev, streams[i]);
        if (idle_default)   /* the default stream has finished its work: no join through it is needed */
            cuh_sim_complete_stream(t.dev, 0);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &b), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        assert_int_equal(b, a);   /* taken back, not grown */
        for (int s2 = 0; s2 <= K; s2++)
            for (int j = 0; j <= K; j++)
                if (s2 != j && !cuh_sim_stream_waits_for(t.dev, streams[s2], streams[j], work[j]))
                    fail_msg("stream %d could start before stream %d's work issued before the free", s2, j);
        assert_int_equal(c1.event_waits, c0.event_waits);   /* the GPU waits, not the CPU */
        assert_true(c1.stream_waits - c0.stream_waits <= 2 * (K + 1));
        assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
        heap_ok(t.heap);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}

/* A model of cudaFree's promise checked over random operations: a block
 * freed device-wide is unsafe until every stream, the registered-only S3
 * included, has finished the work issued before the free. */
static void random_device_wide_frees(int small_mix)
{
    test_heap_t t = test_heap_new(8 * GiB, "wait_before_grow:0");
    cuh_sim_hold_events(t.dev, 1);
    enum { SLOTS = 300, OPS = 20000, NSTREAMS = 4, UNSAFE_MAX = 20000 };
    const cuh_stream_t streams[NSTREAMS] = {0, S1, S2, S3};
    assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
    uintptr_t addr[SLOTS] = {0};
    size_t size[SLOTS];
    cuh_stream_t stream[SLOTS];
    uintptr_t *unsafe_addr = malloc(UNSAFE_MAX * sizeof *unsafe_addr);
    size_t *unsafe_len = malloc(UNSAFE_MAX * sizeof *unsafe_len);
    uint64_t (*unsafe_work)[NSTREAMS] = malloc(UNSAFE_MAX * sizeof *unsafe_work);
    assert_true(unsafe_addr && unsafe_len && unsafe_work);
    size_t num_unsafe = 0, device_wide = 0;
    uint64_t seed = 2026;
    for (int op = 0; op < OPS; op++) {
        uint64_t r = test_rand(&seed);
        int i = (int)(r % SLOTS);
        if (addr[i]) {
            if ((r >> 30) & 1 || (small_mix && (r >> 31) % 4)) {
                /* Work on every stream may still read it: a kernel each. */
                assert_true(num_unsafe < UNSAFE_MAX);
                for (int k = 0; k < NSTREAMS; k++)
                    unsafe_work[num_unsafe][k] = cuh_sim_enqueue_work(t.dev, streams[k]);
                assert_int_equal(cuh_heap_free_device_wide(t.heap, addr[i]), CUHEAP_OK);
                unsafe_addr[num_unsafe] = addr[i];
                unsafe_len[num_unsafe++] = size[i];
                device_wide++;
            } else {
                must_free(t.heap, addr[i], stream[i]);
            }
            addr[i] = 0;
        } else {
            size[i] = (r >> 40) % 4 ? 1 + (size_t)(r >> 16) % (96 * KiB) : 1 + (size_t)(r >> 16) % (8 * MiB);
            if (small_mix)   /* mostly small cudaMalloc/cudaFree pairs: what threads' caches take */
                size[i] = (r >> 40) % 8 ? 1 + (size_t)(r >> 16) % (4 * KiB) : size[i];
            stream[i] = streams[(r >> 8) % 3];
            if ((r >> 12) % 4 == 0 || (small_mix && (r >> 13) % 4))   /* cudaMalloc: for every stream */
                assert_int_equal(cuh_heap_malloc_device_wide(t.heap, size[i], &addr[i]), CUHEAP_OK);
            else
                addr[i] = must_alloc(t.heap, size[i], stream[i]);
            /* Safe once that work is done on every stream (the test completes
             * streams below; a wait of the heap's may complete work too). */
            size_t kept = 0;
            for (size_t u = 0; u < num_unsafe; u++) {
                int done = 1;
                for (int k = 0; k < NSTREAMS; k++)
                    done &= cuh_sim_work_done(t.dev, streams[k], unsafe_work[u][k]);
                if (done)
                    continue;
                if (heap_model_overlap(addr[i], size[i], unsafe_addr[u], unsafe_len[u]))
                    fail_msg("op %d: 0x%lx was freed device-wide and handed out before every stream finished", op,
                             (unsigned long)unsafe_addr[u]);
                unsafe_addr[kept] = unsafe_addr[u];
                unsafe_len[kept] = unsafe_len[u];
                memcpy(unsafe_work[kept++], unsafe_work[u], sizeof unsafe_work[u]);
            }
            num_unsafe = kept;
        }
        if (op % 29 == 0)
            cuh_sim_complete_stream(t.dev, streams[(r >> 4) % NSTREAMS]);
        if (op % 1000 == 0)
            heap_ok(t.heap);
    }
    assert_true(device_wide > 4000);
    for (int i = 0; i < SLOTS; i++)
        if (addr[i])
            must_free(t.heap, addr[i], stream[i]);
    cuh_sim_complete_all(t.dev);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 0);
    assert_int_equal(st.allocated.current, 0);
    heap_ok(t.heap);
    free(unsafe_addr);
    free(unsafe_len);
    free(unsafe_work);
    test_heap_free(&t);
}

/* Over random operations, and over a mix of mostly small cudaMalloc and
 * cudaFree pairs, as PyTorch makes them without its cache: small objects
 * whose batches close at half the free slack and come back when a slab runs
 * out. */
static void test_random_device_wide_frees_are_never_reused_early(void **state)
{
    (void)state;
    random_device_wide_frees(0);
    random_device_wide_frees(1);
}

/* ---- device-wide fences -------------------------------------------------- */

/* With device-wide fences (the default) a cudaFree'd block comes back at
 * the next cudaMalloc that wants it, however many streams are known, for
 * one device-wide event and one device-wide wait on the GPU: no event or
 * wait per stream, and no rationing. The wait covers every stream: those the
 * heap knows, one it never heard of, and one created afterwards. */
static void test_device_fences_take_back_at_every_malloc_and_cover_every_stream(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    register_pool_streams(t.heap);   /* 33 streams known, the default one included */
    assert_int_equal(cuh_heap_register_stream(t.heap, S1), CUHEAP_OK);
    cuh_sim_hold_events(t.dev, 1);
    const cuh_stream_t unknown = 0x9000, created_later = 0xA000;
    uintptr_t a, d, b, e;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &a), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &d), CUHEAP_OK);
    /* Kernels that read a: one on a stream the heap never heard of. */
    const uint64_t on_unknown = cuh_sim_enqueue_work(t.dev, unknown);
    const uint64_t on_default = cuh_sim_enqueue_work(t.dev, 0);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &b), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(b, a);   /* the same memory at once */
    assert_int_equal(c1.events_recorded - c0.events_recorded, 1);
    assert_int_equal(c1.events_recorded_all - c0.events_recorded_all, 1);
    assert_int_equal(c1.waits_all - c0.waits_all, 1);
    assert_int_equal(c1.stream_waits, c0.stream_waits);
    assert_int_equal(c1.event_waits, c0.event_waits);   /* never the CPU */
    const cuh_stream_t waiters[] = {S1, (cuh_stream_t)0x10000, 0, unknown, created_later};
    for (size_t i = 0; i < sizeof waiters / sizeof waiters[0]; i++) {
        assert_true(cuh_sim_stream_waits_for(t.dev, waiters[i], unknown, on_unknown));
        assert_true(cuh_sim_stream_waits_for(t.dev, waiters[i], 0, on_default));
    }
    /* Freed right after the take-back: the next cudaMalloc takes it back too. */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, d), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &e), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(e, d);
    assert_int_equal(c0.waits_all - c1.waits_all, 1);
    assert_int_equal(c0.stream_waits, c1.stream_waits);
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, e), CUHEAP_OK);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* cudaFree'd small objects cost a fence only once more than half of the
 * free slack (cuh_hp_free_slack_locked: 2 MiB on a heap this small) waits
 * in the open batch, not one per free: 4,096 pairs of 512 bytes, the GPU
 * keeping up, record 16 events, where they recorded 4,096 (each time the
 * slab's free objects run out, the allocation takes back what the batch
 * holds rather than start another slab), and the heap holds one slab. What
 * the open batch holds still comes back before the heap grows:
 * under a limit that leaves no room for another slab, the same objects are
 * handed out again, the GPU ordered after their frees (it had not passed
 * them). */
static void test_device_fences_come_once_per_half_slack_of_small_frees(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_counters_t c0, c1;
    uintptr_t a = must_alloc(t.heap, 512, 0);   /* the slab exists */
    must_free(t.heap, a, 0);
    cuh_sim_counters(t.dev, &c0);
    for (int i = 0; i < 4096; i++) {
        uintptr_t x;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 512, &x), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, x), CUHEAP_OK);
    }
    cuh_sim_counters(t.dev, &c1);
    assert_true(c1.events_recorded - c0.events_recorded <= 4096 / 128);
    assert_true(c1.event_queries - c0.event_queries <= 2 * 4096 / 128);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.num_segment_allocs, 1);
    heap_ok(t.heap);
    cuh_heap_poll(t.heap);
    test_heap_free(&t);

    /* The limit: what holds 1,000 objects now, no more. */
    t = test_heap_new(GiB, NULL);
    enum { N = 1000 };
    uintptr_t obj[N], again[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 512, &obj[i]), CUHEAP_OK);
    cuh_heap_stats(t.heap, &st);
    cuh_heap_set_limit(t.heap, st.reserved.current);
    cuh_sim_hold_events(t.dev, 1);
    const uint64_t reading = cuh_sim_enqueue_work(t.dev, 0);   /* a kernel still reads them */
    cuh_sim_counters(t.dev, &c0);
    for (int i = 0; i < N; i++)
        assert_int_equal(cuh_heap_free_device_wide(t.heap, obj[i]), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.events_recorded, c0.events_recorded);   /* 500 KiB freed: no fence yet */
    for (int i = 0; i < N; i++)
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 512, &again[i]), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    cuh_heap_stats(t.heap, &st);
    assert_true(st.reserved.peak <= st.limit);
    assert_int_equal(st.num_ooms, 0);
    assert_true(c1.waits_all > c0.waits_all);   /* the GPU waits, not the CPU */
    assert_int_equal(c1.event_waits, c0.event_waits);
    assert_true(cuh_sim_stream_waits_for(t.dev, S1, 0, reading));
    heap_ok(t.heap);
    for (int i = 0; i < N; i++)
        assert_int_equal(cuh_heap_free_device_wide(t.heap, again[i]), CUHEAP_OK);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* A take-back being cheap with device-wide fences, a cudaMalloc takes back
 * whatever cudaFree gave back before it searches, not only once as much as
 * it asks for is held: a 32 MiB hole beside 32 MiB of free memory then
 * serves a 48 MiB request, instead of a cut of a free 100 MiB segment. */
static void test_device_fences_take_back_whatever_is_held_before_a_search(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    register_pool_streams(t.heap);
    uintptr_t p, q, a, b;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &p), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 100 * MiB, &q), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, p), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, q), CUHEAP_OK);
    cuh_heap_poll(t.heap);   /* both segments whole and free */
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 32 * MiB, &a), CUHEAP_OK);
    assert_int_equal(a, p);   /* the smaller segment */
    cuh_sim_hold_events(t.dev, 1);
    cuh_sim_enqueue_work(t.dev, 0);   /* a kernel still reads a */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    cuheap_stats_t st0, st1;
    cuh_heap_stats(t.heap, &st0);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 48 * MiB, &b), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    cuh_heap_stats(t.heap, &st1);
    assert_int_equal(b, a);   /* in a's hole and the free room beside it */
    assert_int_equal(c1.waits_all - c0.waits_all, 1);
    assert_int_equal(c1.event_waits, c0.event_waits);
    assert_int_equal(st1.reserved.current, st0.reserved.current);
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* A device without device-wide fences (a driver before CUDA 12.5) is fenced
 * stream by stream from its first refusal on; while a graph capture is
 * underway no event call is made at all (a device-wide one would invalidate
 * the capture, one on the capturing stream would join its graph): freed
 * blocks wait, and the heap grows instead. After the capture they come back. */
static void test_device_fences_fall_back_and_keep_out_of_captures(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_device_fences(t.dev, 0);
    assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a, b, c;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &a), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &b), CUHEAP_OK);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(b, a);
    assert_int_equal(c0.events_recorded_all, 0);
    assert_true(c0.events_recorded >= 2 && c0.stream_waits >= 1);   /* S3 and the default stream */
    assert_int_equal(c0.event_waits, 0);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);

    t = test_heap_new(GiB, NULL);
    assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
    cuh_sim_hold_events(t.dev, 1);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &a), CUHEAP_OK);
    cuh_sim_capturing(t.dev, 1);
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &b), CUHEAP_OK);
    cuh_heap_poll(t.heap);
    cuh_sim_counters(t.dev, &c1);
    assert_false(heap_model_overlap(a, 64 * MiB, b, 64 * MiB));   /* a waits out the capture */
    assert_int_equal(c1.events_recorded, c0.events_recorded);
    assert_int_equal(c1.event_queries, c0.event_queries);
    assert_int_equal(c1.stream_waits, c0.stream_waits);
    assert_int_equal(c1.event_waits + c1.synchronizes, c0.event_waits + c0.synchronizes);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 64 * MiB);
    cuh_sim_capturing(t.dev, 0);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &c), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c, a);   /* taken back once the capture is over */
    assert_int_equal(c1.events_recorded_all - c0.events_recorded_all, 1);
    heap_ok(t.heap);

    /* A capture that begins after a batch closed, before it comes back: the
     * device-wide wait is refused, so the batch waits for the capture's end,
     * and neither the GPU nor the CPU waits now. */
    uintptr_t d, e;
    assert_int_equal(cuh_heap_free_device_wide(t.heap, c), CUHEAP_OK);   /* closes under a device-wide event */
    cuh_sim_capturing(t.dev, 1);
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &d), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_false(heap_model_overlap(c, 64 * MiB, d, 64 * MiB));
    assert_int_equal(c1.waits_all, c0.waits_all);
    assert_int_equal(c1.stream_waits, c0.stream_waits);
    assert_int_equal(c1.event_waits + c1.synchronizes, c0.event_waits + c0.synchronizes);
    cuh_sim_capturing(t.dev, 0);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 64 * MiB, &e), CUHEAP_OK);
    assert_int_equal(e, c);   /* back once the capture is over */
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, d), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, e), CUHEAP_OK);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

/* ---- reuse across streams ------------------------------------------------ */

/* reuse_across_streams:1: a stream that would make the heap grow takes what
 * another stream freed while its work may still run, and waits on the GPU
 * for that work first; the CPU does not wait. Off (the default), it grows. */
static void test_reuse_across_streams_orders_the_new_user_after_the_free(void **state)
{
    (void)state;
    for (int reuse = 0; reuse <= 1; reuse++) {
        test_heap_t t = test_heap_new(GiB, reuse ? "grow_fraction:0,reuse_across_streams:1" : "grow_fraction:0");
        cuh_sim_hold_events(t.dev, 1);
        uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
        uint64_t work1 = cuh_sim_enqueue_work(t.dev, S1);   /* a kernel still reading a */
        must_free(t.heap, a, S1);
        uintptr_t b = must_alloc(t.heap, 8 * MiB, S2);
        cuheap_stats_t s;
        cuh_heap_stats(t.heap, &s);
        if (!reuse) {
            assert_false(heap_model_overlap(a, 8 * MiB, b, 8 * MiB));
            assert_int_equal(s.num_segment_allocs, 2);
            assert_false(cuh_sim_stream_waits_for(t.dev, S2, S1, work1));
        } else {
            assert_int_equal(b, a);
            assert_int_equal(s.num_segment_allocs, 1);
            assert_true(cuh_sim_stream_waits_for(t.dev, S2, S1, work1));
            assert_false(cuh_sim_stream_waits_for(t.dev, S3, S1, work1));   /* nobody else was ordered */
            /* Handed on: S3 must then start after S2's work and S1's. */
            uint64_t work2 = cuh_sim_enqueue_work(t.dev, S2);
            must_free(t.heap, b, S2);
            uintptr_t c = must_alloc(t.heap, 8 * MiB, S3);
            assert_int_equal(c, a);
            assert_true(cuh_sim_stream_waits_for(t.dev, S3, S2, work2));
            assert_true(cuh_sim_stream_waits_for(t.dev, S3, S1, work1));
            cuh_heap_stats(t.heap, &s);
            assert_int_equal(s.num_segment_allocs, 1);
            must_free(t.heap, c, S3);
        }
        assert_int_equal(s.num_cpu_waits, 0);
        heap_ok(t.heap);
        if (!reuse)
            must_free(t.heap, b, S2);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}

/* reuse_across_streams:1 and a device-wide request (cudaMalloc): what a
 * stream freed in order serves it once every stream, and a stream heard of
 * later, waits on the GPU for that stream's work. */
static void test_reuse_across_streams_device_wide_orders_every_stream(void **state)
{
    (void)state;
    for (int vmm = 0; vmm <= 1; vmm++) {
        test_heap_t t = test_heap_new(GiB, vmm ? "vmm:1,vmm_margin:0,reuse_across_streams:1"
                                               : "grow_fraction:0,reuse_across_streams:1");
        cuh_sim_hold_events(t.dev, 1);
        assert_int_equal(cuh_heap_register_stream(t.heap, S1), CUHEAP_OK);
        assert_int_equal(cuh_heap_register_stream(t.heap, S2), CUHEAP_OK);
        uintptr_t a = must_alloc(t.heap, 8 * MiB, S1);
        uint64_t work1 = cuh_sim_enqueue_work(t.dev, S1);
        must_free(t.heap, a, S1);
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        uintptr_t d;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 8 * MiB, &d), CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        assert_int_equal(d, a);
        assert_int_equal(c1.vm_maps, c0.vm_maps);   /* no new page either */
        assert_true(cuh_sim_stream_waits_for(t.dev, 0, S1, work1));
        assert_true(cuh_sim_stream_waits_for(t.dev, S2, S1, work1));
        assert_int_equal(cuh_heap_register_stream(t.heap, S3), CUHEAP_OK);
        assert_true(cuh_sim_stream_waits_for(t.dev, S3, S1, work1));
        cuheap_stats_t s;
        cuh_heap_stats(t.heap, &s);
        assert_int_equal(s.num_segment_allocs, vmm ? c1.vm_creates : 1);
        assert_int_equal(s.num_cpu_waits, 0);
        /* Under vmm:1 no page of it may move before S1's work is done. */
        heap_ok(t.heap);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, d), CUHEAP_OK);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}

/* A cudaMalloc of a small size whose slabs are all in use takes back what
 * cudaFree'd (a take-back, as the ladder's first step would): a slab that
 * take-back empties serves the request rather than go to the arena and be
 * cut again, and when another slab of the class serves instead, the empty
 * one still goes back (heap_ok: no slab stays with every object avail). */
static void test_small_take_back_keeps_the_slab_it_empties_for_the_request(void **state)
{
    (void)state;
    enum { PER_SLAB = 16 };   /* 64 KiB objects: sixteen a slab (sizeclass.c) */
    const size_t obj = 64 * KiB;
    for (int other_serves = 0; other_serves <= 1; other_serves++) {
        print_message("case: %s\n", other_serves ? "another slab of the class serves" : "the emptied slab serves");
        test_heap_t t = test_heap_new(GiB, NULL);
        uintptr_t a[PER_SLAB], b[PER_SLAB];
        for (int i = 0; i < PER_SLAB; i++)
            assert_int_equal(cuh_heap_malloc_device_wide(t.heap, obj, &a[i]), CUHEAP_OK);
        for (int i = 0; i < PER_SLAB; i++)
            assert_int_equal(cuh_heap_malloc_device_wide(t.heap, obj, &b[i]), CUHEAP_OK);
        for (int i = 0; i < PER_SLAB; i++)
            assert_false(b[i] >= a[0] && b[i] < a[0] + PER_SLAB * obj);   /* a second slab */
        for (int i = 0; i < PER_SLAB; i++)
            assert_int_equal(cuh_heap_free_device_wide(t.heap, a[i]), CUHEAP_OK);
        if (other_serves)
            assert_int_equal(cuh_heap_free_device_wide(t.heap, b[PER_SLAB - 1]), CUHEAP_OK);
        heap_ok(t.heap);
        cuh_sim_complete_all(t.dev);
        uintptr_t x;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, obj, &x), CUHEAP_OK);
        if (other_serves)
            assert_int_equal(x, b[PER_SLAB - 1]);   /* the slab listed last; the empty one went back */
        else
            assert_true(x >= a[0] && x < a[0] + PER_SLAB * obj);
        heap_ok(t.heap);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, x), CUHEAP_OK);
        for (int i = 0; i < PER_SLAB - other_serves; i++)
            assert_int_equal(cuh_heap_free_device_wide(t.heap, b[i]), CUHEAP_OK);
        cuh_sim_complete_all(t.dev);
        assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
        heap_ok(t.heap);
        test_heap_free(&t);
    }
}

/* A block's allocation takes back the batches that are closed (a block's
 * free closes its batch at once), but leaves an open batch of small objects
 * alone: closing it there cost a second fence for memory no block could use.
 * That batch still comes back at the ladder's later steps (here: before the
 * heap would grow for a block that fits nowhere else). */
static void test_block_allocation_leaves_an_open_batch_of_small_objects(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(64 * MiB, "vmm:0");
    uintptr_t big, small, again, huge;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 8 * MiB, &big), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 2000, &small), CUHEAP_OK);
    cuh_sim_counters_t c0, c1, c2;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, big), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, small), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.events_recorded_all - c0.events_recorded_all, 1);   /* the block's free */
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 8 * MiB, &again), CUHEAP_OK);
    cuh_sim_counters(t.dev, &c2);
    assert_int_equal(again, big);   /* its batch came back */
    assert_int_equal(c2.events_recorded_all - c1.events_recorded_all, 0);   /* no fence for the small one */
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 2048);   /* still in the open batch */
    heap_ok(t.heap);
    /* Nothing free fits 56 MiB without the small object's segment: the
     * ladder takes everything back before it grows. */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, again), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 56 * MiB, &huge), CUHEAP_OK);
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.pending.current, 0);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, huge), CUHEAP_OK);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* ---- a cudaFree'd block asked for again at its size ---------------------------- */

static uintptr_t dw_alloc(test_heap_t *t, size_t size)
{
    uintptr_t a = 0;
    assert_int_equal(cuh_heap_malloc_device_wide(t->heap, size, &a), CUHEAP_OK);
    return a;
}

/* A heap for the cases below: one segment (or the reservation) for every
 * block, and a small object allocated first, below them, whose
 * stream-ordered free finishes every batch whose fence is done (a free
 * polls them), touching no free block. */
static test_heap_t same_size_heap(int vm, uintptr_t *small)
{
    test_heap_t t = test_heap_new(GiB, vm ? "vmm:1" : "vmm:0,segment_min:256M");
    *small = must_alloc(t.heap, 100, S1);
    return t;
}

/* Frees block a and lets its batch finish (a is free memory then), frees
 * block b (held in its batch), and asks for `size` bytes device-wide: the
 * address the request gets. */
static uintptr_t free_a_then_b_and_ask(test_heap_t *t, uintptr_t small, uintptr_t a, uintptr_t b, size_t size)
{
    assert_int_equal(cuh_heap_free_device_wide(t->heap, a), CUHEAP_OK);
    must_free(t->heap, small, S1);
    assert_int_equal(cuh_heap_free_device_wide(t->heap, b), CUHEAP_OK);
    return dw_alloc(t, size);
}

/* A block cudaFree'd and asked for again at its size skips the round trip
 * through the arena only where the search would hand out the same block
 * (heap_devicewide.c, cuh_hp_take_freed_block_locked): an equal hole lower
 * down, a free neighbour below it, and a hole of its size while it would
 * absorb the free space above it each send the request elsewhere, as the
 * search does. On plain segments and on virtual memory (where the block at
 * the top is at the growth edge). */
static void test_cudafree_same_size_goes_where_the_search_would(void **state)
{
    (void)state;
    const size_t B = MiB;
    for (int vm = 0; vm <= 1; vm++) {
        print_message("case: %s\n", vm ? "vmm:1" : "vmm:0");
        uintptr_t small;
        {   /* The block alone: it comes back. */
            test_heap_t t = same_size_heap(vm, &small);
            uintptr_t g0 = dw_alloc(&t, B), a = dw_alloc(&t, B), g1 = dw_alloc(&t, B);
            assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
            assert_int_equal(dw_alloc(&t, B), a);
            (void)g0, (void)g1, (void)small;
            heap_ok(t.heap);
            test_heap_free(&t);
        }
        {   /* An equal hole lower down wins: the same size, the lower address. */
            test_heap_t t = same_size_heap(vm, &small);
            uintptr_t g0 = dw_alloc(&t, B), a = dw_alloc(&t, B), g1 = dw_alloc(&t, B), b = dw_alloc(&t, B);
            uintptr_t g2 = dw_alloc(&t, B);
            assert_true(g0 < a && a < g1 && g1 < b && b < g2);
            assert_int_equal(free_a_then_b_and_ask(&t, small, a, b, B), a);
            assert_int_equal(dw_alloc(&t, B), b);
            heap_ok(t.heap);
            test_heap_free(&t);
        }
        {   /* A free neighbour below, too small to serve by itself: released,
             * the block would merge with it and be cut from its start. */
            test_heap_t t = same_size_heap(vm, &small);
            uintptr_t g0 = dw_alloc(&t, B), a = dw_alloc(&t, B / 2), b = dw_alloc(&t, B), g2 = dw_alloc(&t, B);
            assert_true(a + B / 2 == b && g0 < a && b < g2);
            assert_int_equal(free_a_then_b_and_ask(&t, small, a, b, B), a);
            heap_ok(t.heap);
            test_heap_free(&t);
        }
        {   /* At the top, the block would absorb the free space above it: a
             * hole of its size elsewhere is the better fit. */
            test_heap_t t = same_size_heap(vm, &small);
            uintptr_t g0 = dw_alloc(&t, B), a = dw_alloc(&t, B), g1 = dw_alloc(&t, B), b = dw_alloc(&t, B);
            assert_true(g0 < a && a < g1 && g1 < b);
            assert_int_equal(free_a_then_b_and_ask(&t, small, a, b, B), a);
            assert_int_equal(dw_alloc(&t, B), b);
            heap_ok(t.heap);
            test_heap_free(&t);
        }
    }
}

/* The search's answer for a block handed out again is kept while the free
 * index stands still (heap_devicewide.c, same_block_locked): a block taken
 * again pair after pair still goes where the search would once memory that
 * cudaFree gave back elsewhere becomes free. Here an equal hole lower down
 * appears after three pairs, and the fourth request takes it, as the search
 * does; every pair leaves the block in the block map, once (heap_ok). */
static void test_cudafree_same_size_follows_the_search_after_many_pairs(void **state)
{
    (void)state;
    const size_t B = MiB;
    for (int vm = 0; vm <= 1; vm++) {
        print_message("case: %s\n", vm ? "vmm:1" : "vmm:0");
        uintptr_t small;
        test_heap_t t = same_size_heap(vm, &small);
        uintptr_t g0 = dw_alloc(&t, B), b = dw_alloc(&t, B), g1 = dw_alloc(&t, B), a = dw_alloc(&t, B);
        uintptr_t g2 = dw_alloc(&t, B);
        assert_true(g0 < b && b < g1 && g1 < a && a < g2);
        for (int pair = 0; pair < 3; pair++) {
            assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
            assert_int_equal(dw_alloc(&t, B), a);
            heap_ok(t.heap);
        }
        assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
        must_free(t.heap, small, S1);   /* b's batch finishes: b is free memory */
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
        assert_int_equal(dw_alloc(&t, B), b);
        assert_int_equal(dw_alloc(&t, B), a);
        heap_ok(t.heap);
        test_heap_free(&t);
    }
}

/* The short way for a block asked for again (take_back_locked) asks its
 * fence once: done, the block is handed out as it is; still running, the
 * long way orders all later work after it on the GPU (one device-wide wait),
 * without asking again and without the CPU waiting, and the request still
 * gets the block's place. On plain segments every pair takes the short way
 * once its answer is kept; under vmm:1 the first pair whose fence runs. */
static void test_cudafree_same_size_asks_its_fence_once(void **state)
{
    (void)state;
    const size_t B = MiB;
    for (int vm = 0; vm <= 1; vm++) {
        print_message("case: %s\n", vm ? "vmm:1" : "vmm:0");
        uintptr_t small;
        test_heap_t t = same_size_heap(vm, &small);
        uintptr_t g0 = dw_alloc(&t, B), a = dw_alloc(&t, B), g1 = dw_alloc(&t, B);
        (void)g0, (void)g1, (void)small;
        cuh_sim_counters_t c0, c1;
        for (int pair = 0; pair < 6; pair++) {
            const int running = pair >= 3;   /* the answer is kept from the second pair on */
            cuh_sim_hold_events(t.dev, running);
            assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
            cuh_sim_counters(t.dev, &c0);
            assert_int_equal(dw_alloc(&t, B), a);
            cuh_sim_counters(t.dev, &c1);
            /* Under vmm:1 a block the long way took back while its fence ran
             * came back through the arena with its pages stamped (their old
             * work may still run), and its next take-back asks that
             * generation's fence too. */
            const uint64_t queries = c1.event_queries - c0.event_queries;
            assert_true(queries == 1 || (vm && pair > 3 && queries == 2));
            assert_int_equal(c1.waits_all - c0.waits_all, running);
            assert_int_equal(c1.synchronizes, c0.synchronizes);
            assert_int_equal(c1.event_waits, c0.event_waits);
            cuh_sim_complete_all(t.dev);
            heap_ok(t.heap);
        }
        cuheap_stats_t st;
        cuh_heap_stats(t.heap, &st);
        assert_int_equal(st.num_cpu_waits, 0);
        test_heap_free(&t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_across_streams_orders_the_new_user_after_the_free),
        cmocka_unit_test(test_reuse_across_streams_device_wide_orders_every_stream),
        cmocka_unit_test(test_device_fences_take_back_at_every_malloc_and_cover_every_stream),
        cmocka_unit_test(test_device_fences_take_back_whatever_is_held_before_a_search),
        cmocka_unit_test(test_device_fences_fall_back_and_keep_out_of_captures),
        cmocka_unit_test(test_device_wide_free_waits_for_every_stream_without_blocking),
        cmocka_unit_test(test_device_wide_frees_cost_events_per_batch_not_per_free),
        cmocka_unit_test(test_device_wide_malloc_takes_only_memory_every_stream_may_use),
        cmocka_unit_test(test_random_device_wide_frees_are_never_reused_early),
        cmocka_unit_test(test_device_wide_malloc_waits_for_a_batch_rather_than_grow),
        cmocka_unit_test(test_cudafree_batches_come_back_before_other_free_memory),
        cmocka_unit_test(test_take_back_orders_every_stream_after_the_frees_at_linear_cost),
        cmocka_unit_test(test_device_wide_frees_with_many_streams_ration_batch_closes),
        cmocka_unit_test(test_poll_sends_a_rationed_batch_out),
        cmocka_unit_test(test_device_fences_come_once_per_half_slack_of_small_frees),
        cmocka_unit_test(test_small_take_back_keeps_the_slab_it_empties_for_the_request),
        cmocka_unit_test(test_block_allocation_leaves_an_open_batch_of_small_objects),
        cmocka_unit_test(test_cudafree_same_size_goes_where_the_search_would),
        cmocka_unit_test(test_cudafree_same_size_follows_the_search_after_many_pairs),
        cmocka_unit_test(test_cudafree_same_size_asks_its_fence_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
