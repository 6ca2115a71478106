/* test_device_sim.c - tests of the simulated device (src/device_sim.c).
 *
 * Memory: segments are distinct, 2 MiB-aligned and never overlap; sizes that
 * are not multiples of 2 MiB are errors that explain themselves; asking for
 * more than is free is OOM and counted as a refusal; memory used by others
 * (external bytes) shrinks both what can be allocated and what mem_info
 * reports free; freeing an unknown address or with the wrong size is an
 * error; freed capacity can be allocated again; two devices of different
 * ordinals hand out disjoint addresses. A byte-exact model of used memory
 * is checked against the counters and mem_info throughout.
 *
 * Events: with hold off an event completes when recorded; with hold on it
 * stays NOT_READY until its own stream is completed (not another's), all
 * streams are, the device synchronizes, or a host wait on it (which also
 * completes earlier events of its stream, not later ones); an event never
 * recorded is complete; live_events follows create/destroy.
 */
#include "test_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SEG (2 * MiB)

static cuh_device_t *sim_new(size_t capacity, int ordinal)
{
    cuh_device_t *d = cuh_sim_create(&(cuh_sim_params_t){.capacity = capacity, .ordinal = ordinal});
    assert_non_null(d);
    assert_string_equal(d->kind, "sim");
    assert_int_equal(d->ordinal, ordinal);
    return d;
}

static cuh_sim_counters_t counters(cuh_device_t *d)
{
    cuh_sim_counters_t c;
    memset(&c, 0xee, sizeof c);
    cuh_sim_counters(d, &c);
    return c;
}

static size_t free_bytes(cuh_device_t *d, size_t *total)
{
    size_t f = 0, t = 0;
    assert_int_equal(d->ops->mem_info(d, &f, &t), CUH_DEV_OK);
    if (total)
        *total = t;
    return f;
}

typedef struct seg_s {
    uintptr_t addr;
    size_t size;
} seg_t;

static void assert_disjoint(const seg_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (s[i].addr < s[j].addr + s[j].size && s[j].addr < s[i].addr + s[i].size)
                fail_msg("segments [0x%lx,+%zu) and [0x%lx,+%zu) overlap", (unsigned long)s[i].addr, s[i].size,
                         (unsigned long)s[j].addr, s[j].size);
}

static void test_alloc_gives_distinct_aligned_non_overlapping_segments(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    size_t total = 0;
    assert_int_equal(free_bytes(d, &total), GiB);
    assert_int_equal(total, GiB);
    seg_t segs[64];
    size_t n = 0, used = 0;
    const size_t mult[] = {1, 3, 2, 8, 1, 5, 16, 1, 4, 7};
    for (size_t i = 0; i < sizeof mult / sizeof mult[0]; i++) {
        size_t sz = mult[i] * SEG;
        uintptr_t a = 0;
        assert_int_equal(d->ops->mem_alloc(d, sz, &a), CUH_DEV_OK);
        assert_true(a != 0);
        assert_int_equal(a % SEG, 0);
        segs[n].addr = a;
        segs[n].size = sz;
        n++;
        used += sz;
        assert_disjoint(segs, n);
        cuh_sim_counters_t c = counters(d);
        assert_int_equal(c.used, used);
        assert_int_equal(c.mem_allocs, n);
        assert_int_equal(free_bytes(d, NULL), GiB - used);
    }
    /* Segments of one device are not adjacent (a gap separates them). */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            assert_true(segs[i].addr + segs[i].size != segs[j].addr);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(d->ops->mem_free(d, segs[i].addr, segs[i].size), CUH_DEV_OK);
    cuh_sim_counters_t c = counters(d);
    assert_int_equal(c.used, 0);
    assert_int_equal(c.mem_frees, n);
    assert_int_equal(c.mem_refusals, 0);
    assert_int_equal(free_bytes(d, NULL), GiB);
    d->ops->destroy(d);
}

/* A failed call's message is the calling thread's: another thread's failure
 * meanwhile (a thread's slot calls the device outside the heap's lock) does
 * not overwrite it, and each thread reads its own. */
static pthread_barrier_t error_barrier;

static void *fail_in_between(void *arg)
{
    cuh_device_t *d = arg;
    pthread_barrier_wait(&error_barrier);   /* the main thread has failed */
    uintptr_t a = 0;
    int failed = d->ops->mem_alloc(d, 3 * MiB, &a) == CUH_DEV_ERROR;
    pthread_barrier_wait(&error_barrier);
    return failed && strstr(cuh_dev_error_text(d), "segment of 3145728 bytes") ? d : NULL;
}

static void test_a_failed_calls_message_is_its_threads(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    pthread_t t;
    assert_int_equal(pthread_barrier_init(&error_barrier, NULL, 2), 0);
    assert_int_equal(pthread_create(&t, NULL, fail_in_between, d), 0);
    uintptr_t a = 0;
    assert_int_equal(d->ops->mem_alloc(d, 1, &a), CUH_DEV_ERROR);
    pthread_barrier_wait(&error_barrier);
    pthread_barrier_wait(&error_barrier);   /* the other thread's call has failed too */
    void *theirs = NULL;
    assert_int_equal(pthread_join(t, &theirs), 0);
    assert_non_null(strstr(cuh_dev_error_text(d), "segment of 1 bytes"));
    assert_ptr_equal(theirs, d);
    pthread_barrier_destroy(&error_barrier);
    d->ops->destroy(d);
}

