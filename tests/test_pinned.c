/* test_pinned.c - the pinned host memory cache (src/pinned.c) through the
 * runtime, on simulated devices whose page-locked chunks are anonymous host
 * memory: every rule of pinned.h, the statistics, and the errors.
 *
 * Simulated events can be held incomplete (a busy GPU): that is how the
 * ordering rule is checked - a buffer freed while "GPU work" may still read
 * it must not come back before that work is done.
 */
#include "test_util.h"

#include "runtime.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The simulated device behind `device`'s heap, made if needed. */
static cuh_device_t *sim_device(int device)
{
    cuh_heap_t *h;
    assert_int_equal(cuh_runtime_heap(device, &h), CUHEAP_OK);
    return cuh_heap_device(h);
}

static void *host_alloc_on(int device, size_t size, unsigned flags)
{
    void *p = NULL;
    cuheap_status_t st = cuh_runtime_host_alloc("test", &p, size, flags, device);
    if (st != CUHEAP_OK)
        fail_msg("pinned alloc of %zu bytes (flags %u) on device %d: %s", size, flags, device, cuheap_last_error());
    assert_non_null(p);
    return p;
}

static cuheap_host_stats_t host_stats(void)
{
    cuheap_host_stats_t st;
    assert_int_equal(cuheap_get_host_stats(&st), CUHEAP_OK);
    return st;
}

static void test_allocations_are_aligned_writable_and_counted(void **state)
{
    (void)state;
    cuheap_host_stats_t st = host_stats();
    assert_int_equal(st.num_allocs, 0);
    assert_int_equal(st.reserved.current, 0);

    static const size_t sizes[] = {1, 100, 300, 4096, 5000, 65536, 1u << 20, 3u << 20};
    void *ptrs[sizeof sizes / sizeof sizes[0]];
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        assert_int_equal(cuheap_host_alloc(&ptrs[i], sizes[i], 0), CUHEAP_OK);
        uintptr_t a = (uintptr_t)ptrs[i];
        assert_int_equal(a % (sizes[i] >= 4096 ? 4096 : 256), 0);
        memset(ptrs[i], (int)i + 1, sizes[i]);   /* host memory: the host writes it */
        total += sizes[i];
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t b = 0; b < sizes[i]; b += 97)
            assert_int_equal(((unsigned char *)ptrs[i])[b], i + 1);
    st = host_stats();
    assert_int_equal(st.num_allocs, sizeof sizes / sizeof sizes[0]);
    assert_int_equal(st.requested.current, total);
    assert_true(st.allocated.current >= total);
    assert_true(st.reserved.current >= st.allocated.current);
    assert_int_equal(st.chunk_size, 32 * MiB);
    assert_true(st.num_chunks >= 1);

    void *zero = (void *)1;
    assert_int_equal(cuheap_host_alloc(&zero, 0, 0), CUHEAP_OK);
    assert_null(zero);
    assert_int_equal(cuheap_host_free(NULL), CUHEAP_OK);

    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        assert_int_equal(cuheap_host_free(ptrs[i]), CUHEAP_OK);
    st = host_stats();
    assert_int_equal(st.num_frees, sizeof sizes / sizeof sizes[0]);
    assert_int_equal(st.requested.current, 0);
    assert_int_equal(st.allocated.current, 0);
    assert_int_equal(st.requested.peak, total);
}

/* Every allocation lies in a chunk allocated with exactly its flags, and
 * memory that is not portable in a chunk of its own device's context. */
