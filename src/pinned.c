/* pinned.c - the pinned host memory cache (see pinned.h).
 *
 * jemalloc (built into libcuheap.so with every symbol renamed cuh_je_* and
 * hidden) does the allocating. Each flag set gets an arena created with
 * extent hooks: when the arena needs memory, alloc_hook carves it from the
 * arena's newest page-locked chunk, or asks the source for a new chunk
 * (pinned_chunk bytes, or more for a larger request). jemalloc is told that
 * memory can never be given back (dalloc_hook declines, so it keeps the
 * extents for reuse), and merge_hook refuses to join extents of two chunks,
 * so no allocation straddles two page-locked allocations. The arenas are
 * used without thread caches (MALLOCX_TCACHE_NONE): a thread cache would
 * hand a region of one arena to a request for another.
 *
 * Frees do not go back to jemalloc at once. They collect in an open batch;
 * a batch closes with one fence from the source (events on every stream of
 * every device) and returns its buffers to jemalloc once the fence has
 * passed. Closing and polling are rationed (every RATION_OPS operations, or
 * once RATION_BYTES wait), so a loop of small allocations and frees pays for
 * an event record and a query every few dozen pairs, not every pair.
 *
 * Locks, always taken in this order: `lock` (live map, batches, statistics),
 * then jemalloc's own, then `chunk_lock` (chunks and each arena's carving
 * point, taken inside the hooks). The source's chunk_alloc is called with
 * chunk_lock held; its fences with `lock` held.
 */
#define JEMALLOC_NO_DEMANGLE
#include <jemalloc/jemalloc.h>

#include "pinned.h"

#include "common.h"
#include "ptrmap.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jemalloc's own settings (its MALLOC_CONF, under the prefix): no thread
 * caches, one automatic arena (nothing allocates from it) and no background
 * thread. cuheap's arenas are made with arenas.create. */
const char *je_malloc_conf = "tcache:false,narenas:1,background_thread:false";

#define PAGE ((size_t)4096)
#define CHUNK_ROUND ((size_t)2 << 20)
#define SMALL_ALIGN ((size_t)256)
#define MAX_DEVICES 64
#define NUM_FLAG_SETS 4        /* every combination of CUH_PINNED_SERVED_FLAGS */
#define RATION_OPS 64u         /* a batch closes, or batches are polled, at least this often ... */
#define RATION_BYTES_SHIFT 3   /* ... or once chunk_size >> this many bytes wait */

typedef struct pinned_arena_s {
    extent_hooks_t hooks;      /* first: jemalloc hands &hooks back to every hook */
    cuh_pinned_t *owner;
    unsigned flags;
    int device;                /* the context it is pinned for; -1: portable, any */
    unsigned index;            /* jemalloc's arena index */
    uintptr_t carve, carve_end; /* the unused rest of its newest chunk */
} pinned_arena_t;

typedef struct chunk_s {
    uintptr_t base;
    size_t size;
    pinned_arena_t *arena;
    int device;                /* whose context allocated it */
} chunk_t;

typedef struct batch_s {
    struct batch_s *next;      /* closed batches, oldest first */
    void *fence;
    void **ptrs;
    size_t num, cap;
    size_t bytes;              /* allocated bytes waiting */
} batch_t;

typedef struct stat_s {
    uint64_t current, peak;
} stat_t;

struct cuh_pinned_s {
    cuh_pinned_source_t src;
    size_t chunk_size;

    pthread_mutex_t arena_lock;  /* making arenas */
    pinned_arena_t *_Atomic arenas[NUM_FLAG_SETS][MAX_DEVICES + 1];   /* [flags][device + 1] */

    pthread_mutex_t chunk_lock;
    chunk_t *chunks;             /* sorted by base */
    size_t num_chunks, cap_chunks;
    size_t reserved_bytes;
    uint64_t num_chunk_allocs;

    pthread_mutex_t lock;
    cuh_ptrmap_t live;           /* address -> bytes asked for */
    batch_t *open;
    batch_t *closed;
    unsigned ops_since_poll;
    stat_t requested, allocated, reserved, pending;
    uint64_t num_allocs, num_frees, num_waits, num_ooms;
    int abandoned;               /* a device reset took chunks: see cuh_pinned_abandon */
};

