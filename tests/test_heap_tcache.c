/* test_heap_tcache.c - where freed blocks wait outside the arena
 * (src/heap_tcache.c): the parked block, each thread's cache of small objects
 * and each thread's large block keep every rule: stream order, a double free
 * caught from any thread, exact statistics, nothing held through a capture,
 * an out-of-memory, a retired stream or the thread's exit.
 */
#include "heap_test.h"

/* ---- the parked block --------------------------------------------------------- */

/* The last large block freed on a stream comes back to the next request of
 * its size on that stream; the books stay exact meanwhile. */
static void test_parked_block_returns_to_a_same_size_request_on_its_stream(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t keep = must_alloc(t.heap, 3 * MiB, S1);
    uintptr_t a = must_alloc(t.heap, 5 * MiB, S1);
    must_free(t.heap, a, S1);
    heap_ok(t.heap);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(t.dev, &c0);
    assert_int_equal(must_alloc(t.heap, 5 * MiB - 100, S1), a);   /* same 512-byte rounding */
    cuh_sim_counters(t.dev, &c1);
    assert_int_equal(c1.events_recorded, c0.events_recorded);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.requested.current, 3 * MiB + 5 * MiB - 100);
    assert_int_equal(s.allocated.current, 8 * MiB);
    assert_int_equal(cuh_heap_block_size(t.heap, a), 5 * MiB - 100);
    must_free(t.heap, a, S1);
    must_free(t.heap, keep, S1);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* To every other call a parked block is freed memory. */
static void test_parked_block_is_free_to_every_other_call(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t keep = must_alloc(t.heap, 3 * MiB, S1);
    uintptr_t a = must_alloc(t.heap, 5 * MiB, S1);
    must_free(t.heap, a, S1);
    assert_int_equal(cuh_heap_block_size(t.heap, a), 0);
    assert_int_equal(cuh_heap_record_stream(t.heap, a, S2), CUHEAP_ERR_DOUBLE_FREE);
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free(t.heap, a, S1), CUHEAP_ERR_DOUBLE_FREE);
    uintptr_t c = must_alloc(t.heap, 5 * MiB, S1);
    must_free(t.heap, c, S1);   /* parked again */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, c), CUHEAP_ERR_DOUBLE_FREE);
    must_free(t.heap, keep, S1);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* Parked, the block is still its stream's private memory: another stream gets
 * it only once a fence recorded after the free has completed, whether the
 * fence completed before the block went back to the arena or after. */
static void test_parked_block_reaches_other_streams_only_after_its_fence(void **state)
{
    (void)state;
    for (int complete_first = 0; complete_first < 2; complete_first++) {
        test_heap_t t = test_heap_new(GiB, "grow_fraction:0");
        cuh_sim_hold_events(t.dev, 1);
        uintptr_t a = must_alloc(t.heap, 32 * MiB, S1);   /* a segment of its own: its free fences it */
        must_free(t.heap, a, S1);
        if (complete_first) {
            cuh_sim_complete_stream(t.dev, S1);
            cuh_heap_poll(t.heap);
            assert_int_equal(must_alloc(t.heap, 32 * MiB, S2), a);
        } else {
            uintptr_t b = must_alloc(t.heap, 32 * MiB, S2);
            assert_true(b != a);
            cuh_sim_complete_stream(t.dev, S1);
            assert_int_equal(must_alloc(t.heap, 32 * MiB, S2), a);
            must_free(t.heap, b, S2);
        }
        must_free(t.heap, a, S2);
        heap_ok(t.heap);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}

/* ---- thread caches ---------------------------------------------------------- */

/* Runs fn(arg) on a thread of its own, to its end (its exit hook included). */
static void on_other_thread(void *(*fn)(void *), void *arg)
{
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fn, arg), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
}

typedef struct tc_job_s {
    cuh_heap_t *heap;
    uintptr_t addr;
    size_t size;
    cuh_stream_t stream;
    cuheap_status_t status;
} tc_job_t;

static void *tc_alloc_job(void *arg)
{
    tc_job_t *j = arg;
    j->status = cuh_heap_malloc(j->heap, j->size, j->stream, &j->addr);
    return NULL;
}

static void *tc_free_job(void *arg)
{
    tc_job_t *j = arg;
    j->status = cuh_heap_free(j->heap, j->addr, j->stream);
    return NULL;
}

/* What a thread frees on a stream only that thread gets back, on that stream
 * (without a thread cache, another thread on the stream would get it). */