static void test_size_not_multiple_of_2mib_is_error_with_message(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    const size_t bad[] = {0, 1, 512, SEG - 1, SEG + 1, SEG + 512, 3 * MiB};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cuh_dev_error_text(d)[0] = '\0';
        uintptr_t a = 0xdead;
        assert_int_equal(d->ops->mem_alloc(d, bad[i], &a), CUH_DEV_ERROR);
        assert_true(strlen(cuh_dev_error_text(d)) > 0);
        assert_non_null(strstr(cuh_dev_error_text(d), "2 MiB"));
        assert_int_equal(a, 0xdead);   /* untouched */
    }
    cuh_sim_counters_t c = counters(d);
    assert_int_equal(c.used, 0);
    assert_int_equal(c.mem_allocs, 0);
    assert_int_equal(c.mem_refusals, 0);   /* an error is not a refusal */
    d->ops->destroy(d);
}

/* As the driver (bench/gpu/vm_offset_probe.cu): a mapping takes a whole
 * physical allocation, never part of one; the whole one maps at a second
 * range too, and reads back as the same allocation there. */
static void test_vm_map_takes_only_a_whole_allocation(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    uint64_t h = 0;
    uintptr_t va = 0;
    assert_int_equal(d->ops->vm_create(d, 8 * MiB, &h), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_reserve(d, 32 * MiB, &va), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_map(d, va, 2 * MiB, h), CUH_DEV_ERROR);
    assert_int_equal(d->ops->vm_map(d, va, 16 * MiB, h), CUH_DEV_ERROR);
    assert_int_equal(d->ops->vm_map(d, va, 8 * MiB, h), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_map(d, va + 16 * MiB, 8 * MiB, h), CUH_DEV_OK);
    size_t off = 1;
    assert_true(cuh_sim_handle_at(d, va + 16 * MiB + 6 * MiB, &off) == h);
    assert_int_equal(off, 6 * MiB);
    assert_int_equal(d->ops->vm_unmap(d, va, 2 * MiB), CUH_DEV_ERROR);   /* not the whole mapping */
    assert_int_equal(d->ops->vm_unmap(d, va, 8 * MiB), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_unmap(d, va + 16 * MiB, 8 * MiB), CUH_DEV_OK);
    d->ops->vm_release(d, h);
    d->ops->vm_unreserve(d, va, 32 * MiB);
    assert_int_equal(counters(d).used, 0);
    d->ops->destroy(d);
}

/* With cuh_sim_reuse_handles, a released handle's value names the next
 * allocation made (the lowest such value first), while the old allocation
 * lives on in its mapping: the two share a value, and the device tells
 * them apart (cuh_sim_released_at). Without, values are never reused. */
static void test_vm_a_released_handle_value_names_a_new_allocation_once_reused(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    uint64_t h = 0, g = 0, k = 0, n = 0;
    uintptr_t va = 0;
    assert_int_equal(d->ops->vm_reserve(d, 64 * MiB, &va), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_create(d, 2 * MiB, &h), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_create(d, 2 * MiB, &g), CUH_DEV_OK);
    d->ops->vm_release(d, g);
    assert_int_equal(d->ops->vm_create(d, 2 * MiB, &k), CUH_DEV_OK);
    assert_true(k != g && k != h);   /* reuse off: a new value */
    cuh_sim_reuse_handles(d, 1);
    assert_int_equal(d->ops->vm_map(d, va, 2 * MiB, h), CUH_DEV_OK);
    d->ops->vm_release(d, k);
    d->ops->vm_release(d, h);   /* still mapped at va */
    assert_true(cuh_sim_released_at(d, va));
    assert_int_equal(d->ops->vm_create(d, 2 * MiB, &n), CUH_DEV_OK);
    assert_true(h < k);
    assert_int_equal(n, h);   /* the lowest released value */
    assert_int_equal(cuh_sim_handle_at(d, va, NULL), h);
    assert_int_equal(counters(d).used, 4 * MiB);   /* the old one and the new one */
    /* The new allocation maps elsewhere; the old mapping is still the old allocation. */
    assert_int_equal(d->ops->vm_map(d, va + 2 * MiB, 2 * MiB, n), CUH_DEV_OK);
    assert_false(cuh_sim_released_at(d, va + 2 * MiB));
    assert_true(cuh_sim_released_at(d, va));
    assert_int_equal(d->ops->vm_unmap(d, va + 2 * MiB, 2 * MiB), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_unmap(d, va, 2 * MiB), CUH_DEV_OK);
    assert_int_equal(counters(d).used, 2 * MiB);   /* the old one went with its mapping */
    d->ops->vm_release(d, n);
    assert_int_equal(d->ops->vm_map(d, va, 2 * MiB, n), CUH_DEV_ERROR);   /* released: names nothing */
    d->ops->vm_unreserve(d, va, 64 * MiB);
    assert_int_equal(counters(d).used, 0);
    d->ops->destroy(d);
}

/* As with the driver: an allocation released while mapped keeps its memory
 * until its last mapping goes, and can no longer be mapped; no mapping may
 * overlap another. */