/* The device of the thread inside je_mallocx, for chunks of portable
 * arenas (any context will do; the caller's is the one surely alive). */
static _Thread_local int carving_device;

static void stat_add(stat_t *s, uint64_t n)
{
    s->current += n;
    if (s->current > s->peak)
        s->peak = s->current;
}

static void stat_sub(stat_t *s, uint64_t n) { s->current -= n; }

static uintptr_t align_up(uintptr_t x, size_t a) { return (x + a - 1) & ~(uintptr_t)(a - 1); }

/* ---- chunks ------------------------------------------------------------------ */

/* Index of the chunk holding addr, or -1. Caller holds chunk_lock. */
static ptrdiff_t chunk_find_locked(const cuh_pinned_t *p, uintptr_t addr)
{
    size_t lo = 0, hi = p->num_chunks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (addr < p->chunks[mid].base)
            hi = mid;
        else if (addr - p->chunks[mid].base >= p->chunks[mid].size)
            lo = mid + 1;
        else
            return (ptrdiff_t)mid;
    }
    return -1;
}

static int chunk_insert_locked(cuh_pinned_t *p, chunk_t c)
{
    if (p->num_chunks == p->cap_chunks) {
        size_t cap = p->cap_chunks ? 2 * p->cap_chunks : 16;
        chunk_t *grown = realloc(p->chunks, cap * sizeof *grown);
        if (!grown)
            return -1;
        p->chunks = grown;
        p->cap_chunks = cap;
    }
    size_t at = p->num_chunks;
    while (at > 0 && p->chunks[at - 1].base > c.base) {
        p->chunks[at] = p->chunks[at - 1];
        at--;
    }
    p->chunks[at] = c;
    p->num_chunks++;
    p->reserved_bytes += c.size;
    p->num_chunk_allocs++;
    return 0;
}

/* ---- extent hooks --------------------------------------------------------------- */

static void *alloc_hook(extent_hooks_t *hooks, void *new_addr, size_t size, size_t alignment, bool *zero,
                        bool *commit, unsigned arena_index)
{
    (void)arena_index;
    pinned_arena_t *a = (pinned_arena_t *)hooks;
    cuh_pinned_t *p = a->owner;
    if (new_addr || size == 0 || size > SIZE_MAX / 4)
        return NULL;   /* memory at a given address cannot be had */
    if (alignment < PAGE)
        alignment = PAGE;
    pthread_mutex_lock(&p->chunk_lock);
    uintptr_t start = align_up(a->carve, alignment);
    if (!a->carve || start < a->carve || start > a->carve_end || size > a->carve_end - start) {
        size_t want = size + (alignment > PAGE ? alignment : 0);
        size_t csize = want > p->chunk_size ? (want + CHUNK_ROUND - 1) / CHUNK_ROUND * CHUNK_ROUND : p->chunk_size;
        void *base = NULL;
        int device = a->device >= 0 ? a->device : carving_device;
        if (p->src.chunk_alloc(p->src.ctx, device, a->flags, csize, &base) != CUHEAP_OK) {
            pthread_mutex_unlock(&p->chunk_lock);
            return NULL;
        }
        if (chunk_insert_locked(p, (chunk_t){(uintptr_t)base, csize, a, device})) {
            p->src.chunk_free(p->src.ctx, device, base, csize);
            cuh_set_error("out of host memory for the pinned cache's chunk table");
            pthread_mutex_unlock(&p->chunk_lock);
            return NULL;
        }
        start = align_up((uintptr_t)base, alignment);
        uintptr_t end = (uintptr_t)base + csize;
        /* Carve on from whichever chunk has more left. */
        if (end - (start + size) >= a->carve_end - a->carve) {
            a->carve = start + size;
            a->carve_end = end;
        }
    } else {
        a->carve = start + size;
    }
    pthread_mutex_unlock(&p->chunk_lock);
    if (*zero)
        memset((void *)start, 0, size);
    *commit = true;
    return (void *)start;
}

/* Page-locked memory is never given back while the arena lives: declining
 * makes jemalloc keep the extent for reuse. */
static bool dalloc_hook(extent_hooks_t *hooks, void *addr, size_t size, bool committed, unsigned arena_index)
{
    (void)hooks, (void)addr, (void)size, (void)committed, (void)arena_index;
    return true;
}