static void test_thread_cache_serves_its_thread_and_stream_only(void **state)
{
    (void)state;
    for (int cached = 0; cached < 2; cached++) {
        test_heap_t t = test_heap_new(GiB, cached ? NULL : "thread_cache:0");
        cuh_sim_hold_events(t.dev, 1);
        uintptr_t a = must_alloc(t.heap, 3000, S1);
        must_free(t.heap, a, S1);
        tc_job_t other = {.heap = t.heap, .size = 3000, .stream = S1};
        on_other_thread(tc_alloc_job, &other);
        assert_int_equal(other.status, CUHEAP_OK);
        if (cached)
            assert_true(other.addr != a);
        else
            assert_int_equal(other.addr, a);
        if (cached) {
            /* Not to another stream of this thread either, while S1's work may run. */
            uintptr_t b = must_alloc(t.heap, 3000, S2);
            assert_true(b != a);
            assert_int_equal(must_alloc(t.heap, 3000, S1), a);
            must_free(t.heap, b, S2);
            must_free(t.heap, a, S1);
        }
        heap_ok(t.heap);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}

/* The program's figures stay exact while objects pass through a cache. */
static void test_thread_cache_keeps_current_statistics_exact(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t a = must_alloc(t.heap, 2600, S1);
    must_free(t.heap, a, S1);                     /* into the cache */
    assert_int_equal(must_alloc(t.heap, 2900, S1), a);   /* same class, from the cache */
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.requested.current, 2900);
    assert_int_equal(s.allocated.current, 3072);
    assert_int_equal(s.num_allocs, 2);
    assert_int_equal(s.num_frees, 1);
    assert_int_equal(s.cached.current, s.reserved.current - 3072);
    assert_true(s.cached.peak >= s.cached.current);
    assert_int_equal(cuh_heap_block_size(t.heap, a), 2900);
    must_free(t.heap, a, S1);                     /* back to the cache */
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.requested.current, 0);
    assert_int_equal(s.allocated.current, 0);
    assert_int_equal(s.num_frees, 2);
    assert_int_equal(cuh_heap_block_size(t.heap, a), 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_thread_cache_double_free_is_caught_from_any_thread(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t keep = must_alloc(t.heap, 3000, S1);
    uintptr_t a = must_alloc(t.heap, 3000, S1);
    must_free(t.heap, a, S1);                     /* held by this thread's cache */
    assert_int_equal(cuh_heap_free(t.heap, a, S1), CUHEAP_ERR_DOUBLE_FREE);
    assert_int_equal(cuh_heap_free(t.heap, a, S2), CUHEAP_ERR_DOUBLE_FREE);
    tc_job_t other = {.heap = t.heap, .addr = a, .stream = S1};
    on_other_thread(tc_free_job, &other);
    assert_int_equal(other.status, CUHEAP_ERR_DOUBLE_FREE);
    heap_ok(t.heap);

    /* Handed out again, freed by another thread: that free counts, and the
     * owner's later free of it is the double one. */
    assert_int_equal(must_alloc(t.heap, 3000, S1), a);
    on_other_thread(tc_free_job, &other);
    assert_int_equal(other.status, CUHEAP_OK);
    assert_int_equal(cuh_heap_free(t.heap, a, S1), CUHEAP_ERR_DOUBLE_FREE);
    must_free(t.heap, keep, S1);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A block served from a cache and then used on another stream waits for that
 * stream's work like any other (record_stream takes it from the cache). */
static void test_thread_cache_object_used_on_another_stream_waits_for_it(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a = must_alloc(t.heap, 3000, S1);
    must_free(t.heap, a, S1);
    assert_int_equal(must_alloc(t.heap, 3000, S1), a);
    assert_int_equal(cuh_heap_record_stream(t.heap, a, S2), CUHEAP_OK);
    must_free(t.heap, a, S1);
    uintptr_t b = must_alloc(t.heap, 3000, S1);
    assert_true(b != a);                          /* S2 may still use it */
    heap_ok(t.heap);
    cuh_sim_complete_all(t.dev);
    must_free(t.heap, b, S1);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* During a graph capture allocations come from the heap, which records them
 * for the graph: a cache's object would escape the graph's pool. */
static void test_thread_cache_stays_shut_during_a_capture(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t a = must_alloc(t.heap, 3000, S1);
    must_free(t.heap, a, S1);                     /* cached */
    cuh_heap_capture_begin(t.heap, 7);
    uintptr_t b = must_alloc(t.heap, 3000, S1);
    cuh_heap_capture_end(t.heap);
    assert_true(b != a);
    must_free(t.heap, b, S1);
    /* Replays of the graph still write b: nobody gets it before the pool goes. */
    for (int i = 0; i < 4; i++)
        assert_true(must_alloc(t.heap, 3000, S1) != b);
    cuh_heap_release_pool(t.heap, 7);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* What caches hold goes back on release_cached and before an out-of-memory. */
static void test_thread_caches_give_back_before_out_of_memory(void **state)
{
    (void)state;
    /* On plain segments, and under vmm:1 where pages move instead. */
    for (int vmm = 0; vmm < 2; vmm++) {
        test_heap_t t = test_heap_new(GiB, vmm ? "limit:8M,vmm:1" : "limit:8M,segment_min:2M,grow_fraction:0");
        enum { N = 40 };
        uintptr_t a[N];
        for (int i = 0; i < N; i++)
            a[i] = must_alloc(t.heap, 64 * KiB, S1);
        for (int i = 0; i < N; i++)
            must_free(t.heap, a[i], S1);
        /* The slabs' 2.5 MiB and more sit in this thread's cache and S1's ring:
         * an 8 MiB block needs every byte of the limit. */
        uintptr_t big = must_alloc(t.heap, 8 * MiB, S2);
        must_free(t.heap, big, S2);
        heap_ok(t.heap);

        for (int i = 0; i < N; i++)
            a[i] = must_alloc(t.heap, 64 * KiB, S1);
        for (int i = 0; i < N; i++)
            must_free(t.heap, a[i], S1);
        assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
        cuheap_stats_t s;
        cuh_heap_stats(t.heap, &s);
        assert_int_equal(s.reserved.current, 0);
        heap_ok(t.heap);
        test_heap_free(&t);
    }
}

static void *tc_churn_job(void *arg)
{
    tc_job_t *j = arg;
    uintptr_t a[50];
    j->status = CUHEAP_OK;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 50; i++)
            if (cuh_heap_malloc(j->heap, 512 + 700 * (size_t)i, j->stream, &a[i]) != CUHEAP_OK)
                j->status = CUHEAP_ERR_OUT_OF_MEMORY;
        for (int i = 0; i < 50; i++)
            if (cuh_heap_free(j->heap, a[i], j->stream) != CUHEAP_OK)
                j->status = CUHEAP_ERR_INVALID_ARGUMENT;
    }
    j->addr = a[0];   /* a block this thread freed last: held by its cache when it exits */
    return NULL;
}

/* A thread that exits gives its cache back: every byte can be released. */
static void test_thread_exit_gives_its_cache_back(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    tc_job_t job = {.heap = t.heap, .stream = S1};
    on_other_thread(tc_churn_job, &job);
    assert_int_equal(job.status, CUHEAP_OK);
    heap_ok(t.heap);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.allocated.current, 0);
    assert_int_equal(s.num_allocs, 150);
    assert_int_equal(s.num_frees, 150);
    /* Back in S1's ring, not lost: a second free is still a double free. */
    assert_int_equal(cuh_heap_free(t.heap, job.addr, S1), CUHEAP_ERR_DOUBLE_FREE);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 0);
    test_heap_free(&t);
}

/* A retired stream's handle may come back as a new stream: what caches hold
 * for the old one waits for its work like the rest of its frees. */
static void test_retired_stream_takes_its_objects_out_of_thread_caches(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a = must_alloc(t.heap, 3000, S1);
    must_free(t.heap, a, S1);                     /* cached for S1 */
    cuh_heap_retire_stream(t.heap, S1);
    assert_true(must_alloc(t.heap, 3000, S1) != a);   /* the new S1: old work may run */
    heap_ok(t.heap);
    cuh_sim_complete_all(t.dev);
    test_heap_free(&t);
}

typedef struct tc_relay_s {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    cuh_heap_t *heap;   /* the heap to use next; NULL: done */
    int step, done_step;
    cuheap_status_t status;
} tc_relay_t;

