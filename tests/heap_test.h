/* heap_test.h - what the heap's tests share (tests/test_heap*.c, a file per
 * room of the heap): streams, the count of GPU waits, PyTorch's stream pool,
 * and random operations that keep checking the books.
 */
#ifndef CUH_TEST_HEAP_TEST_H
#define CUH_TEST_HEAP_TEST_H

#include "test_util.h"
#include "heap_model.h"
#include "common.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S1 ((cuh_stream_t)0x1000)
#define S2 ((cuh_stream_t)0x2000)
#define S3 ((cuh_stream_t)0x3000)

/* Waits the heap enqueued on the GPU: stream by stream, or device-wide. */
static inline uint64_t gpu_waits(const cuh_sim_counters_t *c) { return c->stream_waits + c->waits_all; }

/* Makes the heap know 32 more streams, as PyTorch's stream pool does (they
 * stay idle unless a test gives them work). */
static inline void register_pool_streams(cuh_heap_t *heap)
{
    for (uintptr_t i = 0; i < 32; i++)
        assert_int_equal(cuh_heap_register_stream(heap, (cuh_stream_t)(0x10000 + i * 0x100)), CUHEAP_OK);
}

/* Random allocations and frees on three streams whose work completes now and
 * then; after every allocation no two live blocks overlap, and the books are
 * checked as it goes and at the end. */
static inline void random_operations(const char *conf, size_t capacity, int ops, size_t big, int complete_every,
                                     uint64_t seed)
{
    test_heap_t t = test_heap_new(capacity, conf);
    cuh_sim_hold_events(t.dev, 1);
    enum { SLOTS = 300 };
    uintptr_t addr[SLOTS] = {0};
    size_t size[SLOTS];
    cuh_stream_t stream[SLOTS];
    cuh_stream_t streams[3] = {0, S1, S2};
    for (int op = 0; op < ops; op++) {
        uint64_t r = test_rand(&seed);
        int i = (int)(r % SLOTS);
        if (addr[i]) {
            must_free(t.heap, addr[i], stream[i]);
            addr[i] = 0;
        } else {
            size[i] = (r >> 40) % 4 ? 1 + (size_t)(r >> 16) % (96 * KiB) : 1 + (size_t)(r >> 16) % big;
            stream[i] = streams[(r >> 8) % 3];
            addr[i] = must_alloc(t.heap, size[i], stream[i]);
            for (int k = 0; k < SLOTS; k++)
                if (k != i && addr[k] && heap_model_overlap(addr[i], size[i], addr[k], size[k]))
                    fail_msg("op %d: block %d overlaps live block %d", op, i, k);
        }
        if (op % complete_every == 0)
            cuh_sim_complete_stream(t.dev, streams[(r >> 4) % 3]);
        if (op % 1000 == 0)
            heap_ok(t.heap);
    }
    for (int i = 0; i < SLOTS; i++)
        if (addr[i])
            must_free(t.heap, addr[i], stream[i]);
    heap_ok(t.heap);
    cuheap_stats_t s;
    cuh_heap_stats(t.heap, &s);
    assert_int_equal(s.allocated.current, 0);
    assert_int_equal(s.requested.current, 0);
    test_heap_free(&t);
}

/* A heap with settings `conf` on a simulated device behind a fault plan
 * (src/device_fault.c): the test sets the plan on dev, and reads the
 * device's own counters from sim. */
typedef struct fault_heap_s {
    cuh_device_t *sim, *dev;
    cuh_heap_t *heap;
} fault_heap_t;

static inline fault_heap_t fault_heap_new(size_t capacity, const char *conf)
{
    fault_heap_t t;
    t.sim = cuh_sim_create(&(cuh_sim_params_t){.capacity = capacity, .ordinal = 0});
    assert_non_null(t.sim);
    t.dev = cuh_fault_wrap(t.sim);
    assert_non_null(t.dev);
    cuh_config_t cfg = test_config(conf);
    char err[256];
    t.heap = cuh_heap_create(t.dev, &cfg, err, sizeof err);
    assert_non_null(t.heap);
    return t;
}

/* The plan ends (a lost device works again) and the GPU finishes; the books
 * balance, and destroying the heap returns every byte and event. */
static inline void fault_heap_free(fault_heap_t *t)
{
    cuh_fault_clear(t->dev);
    cuh_sim_complete_all(t->sim);
    heap_ok(t->heap);
    cuh_heap_destroy(t->heap);
    cuh_sim_counters_t c;
    cuh_sim_counters(t->sim, &c);
    assert_int_equal(c.used, 0);
    assert_int_equal(c.live_events, 0);
    t->dev->ops->destroy(t->dev);
}

/* The heap's reservation, from a snapshot: pages moved from free memory
 * since it began, pages kept mapped where units moved from, and units placed
 * again where they stayed mapped. */
static inline void vm_totals(cuh_heap_t *heap, uint64_t *moves, uint64_t *kept, uint64_t *hits)
{
    cuh_heap_snapshot_t *snap = cuh_heap_snapshot(heap, 0);
    assert_non_null(snap);
    *moves = *kept = *hits = 0;
    for (size_t i = 0; i < snap->num_segments; i++) {
        *moves += snap->segments[i].page_moves;
        *kept += snap->segments[i].kept_pages;
        *hits += snap->segments[i].kept_hits;
    }
    cuh_heap_snapshot_free(snap);
}

static inline uint64_t page_moves(cuh_heap_t *heap)
{
    uint64_t moves, kept, hits;
    vm_totals(heap, &moves, &kept, &hits);
    return moves;
}

static inline uint64_t kept_pages(cuh_heap_t *heap)
{
    uint64_t moves, kept, hits;
    vm_totals(heap, &moves, &kept, &hits);
    return kept;
}

#endif /* CUH_TEST_HEAP_TEST_H */