/* The chunks go back to CUDA in cuh_pinned_destroy, all at once. */
static void destroy_hook(extent_hooks_t *hooks, void *addr, size_t size, bool committed, unsigned arena_index)
{
    (void)hooks, (void)addr, (void)size, (void)committed, (void)arena_index;
}

static bool commit_hook(extent_hooks_t *hooks, void *addr, size_t size, size_t offset, size_t length,
                        unsigned arena_index)
{
    (void)hooks, (void)addr, (void)size, (void)offset, (void)length, (void)arena_index;
    return false;   /* always committed */
}

static bool split_hook(extent_hooks_t *hooks, void *addr, size_t size, size_t size_a, size_t size_b, bool committed,
                       unsigned arena_index)
{
    (void)hooks, (void)addr, (void)size, (void)size_a, (void)size_b, (void)committed, (void)arena_index;
    return false;
}

/* Two extents may become one only inside one chunk: a buffer across two
 * page-locked allocations is not one pinned range for CUDA. */
static bool merge_hook(extent_hooks_t *hooks, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                       bool committed, unsigned arena_index)
{
    (void)committed, (void)arena_index, (void)size_a;
    cuh_pinned_t *p = ((pinned_arena_t *)hooks)->owner;
    pthread_mutex_lock(&p->chunk_lock);
    ptrdiff_t a = chunk_find_locked(p, (uintptr_t)addr_a);
    ptrdiff_t b = chunk_find_locked(p, (uintptr_t)addr_b + size_b - 1);
    pthread_mutex_unlock(&p->chunk_lock);
    return a < 0 || a != b;
}

/* ---- arenas ------------------------------------------------------------------- */

static pinned_arena_t *arena_get(cuh_pinned_t *p, unsigned flags, int device)
{
    int slot = flags & CUH_PINNED_PORTABLE ? 0 : device + 1;
    if (slot < 0 || slot > MAX_DEVICES) {
        cuh_set_error("pinned memory for device %d: cuheap serves devices 0 to %d", device, MAX_DEVICES - 1);
        return NULL;
    }
    pinned_arena_t *a = atomic_load_explicit(&p->arenas[flags][slot], memory_order_acquire);
    if (cuh_likely(a != NULL))
        return a;
    pthread_mutex_lock(&p->arena_lock);
    a = atomic_load_explicit(&p->arenas[flags][slot], memory_order_relaxed);
    if (!a && (a = calloc(1, sizeof *a))) {
        a->hooks = (extent_hooks_t){
            .alloc = alloc_hook,
            .dalloc = dalloc_hook,
            .destroy = destroy_hook,
            .commit = commit_hook,
            .split = split_hook,
            .merge = merge_hook,
        };
        a->owner = p;
        a->flags = flags;
        a->device = slot - 1;
        extent_hooks_t *hooks = &a->hooks;
        size_t len = sizeof a->index;
        carving_device = device;   /* the arena's metadata comes from a chunk too */
        cuh_clear_error();
        if (je_mallctl("arenas.create", &a->index, &len, &hooks, sizeof hooks) != 0) {
            char why[320];
            snprintf(why, sizeof why, "%s", cuh_get_error()[0] ? cuh_get_error() : "no reason given");
            cuh_set_error("jemalloc could not make an arena for pinned memory (flags 0x%x): %s", flags, why);
            free(a);
            a = NULL;
        } else {
            /* Never purge: the hooks cannot give pages back anyway. */
            char name[64];
            ssize_t never = -1;
            snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", a->index);
            (void)je_mallctl(name, NULL, NULL, &never, sizeof never);
            snprintf(name, sizeof name, "arena.%u.muzzy_decay_ms", a->index);
            (void)je_mallctl(name, NULL, NULL, &never, sizeof never);
            /* jemalloc grows its memory geometrically; page-locked memory
             * is held for good, so grow a chunk at a time at most. */
            size_t grow_limit = p->chunk_size;
            snprintf(name, sizeof name, "arena.%u.retain_grow_limit", a->index);
            (void)je_mallctl(name, NULL, NULL, &grow_limit, sizeof grow_limit);
            atomic_store_explicit(&p->arenas[flags][slot], a, memory_order_release);
        }
    } else if (!a) {
        cuh_set_error("out of host memory for a pinned arena");
    }
    pthread_mutex_unlock(&p->arena_lock);
    return a;
}