/* Uses each heap it is handed (a cache of it stays behind) until told to stop. */
static void *tc_relay_job(void *arg)
{
    tc_relay_t *r = arg;
    pthread_mutex_lock(&r->lock);
    for (int seen = 0;;) {
        while (r->step == seen)
            pthread_cond_wait(&r->cond, &r->lock);
        seen = r->step;
        if (!r->heap)
            break;
        uintptr_t a;
        for (int i = 0; i < 3; i++) {
            if (cuh_heap_malloc(r->heap, 3000, S1, &a) != CUHEAP_OK || cuh_heap_free(r->heap, a, S1) != CUHEAP_OK)
                r->status = CUHEAP_ERR_INVALID_ARGUMENT;
        }
        r->done_step = seen;
        pthread_cond_broadcast(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static void relay_run(tc_relay_t *r, cuh_heap_t *h)
{
    pthread_mutex_lock(&r->lock);
    r->heap = h;
    int step = ++r->step;
    pthread_cond_broadcast(&r->cond);
    while (h && r->done_step != step)
        pthread_cond_wait(&r->cond, &r->lock);
    pthread_mutex_unlock(&r->lock);
}

/* A heap destroyed while a live thread still has a cache of it: the thread
 * goes on with the next heap (which may sit at the same address) and exits
 * cleanly (AddressSanitizer watches). */
static void test_thread_cache_outlives_its_heap_safely(void **state)
{
    (void)state;
    tc_relay_t r = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, tc_relay_job, &r), 0);
    for (int i = 0; i < 3; i++) {
        test_heap_t t = test_heap_new(GiB, NULL);
        relay_run(&r, t.heap);
        assert_int_equal(r.status, CUHEAP_OK);
        heap_ok(t.heap);
        cuheap_stats_t s;
        cuh_heap_stats(t.heap, &s);
        assert_int_equal(s.num_allocs, 3);
        assert_int_equal(s.allocated.current, 0);
        test_heap_free(&t);
    }
    relay_run(&r, NULL);
    assert_int_equal(pthread_join(th, NULL), 0);
}

/* ---- a thread's large block ------------------------------------------------- */

/* A heap of 1 GiB, run as if threads contended for it when `contended`. */
static test_heap_t heap_maybe_contended(int contended, const char *conf)
{
    test_heap_t t = test_heap_new(GiB, conf);
    if (contended)
        cuh_heap_assume_contention(t.heap, 100);
    return t;
}

/* Frees a, then b, on S1: a ends in the arena, b in this thread's cache. */
static void hold_two(cuh_heap_t *h, uintptr_t a, uintptr_t b)
{
    must_free(h, a, S1);
    must_free(h, b, S1);
    heap_ok(h);
}

/* While nobody contends, another thread's search sees the block this thread
 * holds, as it saw the parked block; once threads contend, only when it
 * finds no other fit. */
static void test_a_threads_large_block_is_everyones_unless_threads_contend(void **state)
{
    (void)state;
    for (int contended = 0; contended < 2; contended++) {
        test_heap_t t = test_heap_new(GiB, "grow_fraction:0");
        uintptr_t b = must_alloc(t.heap, 8 * MiB, S1);   /* a segment of 8 MiB */
        uintptr_t a = must_alloc(t.heap, 5 * MiB, S1);   /* one of 6 MiB */
        hold_two(t.heap, b, a);
        if (contended)
            cuh_heap_assume_contention(t.heap, 100);
        tc_job_t other = {.heap = t.heap, .size = 4 * MiB, .stream = S1};
        on_other_thread(tc_alloc_job, &other);
        assert_int_equal(other.status, CUHEAP_OK);
        if (contended) {
            assert_int_equal(other.addr, b);                          /* the 8 MiB hole */
            assert_int_equal(must_alloc(t.heap, 5 * MiB, S1), a);     /* still this thread's */
            must_free(t.heap, a, S1);
        } else {
            assert_int_equal(other.addr, a);                          /* the best fit, as parked */
        }
        heap_ok(t.heap);
        must_free(t.heap, other.addr, S1);
        all_freed(t.heap);
        test_heap_free(&t);
    }
}

/* The statistics add up after every operation, whatever thread caches,
 * streams, device-wide frees and GPU work that has not finished hold:
 * reserved = allocated + cached, and the largest free extent is no larger
 * than what is cached. */
static void test_statistics_add_up_after_every_operation(void **state)
{
    (void)state;
    const char *confs[] = {NULL, "vmm:1", "vmm:1,vmm_margin:0", "workspace:16M"};
    const cuh_stream_t streams[2] = {S1, S2};
    for (int k = 0; k < 4; k++)
        for (int contended = 0; contended < 2; contended++) {
            test_heap_t t = test_heap_new(GiB, confs[k]);
            if (contended)
                cuh_heap_assume_contention(t.heap, 1000000);
            uintptr_t live[16] = {0};
            cuh_stream_t on[16] = {0};
            uint32_t r = 12345;
            for (int op = 0; op < 3000; op++) {
                r = r * 1103515245u + 12345u;
                size_t i = (r >> 16) % 16;
                if (op % 200 == 0)
                    cuh_sim_hold_events(t.dev, (op / 200) % 2);   /* the GPU runs behind, then catches up */
                if (live[i]) {
                    switch ((r >> 4) % 3) {
                    case 0: must_free(t.heap, live[i], on[i]); break;
                    case 1: must_free(t.heap, live[i], streams[on[i] == S1]); break;   /* the other stream */
                    default: assert_int_equal(cuh_heap_free_device_wide(t.heap, live[i]), CUHEAP_OK);
                    }
                    live[i] = 0;
                } else {
                    on[i] = streams[(r >> 12) % 2];
                    live[i] = must_alloc(t.heap, (size_t)1 << (10 + (r >> 8) % 14), on[i]);
                }
                cuheap_stats_t s;
                cuh_heap_stats(t.heap, &s);
                assert_int_equal(s.reserved.current, s.allocated.current + s.cached.current);
                assert_true(s.largest_free_extent <= s.cached.current);
                assert_true(s.reserved.current <= s.reserved.peak);
                assert_true(s.allocated.current <= s.allocated.peak);
            }
            cuh_sim_hold_events(t.dev, 0);
            for (size_t i = 0; i < 16; i++)
                if (live[i])
                    must_free(t.heap, live[i], on[i]);
            heap_ok(t.heap);
            test_heap_free(&t);
        }
}

/* Blocks other threads hold go back before the heap grows or maps pages. */
static void test_held_large_blocks_go_back_before_the_heap_grows(void **state)
{
    (void)state;
    for (int vmm = 0; vmm < 2; vmm++) {
        test_heap_t t = test_heap_new(GiB, vmm ? "vmm:1" : "grow_fraction:0");
        uintptr_t a = must_alloc(t.heap, 6 * MiB, S1);
        must_free(t.heap, a, S1);                       /* held by this thread */
        cuh_heap_assume_contention(t.heap, 100);
        cuh_sim_counters_t c0, c1;
        cuh_sim_counters(t.dev, &c0);
        tc_job_t other = {.heap = t.heap, .size = 4 * MiB, .stream = S1};
        on_other_thread(tc_alloc_job, &other);
        assert_int_equal(other.status, CUHEAP_OK);
        cuh_sim_counters(t.dev, &c1);
        assert_int_equal(other.addr, a);
        assert_int_equal(c1.used, c0.used);             /* no segment, no page */
        must_free(t.heap, other.addr, S1);
        all_freed(t.heap);
        test_heap_free(&t);
    }
}

/* A held block goes back only to a request on the stream it was freed on:
 * freed again on another stream, it is that stream's. */
static void test_a_threads_large_block_serves_only_its_stream(void **state)
{
    (void)state;
    for (int contended = 0; contended < 2; contended++) {
        test_heap_t t = test_heap_new(GiB, NULL);
        cuh_sim_hold_events(t.dev, 1);
        uintptr_t keep = must_alloc(t.heap, 3 * MiB, S1);
        uintptr_t a = must_alloc(t.heap, 5 * MiB, S1);
        if (contended)
            cuh_heap_assume_contention(t.heap, 100);
        must_free(t.heap, a, S1);
        assert_int_equal(must_alloc(t.heap, 5 * MiB, S1), a);
        must_free(t.heap, a, S2);                       /* S2 used it last */
        heap_ok(t.heap);
        uintptr_t b = must_alloc(t.heap, 5 * MiB, S1);
        assert_true(b != a);                            /* S2's work may still read a */
        assert_int_equal(must_alloc(t.heap, 5 * MiB, S2), a);
        must_free(t.heap, a, S2);
        must_free(t.heap, b, S1);
        must_free(t.heap, keep, S1);
        heap_ok(t.heap);
        cuh_sim_complete_all(t.dev);
        test_heap_free(&t);
    }
}

/* A thread whose held blocks keep going back unused stops holding them (its
 * frees park as before, everybody's), until it takes one of them back. */
static void test_a_thread_that_never_repeats_a_size_holds_no_block(void **state)
{
    (void)state;
    test_heap_t t = heap_maybe_contended(1, "grow_fraction:0");
    uintptr_t b = must_alloc(t.heap, 8 * MiB, S1);
    uintptr_t a = must_alloc(t.heap, 5 * MiB, S1);
    for (size_t i = 0; i < 5; i++)   /* each allocation gives the block held before back unused */
        must_free(t.heap, must_alloc(t.heap, 2 * MiB + i * 4096, S1), S1);
    hold_two(t.heap, b, a);          /* a is parked, not held */
    /* Larger than the loop's free segments, another size than a's. */
    tc_job_t other = {.heap = t.heap, .size = 4 * MiB + 512 * KiB, .stream = S1};
    on_other_thread(tc_alloc_job, &other);
    assert_int_equal(other.addr, a);
    must_free(t.heap, other.addr, S1);
    must_free(t.heap, must_alloc(t.heap, 5 * MiB, S1), S1);   /* parked again */
    assert_int_equal(must_alloc(t.heap, 5 * MiB, S1), a);     /* its own parked block: holding resumes */
    must_free(t.heap, a, S1);
    on_other_thread(tc_alloc_job, &other);
    assert_int_equal(other.addr, b);
    must_free(t.heap, other.addr, S1);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A block handed out again may be freed by any thread; a held one freed
 * again, by any thread, is a double free that harms nothing. */
static void test_a_threads_large_block_double_free_is_caught_from_any_thread(void **state)
{
    (void)state;
    for (int contended = 0; contended < 2; contended++) {
        test_heap_t t = heap_maybe_contended(contended, NULL);
        uintptr_t keep = must_alloc(t.heap, 3 * MiB, S1);
        uintptr_t a = must_alloc(t.heap, 5 * MiB, S1);
        must_free(t.heap, a, S1);
        assert_int_equal(must_alloc(t.heap, 5 * MiB, S1), a);   /* handed out by the cache */
        tc_job_t other = {.heap = t.heap, .addr = a, .stream = S1};
        on_other_thread(tc_free_job, &other);
        assert_int_equal(other.status, CUHEAP_OK);
        assert_int_equal(cuh_heap_free(t.heap, a, S1), CUHEAP_ERR_DOUBLE_FREE);
        heap_ok(t.heap);
        uintptr_t b = must_alloc(t.heap, 7 * MiB, S1);
        must_free(t.heap, b, S1);                        /* held by this thread */
        on_other_thread(tc_free_job, &(tc_job_t){.heap = t.heap, .addr = b, .stream = S1});
        other = (tc_job_t){.heap = t.heap, .addr = b, .stream = S2};
        on_other_thread(tc_free_job, &other);
        assert_int_equal(other.status, CUHEAP_ERR_DOUBLE_FREE);
        assert_int_equal(cuh_heap_record_stream(t.heap, b, S2), CUHEAP_ERR_DOUBLE_FREE);
        assert_int_equal(cuh_heap_free(t.heap, b, S1), CUHEAP_ERR_DOUBLE_FREE);
        assert_int_equal(cuh_heap_block_size(t.heap, b), 0);
        must_free(t.heap, keep, S1);
        all_freed(t.heap);
        test_heap_free(&t);
    }
}

/* The figures stay exact: a request above the one the block was counted
 * with goes through the heap, so the peak of requested bytes is the
 * program's own. */
static void test_a_threads_large_block_keeps_the_books_exact(void **state)
{
    (void)state;
    for (int contended = 0; contended < 2; contended++) {
        test_heap_t t = heap_maybe_contended(contended, NULL);
        uintptr_t keep = must_alloc(t.heap, 3 * MiB, S1);
        uintptr_t a = must_alloc(t.heap, 5 * MiB - 400, S1);   /* all three round to 5 MiB */
        must_free(t.heap, a, S1);
        assert_int_equal(must_alloc(t.heap, 5 * MiB - 100, S1), a);   /* larger: the heap serves it */
        must_free(t.heap, a, S1);
        assert_int_equal(must_alloc(t.heap, 5 * MiB - 500, S1), a);   /* smaller: the cache does */
        cuheap_stats_t s;
        cuh_heap_stats(t.heap, &s);
        assert_int_equal(s.requested.current, 8 * MiB - 500);
        assert_int_equal(s.requested.peak, 8 * MiB - 100);
        assert_int_equal(s.allocated.current, 8 * MiB);
        assert_int_equal(s.allocated.peak, 8 * MiB);
        assert_int_equal(s.num_allocs, 4);
        assert_int_equal(s.num_frees, 2);
        assert_int_equal(cuh_heap_block_size(t.heap, a), 5 * MiB - 500);
        heap_ok(t.heap);
        must_free(t.heap, a, S1);
        cuh_heap_stats(t.heap, &s);
        assert_int_equal(s.requested.current, 3 * MiB);
        assert_int_equal(s.allocated.current, 3 * MiB);
        assert_int_equal(s.num_frees, 3);
        must_free(t.heap, keep, S1);
        all_freed(t.heap);
        test_heap_free(&t);
    }
}

static void *tc_alloc_free_alloc_job(void *arg)
{
    tc_job_t *j = arg;
    j->status = cuh_heap_malloc(j->heap, j->size, j->stream, &j->addr);
    if (j->status == CUHEAP_OK)
        j->status = cuh_heap_free(j->heap, j->addr, j->stream);
    if (j->status == CUHEAP_OK)
        j->status = cuh_heap_malloc(j->heap, j->size, j->stream, &j->addr);
    return NULL;
}

/* A thread that exits holding a large block, or having handed one out again,
 * leaves the heap whole: the block is freed memory, or the program's. */
static void test_a_threads_large_block_survives_its_thread(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_heap_assume_contention(t.heap, 1000);
    tc_job_t other = {.heap = t.heap, .size = 5 * MiB, .stream = S2};
    on_other_thread(tc_alloc_free_alloc_job, &other);    /* exits with it handed out */
    assert_int_equal(other.status, CUHEAP_OK);
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_block_size(t.heap, other.addr), 5 * MiB);
    must_free(t.heap, other.addr, S2);
    uintptr_t a = other.addr;
    on_other_thread(tc_alloc_job, &other);
    must_free(t.heap, a, S2);                            /* held by this thread now */
    other.addr = 0;
    on_other_thread(tc_alloc_free_alloc_job, &other);
    on_other_thread(tc_free_job, &other);                 /* exits holding it */
    heap_ok(t.heap);
    assert_int_equal(must_alloc(t.heap, 5 * MiB, S2), other.addr);
    must_free(t.heap, other.addr, S2);
    all_freed(t.heap);
    test_heap_free(&t);
}

/* A capture takes no block a thread holds: its allocations belong to the
 * graph's pool. */
static void test_a_threads_large_block_stays_out_of_a_capture(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    cuh_heap_assume_contention(t.heap, 100);
    uintptr_t a = must_alloc(t.heap, 5 * MiB, S1);
    must_free(t.heap, a, S1);                             /* held */
    cuh_heap_capture_begin(t.heap, 7);
    uintptr_t b = must_alloc(t.heap, 5 * MiB, S1);
    cuh_heap_capture_end(t.heap);
    must_free(t.heap, b, S1);
    for (int i = 0; i < 4; i++) {
        uintptr_t c = must_alloc(t.heap, 5 * MiB, S1);
        assert_true(c != b);                              /* the graph's replays still write b */
        must_free(t.heap, c, S1);
    }
    cuh_heap_release_pool(t.heap, 7);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* ---- a thread's cudaFree'd block ------------------------------------------- */

/* The script the twins below run: cudaMalloc and cudaFree pairs of one
 * block's size at random (some asking a little more than the block was
 * counted with, some labelled), now and then a pair of another size, with
 * the GPU keeping up and then running behind; every address handed out and
 * every free's answer go to out[]. Long enough to pass several of the
 * timeline's samples. */
static size_t dw_script(test_heap_t *t, uint64_t *out)
{
    const size_t B = 5 * MiB - 400;
    size_t n = 0;
    uint64_t seed = 4242;
    uintptr_t keep = 0;
    assert_int_equal(cuh_heap_malloc_device_wide(t->heap, 3 * MiB, &keep), CUHEAP_OK);
    for (int i = 0; i < 400; i++) {
        if (i % 40 == 0)
            cuh_sim_hold_events(t->dev, (i / 40) % 2);   /* the GPU runs behind, then catches up */
        if (i % 97 == 0)
            cuh_sim_complete_all(t->dev);
        const uint64_t r = test_rand(&seed);
        const size_t size = r % 13 == 5 ? 2 * MiB : r % 9 == 3 ? B + 300 : B - (size_t)(r >> 8) % 3 * 100;
        const unsigned label = (r >> 16) % 5 == 0 ? 3 : 0;
        uintptr_t a = 0;
        assert_int_equal(cuh_heap_malloc_labelled(t->heap, size, 1, 0, 0, label, &a), CUHEAP_OK);
        cuh_heap_freed_t freed;
        assert_int_equal(cuh_heap_free_labelled(t->heap, a, 1, 0, &freed), CUHEAP_OK);
        out[n++] = a;
        out[n++] = freed.requested << 8 | freed.label;
    }
    cuh_sim_hold_events(t->dev, 0);
    cuh_sim_complete_all(t->dev);
    /* Runs of one size longer than the timeline's interval, so that a slot
     * serves the operations that take its samples, each run after one
     * operation of another size, which moves the samples from the runs'
     * frees to their takes and back. */
    uintptr_t odd = 0;
    for (int run = 0; run < 4; run++) {
        if (run % 2)
            assert_int_equal(cuh_heap_free_device_wide(t->heap, odd), CUHEAP_OK);
        else
            assert_int_equal(cuh_heap_malloc_device_wide(t->heap, 2 * MiB, &odd), CUHEAP_OK);
        for (int i = 0; i < 100; i++) {
            uintptr_t a = 0;
            assert_int_equal(cuh_heap_malloc_device_wide(t->heap, B - (size_t)(i % 3 == 1) * 100, &a), CUHEAP_OK);
            cuh_heap_freed_t freed;
            assert_int_equal(cuh_heap_free_labelled(t->heap, a, 1, 0, &freed), CUHEAP_OK);
            out[n++] = a;
            out[n++] = freed.requested << 8 | freed.label;
        }
    }
    assert_int_equal(cuh_heap_free_device_wide(t->heap, keep), CUHEAP_OK);
    return n;
}

/* The twins' timelines (snap[0] without thread caches, snap[1] with) agree
 * sample for sample; both snapshots are freed. */
static void twins_sampled_alike(cuh_heap_snapshot_t *snap[2])
{
    assert_int_equal(snap[0]->num_samples, snap[1]->num_samples);
    for (size_t i = 0; i < snap[0]->num_samples; i++) {
        const cuh_sample_t *a = &snap[0]->timeline[i], *b = &snap[1]->timeline[i];
        if (a->live != b->live || a->reserved != b->reserved || a->cached != b->cached)
            fail_msg("timeline sample %zu differs: live %" PRIu64 " without a slot, %" PRIu64 " with", i, a->live,
                     b->live);
    }
    cuh_heap_snapshot_free(snap[0]);
    cuh_heap_snapshot_free(snap[1]);
}

/* A thread's slot changes nothing the heap says (heap_tcache.c, "a thread's
 * cudaFree'd block"): the script above on a heap without thread caches and
 * on one with them gives the same addresses, free answers, statistics,
 * peaks, device calls and timeline, on plain segments and under vmm:1. */
static void test_a_threads_cudafree_block_changes_nothing_the_heap_says(void **state)
{
    (void)state;
    for (int vm = 0; vm < 2; vm++) {
        print_message("case: %s\n", vm ? "vmm:1" : "vmm:0");
        uint64_t out[2][1700];
        size_t n[2];
        cuheap_stats_t st[2];
        cuh_sim_counters_t c[2];
        cuh_heap_snapshot_t *snap[2];
        for (int slot = 0; slot < 2; slot++) {
            char conf[64];
            snprintf(conf, sizeof conf, "vmm:%d,thread_cache:%s", vm, slot ? "4M" : "0");
            test_heap_t t = test_heap_new(GiB, conf);
            n[slot] = dw_script(&t, out[slot]);
            uint64_t at_free, at_take;   /* samples the slot took: the runs above must give some of each */
            cuh_heap_device_wide_slot_samples(t.heap, &at_free, &at_take);
            if (slot ? !at_free || !at_take : at_free || at_take)
                fail_msg("%s: %" PRIu64 " samples at a free, %" PRIu64 " at a take", conf, at_free, at_take);
            cuh_heap_stats(t.heap, &st[slot]);
            cuh_sim_counters(t.dev, &c[slot]);
            snap[slot] = cuh_heap_snapshot(t.heap, 0);
            assert_non_null(snap[slot]);
            heap_ok(t.heap);
            test_heap_free(&t);
        }
        assert_int_equal(n[0], n[1]);
        for (size_t i = 0; i < n[0]; i++)
            if (out[0][i] != out[1][i])
                fail_msg("item %zu of the script: 0x%" PRIx64 " without a slot, 0x%" PRIx64 " with", i, out[0][i],
                         out[1][i]);
        assert_int_equal(st[0].num_allocs, st[1].num_allocs);
        assert_int_equal(st[0].num_frees, st[1].num_frees);
        assert_int_equal(st[0].num_cache_hits, st[1].num_cache_hits);
        assert_int_equal(st[0].num_cpu_waits, st[1].num_cpu_waits);
        const struct {
            const cuheap_stat_t *a, *b;
        } figures[] = {{&st[0].requested, &st[1].requested}, {&st[0].allocated, &st[1].allocated},
                       {&st[0].reserved, &st[1].reserved}, {&st[0].cached, &st[1].cached},
                       {&st[0].pending, &st[1].pending}};
        for (size_t k = 0; k < sizeof figures / sizeof figures[0]; k++) {
            assert_int_equal(figures[k].a->current, figures[k].b->current);
            assert_int_equal(figures[k].a->peak, figures[k].b->peak);
        }
        assert_int_equal(c[0].event_queries, c[1].event_queries);
        assert_int_equal(c[0].events_recorded, c[1].events_recorded);
        assert_int_equal(c[0].events_recorded_all, c[1].events_recorded_all);
        assert_int_equal(c[0].waits_all, c[1].waits_all);
        assert_int_equal(c[0].stream_waits, c[1].stream_waits);
        assert_int_equal(c[0].event_waits, c[1].event_waits);
        assert_int_equal(c[0].synchronizes, c[1].synchronizes);
        twins_sampled_alike(snap);
    }
}

/* A free that takes the timeline's sample through the slot leaves the
 * heap's figures as the heap's own free would: what the pair's first free
 * left there, through the heap (a stats read gives the slot's block back
 * without refreshing them). */
static void test_a_threads_cudafree_block_samples_as_the_heap_would(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t keep = 0, odd = 0, a = 0;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 3 * MiB, &keep), CUHEAP_OK);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 2 * MiB, &odd), CUHEAP_OK);
    cuheap_stats_t first, now;
    uint64_t at_free = 0, at_take = 0;
    /* The samples fall on the pairs' takes or on their frees, as the count
     * of operations has it: if on a take, one more operation moves them. */
    for (int attempt = 0; attempt < 2 && !at_free; attempt++) {
        if (attempt)
            assert_int_equal(cuh_heap_free_device_wide(t.heap, odd), CUHEAP_OK);
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 5 * MiB, &a), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
        cuh_heap_stats(t.heap, &first);
        const uint64_t takes_before = at_take;
        for (int pair = 0; pair < 200 && !at_free && at_take == takes_before; pair++) {
            assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 5 * MiB, &a), CUHEAP_OK);
            assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
            cuh_heap_device_wide_slot_samples(t.heap, &at_free, &at_take);
        }
    }
    assert_true(at_free > 0);
    cuh_heap_stats(t.heap, &now);
    assert_int_equal(now.pending.current, first.pending.current);
    assert_int_equal(now.requested.current, first.requested.current);
    assert_int_equal(now.allocated.current, first.allocated.current);
    assert_int_equal(now.cached.current, first.cached.current);
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, keep), CUHEAP_OK);
    test_heap_free(&t);
}