static void test_vm_release_while_mapped_frees_at_the_last_unmap(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    uint64_t h = 0, g = 0;
    uintptr_t va = 0;
    assert_int_equal(d->ops->vm_create(d, 8 * MiB, &h), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_create(d, 4 * MiB, &g), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_reserve(d, 64 * MiB, &va), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_map(d, va, 8 * MiB, h), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_map(d, va + 16 * MiB, 8 * MiB, h), CUH_DEV_OK);
    assert_int_equal(d->ops->vm_map(d, va + 4 * MiB, 4 * MiB, g), CUH_DEV_ERROR);    /* inside h's first */
    assert_int_equal(d->ops->vm_map(d, va + 14 * MiB, 4 * MiB, g), CUH_DEV_ERROR);   /* into h's second */
    d->ops->vm_release(d, h);
    cuh_sim_counters_t c = counters(d);
    assert_int_equal(c.used, 12 * MiB);   /* still mapped: still held */
    assert_int_equal(c.vm_releases, 1);
    assert_int_equal(c.vm_releases_mapped, 1);
    assert_int_equal(d->ops->vm_map(d, va + 32 * MiB, 8 * MiB, h), CUH_DEV_ERROR);   /* released */
    assert_true(cuh_sim_handle_at(d, va + 18 * MiB, NULL) == h);
    assert_int_equal(d->ops->vm_unmap(d, va, 8 * MiB), CUH_DEV_OK);
    assert_int_equal(counters(d).used, 12 * MiB);
    assert_int_equal(d->ops->vm_unmap(d, va + 16 * MiB, 8 * MiB), CUH_DEV_OK);
    assert_int_equal(counters(d).used, 4 * MiB);   /* h's memory went with its last mapping */
    d->ops->vm_release(d, h);                      /* once is enough: nothing more happens */
    assert_int_equal(counters(d).vm_releases, 1);
    d->ops->vm_release(d, g);
    d->ops->vm_unreserve(d, va, 64 * MiB);
    assert_int_equal(counters(d).used, 0);
    d->ops->destroy(d);
}

static void test_beyond_capacity_is_oom_and_counted(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(64 * MiB, 0);
    uintptr_t a = 0, b = 0, x = 0;
    assert_int_equal(d->ops->mem_alloc(d, 65 * MiB + MiB, &x), CUH_DEV_OOM);   /* 66 MiB > 64 */
    assert_int_equal(counters(d).mem_refusals, 1);
    assert_int_equal(d->ops->mem_alloc(d, 40 * MiB, &a), CUH_DEV_OK);
    assert_int_equal(d->ops->mem_alloc(d, 26 * MiB, &x), CUH_DEV_OOM);        /* 24 MiB left */
    assert_int_equal(counters(d).mem_refusals, 2);
    assert_int_equal(d->ops->mem_alloc(d, 24 * MiB, &b), CUH_DEV_OK);         /* exactly fills */
    assert_int_equal(free_bytes(d, NULL), 0);
    assert_int_equal(d->ops->mem_alloc(d, SEG, &x), CUH_DEV_OOM);
    cuh_sim_counters_t c = counters(d);
    assert_int_equal(c.mem_refusals, 3);
    assert_int_equal(c.mem_allocs, 2);
    assert_int_equal(c.used, 64 * MiB);
    /* Freeing makes that capacity available again, and only that. */
    assert_int_equal(d->ops->mem_free(d, a, 40 * MiB), CUH_DEV_OK);
    assert_int_equal(free_bytes(d, NULL), 40 * MiB);
    assert_int_equal(d->ops->mem_alloc(d, 42 * MiB, &x), CUH_DEV_OOM);
    assert_int_equal(d->ops->mem_alloc(d, 40 * MiB, &a), CUH_DEV_OK);
    assert_true(a != b);
    assert_int_equal(counters(d).mem_refusals, 4);
    assert_int_equal(d->ops->mem_free(d, a, 40 * MiB), CUH_DEV_OK);
    assert_int_equal(d->ops->mem_free(d, b, 24 * MiB), CUH_DEV_OK);
    assert_int_equal(counters(d).used, 0);
    d->ops->destroy(d);
}

static void test_external_bytes_reduce_allocatable_and_free(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    size_t total = 0;
    cuh_sim_set_external(d, 900 * MiB);
    assert_int_equal(free_bytes(d, &total), 124 * MiB);
    assert_int_equal(total, GiB);   /* total is the capacity, regardless */
    uintptr_t a = 0, x = 0;
    assert_int_equal(d->ops->mem_alloc(d, 126 * MiB, &x), CUH_DEV_OOM);
    assert_int_equal(d->ops->mem_alloc(d, 124 * MiB, &a), CUH_DEV_OK);
    assert_int_equal(free_bytes(d, NULL), 0);
    assert_int_equal(counters(d).used, 124 * MiB);   /* external is not cuheap's */
    assert_int_equal(d->ops->mem_free(d, a, 124 * MiB), CUH_DEV_OK);
    /* External beyond capacity: nothing free, nothing allocatable. */
    cuh_sim_set_external(d, 2 * GiB);
    assert_int_equal(free_bytes(d, NULL), 0);
    assert_int_equal(d->ops->mem_alloc(d, SEG, &x), CUH_DEV_OOM);
    /* Lowering it gives the memory back. */
    cuh_sim_set_external(d, 0);
    assert_int_equal(free_bytes(d, NULL), GiB);
    assert_int_equal(d->ops->mem_alloc(d, GiB, &a), CUH_DEV_OK);
    assert_int_equal(d->ops->mem_free(d, a, GiB), CUH_DEV_OK);
    assert_int_equal(counters(d).mem_refusals, 2);
    d->ops->destroy(d);
}