/* ---- batches of frees ------------------------------------------------------------ */

static void batch_free(batch_t *b)
{
    free(b->ptrs);
    free(b);
}

/* Adds a freed buffer to the open batch; -1 when host memory runs out. */
static int batch_push_locked(cuh_pinned_t *p, void *ptr, size_t usable)
{
    batch_t *b = p->open;
    if (!b && !(b = p->open = calloc(1, sizeof *b)))
        return -1;
    if (b->num == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        void **grown = realloc(b->ptrs, cap * sizeof *grown);
        if (!grown)
            return -1;
        b->ptrs = grown;
        b->cap = cap;
    }
    b->ptrs[b->num++] = ptr;
    b->bytes += usable;
    return 0;
}

/* Closes the open batch: one fence covers its buffers. */
static void close_locked(cuh_pinned_t *p)
{
    batch_t *b = p->open;
    if (!b)
        return;
    p->open = NULL;
    b->fence = p->src.fence(p->src.ctx);
    batch_t **tail = &p->closed;
    while (*tail)
        tail = &(*tail)->next;
    *tail = b;
}

/* Returns to jemalloc the buffers of every closed batch whose fence has
 * passed (wait: waits for the oldest first); then closes the open batch if
 * none is left in flight. */
static void poll_locked(cuh_pinned_t *p, int wait)
{
    p->ops_since_poll = 0;
    while (p->closed) {
        batch_t *b = p->closed;
        if (!p->src.fence_passed(p->src.ctx, b->fence, wait))
            break;
        p->src.fence_free(p->src.ctx, b->fence);
        for (size_t i = 0; i < b->num; i++)
            je_dallocx(b->ptrs[i], MALLOCX_TCACHE_NONE);
        stat_sub(&p->pending, b->bytes);
        p->closed = b->next;
        batch_free(b);
    }
    if (!p->closed && p->open)
        close_locked(p);
}

/* Waits for every batch (closing the open one): before an allocation that
 * found no memory, and when pending memory outgrows its bound. */
static void drain_locked(cuh_pinned_t *p)
{
    close_locked(p);
    poll_locked(p, 1);
}

/* ---- the cache -------------------------------------------------------------------- */

cuh_pinned_t *cuh_pinned_create(const cuh_pinned_source_t *source, size_t chunk_size, char *err, size_t errlen)
{
    cuh_pinned_t *p = calloc(1, sizeof *p);
    if (!p || cuh_ptrmap_init(&p->live, 1024)) {
        snprintf(err, errlen, "out of host memory for the pinned cache");
        free(p);
        return NULL;
    }
    p->src = *source;
    p->chunk_size = (chunk_size + CHUNK_ROUND - 1) / CHUNK_ROUND * CHUNK_ROUND;
    pthread_mutex_init(&p->arena_lock, NULL);
    pthread_mutex_init(&p->chunk_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    return p;
}

void cuh_pinned_destroy(cuh_pinned_t *p)
{
    if (!p)
        return;
    if (p->abandoned) {
        /* Its arenas' metadata may lie in memory CUDA took back: only the
         * books go, jemalloc's arenas are left alone. */
        for (unsigned f = 0; f < NUM_FLAG_SETS; f++)
            for (int slot = 0; slot <= MAX_DEVICES; slot++)
                free(p->arenas[f][slot]);
        cuh_ptrmap_destroy(&p->live);
        free(p->chunks);
        free(p);
        return;
    }
    /* Buffers still waiting go with their arenas. */
    pthread_mutex_lock(&p->lock);
    if (p->open)
        batch_free(p->open);
    while (p->closed) {
        batch_t *b = p->closed;
        p->closed = b->next;
        p->src.fence_free(p->src.ctx, b->fence);
        batch_free(b);
    }
    pthread_mutex_unlock(&p->lock);
    for (unsigned f = 0; f < NUM_FLAG_SETS; f++)
        for (int slot = 0; slot <= MAX_DEVICES; slot++) {
            pinned_arena_t *a = p->arenas[f][slot];
            if (!a)
                continue;
            char name[64];
            snprintf(name, sizeof name, "arena.%u.destroy", a->index);
            (void)je_mallctl(name, NULL, NULL, NULL, 0);
            free(a);
        }
    for (size_t i = 0; i < p->num_chunks; i++) {
        const chunk_t *c = &p->chunks[i];
        p->src.chunk_free(p->src.ctx, c->device, (void *)c->base, c->size);
    }
    free(p->chunks);
    cuh_ptrmap_destroy(&p->live);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->chunk_lock);
    pthread_mutex_destroy(&p->arena_lock);
    free(p);
}