/* A slot's budget is 16 bits: where the timeline's interval is longer, the
 * slot counts its operations under the lock when the budget runs out and
 * goes on, and the sample still comes at the operation where the heap's own
 * would (the twin without thread caches says which). */
static void test_a_threads_cudafree_block_samples_past_its_budget(void **state)
{
    (void)state;
    enum { EVERY = 70000, PAIRS = 36000 };
    cuh_heap_snapshot_t *snap[2];
    for (int slot = 0; slot < 2; slot++) {
        test_heap_t t = test_heap_new(GiB, slot ? NULL : "thread_cache:0");
        uintptr_t keep = 0, a = 0;
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 3 * MiB, &keep), CUHEAP_OK);
        cuh_heap_set_sample_interval(t.heap, EVERY);
        for (int pair = 0; pair < PAIRS; pair++) {
            /* one request in three smaller: the sample's live bytes say which pair took it */
            assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 5 * MiB - (size_t)(pair % 3) * 128, &a), CUHEAP_OK);
            assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
        }
        uint64_t at_free, at_take;
        cuh_heap_device_wide_slot_samples(t.heap, &at_free, &at_take);
        if (slot)
            assert_true(at_free + at_take >= 2);   /* the budget ran out, then the sample */
        snap[slot] = cuh_heap_snapshot(t.heap, 0);
        assert_non_null(snap[slot]);
        heap_ok(t.heap);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, keep), CUHEAP_OK);
        test_heap_free(&t);
    }
    twins_sampled_alike(snap);
}