static void test_free_of_unknown_address_or_wrong_size_is_error(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    uintptr_t a = 0;
    assert_int_equal(d->ops->mem_alloc(d, 4 * MiB, &a), CUH_DEV_OK);
    const struct {
        uintptr_t addr;
        size_t size;
    } bad[] = {{a, 2 * MiB}, {a, 6 * MiB}, {a + SEG, 2 * MiB}, {a + 512, 4 * MiB}, {0x1000, 4 * MiB},
               {a - SEG, 4 * MiB}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cuh_dev_error_text(d)[0] = '\0';
        assert_int_equal(d->ops->mem_free(d, bad[i].addr, bad[i].size), CUH_DEV_ERROR);
        assert_true(strlen(cuh_dev_error_text(d)) > 0);
        assert_non_null(strstr(cuh_dev_error_text(d), "not a live segment"));
    }
    cuh_sim_counters_t c = counters(d);
    assert_int_equal(c.used, 4 * MiB);   /* the bad frees changed nothing */
    assert_int_equal(c.mem_frees, 0);
    assert_int_equal(d->ops->mem_free(d, a, 4 * MiB), CUH_DEV_OK);
    /* A second free of the same segment is an error. */
    assert_int_equal(d->ops->mem_free(d, a, 4 * MiB), CUH_DEV_ERROR);
    c = counters(d);
    assert_int_equal(c.used, 0);
    assert_int_equal(c.mem_frees, 1);
    d->ops->destroy(d);
}

static void test_random_alloc_free_matches_used_model(void **state)
{
    (void)state;
    const size_t cap = 256 * MiB;
    cuh_device_t *d = sim_new(cap, 0);
    seg_t live[128];
    size_t n = 0, used = 0;
    uint64_t rng = 0xfeed, allocs = 0, frees = 0, refusals = 0;
    for (int op = 0; op < 3000; op++) {
        if (n < 128 && (n == 0 || test_rand(&rng) % 2)) {
            size_t sz = (size_t)(1 + test_rand(&rng) % 24) * SEG;
            uintptr_t a = 0;
            cuh_dev_status_t rc = d->ops->mem_alloc(d, sz, &a);
            if (used + sz > cap) {
                assert_int_equal(rc, CUH_DEV_OOM);
                refusals++;
            } else {
                assert_int_equal(rc, CUH_DEV_OK);
                assert_int_equal(a % SEG, 0);
                live[n].addr = a;
                live[n].size = sz;
                n++;
                used += sz;
                allocs++;
                assert_disjoint(live, n);
            }
        } else {
            size_t i = (size_t)(test_rand(&rng) % n);
            assert_int_equal(d->ops->mem_free(d, live[i].addr, live[i].size), CUH_DEV_OK);
            used -= live[i].size;
            live[i] = live[--n];
            frees++;
        }
        cuh_sim_counters_t c = counters(d);
        assert_int_equal(c.used, used);
        assert_int_equal(c.mem_allocs, allocs);
        assert_int_equal(c.mem_frees, frees);
        assert_int_equal(c.mem_refusals, refusals);
        assert_int_equal(free_bytes(d, NULL), cap - used);
    }
    assert_true(refusals > 0);
    while (n) {
        assert_int_equal(d->ops->mem_free(d, live[n - 1].addr, live[n - 1].size), CUH_DEV_OK);
        n--;
    }
    assert_int_equal(counters(d).used, 0);
    d->ops->destroy(d);
}

static void test_devices_with_different_ordinals_give_disjoint_addresses(void **state)
{
    (void)state;
    cuh_device_t *d0 = sim_new(GiB, 0), *d1 = sim_new(GiB, 1), *d7 = sim_new(GiB, 7);
    cuh_device_t *devs[3] = {d0, d1, d7};
    seg_t segs[3 * 8];
    size_t n = 0;
    for (int round = 0; round < 8; round++)
        for (int k = 0; k < 3; k++) {
            size_t sz = (size_t)(round + 1) * SEG;
            assert_int_equal(devs[k]->ops->mem_alloc(devs[k], sz, &segs[n].addr), CUH_DEV_OK);
            segs[n].size = sz;
            n++;
        }
    assert_disjoint(segs, n);
    /* Each device's capacity is its own. */
    assert_int_equal(counters(d0).used, 36 * SEG);
    assert_int_equal(counters(d1).used, 36 * SEG);
    /* A segment of one device is unknown to another. */
    assert_int_equal(d1->ops->mem_free(d1, segs[0].addr, segs[0].size), CUH_DEV_ERROR);
    n = 0;
    for (int round = 0; round < 8; round++)
        for (int k = 0; k < 3; k++, n++)
            assert_int_equal(devs[k]->ops->mem_free(devs[k], segs[n].addr, segs[n].size), CUH_DEV_OK);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(counters(devs[k]).used, 0);
        devs[k]->ops->destroy(devs[k]);
    }
}

/* ---- events ---------------------------------------------------------------- */

static cuh_event_t new_event(cuh_device_t *d)
{
    cuh_event_t e = NULL;
    assert_int_equal(d->ops->event_create(d, &e), CUH_DEV_OK);
    assert_non_null(e);
    return e;
}

static void test_without_hold_recorded_event_completes_at_once(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_event_t e = new_event(d);
    assert_int_equal(d->ops->event_query(d, e), CUH_DEV_OK);   /* never recorded */
    for (cuh_stream_t s = 0; s < 4; s++) {
        assert_int_equal(d->ops->event_record(d, e, s), CUH_DEV_OK);
        assert_int_equal(d->ops->event_query(d, e), CUH_DEV_OK);
    }
    assert_int_equal(counters(d).events_recorded, 4);
    d->ops->event_destroy(d, e);
    d->ops->destroy(d);
}

