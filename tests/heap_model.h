/* heap_model.h - a model of DESIGN's reuse rule, checked against the heap on
 * the simulated GPU; shared by the heap's tests (tests/test_heap*.c;
 * page_rule_model in test_heap_vmm.c) and its fuzz target
 * (tests/fuzz/fuzz_heap.c).
 *
 * A freed block leaves its bytes behind, page by page: by address and, under
 * vmm:1, by physical page and offset (pages move to other addresses). Those
 * bytes are unsafe for every stream but the one whose work used them until
 * that work is done (the simulated device answers exactly, with a probe
 * stream that runs nothing), and, for a block of a CUDA graph's pool, until
 * the pool is released. A page whose old mapping may still be touched by
 * running work must stay mapped where it was: unmapping is not
 * stream-ordered. The model records what each free leaves (heap_model_add),
 * checks every new block against it (heap_model_check), and forgets what
 * nobody can touch any more (heap_model_prune), which is where it checks
 * the mappings. A broken rule goes to the caller's on_fail callback with a
 * sentence that names it. Beside the model, the two checks both callers
 * make of every block and every capture: blocks that overlap, and device
 * calls a graph capture cannot take.
 */
#ifndef CUH_TEST_HEAP_MODEL_H
#define CUH_TEST_HEAP_MODEL_H