/* The slot serves the pair without the heap's lock: a cudaMalloc of the
 * freed block's size takes it from there (the lock would have emptied the
 * slot), and every other call gives it back first. */
static void test_a_threads_cudafree_block_is_taken_without_the_lock(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t keep = 0, a = 0, b = 0;
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 3 * MiB, &keep), CUHEAP_OK);
    for (int pair = 0; pair < 3; pair++) {   /* the first pair finds the search's answer */
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 5 * MiB, &b), CUHEAP_OK);
        assert_true(pair == 0 || b == a);
        a = b;
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    }
    assert_int_equal(cuh_heap_device_wide_slots(t.heap), 1);
    for (int pair = 0; pair < 20; pair++) {
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 5 * MiB, &b), CUHEAP_OK);
        assert_int_equal(b, a);
        assert_int_equal(cuh_heap_device_wide_slots(t.heap), 1);   /* handed out from the slot */
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
        assert_int_equal(cuh_heap_device_wide_slots(t.heap), 1);
    }
    /* Freed twice: the heap sees it, with the block back in its batch. */
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_ERR_DOUBLE_FREE);
    assert_int_equal(cuh_heap_device_wide_slots(t.heap), 0);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_allocs, 24);
    assert_int_equal(s.num_frees, 23);
    assert_int_equal(s.requested.current, 3 * MiB);
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, keep), CUHEAP_OK);
    test_heap_free(&t);
    /* A heap destroyed while a slot holds a block frees it and its fence
     * with the rest (and the sanitized run finds no leak). */
    t = test_heap_new(GiB, NULL);
    for (int pair = 0; pair < 4; pair++) {
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 5 * MiB, &a), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    }
    assert_int_equal(cuh_heap_device_wide_slots(t.heap), 1);
    cuh_heap_destroy(t.heap);
    cuh_sim_counters_t c;
    cuh_sim_counters(t.dev, &c);
    assert_int_equal(c.used, 0);
    assert_int_equal(c.live_events, 0);
    t.dev->ops->destroy(t.dev);
}