static void test_held_event_waits_for_its_own_stream(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_sim_hold_events(d, 1);
    const cuh_stream_t s1 = 0x1111, s2 = 0x2222;
    cuh_event_t e1 = new_event(d), e2 = new_event(d), never = new_event(d);
    assert_int_equal(d->ops->event_record(d, e1, s1), CUH_DEV_OK);
    assert_int_equal(d->ops->event_record(d, e2, s2), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e1), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_query(d, e2), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_query(d, never), CUH_DEV_OK);   /* never recorded */
    /* Completing another stream (and one never used) does not complete e1. */
    cuh_sim_complete_stream(d, s2);
    cuh_sim_complete_stream(d, 0x3333);
    assert_int_equal(d->ops->event_query(d, e1), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_query(d, e2), CUH_DEV_OK);
    cuh_sim_complete_stream(d, s1);
    assert_int_equal(d->ops->event_query(d, e1), CUH_DEV_OK);
    /* Work recorded after a completion is not complete. */
    assert_int_equal(d->ops->event_record(d, e1, s1), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e1), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_query(d, e2), CUH_DEV_OK);
    /* The default stream 0 is a stream like any other. */
    assert_int_equal(d->ops->event_record(d, e2, 0), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e2), CUH_DEV_NOT_READY);
    cuh_sim_complete_stream(d, s1);
    assert_int_equal(d->ops->event_query(d, e1), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e2), CUH_DEV_NOT_READY);
    cuh_sim_complete_stream(d, 0);
    assert_int_equal(d->ops->event_query(d, e2), CUH_DEV_OK);
    d->ops->event_destroy(d, e1);
    d->ops->event_destroy(d, e2);
    d->ops->event_destroy(d, never);
    assert_int_equal(counters(d).live_events, 0);
    d->ops->destroy(d);
}

/* Completing a stream's work only up to a position completes the work on
 * other streams that it waited for, as a GPU would (the heap reads a
 * completed fence on s1 as "what s1 waited for is done"), and not what s1
 * waited for only later. Before, only a whole stream's completion did: the
 * heap fuzz target then saw memory handed over through s1's fence reused
 * while the stream it came from still "ran". */
static void test_complete_upto_completes_what_that_work_waited_for(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_sim_hold_events(d, 1);
    const cuh_stream_t s1 = 0x1111, s2 = 0x2222, s3 = 0x3333;
    cuh_event_t on_s2 = new_event(d), on_s3 = new_event(d);
    uint64_t s2_work = cuh_sim_enqueue_work(d, s2);
    assert_int_equal(d->ops->event_record(d, on_s2, s2), CUH_DEV_OK);
    uint64_t s3_work = cuh_sim_enqueue_work(d, s3);
    assert_int_equal(d->ops->event_record(d, on_s3, s3), CUH_DEV_OK);
    uint64_t before_wait = cuh_sim_enqueue_work(d, s1);
    assert_int_equal(d->ops->stream_wait(d, s1, on_s2), CUH_DEV_OK);
    uint64_t after_wait = cuh_sim_enqueue_work(d, s1);
    assert_int_equal(d->ops->stream_wait(d, s1, on_s3), CUH_DEV_OK);
    uint64_t after_both = cuh_sim_enqueue_work(d, s1);
    cuh_sim_complete_stream_upto(d, s1, before_wait);
    assert_false(cuh_sim_work_done(d, s2, s2_work));
    cuh_sim_complete_stream_upto(d, s1, after_wait);
    assert_true(cuh_sim_work_done(d, s2, s2_work));
    assert_int_equal(d->ops->event_query(d, on_s2), CUH_DEV_OK);
    assert_false(cuh_sim_work_done(d, s3, s3_work));   /* waited for after that work */
    cuh_sim_complete_stream_upto(d, s1, after_both);
    assert_true(cuh_sim_work_done(d, s3, s3_work));
    d->ops->event_destroy(d, on_s2);
    d->ops->event_destroy(d, on_s3);
    d->ops->destroy(d);
}

/* Completing a stream up to a position completes what was recorded up to
 * it there and nothing after; a position already passed changes nothing. */
static void test_complete_upto_completes_a_prefix_of_its_stream(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_sim_hold_events(d, 1);
    const cuh_stream_t s1 = 0x1111;
    cuh_event_t before = new_event(d), after = new_event(d), other = new_event(d);
    assert_int_equal(d->ops->event_record(d, before, s1), CUH_DEV_OK);
    uint64_t pos = cuh_sim_enqueue_work(d, s1);
    assert_int_equal(d->ops->event_record(d, after, s1), CUH_DEV_OK);
    assert_int_equal(d->ops->event_record(d, other, 0), CUH_DEV_OK);
    assert_false(cuh_sim_work_done(d, s1, pos));
    cuh_sim_complete_stream_upto(d, s1, pos);
    assert_true(cuh_sim_work_done(d, s1, pos));
    assert_false(cuh_sim_work_done(d, s1, pos + 1));   /* `after` */
    assert_int_equal(d->ops->event_query(d, before), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, after), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_query(d, other), CUH_DEV_NOT_READY);
    cuh_sim_complete_stream_upto(d, s1, pos - 1);   /* already passed */
    assert_int_equal(d->ops->event_query(d, after), CUH_DEV_NOT_READY);
    cuh_sim_complete_stream(d, s1);
    assert_int_equal(d->ops->event_query(d, after), CUH_DEV_OK);
    assert_true(cuh_sim_work_done(d, s1, pos + 1));
    /* A host wait completes work too. */
    uint64_t later = cuh_sim_enqueue_work(d, s1);
    assert_int_equal(d->ops->event_record(d, after, s1), CUH_DEV_OK);
    assert_false(cuh_sim_work_done(d, s1, later));
    assert_int_equal(d->ops->event_wait(d, after), CUH_DEV_OK);
    assert_true(cuh_sim_work_done(d, s1, later));
    d->ops->event_destroy(d, before);
    d->ops->event_destroy(d, after);
    d->ops->event_destroy(d, other);
    d->ops->destroy(d);
}