static void test_flags_are_honoured_one_arena_per_flag_set_and_device(void **state)
{
    (void)state;
    cuh_device_t *dev0 = sim_device(0), *dev1 = sim_device(1);
    for (unsigned flags = 0; flags < 4; flags++)
        for (int d = 0; d < 2; d++) {
            cuh_device_t *mine = d ? dev1 : dev0, *other = d ? dev0 : dev1;
            for (size_t size = 64; size <= 4 * MiB; size *= 8) {
                void *p = host_alloc_on(d, size, flags);
                uintptr_t base;
                size_t len;
                int got = cuh_sim_host_chunk(mine, p, &base, &len);
                if (flags & CUHEAP_HOST_PORTABLE) {
                    /* any context will do: whichever device's chunk holds it */
                    if (got < 0)
                        got = cuh_sim_host_chunk(other, p, &base, &len);
                } else {
                    assert_int_equal(cuh_sim_host_chunk(other, p, NULL, NULL), -1);
                }
                assert_int_equal(got, (int)flags);
                assert_true((uintptr_t)p + size <= base + len);
                memset(p, 0x5a, size);
                assert_int_equal(cuheap_host_free(p), CUHEAP_OK);
            }
        }
    void *p = (void *)1;
    assert_int_equal(cuheap_host_alloc(&p, 4096, 4 /* write-combined */), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_null(p);
    assert_non_null(strstr(cuheap_last_error(), "0x4"));
    assert_int_equal(cuheap_host_alloc(&p, 4096, 0x10), CUHEAP_ERR_INVALID_ARGUMENT);
}

/* cudaFreeHost's promise: a buffer freed while GPU work issued before the
 * free may still use it is not handed out again until that work is done. */
static void test_a_freed_buffer_waits_for_the_gpu_work_issued_before_the_free(void **state)
{
    (void)state;
    cuh_device_t *dev = sim_device(0);
    cuh_sim_hold_events(dev, 1);
    void *victim = host_alloc_on(0, 8192, 0);
    assert_int_equal(cuheap_host_free(victim), CUHEAP_OK);
    assert_int_equal(host_stats().pending.current, 8192);

    /* Many allocations of the same size while the GPU is busy: never the victim. */
    void *held[300];
    for (size_t i = 0; i < 300; i++) {
        held[i] = host_alloc_on(0, 8192, 0);
        assert_ptr_not_equal(held[i], victim);
        if (i % 2)
            assert_int_equal(cuheap_host_free(held[i]), CUHEAP_OK);
    }
    assert_true(host_stats().pending.current >= 8192);

    /* The GPU finishes: the victim comes back. */
    cuh_sim_complete_all(dev);
    (void)host_stats();   /* polls: closes what is open */
    cuh_sim_complete_all(dev);
    assert_int_equal(host_stats().pending.current, 0);
    int found = 0;
    void *again[200];
    for (size_t i = 0; i < 200; i++) {
        again[i] = host_alloc_on(0, 8192, 0);
        found |= again[i] == victim;
    }
    assert_true(found);
    for (size_t i = 0; i < 200; i++)
        assert_int_equal(cuheap_host_free(again[i]), CUHEAP_OK);
    for (size_t i = 0; i < 300; i += 2)
        assert_int_equal(cuheap_host_free(held[i]), CUHEAP_OK);
    cuh_sim_hold_events(dev, 0);
}

/* Work on another device counts too: the fence covers every device. */
static void test_the_fence_covers_every_device(void **state)
{
    (void)state;
    cuh_device_t *dev0 = sim_device(0), *dev1 = sim_device(1);
    cuh_sim_hold_events(dev1, 1);
    void *victim = host_alloc_on(0, 64 * KiB, CUHEAP_HOST_PORTABLE);
    assert_int_equal(cuheap_host_free(victim), CUHEAP_OK);
    for (size_t i = 0; i < 200; i++) {
        void *p = host_alloc_on(0, 64 * KiB, CUHEAP_HOST_PORTABLE);
        assert_ptr_not_equal(p, victim);
    }
    cuh_sim_counters_t c;
    cuh_sim_counters(dev1, &c);
    assert_true(c.events_recorded > 0);
    (void)dev0;
    cuh_sim_hold_events(dev1, 0);
}

/* While the GPU stays busy, memory waiting for it is bounded: past the
 * chunk size and half the cache, an allocation waits (as cudaFreeHost
 * would have), and the cache does not grow without end. */
static void test_pending_memory_is_bounded_by_waiting(void **state)
{
    (void)state;
    cuh_device_t *dev = sim_device(0);
    cuh_sim_hold_events(dev, 1);
    for (int i = 0; i < 100; i++) {
        void *p = host_alloc_on(0, 8 * MiB, 0);
        memset(p, i, 8 * MiB);
        assert_int_equal(cuheap_host_free(p), CUHEAP_OK);
    }
    cuheap_host_stats_t st = host_stats();
    print_message("waits %llu, reserved peak %llu\n", (unsigned long long)st.num_waits,
                  (unsigned long long)st.reserved.peak);
    assert_true(st.num_waits > 0);
    /* Waiting starts past the chunk size and the live bytes (8 MiB here);
     * without it the 100 buffers would take 800 MiB. */
    assert_true(st.pending.peak <= 32 * MiB + 8 * MiB);
    assert_true(st.reserved.peak <= 3 * 32 * MiB);
    cuh_sim_hold_events(dev, 0);
}

static void test_double_free_interior_and_foreign_pointers_are_errors(void **state)
{
    (void)state;
    char *p = host_alloc_on(0, 10000, 0);
    char *q = host_alloc_on(0, 10000, 0);
    memset(q, 7, 10000);
    cuheap_host_stats_t before = host_stats();
    assert_int_equal(cuheap_host_free(p + 64), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(cuheap_last_error(), "inside"));
    assert_int_equal(cuheap_host_free(p), CUHEAP_OK);
    assert_int_equal(cuheap_host_free(p), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(cuheap_last_error(), "freed already"));
    char *foreign = malloc(100);
    assert_int_equal(cuheap_host_free(foreign), CUHEAP_ERR_NOT_OWNED);
    assert_non_null(strstr(cuheap_last_error(), "not allocated by cuheap"));
    free(foreign);
    cuheap_host_stats_t after = host_stats();
    assert_int_equal(after.num_frees, before.num_frees + 1);
    assert_int_equal(after.requested.current, before.requested.current - 10000);
    for (size_t i = 0; i < 10000; i++)   /* the other buffer is untouched */
        assert_int_equal(q[i], 7);
    assert_int_equal(cuheap_host_free(q), CUHEAP_OK);
}

/* A request larger than a chunk gets a chunk of its own; freed buffers in
 * two chunks never merge into one allocation across them. */
static void test_large_requests_and_no_allocation_across_chunks(void **state)
{
    (void)state;
    assert_int_equal(cuheap_configure("pinned_chunk:4M"), CUHEAP_OK);
    cuh_device_t *dev = sim_device(0);
    void *big = host_alloc_on(0, 40 * MiB, 0);
    uintptr_t base;
    size_t len;
    assert_int_equal(cuh_sim_host_chunk(dev, big, &base, &len), 0);
    assert_true(len >= 40 * MiB);
    memset(big, 1, 40 * MiB);
    void *ptrs[64];
    for (int round = 0; round < 3; round++) {
        size_t n = 0;
        for (size_t size = 512 * KiB; n < 64; size += 256 * KiB) {
            ptrs[n] = host_alloc_on(0, size, 0);
            assert_int_equal(cuh_sim_host_chunk(dev, ptrs[n], &base, &len), 0);
            assert_true((uintptr_t)ptrs[n] + size <= base + len);   /* inside one chunk */
            memset(ptrs[n], (int)n, size);
            n++;
        }
        for (size_t i = 0; i < n; i++)
            assert_int_equal(cuheap_host_free(ptrs[i]), CUHEAP_OK);
        (void)host_stats();
    }
    assert_int_equal(cuheap_host_free(big), CUHEAP_OK);
    assert_true(host_stats().num_chunks > 2);
}

static void test_out_of_pinned_memory_is_reported(void **state)
{
    (void)state;
    cuh_device_t *dev = sim_device(0);
    cuh_sim_set_host_capacity(dev, 40 * MiB);
    void *a = host_alloc_on(0, MiB, 0);
    void *p = (void *)1;
    assert_int_equal(cuheap_host_alloc(&p, 100 * MiB, 0), CUHEAP_ERR_OUT_OF_MEMORY);
    assert_null(p);
    const char *msg = cuheap_last_error();
    assert_non_null(strstr(msg, "pinned host memory of 104857600 bytes"));
    assert_non_null(strstr(msg, "sim: host_alloc"));
    assert_int_equal(host_stats().num_ooms, 1);
    /* and the cache still serves what fits */
    void *b = host_alloc_on(0, MiB, 0);
    assert_int_equal(cuheap_host_free(a), CUHEAP_OK);
    assert_int_equal(cuheap_host_free(b), CUHEAP_OK);
}

/* A device reset takes the page-locked memory allocated in its context:
 * the cache that used it serves no more, a new one takes over, and frees of
 * the old buffers still succeed. */
static void test_a_device_reset_retires_the_cache(void **state)
{
    (void)state;
    /* (old lies deep in its chunk: the new cache's chunk may lie where the
     * old one was, and its first buffers at the start of it) */
    void *before[20];
    for (int i = 0; i < 20; i++)
        before[i] = host_alloc_on(0, 4096, 0);
    void *old = host_alloc_on(0, 4096, 0);
    cuh_runtime_drop_heap(0);
    void *fresh = host_alloc_on(0, 100, CUHEAP_HOST_MAPPED);
    assert_ptr_not_equal(fresh, old);
    memset(fresh, 3, 100);
    cuheap_host_stats_t st = host_stats();
    assert_int_equal(st.num_allocs, 1);   /* the new cache's books */
    assert_int_equal(cuheap_host_free(old), CUHEAP_OK);
    assert_int_equal(cuheap_host_free(old), CUHEAP_ERR_INVALID_ARGUMENT);   /* freed already */
    assert_int_equal(cuheap_host_free(fresh), CUHEAP_OK);
    (void)before;   /* gone with the reset, as CUDA's would be */
}

typedef struct worker_s {
    unsigned seed;
    unsigned char tag;
    unsigned long bad;
} worker_t;

static void *worker(void *arg)
{
    worker_t *w = arg;
    void *live[32] = {0};
    size_t sizes[32] = {0};
    for (int i = 0; i < 4000; i++) {
        unsigned slot = (unsigned)rand_r(&w->seed) % 32;
        if (live[slot]) {
            for (size_t b = 0; b < sizes[slot]; b += 61)
                w->bad += ((unsigned char *)live[slot])[b] != (unsigned char)(slot + w->tag);
            if (cuheap_host_free(live[slot]) != CUHEAP_OK)
                w->bad++;
            live[slot] = NULL;
        } else {
            sizes[slot] = 1 + (size_t)rand_r(&w->seed) % (256 * 1024);
            unsigned flags = (unsigned)rand_r(&w->seed) % 4;
            if (cuheap_host_alloc(&live[slot], sizes[slot], flags) != CUHEAP_OK) {
                w->bad++;
                continue;
            }
            memset(live[slot], (int)(slot + w->tag), sizes[slot]);
        }
    }
    for (unsigned s = 0; s < 32; s++)
        if (live[s] && cuheap_host_free(live[s]) != CUHEAP_OK)
            w->bad++;
    return NULL;
}

static void test_threads_allocate_and_free_concurrently(void **state)
{
    (void)state;
    pthread_t t[4];
    worker_t w[4];
    for (unsigned i = 0; i < 4; i++) {
        w[i] = (worker_t){.seed = 17 + i * 7919, .tag = (unsigned char)(40 * i)};
        assert_int_equal(pthread_create(&t[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].bad, 0);
    }
    cuheap_host_stats_t st = host_stats();
    assert_int_equal(st.requested.current, 0);
    assert_int_equal(st.num_allocs, st.num_frees);
}

static void test_settings_are_validated(void **state)
{
    (void)state;
    assert_int_equal(cuheap_configure("pinned_chunk:1G"), CUHEAP_OK);
    assert_int_equal(cuheap_configure("pinned_chunk:2G"), CUHEAP_ERR_CONFIG);
    assert_non_null(strstr(cuheap_last_error(), "pinned_chunk:2G must be between 2M and 1G"));
    assert_int_equal(cuheap_configure("pinned_chunk:0"), CUHEAP_ERR_CONFIG);
    assert_int_equal(cuheap_configure("pinned:2"), CUHEAP_ERR_CONFIG);
    assert_int_equal(cuheap_configure("pinned_chunk:3M"), CUHEAP_OK);
    void *p = host_alloc_on(0, 10, 0);
    assert_int_equal(host_stats().chunk_size, 4 * MiB);   /* rounded up to 2 MiB */
    assert_int_equal(cuheap_host_free(p), CUHEAP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_allocations_are_aligned_writable_and_counted, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_flags_are_honoured_one_arena_per_flag_set_and_device, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_a_freed_buffer_waits_for_the_gpu_work_issued_before_the_free, runtime_on_sim_setup,
                                        runtime_teardown),
        cmocka_unit_test_setup_teardown(test_the_fence_covers_every_device, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_pending_memory_is_bounded_by_waiting, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_double_free_interior_and_foreign_pointers_are_errors, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_large_requests_and_no_allocation_across_chunks, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_out_of_pinned_memory_is_reported, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_a_device_reset_retires_the_cache, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_threads_allocate_and_free_concurrently, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_settings_are_validated, runtime_on_sim_setup, runtime_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