/* Threads that cudaMalloc and cudaFree blocks as they go, two through their
 * slots and one whose sizes seldom repeat (its pairs go through the heap),
 * while kernels on three streams read every block until its free: a block
 * is handed out again only once every stream has finished the work issued
 * before its free, or waits for it on the GPU (cudaFree's promise),
 * whatever order the slots' fences and the heap's batches were recorded
 * in. */
enum { DW_THREADS = 3, DW_PAIRS = 3000, DW_FREED_MAX = 64 };
static const cuh_stream_t dw_streams[3] = {0, S1, S2};

typedef struct {
    pthread_mutex_t lock;
    test_heap_t *t;
    struct {
        uintptr_t addr;
        size_t len;
        uint64_t work[3];
    } freed[DW_FREED_MAX];   /* the last frees, not handed out since */
    size_t num_freed;
    int failed;
} dw_world_t;

typedef struct {
    dw_world_t *w;
    int id;
} dw_job_t;

/* Block [a, a+len) just handed out: every free it overlaps had its work
 * done or ordered before every stream's work from now on (w's lock held). */
static void dw_check_locked(dw_world_t *w, uintptr_t a, size_t len)
{
    for (size_t i = 0; i < w->num_freed;) {
        if (!heap_model_overlap(a, len, w->freed[i].addr, w->freed[i].len)) {
            i++;
            continue;
        }
        for (int k = 0; k < 3; k++)
            for (int u = 0; u < 3; u++)
                if (!cuh_sim_work_done(w->t->dev, dw_streams[k], w->freed[i].work[k]) &&
                    !cuh_sim_stream_waits_for(w->t->dev, dw_streams[u], dw_streams[k], w->freed[i].work[k]))
                    w->failed = 1;
        w->freed[i] = w->freed[--w->num_freed];
    }
}