static void test_complete_all_and_synchronize_complete_every_stream(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_sim_hold_events(d, 1);
    cuh_event_t e[6];
    for (int i = 0; i < 6; i++) {
        e[i] = new_event(d);
        assert_int_equal(d->ops->event_record(d, e[i], (cuh_stream_t)(i % 3)), CUH_DEV_OK);
        assert_int_equal(d->ops->event_query(d, e[i]), CUH_DEV_NOT_READY);
    }
    cuh_sim_complete_all(d);
    for (int i = 0; i < 6; i++)
        assert_int_equal(d->ops->event_query(d, e[i]), CUH_DEV_OK);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(d->ops->event_record(d, e[i], (cuh_stream_t)(100 + i)), CUH_DEV_OK);
        assert_int_equal(d->ops->event_query(d, e[i]), CUH_DEV_NOT_READY);
    }
    assert_int_equal(counters(d).synchronizes, 0);
    assert_int_equal(d->ops->synchronize(d), CUH_DEV_OK);
    for (int i = 0; i < 6; i++)
        assert_int_equal(d->ops->event_query(d, e[i]), CUH_DEV_OK);
    cuh_sim_counters_t c = counters(d);
    assert_int_equal(c.synchronizes, 1);
    assert_int_equal(c.events_recorded, 12);
    assert_int_equal(c.live_events, 6);
    for (int i = 0; i < 6; i++)
        d->ops->event_destroy(d, e[i]);
    d->ops->destroy(d);
}

static void test_event_wait_completes_earlier_events_of_its_stream_only(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_sim_hold_events(d, 1);
    const cuh_stream_t s = 7, other = 8;
    cuh_event_t e[5], o = new_event(d);
    for (int i = 0; i < 5; i++) {
        e[i] = new_event(d);
        assert_int_equal(d->ops->event_record(d, e[i], s), CUH_DEV_OK);
    }
    assert_int_equal(d->ops->event_record(d, o, other), CUH_DEV_OK);
    /* Wait on the third: the first three complete, the last two don't. */
    assert_int_equal(d->ops->event_wait(d, e[2]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[0]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[1]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[2]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[3]), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_query(d, e[4]), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_query(d, o), CUH_DEV_NOT_READY);
    /* Waiting on an already complete event changes nothing. */
    assert_int_equal(d->ops->event_wait(d, e[0]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[3]), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_wait(d, e[4]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[3]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[4]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, o), CUH_DEV_NOT_READY);
    /* Waiting on an event never recorded returns at once. */
    cuh_event_t never = new_event(d);
    assert_int_equal(d->ops->event_wait(d, never), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, o), CUH_DEV_NOT_READY);
    assert_int_equal(counters(d).event_waits, 4);
    /* Re-recording e[0] after the wait puts it behind new work. */
    assert_int_equal(d->ops->event_record(d, e[0], s), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[0]), CUH_DEV_NOT_READY);
    assert_int_equal(d->ops->event_query(d, e[4]), CUH_DEV_OK);
    /* Turning hold off: new records complete at once, and with them the
     * stream's earlier work (streams run in order). */
    cuh_sim_hold_events(d, 0);
    assert_int_equal(d->ops->event_record(d, e[1], s), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[1]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e[0]), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, o), CUH_DEV_NOT_READY);   /* other stream still held */
    for (int i = 0; i < 5; i++)
        d->ops->event_destroy(d, e[i]);
    d->ops->event_destroy(d, o);
    d->ops->event_destroy(d, never);
    d->ops->destroy(d);
}

/* As on a GPU, work done means the work it waited for is done: completing a
 * stream, or a host wait on its event, completes what the stream waited for
 * before (through other streams too), and no more; an idle stream's event
 * completes once what it waited for has. */