int cuh_pinned_owns(cuh_pinned_t *p, const void *ptr)
{
    pthread_mutex_lock(&p->chunk_lock);
    int owned = chunk_find_locked(p, (uintptr_t)ptr) >= 0;
    pthread_mutex_unlock(&p->chunk_lock);
    return owned;
}

cuheap_status_t cuh_pinned_alloc(cuh_pinned_t *p, size_t size, unsigned flags, int device, void **ptr)
{
    *ptr = NULL;
    if (flags & ~CUH_PINNED_SERVED_FLAGS) {
        cuh_set_error("pinned memory with flags 0x%x: cuheap serves flags 0x%x (portable, mapped) only", flags,
                      CUH_PINNED_SERVED_FLAGS);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    if (size == 0)
        return CUHEAP_OK;
    /* Take back what the GPU has passed, now and then; wait when memory
     * held for it outgrows both the chunk size and the live allocations. */
    pthread_mutex_lock(&p->lock);
    if (p->abandoned) {
        pthread_mutex_unlock(&p->lock);
        cuh_set_error("this pinned cache was retired by a device reset");
        return CUHEAP_ERR_NOT_OWNED;
    }
    if ((p->closed || p->open) &&
        (++p->ops_since_poll >= RATION_OPS || p->pending.current >= p->chunk_size >> RATION_BYTES_SHIFT))
        poll_locked(p, 0);
    if (p->pending.current > p->chunk_size && p->pending.current > p->allocated.current) {
        p->num_waits++;
        drain_locked(p);
    }
    pthread_mutex_unlock(&p->lock);
    pinned_arena_t *a = arena_get(p, flags, device);
    if (!a)
        return CUHEAP_ERR_OUT_OF_MEMORY;

    int align_flag = size >= PAGE ? MALLOCX_ALIGN(PAGE) : MALLOCX_ALIGN(SMALL_ALIGN);
    int je_flags = MALLOCX_ARENA(a->index) | MALLOCX_TCACHE_NONE | align_flag;
    carving_device = device;
    cuh_clear_error();
    void *q = size <= SIZE_MAX / 2 ? je_mallocx(size, je_flags) : NULL;
    if (!q && size <= SIZE_MAX / 2) {
        pthread_mutex_lock(&p->lock);
        int had_pending = p->pending.current != 0 || p->open;
        if (had_pending) {
            p->num_waits++;
            drain_locked(p);
        }
        pthread_mutex_unlock(&p->lock);
        if (had_pending)
            q = je_mallocx(size, je_flags);
    }

    pthread_mutex_lock(&p->chunk_lock);
    uint64_t reserved = p->reserved_bytes;
    pthread_mutex_unlock(&p->chunk_lock);
    pthread_mutex_lock(&p->lock);
    p->reserved.current = reserved;
    if (reserved > p->reserved.peak)
        p->reserved.peak = reserved;
    if (!q) {
        p->num_ooms++;
        char why[320];
        snprintf(why, sizeof why, "%s", cuh_get_error()[0] ? cuh_get_error() : "jemalloc found no memory");
        cuh_set_error("pinned host memory of %zu bytes (flags 0x%x) could not be had: %s; the cache holds %llu "
                      "bytes in %zu chunks, %llu of them allocated",
                      size, flags, why, (unsigned long long)reserved, p->num_chunks,
                      (unsigned long long)p->allocated.current);
        pthread_mutex_unlock(&p->lock);
        return CUHEAP_ERR_OUT_OF_MEMORY;
    }
    if (cuh_ptrmap_insert(&p->live, (uintptr_t)q, (void *)(uintptr_t)size)) {
        pthread_mutex_unlock(&p->lock);
        je_dallocx(q, MALLOCX_TCACHE_NONE);
        cuh_set_error("out of host memory for the pinned cache's books");
        return CUHEAP_ERR_OUT_OF_MEMORY;
    }
    stat_add(&p->requested, size);
    stat_add(&p->allocated, je_sallocx(q, 0));
    p->num_allocs++;
    pthread_mutex_unlock(&p->lock);
    *ptr = q;
    return CUHEAP_OK;
}

cuheap_status_t cuh_pinned_free(cuh_pinned_t *p, void *ptr)
{
    pthread_mutex_lock(&p->lock);
    size_t size = (size_t)(uintptr_t)cuh_ptrmap_remove(&p->live, (uintptr_t)ptr);
    if (!size) {
        pthread_mutex_unlock(&p->lock);
        if (!cuh_pinned_owns(p, ptr))
            return CUHEAP_ERR_NOT_OWNED;
        cuh_set_error("%p is not a live pinned allocation of cuheap's: it was freed already, or it points "
                      "inside one",
                      ptr);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    if (p->abandoned) {
        stat_sub(&p->requested, size);
        p->num_frees++;
        pthread_mutex_unlock(&p->lock);
        return CUHEAP_OK;
    }
    size_t usable = je_sallocx(ptr, 0);
    stat_sub(&p->requested, size);
    stat_sub(&p->allocated, usable);
    p->num_frees++;
    if (batch_push_locked(p, ptr, usable)) {
        /* No room to remember the buffer: wait for the work, then reuse it;
         * if no wait is possible now (a graph capture underway), keep it
         * for good rather than hand it out early. */
        drain_locked(p);
        if (!p->closed)
            je_dallocx(ptr, MALLOCX_TCACHE_NONE);
        pthread_mutex_unlock(&p->lock);
        return CUHEAP_OK;
    }
    stat_add(&p->pending, usable);
    batch_t *b = p->open;
    if (!p->closed && (b->num >= RATION_OPS || b->bytes >= p->chunk_size >> RATION_BYTES_SHIFT))
        close_locked(p);
    pthread_mutex_unlock(&p->lock);
    return CUHEAP_OK;
}

int cuh_pinned_uses_device(cuh_pinned_t *p, int device)
{
    pthread_mutex_lock(&p->chunk_lock);
    int uses = 0;
    for (size_t i = 0; i < p->num_chunks && !uses; i++)
        uses = p->chunks[i].device == device;
    pthread_mutex_unlock(&p->chunk_lock);
    return uses;
}

void cuh_pinned_abandon(cuh_pinned_t *p)
{
    pthread_mutex_lock(&p->lock);
    p->abandoned = 1;
    while (p->closed || p->open) {
        batch_t *b = p->closed ? p->closed : p->open;
        if (b == p->closed)
            p->closed = b->next;
        else
            p->open = NULL;
        p->src.fence_free(p->src.ctx, b->fence);
        stat_sub(&p->pending, b->bytes);
        batch_free(b);
    }
    pthread_mutex_unlock(&p->lock);
}

void cuh_pinned_poll(cuh_pinned_t *p)
{
    pthread_mutex_lock(&p->lock);
    if (p->abandoned) {
        pthread_mutex_unlock(&p->lock);
        return;
    }
    poll_locked(p, 0);
    pthread_mutex_unlock(&p->lock);
}

void cuh_pinned_stats(cuh_pinned_t *p, cuheap_host_stats_t *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&p->chunk_lock);
    uint64_t reserved = p->reserved_bytes, chunks = p->num_chunks, chunk_allocs = p->num_chunk_allocs;
    pthread_mutex_unlock(&p->chunk_lock);
    pthread_mutex_lock(&p->lock);
    p->reserved.current = reserved;
    if (reserved > p->reserved.peak)
        p->reserved.peak = reserved;
    out->requested = (cuheap_stat_t){p->requested.current, p->requested.peak};
    out->allocated = (cuheap_stat_t){p->allocated.current, p->allocated.peak};
    out->reserved = (cuheap_stat_t){p->reserved.current, p->reserved.peak};
    out->pending = (cuheap_stat_t){p->pending.current, p->pending.peak};
    out->num_allocs = p->num_allocs;
    out->num_frees = p->num_frees;
    out->num_waits = p->num_waits;
    out->num_ooms = p->num_ooms;
    pthread_mutex_unlock(&p->lock);
    out->num_chunks = chunks;
    out->num_chunk_allocs = chunk_allocs;
    out->chunk_size = p->chunk_size;
}
