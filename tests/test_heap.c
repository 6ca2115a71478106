/* test_heap.c - the rules the heap's front keeps (src/heap.c; heap.h), each
 * proved on the simulated device: alignment and disjointness of blocks; a
 * double free or a foreign pointer leaves the heap intact; the limit caps
 * reserved bytes; release-and-retry happens before an out-of-memory; the
 * workspace is used first; statistics are exact; a block's label comes back
 * at its free and goes with it; random operations and concurrent threads
 * never get overlapping blocks. The rules of the heap's
 * other rooms are proved in test_heap_ROOM.c (helpers in heap_test.h).
 * Every test ends by checking the heap's books (heap_ok).
 */
#include "heap_test.h"

/* ---- alignment, sizes ------------------------------------------------------- */

static void test_every_block_is_512_aligned_and_disjoint(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(64 * GiB, NULL);
    enum { N = 600 };
    uintptr_t addr[N];
    size_t size[N];
    uint64_t seed = 42;
    for (int i = 0; i < N; i++) {
        uint64_t r = test_rand(&seed);
        size[i] = (r % 3 == 0) ? 1 + (size_t)(r >> 20) % (64 * KiB) : 1 + (size_t)(r >> 20) % (48 * MiB);
        addr[i] = must_alloc(t.heap, size[i], 0);
        assert_int_equal(addr[i] % 512, 0);
    }
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            if (heap_model_overlap(addr[i], size[i], addr[j], size[j]))
                fail_msg("blocks %d and %d overlap", i, j);
    heap_ok(t.heap);
    for (int i = 0; i < N; i++)
        must_free(t.heap, addr[i], 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_zero_size_gives_null_and_ok(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t a = 0xdead;
    assert_int_equal(cuh_heap_malloc(t.heap, 0, 0, &a), CUHEAP_OK);
    assert_int_equal(a, 0);
    assert_int_equal(cuh_heap_free(t.heap, 0, 0), CUHEAP_OK);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_allocs, 0);
    assert_int_equal(s.reserved.current, 0);
    test_heap_free(&t);
}

/* ---- bad frees ------------------------------------------------------------- */

static void test_double_free_is_an_error_and_changes_nothing(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t big = must_alloc(t.heap, 5 * MiB, 0);
    uintptr_t small = must_alloc(t.heap, 700, 0);
    uintptr_t keep = must_alloc(t.heap, 5 * MiB, 0);
    must_free(t.heap, big, 0);
    must_free(t.heap, small, 0);
    cuheap_stats_t s1, s2;
    cuh_heap_stats(t.heap, &s1);
    assert_int_equal(cuh_heap_free(t.heap, big, 0), CUHEAP_ERR_DOUBLE_FREE);
    assert_non_null(strstr(cuheap_last_error(), "double free"));
    assert_int_equal(cuh_heap_free(t.heap, small, 0), CUHEAP_ERR_DOUBLE_FREE);
    assert_int_equal(cuh_heap_free(t.heap, small, S2), CUHEAP_ERR_DOUBLE_FREE);
    cuh_heap_stats(t.heap, &s2);
    assert_int_equal(s1.num_frees, s2.num_frees);
    assert_int_equal(s1.allocated.current, s2.allocated.current);
    assert_int_equal(s1.cached.current, s2.cached.current);
    heap_ok(t.heap);
    /* The heap still works, and the kept block is intact. */
    assert_int_equal(cuh_heap_block_size(t.heap, keep), 5 * MiB);
    must_free(t.heap, keep, 0);
    must_free(t.heap, must_alloc(t.heap, 700, 0), 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_foreign_and_interior_pointers_are_refused(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t big = must_alloc(t.heap, 5 * MiB, 0);
    uintptr_t small = must_alloc(t.heap, 700, 0);
    assert_int_equal(cuh_heap_free(t.heap, 0x1234000, 0), CUHEAP_ERR_NOT_OWNED);
    assert_int_equal(cuh_heap_owns(t.heap, 0x1234000), 0);
    assert_int_equal(cuh_heap_free(t.heap, big + 512, 0), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_int_equal(cuh_heap_free(t.heap, small + 8, 0), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_true(cuh_heap_owns(t.heap, big + 512));
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_frees, 0);
    assert_int_equal(s.requested.current, 5 * MiB + 700);
    heap_ok(t.heap);
    must_free(t.heap, big, 0);
    must_free(t.heap, small, 0);
    test_heap_free(&t);
}

/* ---- limits, retry, out of memory ------------------------------------------ */

static void test_limit_in_bytes_caps_reserved(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "limit:64M");
    uintptr_t a[64];
    int n = 0;
    uintptr_t x;
    while (n < 64 && cuh_heap_malloc(t.heap, 8 * MiB, 0, &x) == CUHEAP_OK)
        a[n++] = x;
    assert_int_equal(n, 8);   /* 8 x 8 MiB = the limit */
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.peak, 64 * MiB);
    assert_int_equal(s.limit, 64 * MiB);
    cuh_oom_info_t o;
    assert_true(cuh_heap_last_oom(t.heap, &o));
    assert_int_equal(o.cause, CUH_OOM_LIMIT);
    assert_non_null(strstr(o.action, "limit"));
    heap_ok(t.heap);
    /* Half freed, a request that needs 72 MiB under the 64 MiB limit: the
     * advice gives this request's need as a floor, not as the job's, with
     * the live peak so far and how to measure the whole job. */
    for (int i = 4; i < n; i++)
        must_free(t.heap, a[i], 0);
    assert_int_equal(cuh_heap_malloc(t.heap, 40 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    assert_true(cuh_heap_last_oom(t.heap, &o));
    assert_int_equal(o.cause, CUH_OOM_LIMIT);
    assert_non_null(strstr(o.action, "raise limit in CUHEAP_CONF from 64.00 MiB"));
    assert_non_null(strstr(o.action, "this request alone needs at least 72.00 MiB"));
    assert_non_null(strstr(o.action, "live bytes have peaked at 64.00 MiB so far, but later requests may need more"));
    assert_non_null(strstr(o.action, "trace:PATH, and cuheap-replay --min-capacity"));
    for (int i = 0; i < 4; i++)
        must_free(t.heap, a[i], 0);
    test_heap_free(&t);
}

static void test_limit_as_fraction_of_device(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "limit:0.25");
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.limit, 256 * MiB);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc(t.heap, 300 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    must_free(t.heap, must_alloc(t.heap, 200 * MiB, 0), 0);
    test_heap_free(&t);
}

static void test_set_limit_applies_and_releases_what_is_over(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "grow_fraction:0");
    uintptr_t a = must_alloc(t.heap, 100 * MiB, 0);
    uintptr_t b = must_alloc(t.heap, 100 * MiB, 0);
    must_free(t.heap, b, 0);
    cuh_heap_set_limit(t.heap, 128 * MiB);
    cuheap_stats_t st;
    cuh_heap_stats(t.heap, &st);
    assert_int_equal(st.limit, 128 * MiB);
    assert_int_equal(st.reserved.current, 100 * MiB);
    uintptr_t x;
    assert_int_equal(cuh_heap_malloc(t.heap, 50 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    cuh_heap_set_limit(t.heap, 0);
    must_free(t.heap, must_alloc(t.heap, 50 * MiB, 0), 0);
    must_free(t.heap, a, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_release_and_retry_before_out_of_memory(void **state)
{
    (void)state;
    /* Cached segments too small for a request go back before a growth that
     * sets a new peak (test_growing_returns_idle_segments_too_small_for_the_request);
     * below the peak, only the device's refusal makes the heap give them back
     * and try again. The peak was 112 MiB; another process now holds 64 of
     * the device's 128. */
    test_heap_t t = test_heap_new(128 * MiB, "grow_fraction:0");
    must_free(t.heap, must_alloc(t.heap, 112 * MiB, 0), 0);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    uintptr_t a = must_alloc(t.heap, 24 * MiB, 0);
    uintptr_t b = must_alloc(t.heap, 24 * MiB, 0);
    must_free(t.heap, a, 0);
    must_free(t.heap, b, 0);
    cuh_sim_set_external(t.dev, 64 * MiB);
    cuheap_stats_t s0, s;
    cuh_heap_stats(t.heap, &s0);
    assert_int_equal(s0.reserved.current, 48 * MiB);
    assert_int_equal(s0.reserved.peak, 112 * MiB);
    /* 48 MiB cached in two segments, 16 free on the device: 48 MiB fits
     * only after both go back. */
    uintptr_t c = must_alloc(t.heap, 48 * MiB, 0);
    cuh_heap_stats(t.heap, &s);
    assert_true(s.num_retries > s0.num_retries);
    assert_int_equal(s.num_segment_frees - s0.num_segment_frees, 2);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.reserved.current, 48 * MiB);
    heap_ok(t.heap);
    must_free(t.heap, c, 0);
    test_heap_free(&t);
}

static void test_release_and_retry_settles_other_streams_first(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(64 * MiB, "grow_fraction:0");
    cuh_sim_hold_events(t.dev, 1);
    uintptr_t a = must_alloc(t.heap, 32 * MiB, S1);
    uintptr_t b = must_alloc(t.heap, 32 * MiB, S2);
    must_free(t.heap, a, S1);
    must_free(t.heap, b, S2);
    uintptr_t c = must_alloc(t.heap, 48 * MiB, S1);
    cuh_sim_counters_t cnt;
    cuh_sim_counters(t.dev, &cnt);
    assert_true(cnt.event_waits >= 1);
    heap_ok(t.heap);
    must_free(t.heap, c, S1);
    test_heap_free(&t);
}

static void test_out_of_memory_only_after_retry_and_heap_survives(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(64 * MiB, NULL);
    uintptr_t a = must_alloc(t.heap, 40 * MiB, 0);
    uintptr_t x = 1;
    assert_int_equal(cuh_heap_malloc(t.heap, 40 * MiB, 0, &x), CUHEAP_ERR_OUT_OF_MEMORY);
    assert_int_equal(x, 0);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_ooms, 1);
    assert_true(s.num_retries >= 1);
    cuh_oom_info_t o;
    assert_true(cuh_heap_last_oom(t.heap, &o));
    assert_int_equal(o.cause, CUH_OOM_CAPACITY);
    assert_int_equal(o.request, 40 * MiB);
    assert_non_null(strstr(cuheap_last_error(), "capacity"));
    must_free(t.heap, a, 0);
    must_free(t.heap, must_alloc(t.heap, 40 * MiB, 0), 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* ---- workspace -------------------------------------------------------------- */

static void test_workspace_is_taken_at_first_use_and_used_first(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, "workspace:64M");
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 0);
    uintptr_t a = must_alloc(t.heap, 8 * MiB, 0);
    uintptr_t b = must_alloc(t.heap, 40 * MiB, 0);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.workspace, 64 * MiB);
    assert_int_equal(s.reserved.current, 64 * MiB);
    assert_int_equal(s.num_segment_allocs, 1);
    assert_true(b > a && b - a < 64 * MiB);
    /* Release keeps the workspace. */
    must_free(t.heap, a, 0);
    must_free(t.heap, b, 0);
    cuh_heap_release_cached(t.heap);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 64 * MiB);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_workspace_larger_than_limit_is_refused(void **state)
{
    (void)state;
    cuh_config_t cfg;
    cuh_config_defaults(&cfg);
    char err[256];
    assert_int_equal(cuh_config_parse("workspace:1G,limit:512M", &cfg, err, sizeof err), 0);
    cuh_device_t *dev = cuh_sim_create(&(cuh_sim_params_t){.capacity = 4 * GiB});
    assert_null(cuh_heap_create(dev, &cfg, err, sizeof err));
    assert_non_null(strstr(err, "workspace"));
    dev->ops->destroy(dev);
}

/* ---- statistics -------------------------------------------------------------- */

static void test_statistics_are_exact(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t a = must_alloc(t.heap, 3 * MiB + 1, 0);    /* block 3 MiB + 512 */
    uintptr_t b = must_alloc(t.heap, 1000, 0);           /* class 1024 */
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.requested.current, 3 * MiB + 1 + 1000);
    assert_int_equal(s.allocated.current, 3 * MiB + 512 + 1024);
    assert_int_equal(s.cached.current, s.reserved.current - s.allocated.current);
    assert_int_equal(s.num_allocs, 2);
    must_free(t.heap, a, 0);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.requested.current, 1000);
    assert_int_equal(s.requested.peak, 3 * MiB + 1 + 1000);
    assert_int_equal(s.num_frees, 1);
    uintptr_t c = must_alloc(t.heap, 3 * MiB, 0);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.num_cache_hits, 2);   /* the second 1000 B object came from the slab, c from cache */
    cuh_heap_reset_peaks(t.heap);
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.requested.peak, s.requested.current);
    must_free(t.heap, b, 0);
    must_free(t.heap, c, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

static void test_release_cached_returns_every_free_segment(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(GiB, NULL);
    uintptr_t a[20];
    for (int i = 0; i < 20; i++)
        a[i] = must_alloc(t.heap, (size_t)(i + 1) * MiB + (i % 2 ? 100 : 0), i % 3 ? S1 : S2);
    for (int i = 0; i < 20; i++)
        must_free(t.heap, a[i], i % 3 ? S1 : S2);
    assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.reserved.current, 0);
    assert_int_equal(s.num_segment_frees, s.num_segment_allocs);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* ---- random operations and threads ------------------------------------------- */

static void test_random_operations_on_three_streams_keep_the_books(void **state)
{
    (void)state;
    random_operations(NULL, 8 * GiB, 20000, 40 * MiB, 97, 7);
}

typedef struct interval_set_s {
    pthread_mutex_t lock;
    uintptr_t *start;
    size_t *len;
    size_t n, cap;
    int overlap_seen;
} interval_set_t;

static void set_add(interval_set_t *set, uintptr_t a, size_t len)
{
    pthread_mutex_lock(&set->lock);
    for (size_t i = 0; i < set->n; i++)
        if (heap_model_overlap(a, len, set->start[i], set->len[i]))
            set->overlap_seen = 1;
    set->start[set->n] = a;
    set->len[set->n++] = len;
    pthread_mutex_unlock(&set->lock);
}

static void set_remove(interval_set_t *set, uintptr_t a)
{
    pthread_mutex_lock(&set->lock);
    for (size_t i = 0; i < set->n; i++)
        if (set->start[i] == a) {
            set->start[i] = set->start[--set->n];
            set->len[i] = set->len[set->n];
            break;
        }
    pthread_mutex_unlock(&set->lock);
}

typedef struct worker_s {
    cuh_heap_t *heap;
    interval_set_t *set;
    cuh_stream_t stream;
    uint64_t seed;
    int device_wide;   /* most calls cudaMalloc/cudaFree */
    int failures;
} worker_t;

static cuheap_status_t worker_free(const worker_t *w, uintptr_t addr, uint64_t r)
{
    return w->device_wide && (r >> 20) % 4 ? cuh_heap_free_device_wide(w->heap, addr)
                                           : cuh_heap_free(w->heap, addr, w->stream);
}

static cuheap_status_t worker_malloc(const worker_t *w, size_t size, uint64_t r, uintptr_t *addr)
{
    return w->device_wide && (r >> 24) % 4 ? cuh_heap_malloc_device_wide(w->heap, size, addr)
                                           : cuh_heap_malloc(w->heap, size, w->stream, addr);
}

static void *worker(void *arg)
{
    worker_t *w = arg;
    enum { SLOTS = 32, OPS = 4000 };
    uintptr_t addr[SLOTS] = {0};
    size_t sizes[SLOTS] = {0};
    for (int op = 0; op < OPS; op++) {
        uint64_t r = test_rand(&w->seed);
        int i = (int)(r % SLOTS);
        if (addr[i]) {
            set_remove(w->set, addr[i]);
            w->failures += worker_free(w, addr[i], r) != CUHEAP_OK;
            addr[i] = 0;
            if (!((r >> 8) % 3)) {
                /* The same size again at once: a thread cache's fast path. */
                if (worker_malloc(w, sizes[i], r, &addr[i]) != CUHEAP_OK)
                    w->failures++;
                else
                    set_add(w->set, addr[i], sizes[i]);
            }
        } else {
            size_t size = (r >> 40) % 8 ? 1 + (size_t)(r >> 16) % (64 * KiB) : 1 + (size_t)(r >> 16) % (8 * MiB);
            if (worker_malloc(w, size, r, &addr[i]) != CUHEAP_OK)
                w->failures++;
            else
                set_add(w->set, addr[i], sizes[i] = size);
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (addr[i]) {
            set_remove(w->set, addr[i]);
            w->failures += cuh_heap_free(w->heap, addr[i], w->stream) != CUHEAP_OK;
        }
    return NULL;
}

static void test_concurrent_threads_never_share_memory(void **state)
{
    (void)state;
    /* As the threads come, and as if they had contended from the start
     * (each then keeps the large block it freed: "a thread's large block");
     * and with most calls device-wide (cudaMalloc/cudaFree: frees wait in
     * the heap's batches), while the main thread reads statistics and gives
     * the caches back. */
    for (int contended = 0; contended < 3; contended++) {
        test_heap_t t = test_heap_new(16 * GiB, NULL);
        if (contended == 1)
            cuh_heap_assume_contention(t.heap, 1u << 30);
        enum { THREADS = 8 };
        interval_set_t set = {.start = calloc(THREADS * 32, sizeof(uintptr_t)),
                              .len = calloc(THREADS * 32, sizeof(size_t))};
        pthread_mutex_init(&set.lock, NULL);
        pthread_t th[THREADS];
        worker_t w[THREADS];
        for (int i = 0; i < THREADS; i++) {
            /* Half the threads share stream S1: frees and reuse across threads. */
            w[i] = (worker_t){.heap = t.heap, .set = &set, .stream = i % 2 ? S1 : (cuh_stream_t)(0x100 + i),
                              .seed = 1000 + (uint64_t)i, .device_wide = contended == 2};
            pthread_create(&th[i], NULL, worker, &w[i]);
        }
        for (int k = 0; contended == 2 && k < 20; k++) {
            cuheap_stats_t st;
            cuh_heap_stats(t.heap, &st);
            if (k % 5 == 0)
                assert_int_equal(cuh_heap_release_cached(t.heap), CUHEAP_OK);
        }
        for (int i = 0; i < THREADS; i++) {
            pthread_join(th[i], NULL);
            assert_int_equal(w[i].failures, 0);
        }
        assert_int_equal(set.overlap_seen, 0);
        all_freed(t.heap);
        free(set.start);
        free(set.len);
        pthread_mutex_destroy(&set.lock);
        test_heap_free(&t);
    }
}

/* A sticky error (the fault plan's, as CUDA's illegal address) loses the
 * device: the call that met it fails with a device error naming the call,
 * and from then on every allocation and free, even one the caches could
 * serve, is refused with the device's error and changes nothing; the books
 * stay sound and a report can still be written. */
static void test_a_lost_device_refuses_new_work_and_reports_still_render(void **state)
{
    (void)state;
    for (int vmm = 0; vmm < 2; vmm++) {
        fault_heap_t t = fault_heap_new(GiB, vmm ? "vmm:1" : "vmm:0");
        cuh_device_t *dev = t.dev;
        cuh_heap_t *h = t.heap;
        uintptr_t live = must_alloc(h, 8 * MiB, 0), cached = must_alloc(h, 4 * KiB, 0), x;
        must_free(h, cached, 0);   /* a small object the thread's cache holds */
        cuheap_stats_t before, after;
        cuh_heap_stats(h, &before);

        cuh_fault_sticky(dev, 1, CUH_DEV_ERROR);
        assert_int_equal(cuh_heap_malloc(h, 512 * MiB, 0, &x), CUHEAP_ERR_DEVICE);   /* needs the device */
        assert_non_null(strstr(cuheap_last_error(), "injected sticky error"));
        assert_int_equal(cuh_heap_malloc(h, 4 * KiB, 0, &x), CUHEAP_ERR_DEVICE);     /* the cache could serve it */
        assert_non_null(strstr(cuheap_last_error(), "device 0 is lost (error 700"));
        assert_non_null(strstr(cuheap_last_error(), "cuheap refuses new work"));
        assert_int_equal(cuh_noted_lost_since(0), 700);
        assert_int_equal(cuh_heap_malloc_device_wide(h, 4 * KiB, &x), CUHEAP_ERR_DEVICE);
        assert_int_equal(cuh_heap_free(h, live, 0), CUHEAP_ERR_DEVICE);
        assert_int_equal(cuh_heap_free_device_wide(h, live), CUHEAP_ERR_DEVICE);
        cuh_heap_stats(h, &after);
        assert_int_equal(after.requested.current, before.requested.current);
        assert_int_equal(after.num_frees, before.num_frees);
        heap_ok(h);
        /* A report still renders, the device not asked. */
        cuh_heap_snapshot_t *snap = cuh_heap_snapshot(h, 0);
        assert_non_null(snap);
        FILE *out = fopen("/dev/null", "w");
        assert_non_null(out);
        cuh_report_text(out, cuh_report_origin_now(), &snap, 1, NULL);
        cuh_report_json(out, cuh_report_origin_now(), &snap, 1, NULL);
        fclose(out);
        cuh_heap_snapshot_free(snap);

        /* The test cleans up: the device comes back, and everything goes home. */
        cuh_fault_clear(dev);
        must_free(h, live, 0);
        fault_heap_free(&t);
    }
}

/* The call that lost the device is named to every thread, not only to the
 * one whose call met it (each thread has its own device error text). */
static void *refused_on_another_thread(void *arg)
{
    cuh_heap_t *h = arg;
    uintptr_t x;
    int named = cuh_heap_malloc(h, 4 * KiB, 0, &x) == CUHEAP_ERR_DEVICE &&
                strstr(cuheap_last_error(), "device 0 is lost (error 700") &&
                strstr(cuheap_last_error(), "injected sticky error (the context is lost since call");
    return named ? h : NULL;
}

static void test_the_call_that_lost_the_device_is_named_to_every_thread(void **state)
{
    (void)state;
    fault_heap_t t = fault_heap_new(GiB, "vmm:0");
    uintptr_t x;
    cuh_fault_sticky(t.dev, 1, CUH_DEV_ERROR);
    assert_int_equal(cuh_heap_malloc(t.heap, 512 * MiB, 0, &x), CUHEAP_ERR_DEVICE);
    assert_non_null(strstr(cuheap_last_error(), "injected sticky error"));
    pthread_t other;
    void *named = NULL;
    assert_int_equal(pthread_create(&other, NULL, refused_on_another_thread, t.heap), 0);
    assert_int_equal(pthread_join(other, &named), 0);
    assert_ptr_equal(named, t.heap);
    cuh_fault_clear(t.dev);
    fault_heap_free(&t);
}

/* ---- labels ------------------------------------------------------------------ */

/* A block's label comes back at its free, with the bytes it was asked for,
 * for small objects and blocks, device-wide and on a stream; the live
 * labelled bytes add up by label; the label goes with the block: memory a
 * thread's cache hands out again (no label set on that path) frees with
 * none. A label over 255 is refused. */
static void test_a_label_comes_back_at_its_free_and_goes_with_the_block(void **state)
{
    (void)state;
    test_heap_t t = test_heap_new(4 * GiB, NULL);
    const size_t sizes[] = {700, 40 * KiB, 3 * MiB + 5};
    uintptr_t a[3][2];
    for (int k = 0; k < 3; k++) {
        assert_int_equal(cuh_heap_malloc_labelled(t.heap, sizes[k], 1, 0, 0, 7, &a[k][0]), CUHEAP_OK);
        assert_int_equal(cuh_heap_malloc_labelled(t.heap, sizes[k], 0, 0, S1, 9, &a[k][1]), CUHEAP_OK);
    }
    uint64_t by_label[256] = {0};
    cuh_heap_live_by_label(t.heap, by_label);
    assert_int_equal(by_label[7], 700 + 40 * KiB + 3 * MiB + 5);
    assert_int_equal(by_label[9], 700 + 40 * KiB + 3 * MiB + 5);
    heap_ok(t.heap);
    for (int k = 0; k < 3; k++) {
        cuh_heap_freed_t f;
        assert_int_equal(cuh_heap_free_labelled(t.heap, a[k][0], 1, 0, &f), CUHEAP_OK);
        assert_int_equal(f.label, 7);
        assert_int_equal(f.requested, sizes[k]);
        assert_int_equal(cuh_heap_free_labelled(t.heap, a[k][1], 0, S1, &f), CUHEAP_OK);
        assert_int_equal(f.label, 9);
        assert_int_equal(f.requested, sizes[k]);
    }
    memset(by_label, 0, sizeof by_label);
    cuh_heap_live_by_label(t.heap, by_label);
    for (int k = 0; k < 256; k++)
        assert_int_equal(by_label[k], 0);
    heap_ok(t.heap);
    /* Freed on its stream, a small object goes to the thread's cache, which
     * hands it out again without the lock: it must not bring its old label. */
    uintptr_t x, y;
    assert_int_equal(cuh_heap_malloc_labelled(t.heap, 700, 0, 0, S1, 5, &x), CUHEAP_OK);
    cuh_heap_freed_t f;
    assert_int_equal(cuh_heap_free_labelled(t.heap, x, 0, S1, &f), CUHEAP_OK);
    assert_int_equal(f.label, 5);
    assert_int_equal(cuh_heap_malloc(t.heap, 700, S1, &y), CUHEAP_OK);
    assert_int_equal(y, x);   /* from the thread's cache */
    heap_ok(t.heap);
    assert_int_equal(cuh_heap_free_labelled(t.heap, y, 0, S1, &f), CUHEAP_OK);
    assert_int_equal(f.label, 0);
    /* The same for a block through the parked place and the arena. */
    assert_int_equal(cuh_heap_malloc_labelled(t.heap, 3 * MiB, 1, 0, 0, 6, &x), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_labelled(t.heap, x, 1, 0, &f), CUHEAP_OK);
    assert_int_equal(f.label, 6);
    assert_int_equal(cuh_heap_malloc_device_wide(t.heap, 3 * MiB, &y), CUHEAP_OK);
    assert_int_equal(cuh_heap_free_labelled(t.heap, y, 1, 0, &f), CUHEAP_OK);
    assert_int_equal(f.label, 0);
    assert_int_equal(cuh_heap_malloc_labelled(t.heap, 512, 1, 0, 0, 256, &x), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_int_equal(x, 0);
    heap_ok(t.heap);
    test_heap_free(&t);
}

/* Every way a labelled block can be cut keeps its label: plain segments,
 * a segment of its own (shareable, ipc_safe), the reservation, small and
 * large; a step plan's window; the labelled bytes add up, then all go. */
static void test_every_way_a_block_is_cut_keeps_its_label(void **state)
{
    (void)state;
    const char *confs[] = {NULL, "vmm:0", "vmm:0,ipc_safe:1", "ipc_safe:1", "step_plan:1", "vmm:0,small_max:0"};
    const size_t sizes[] = {100, 9 * KiB, 64 * KiB, 70 * KiB, 2 * MiB, 9 * MiB + 3};
    for (size_t c = 0; c < sizeof confs / sizeof confs[0]; c++) {
        test_heap_t t = test_heap_new(4 * GiB, confs[c]);
        enum { N = 6 * 3 };
        uintptr_t a[N];
        unsigned label[N];
        uint64_t want[256] = {0};
        for (int k = 0; k < N; k++) {
            const int way = k % 3;   /* device-wide, shareable, on a stream */
            const size_t size = sizes[k / 3];
            label[k] = 1 + (unsigned)k * 13 % 255;
            assert_int_equal(cuh_heap_malloc_labelled(t.heap, size, way < 2, way == 1, way == 2 ? S1 : 0, label[k],
                                                      &a[k]),
                             CUHEAP_OK);
            want[label[k]] += size;
        }
        uint64_t by_label[256] = {0};
        cuh_heap_live_by_label(t.heap, by_label);
        for (int k = 0; k < 256; k++)
            if (by_label[k] != want[k])
                fail_msg("settings %s: label %d holds %llu bytes, %llu allocated", confs[c] ? confs[c] : "default", k,
                         (unsigned long long)by_label[k], (unsigned long long)want[k]);
        heap_ok(t.heap);
        for (int k = 0; k < N; k++) {
            cuh_heap_freed_t f;
            assert_int_equal(cuh_heap_free_labelled(t.heap, a[k], k % 3 < 2, k % 3 == 2 ? S1 : 0, &f), CUHEAP_OK);
            if (f.label != label[k] || f.requested != sizes[k / 3])
                fail_msg("settings %s: block %d freed with label %u and %zu bytes, allocated with %u and %zu",
                         confs[c] ? confs[c] : "default", k, f.label, f.requested, label[k], sizes[k / 3]);
        }
        memset(by_label, 0, sizeof by_label);
        cuh_heap_live_by_label(t.heap, by_label);
        for (int k = 0; k < 256; k++)
            assert_int_equal(by_label[k], 0);
        heap_ok(t.heap);
        test_heap_free(&t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_block_is_512_aligned_and_disjoint),
        cmocka_unit_test(test_a_label_comes_back_at_its_free_and_goes_with_the_block),
        cmocka_unit_test(test_every_way_a_block_is_cut_keeps_its_label),
        cmocka_unit_test(test_zero_size_gives_null_and_ok),
        cmocka_unit_test(test_set_limit_applies_and_releases_what_is_over),
        cmocka_unit_test(test_double_free_is_an_error_and_changes_nothing),
        cmocka_unit_test(test_foreign_and_interior_pointers_are_refused),
        cmocka_unit_test(test_limit_in_bytes_caps_reserved),
        cmocka_unit_test(test_limit_as_fraction_of_device),
        cmocka_unit_test(test_release_and_retry_before_out_of_memory),
        cmocka_unit_test(test_release_and_retry_settles_other_streams_first),
        cmocka_unit_test(test_out_of_memory_only_after_retry_and_heap_survives),
        cmocka_unit_test(test_workspace_is_taken_at_first_use_and_used_first),
        cmocka_unit_test(test_workspace_larger_than_limit_is_refused),
        cmocka_unit_test(test_statistics_are_exact),
        cmocka_unit_test(test_release_cached_returns_every_free_segment),
        cmocka_unit_test(test_random_operations_on_three_streams_keep_the_books),
        cmocka_unit_test(test_concurrent_threads_never_share_memory),
        cmocka_unit_test(test_a_lost_device_refuses_new_work_and_reports_still_render),
        cmocka_unit_test(test_the_call_that_lost_the_device_is_named_to_every_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