static void test_work_done_means_what_it_waited_for_is_done(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_sim_hold_events(d, 1);
    const cuh_stream_t s1 = 0x1111, s2 = 0x2222, s3 = 0x3333, idle = 0x4444;
    cuh_sim_stream_idle(d, idle);
    cuh_event_t e1 = new_event(d), e2 = new_event(d), e3 = new_event(d), later = new_event(d), ei = new_event(d);
    uint64_t w1 = cuh_sim_enqueue_work(d, s1);
    assert_int_equal(d->ops->event_record(d, e1, s1), CUH_DEV_OK);
    assert_int_equal(d->ops->stream_wait(d, s2, e1), CUH_DEV_OK);
    assert_int_equal(d->ops->event_record(d, e2, s2), CUH_DEV_OK);
    assert_int_equal(d->ops->stream_wait(d, s3, e2), CUH_DEV_OK);   /* s3 waits for s1 through s2 */
    assert_int_equal(d->ops->event_record(d, e3, s3), CUH_DEV_OK);
    assert_int_equal(d->ops->event_record(d, later, s1), CUH_DEV_OK);   /* nobody waits for it */
    cuh_sim_complete_stream(d, s3);
    assert_int_equal(d->ops->event_query(d, e3), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e2), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, e1), CUH_DEV_OK);
    assert_true(cuh_sim_stream_waits_for(d, idle, s1, w1));   /* done: anyone may start after it */
    assert_int_equal(d->ops->event_query(d, later), CUH_DEV_NOT_READY);
    /* A wait added after a stream's last record is not part of that work. */
    cuh_event_t e4 = new_event(d), e5 = new_event(d);
    assert_int_equal(d->ops->event_record(d, e4, s2), CUH_DEV_OK);
    assert_int_equal(d->ops->stream_wait(d, s2, later), CUH_DEV_OK);
    cuh_sim_complete_stream(d, s2);
    assert_int_equal(d->ops->event_query(d, e4), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, later), CUH_DEV_NOT_READY);
    /* A host wait completes what the event waited for too. */
    assert_int_equal(d->ops->event_record(d, e5, s2), CUH_DEV_OK);   /* after the wait on `later` */
    assert_int_equal(d->ops->event_wait(d, e5), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, later), CUH_DEV_OK);
    /* An idle stream runs nothing of its own, but what it waits for it waits for. */
    cuh_event_t busy = new_event(d);
    assert_int_equal(d->ops->event_record(d, busy, s1), CUH_DEV_OK);
    assert_int_equal(d->ops->stream_wait(d, idle, busy), CUH_DEV_OK);
    assert_int_equal(d->ops->event_record(d, ei, idle), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, ei), CUH_DEV_NOT_READY);
    cuh_sim_complete_stream(d, s1);
    assert_int_equal(d->ops->event_query(d, ei), CUH_DEV_OK);
    cuh_event_t all[] = {e1, e2, e3, e4, e5, later, ei, busy};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        d->ops->event_destroy(d, all[i]);
    d->ops->destroy(d);
}

/* Device-wide fences: one event over every stream's work so far (an idle
 * stream has none), and a wait that every stream's later work, and every
 * later stream's, starts after. Turned off, or while a capture is underway,
 * both refuse and record nothing. */
static void test_device_wide_event_and_wait_cover_every_stream(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_sim_hold_events(d, 1);
    const cuh_stream_t s1 = 0x1111, s2 = 0x2222, idle = 0x4444, later = 0x5555;
    cuh_sim_stream_idle(d, idle);
    uint64_t w1 = cuh_sim_enqueue_work(d, s1), w2 = cuh_sim_enqueue_work(d, s2);
    cuh_event_t all = new_event(d), on_idle = new_event(d);
    assert_int_equal(d->ops->event_record_all(d, all), CUH_DEV_OK);
    assert_int_equal(counters(d).events_recorded_all, 1);
    assert_int_equal(d->ops->event_query(d, all), CUH_DEV_NOT_READY);
    cuh_sim_complete_stream(d, s1);
    cuh_sim_complete_stream(d, 0);   /* the record is one on each stream that runs work, the default one too */
    assert_int_equal(d->ops->event_query(d, all), CUH_DEV_NOT_READY);   /* s2 still runs */
    assert_false(cuh_sim_stream_waits_for(d, s1, s2, w2));
    assert_int_equal(d->ops->wait_all(d, all), CUH_DEV_OK);
    assert_int_equal(counters(d).waits_all, 1);
    /* Every stream waits now: those that ran work, the idle one, the
     * default stream, and one the device hears of only afterwards. */
    assert_true(cuh_sim_stream_waits_for(d, s1, s2, w2));
    assert_true(cuh_sim_stream_waits_for(d, idle, s2, w2));
    assert_true(cuh_sim_stream_waits_for(d, 0, s2, w2));
    assert_true(cuh_sim_stream_waits_for(d, later, s2, w2));
    assert_true(cuh_sim_stream_waits_for(d, later, s1, w1));
    assert_int_equal(d->ops->event_record(d, on_idle, idle), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, on_idle), CUH_DEV_NOT_READY);   /* it waits for s2 now */
    cuh_sim_complete_stream(d, s2);
    assert_int_equal(d->ops->event_query(d, all), CUH_DEV_OK);
    assert_int_equal(d->ops->event_query(d, on_idle), CUH_DEV_OK);
    /* A host wait on a device-wide event completes every stream's work. */
    cuh_sim_enqueue_work(d, s1);
    uint64_t w3 = cuh_sim_enqueue_work(d, s2);
    assert_int_equal(d->ops->event_record_all(d, all), CUH_DEV_OK);
    assert_int_equal(d->ops->event_wait(d, all), CUH_DEV_OK);
    assert_true(cuh_sim_work_done(d, s2, w3));
    /* Taken away (a driver before CUDA 12.5), or during a capture. */
    cuh_sim_device_fences(d, 0);
    assert_int_equal(d->ops->event_record_all(d, all), CUH_DEV_UNSUPPORTED);
    assert_int_equal(d->ops->wait_all(d, all), CUH_DEV_UNSUPPORTED);
    cuh_sim_device_fences(d, 1);
    cuh_sim_capturing(d, 1);
    assert_int_equal(d->ops->event_record_all(d, all), CUH_DEV_CAPTURING);
    assert_int_equal(d->ops->wait_all(d, all), CUH_DEV_CAPTURING);
    cuh_sim_capturing(d, 0);
    assert_int_equal(counters(d).events_recorded_all, 2);
    assert_int_equal(counters(d).waits_all, 1);
    d->ops->event_destroy(d, all);
    d->ops->event_destroy(d, on_idle);
    d->ops->destroy(d);
}