static void *dw_pairs_job(void *arg)
{
    dw_job_t *j = arg;
    dw_world_t *w = j->w;
    uint64_t seed = 77 + (uint64_t)j->id;
    for (int p = 0; p < DW_PAIRS; p++) {
        const size_t size = j->id < 2 ? (size_t)(3 + 2 * j->id) * MiB : (1 + test_rand(&seed) % 8) * MiB;
        uintptr_t a = 0;
        if (cuh_heap_malloc_device_wide(w->t->heap, size, &a) != CUHEAP_OK)
            w->failed = 1;
        pthread_mutex_lock(&w->lock);
        dw_check_locked(w, a, size);
        if (w->num_freed == DW_FREED_MAX)
            memmove(w->freed, w->freed + 1, --w->num_freed * sizeof w->freed[0]);
        w->freed[w->num_freed].addr = a;
        w->freed[w->num_freed].len = size;
        for (int k = 0; k < 3; k++)   /* a kernel on each stream reads it until its free */
            w->freed[w->num_freed].work[k] = cuh_sim_enqueue_work(w->t->dev, dw_streams[k]);
        w->num_freed++;
        if (p % 37 == j->id)
            cuh_sim_complete_stream(w->t->dev, dw_streams[p % 3]);
        pthread_mutex_unlock(&w->lock);
        if (cuh_heap_free_device_wide(w->t->heap, a) != CUHEAP_OK)
            w->failed = 1;
    }
    return NULL;
}