#include "common.h"
#include "device.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* 1 if blocks [a, a + an) and [b, b + bn) share a byte. */
static inline int heap_model_overlap(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

/* The device calls a graph capture cannot take: an event recorded, queried
 * or waited for, a stream wait, a device synchronize, a segment or a page
 * freed that had been mapped (one created and never mapped the GPU never
 * saw). 1 if the counters moved from a to b by any of them. */
static inline int heap_model_capture_broken(const cuh_sim_counters_t *a, const cuh_sim_counters_t *b)
{
    return a->events_recorded != b->events_recorded || a->event_queries != b->event_queries ||
           a->event_waits != b->event_waits || a->stream_waits != b->stream_waits ||
           a->synchronizes != b->synchronizes || a->mem_frees != b->mem_frees ||
           a->vm_releases_used != b->vm_releases_used;
}

/* What a freed block leaves in one page. */
typedef struct heap_model_piece_s {
    uintptr_t va;          /* the page's address when freed */
    uint64_t handle;       /* the physical allocation mapped there (0: plain segment or workspace) */
    size_t hoff;           /* the page's offset into that allocation (a unit of several pages) */
    size_t lo, hi;         /* the block's bytes within that page */
    cuh_stream_t stream;   /* whose work used them */
    uint64_t pos;          /* that work's position on the stream */
    uint64_t pool, also_pool;   /* graph pools that may use them (0: none; the caller numbers pools) */
} heap_model_piece_t;

typedef struct heap_model_s {
    cuh_device_t *dev;     /* the simulated device */
    size_t page;           /* granule of the model: vmm_page, or 2 MiB */
    cuh_stream_t probe;    /* a stream that runs nothing: "is that work done" */
    heap_model_piece_t *pieces;
    size_t num, max;
    /* 1 while graph pool `pool` (never 0) is not released; NULL: no pools. */
    int (*pool_live)(void *ctx, uint64_t pool);
    /* A broken rule, in a sentence; must not return. */
    void (*on_fail)(void *ctx, const char *what);
    void *ctx;
} heap_model_t;

/* A model of `max` pieces; the caller frees m->pieces. */
static inline heap_model_t heap_model_new(cuh_device_t *dev, size_t page, cuh_stream_t probe, size_t max,
                                          void (*on_fail)(void *, const char *), void *ctx)
{
    heap_model_t m = {dev, page, probe, malloc(max * sizeof(heap_model_piece_t)), 0, max, NULL, on_fail, ctx};
    if (!m.pieces)
        abort();
    return m;
}

__attribute__((format(printf, 2, 3))) static inline void heap_model_fail(const heap_model_t *m, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    m->on_fail(m->ctx, what);
    abort();   /* on_fail must not return */
}

/* The bytes of block [addr, addr + size) that lie in the page at pva, as
 * offsets [*lo, *hi) into that page. */
static inline void heap_model_bytes_in_page(const heap_model_t *m, uintptr_t addr, size_t size, uintptr_t pva,
                                            size_t *lo, size_t *hi)
{
    *lo = cuh_max_size(addr, pva) - pva;
    *hi = cuh_min_size(addr + size, pva + m->page) - pva;
}

/* Block [addr, addr + size) was freed after `user`'s work at pos (call it
 * once per stream that used the block). */
static inline void heap_model_add(heap_model_t *m, uintptr_t addr, size_t size, cuh_stream_t user, uint64_t pos,
                                  uint64_t pool, uint64_t also_pool)
{
    for (uintptr_t pva = addr & ~(uintptr_t)(m->page - 1); pva < addr + size; pva += m->page) {
        if (m->num == m->max)
            heap_model_fail(m, "the model's %zu pieces are full: make its maximum larger", m->max);
        heap_model_piece_t *p = &m->pieces[m->num++];
        p->va = pva;
        p->hoff = 0;
        p->handle = cuh_sim_handle_at(m->dev, pva, &p->hoff);
        heap_model_bytes_in_page(m, addr, size, pva, &p->lo, &p->hi);
        p->stream = user;
        p->pos = pos;
        p->pool = pool;
        p->also_pool = also_pool;
    }
}

static inline int heap_model_pool_holds(const heap_model_t *m, const heap_model_piece_t *p)
{
    return m->pool_live && ((p->pool && m->pool_live(m->ctx, p->pool)) ||
                            (p->also_pool && m->pool_live(m->ctx, p->also_pool)));
}

/* A new block [addr, addr + size) for stream `stream`, or for every one of
 * the n streams of `all` when device_wide: none of its bytes may be unsafe
 * for a stream that will use it. Returns how many of its pages are bytes
 * its own stream freed, at another address (pages that moved). */
static inline size_t heap_model_check(const heap_model_t *m, uintptr_t addr, size_t size, cuh_stream_t stream,
                                      int device_wide, const cuh_stream_t *all, int n)
{
    size_t own_moved = 0;
    for (uintptr_t pva = addr & ~(uintptr_t)(m->page - 1); pva < addr + size; pva += m->page) {
        size_t off = 0;
        uint64_t h = cuh_sim_handle_at(m->dev, pva, &off);
        size_t lo, hi;
        heap_model_bytes_in_page(m, addr, size, pva, &lo, &hi);
        for (size_t k = 0; k < m->num; k++) {
            const heap_model_piece_t *p = &m->pieces[k];
            int same = (p->va == pva && p->lo < hi && lo < p->hi) ||
                       (h && p->handle == h && p->hoff == off && p->lo < hi && lo < p->hi);
            if (!same)
                continue;
            for (int u = 0; u < (device_wide ? n : 1); u++) {
                cuh_stream_t user = device_wide ? all[u] : stream;
                int held = heap_model_pool_holds(m, p);
                if (!held && p->stream == user) {
                    own_moved += !device_wide && p->handle == h && p->hoff == off && p->va != pva;
                } else if (held || !cuh_sim_stream_waits_for(m->dev, user, p->stream, p->pos)) {
                    heap_model_fail(m, "a block for stream %#lx at 0x%lx+%zu uses bytes freed on stream %#lx%s before %s",
                                    (unsigned long)user, (unsigned long)addr, size, (unsigned long)p->stream,
                                    p->va == pva ? "" : " (its page moved)",
                                    held ? "their graph pool was released" : "that work ran");
                }
            }
        }
    }
    return own_moved;
}

/* Forgets pieces nobody can touch any more. A piece whose work may still
 * run must still have its physical page mapped where it was. */
static inline void heap_model_prune(heap_model_t *m)
{
    size_t kept = 0;
    for (size_t k = 0; k < m->num; k++) {
        const heap_model_piece_t *p = &m->pieces[k];
        int pending = !cuh_sim_stream_waits_for(m->dev, m->probe, p->stream, p->pos);
        size_t off = 0;
        if (pending && (cuh_sim_handle_at(m->dev, p->va, &off) != p->handle || (p->handle && off != p->hoff)))
            heap_model_fail(m, "the page at 0x%lx was unmapped while work on it could still run",
                            (unsigned long)p->va);
        if (pending || heap_model_pool_holds(m, p))
            m->pieces[kept++] = *p;
    }
    m->num = kept;
}

#endif