static void test_live_events_follow_create_and_destroy(void **state)
{
    (void)state;
    cuh_device_t *d = sim_new(GiB, 0);
    cuh_event_t e[40];
    assert_int_equal(counters(d).live_events, 0);
    for (int i = 0; i < 40; i++) {
        e[i] = new_event(d);
        assert_int_equal(counters(d).live_events, (uint64_t)i + 1);
    }
    for (int i = 0; i < 40; i++)
        for (int j = i + 1; j < 40; j++)
            assert_ptr_not_equal(e[i], e[j]);
    for (int i = 0; i < 40; i += 2)
        d->ops->event_destroy(d, e[i]);
    assert_int_equal(counters(d).live_events, 20);
    d->ops->event_destroy(d, NULL);   /* ignored */
    assert_int_equal(counters(d).live_events, 20);
    for (int i = 1; i < 40; i += 2)
        d->ops->event_destroy(d, e[i]);
    assert_int_equal(counters(d).live_events, 0);
    d->ops->destroy(d);
}

static void test_huge_external_use_never_wraps_the_books(void **state)
{
    (void)state;
    cuh_device_t *dev = cuh_sim_create(&(cuh_sim_params_t){.capacity = GiB});
    cuh_sim_set_external(dev, SIZE_MAX);
    uintptr_t a;
    assert_int_equal(dev->ops->mem_alloc(dev, 4 * MiB, &a), CUH_DEV_OOM);
    size_t free_bytes = 1, total = 0;
    dev->ops->mem_info(dev, &free_bytes, &total);
    assert_int_equal(free_bytes, 0);
    assert_int_equal(total, GiB);
    dev->ops->destroy(dev);
}

static void test_device_address_slices_never_overlap_and_run_out_loudly(void **state)
{
    (void)state;
    /* 1 TiB segments allocated and freed: addresses are never reused, so a
     * device's 4 TiB slice runs out after four, with an error, and never
     * reaches the next device's slice. */
    cuh_device_t *d0 = cuh_sim_create(&(cuh_sim_params_t){.capacity = (size_t)2 << 40, .ordinal = 0});
    cuh_device_t *d1 = cuh_sim_create(&(cuh_sim_params_t){.capacity = (size_t)2 << 40, .ordinal = 1});
    uintptr_t first1;
    assert_int_equal(d1->ops->mem_alloc(d1, 2 * MiB, &first1), CUH_DEV_OK);
    int ok = 0;
    cuh_dev_status_t rc;
    uintptr_t a;
    while ((rc = d0->ops->mem_alloc(d0, (size_t)1 << 40, &a)) == CUH_DEV_OK) {
        assert_true(a + ((size_t)1 << 40) <= first1);
        d0->ops->mem_free(d0, a, (size_t)1 << 40);
        ok++;
    }
    assert_int_equal(rc, CUH_DEV_ERROR);
    assert_non_null(strstr(cuh_dev_error_text(d0), "address space"));
    assert_true(ok >= 3);
    assert_null(cuh_sim_create(&(cuh_sim_params_t){.capacity = GiB, .ordinal = 100000}));
    d0->ops->destroy(d0);
    d1->ops->destroy(d1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_gives_distinct_aligned_non_overlapping_segments),
        cmocka_unit_test(test_size_not_multiple_of_2mib_is_error_with_message),
        cmocka_unit_test(test_a_failed_calls_message_is_its_threads),
        cmocka_unit_test(test_vm_map_takes_only_a_whole_allocation),
        cmocka_unit_test(test_vm_release_while_mapped_frees_at_the_last_unmap),
        cmocka_unit_test(test_vm_a_released_handle_value_names_a_new_allocation_once_reused),
        cmocka_unit_test(test_beyond_capacity_is_oom_and_counted),
        cmocka_unit_test(test_external_bytes_reduce_allocatable_and_free),
        cmocka_unit_test(test_free_of_unknown_address_or_wrong_size_is_error),
        cmocka_unit_test(test_random_alloc_free_matches_used_model),
        cmocka_unit_test(test_devices_with_different_ordinals_give_disjoint_addresses),
        cmocka_unit_test(test_without_hold_recorded_event_completes_at_once),
        cmocka_unit_test(test_held_event_waits_for_its_own_stream),
        cmocka_unit_test(test_complete_upto_completes_a_prefix_of_its_stream),
        cmocka_unit_test(test_complete_upto_completes_what_that_work_waited_for),
        cmocka_unit_test(test_complete_all_and_synchronize_complete_every_stream),
        cmocka_unit_test(test_event_wait_completes_earlier_events_of_its_stream_only),
        cmocka_unit_test(test_work_done_means_what_it_waited_for_is_done),
        cmocka_unit_test(test_device_wide_event_and_wait_cover_every_stream),
        cmocka_unit_test(test_live_events_follow_create_and_destroy),
        cmocka_unit_test(test_huge_external_use_never_wraps_the_books),
        cmocka_unit_test(test_device_address_slices_never_overlap_and_run_out_loudly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