static void test_a_threads_cudafree_block_keeps_cudafrees_promise_across_threads(void **state)
{
    (void)state;
    for (int vm = 0; vm < 2; vm++) {
        test_heap_t t = test_heap_new(GiB, vm ? "vmm:1" : NULL);
        assert_int_equal(cuh_heap_register_stream(t.heap, S1), CUHEAP_OK);
        assert_int_equal(cuh_heap_register_stream(t.heap, S2), CUHEAP_OK);
        cuh_sim_hold_events(t.dev, 1);
        dw_world_t w = {.t = &t};
        pthread_mutex_init(&w.lock, NULL);
        pthread_t th[DW_THREADS];
        dw_job_t jobs[DW_THREADS];
        for (int i = 0; i < DW_THREADS; i++) {
            jobs[i] = (dw_job_t){&w, i};
            assert_int_equal(pthread_create(&th[i], NULL, dw_pairs_job, &jobs[i]), 0);
        }
        for (int i = 0; i < DW_THREADS; i++)
            assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_false(w.failed);
        pthread_mutex_destroy(&w.lock);
        cuh_sim_hold_events(t.dev, 0);
        cuh_sim_complete_all(t.dev);
        cuheap_stats_t s;
        cuh_heap_stats(t.heap, &s);
        assert_int_equal(s.num_allocs, DW_THREADS * DW_PAIRS);
        assert_int_equal(s.num_frees, DW_THREADS * DW_PAIRS);
        assert_int_equal(s.allocated.current, 0);
        heap_ok(t.heap);
        test_heap_free(&t);
    }
}

/* Every operation gives the slots' blocks back before anything else, while
 * threads contend too: a fence a slot recorded is older than any batch
 * closed after it, and a take-back waits for the newest fence, which must
 * cover the work before every free it returns. Here a block's fence runs in
 * its slot while another cudaFree'd block's batch closes behind it. */
static void test_a_threads_cudafree_block_goes_back_before_batches_close(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    assert_int_equal(cuh_heap_register_stream(t.heap, S1), CUHEAP_OK);
    assert_int_equal(cuh_heap_register_stream(t.heap, S2), CUHEAP_OK);
    uintptr_t a = 0, b = 0, c = 0;
    for (int pair = 0; pair < 3; pair++) {
        assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 5 * MiB, &a), CUHEAP_OK);
        assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);
    }
    cuh_heap_assume_contention(t.heap, 100);
    cuh_sim_hold_events(t.dev, 1);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 5 * MiB, &a), CUHEAP_OK);
    cuh_sim_enqueue_work(t.dev, S1);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, a), CUHEAP_OK);   /* its fence runs, in the slot */
    assert_int_equal(cuh_heap_device_wide_slots(t.heap), 1);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 3 * MiB, &b), CUHEAP_OK);
    const uint64_t reads_b = cuh_sim_enqueue_work(t.dev, S2);
    assert_int_equal(cuh_heap_free_device_wide(t.heap, b), CUHEAP_OK);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 3 * MiB, &c), CUHEAP_OK);
    if (heap_model_overlap(c, 3 * MiB, b, 3 * MiB)) {
        const cuh_stream_t users[3] = {0, S1, S2};
        for (int u = 0; u < 3; u++)
            assert_true(cuh_sim_stream_waits_for(t.dev, users[u], S2, reads_b));
    }
    assert_false(cuh_sim_work_done(t.dev, S2, reads_b));
    assert_int_equal(cuh_heap_free_device_wide(t.heap, c), CUHEAP_OK);
    cuh_sim_hold_events(t.dev, 0);
    cuh_sim_complete_all(t.dev);
    heap_ok(t.heap);
    test_heap_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parked_block_returns_to_a_same_size_request_on_its_stream),
        cmocka_unit_test(test_parked_block_is_free_to_every_other_call),
        cmocka_unit_test(test_parked_block_reaches_other_streams_only_after_its_fence),
        cmocka_unit_test(test_thread_cache_serves_its_thread_and_stream_only),
        cmocka_unit_test(test_thread_cache_keeps_current_statistics_exact),
        cmocka_unit_test(test_thread_cache_double_free_is_caught_from_any_thread),
        cmocka_unit_test(test_thread_cache_object_used_on_another_stream_waits_for_it),
        cmocka_unit_test(test_thread_cache_stays_shut_during_a_capture),
        cmocka_unit_test(test_thread_caches_give_back_before_out_of_memory),
        cmocka_unit_test(test_thread_exit_gives_its_cache_back),
        cmocka_unit_test(test_retired_stream_takes_its_objects_out_of_thread_caches),
        cmocka_unit_test(test_thread_cache_outlives_its_heap_safely),
        cmocka_unit_test(test_a_threads_large_block_is_everyones_unless_threads_contend),
        cmocka_unit_test(test_statistics_add_up_after_every_operation),
        cmocka_unit_test(test_held_large_blocks_go_back_before_the_heap_grows),
        cmocka_unit_test(test_a_threads_large_block_serves_only_its_stream),
        cmocka_unit_test(test_a_thread_that_never_repeats_a_size_holds_no_block),
        cmocka_unit_test(test_a_threads_large_block_double_free_is_caught_from_any_thread),
        cmocka_unit_test(test_a_threads_large_block_keeps_the_books_exact),
        cmocka_unit_test(test_a_threads_large_block_survives_its_thread),
        cmocka_unit_test(test_a_threads_large_block_stays_out_of_a_capture),
        cmocka_unit_test(test_a_threads_cudafree_block_changes_nothing_the_heap_says),
        cmocka_unit_test(test_a_threads_cudafree_block_samples_as_the_heap_would),
        cmocka_unit_test(test_a_threads_cudafree_block_samples_past_its_budget),
        cmocka_unit_test(test_a_threads_cudafree_block_is_taken_without_the_lock),
        cmocka_unit_test(test_a_threads_cudafree_block_keeps_cudafrees_promise_across_threads),
        cmocka_unit_test(test_a_threads_cudafree_block_goes_back_before_batches_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
