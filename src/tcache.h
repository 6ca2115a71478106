/* tcache.h - a thread's cache of small objects and of its last large block, in front of one heap's lock.
 *
 * One lock serializes a heap (lock.h), and with several threads the heap's
 * state travels between cores with it: threads together then allocate more
 * slowly than one thread alone. A thread cache keeps small objects its
 * thread freed, per size class and per stream, under a lock that only its
 * own thread takes on the fast path (so the lock's cache line stays on that
 * thread's core); a thread that allocates and frees the same sizes on the
 * same stream does not touch the heap at all.
 *
 * This file holds the data structure only: a table of the objects the cache
 * owns, both those it holds (CACHED) and those it handed out again (LIVE: a
 * later free by this thread finds them here, without the heap), and per-class
 * bins of the cached ones with the stream each was freed on; and one large
 * block, the last the thread freed through the heap. Which objects
 * may enter and when they go back to the heap are the heap's rules
 * (heap_tcache.c, "thread caches").
 */
#ifndef CUH_TCACHE_H
#define CUH_TCACHE_H

#include "chunk.h"
#include "lock.h"
#include "sizeclass.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { CUH_TC_LIVE = 1, CUH_TC_CACHED = 2 } cuh_tc_state_t;

typedef struct cuh_tc_entry_s {
    uintptr_t addr;          /* 0: empty slot */
    uintptr_t stream;        /* LIVE: allocated on it; CACHED: freed on it */
    uint32_t size;           /* object bytes (its class's size) */
    uint32_t requested;      /* LIVE: the program's request */
    uint16_t size_class;
    uint8_t state;           /* cuh_tc_state_t */
} cuh_tc_entry_t;

/* Most objects a bin holds: a free that finds its bin full goes to the heap. */
#define CUH_TC_BIN_MAX 32

typedef struct cuh_tc_bin_s {
    uint32_t count;                       /* newest last */
    uintptr_t addr[CUH_TC_BIN_MAX];
    uintptr_t stream[CUH_TC_BIN_MAX];
} cuh_tc_bin_t;

/* A thread's last large block (heap_tcache.c, "a thread's large block"): freed by
 * the thread through the heap, it waits here for the thread's next request
 * of its size on its stream, and comes back here when that request frees it
 * on that stream, both without the heap's lock. */
typedef struct cuh_tc_large_s {
    /* What the fast paths read, in one cache line (tcache.h's users place
     * it on a line of its own): a Python program's interpreter empties the
     * CPU's caches between two tensors (issue 45). */
    uint8_t state;            /* 0 (none), CUH_TC_LIVE or CUH_TC_CACHED */
    uint8_t asked;            /* a cudaFree'd block, CACHED: a take found its fence running */
    uint8_t label;            /* a cudaFree'd block, LIVE: the label of its take (0: none) */
    uint16_t ops;             /* a cudaFree'd block: its takes and frees here since the heap's lock saw it */
    uint16_t budget;          /* a cudaFree'd block: how many it may have before the one that takes a timeline sample */
    uintptr_t addr;           /* 0: none */
    uintptr_t stream;         /* CACHED: freed on it; LIVE: allocated on it */
    size_t size;              /* the block's bytes */
    size_t counted;           /* the request the heap counts it with: the one it had when the cache took it */
    size_t requested;         /* LIVE: the program's request (never above counted) */
    void *event;              /* a cudaFree'd block: its batch's device-wide fence, recorded at each free here */
    size_t lowest;            /* a cudaFree'd block: the least request it may serve (the heap's smallest block) */
    void *ext;                /* the heap's record of the block */
    void *stream_state;       /* the heap's record of `stream` */
    uint64_t epoch;           /* CACHED: the fence that covers its free (CUH_TC_EPOCH_UNKNOWN: freed here) */
    void *batch;              /* a cudaFree'd block: the batch its free closed, kept for its return */
} cuh_tc_large_t;
_Static_assert(offsetof(cuh_tc_large_t, ext) <= 64, "what a large block's fast paths read fits one cache line");

/* The stream of a cudaFree'd block in a thread's slot: every stream (no
 * stream handle has this value). */
#define CUH_TC_DEVICE_WIDE UINTPTR_MAX

/* Most chunks a thread holds at once (heap_chunks.c, "a thread's chunks"). */
#define CUH_TC_CHUNKS 8

/* A block freed without the heap's lock: the heap takes its stream's next
 * fence as the one that covers it. */
#define CUH_TC_EPOCH_UNKNOWN UINT64_MAX

typedef struct cuh_tcache_s {
    cuh_spinlock_t lock;      /* its own thread on the fast paths; the heap now and then */
    /* The heap's list of its caches (under the heap's lock), and the
     * thread's list of its caches, one per heap (the thread's own). */
    struct cuh_tcache_s *heap_prev, *heap_next;
    struct cuh_tcache_s *thread_next;
    const void *heap;
    uint64_t heap_id;        /* the heap's, which no later heap at the same address has */
    int dead;                /* the heap is gone: the thread frees the cache */
    _Alignas(64) cuh_tc_large_t large;
    cuh_tc_entry_t *slots;   /* open addressing, linear probing */
    size_t mask;
    unsigned shift;          /* 64 - log2(slots) */
    size_t count;
    size_t cached_bytes;     /* bytes in the bins */
    /* The program's view against the heap's: the heap counts every object
     * the cache owns as allocated, with its whole size as requested. */
    int64_t allocated_adjust;    /* minus the bytes cached */
    int64_t requested_adjust;    /* LIVE: requested - size; CACHED: -size */
    uint64_t num_allocs, num_frees;   /* served here, without the heap */
    struct cuh_tcache_s *large_next;  /* the heap's list of caches holding a large block (heap's lock) */
    int large_listed;
    uint32_t large_misses;   /* held blocks given back unused since one was taken again */
    /* Chunks lent by the heap while threads contend (chunk.h): the heap
     * counts each as allocated whole and requested by nothing; the books
     * above take off its free pieces and add its blocks' requests. */
    cuh_chunk_t chunks[CUH_TC_CHUNKS];   /* [0, num_chunks) in use */
    unsigned num_chunks;
    uint32_t waits;          /* bit i: the heap's lock was held at this thread's large allocation i+1 back through it */
    uint32_t chunks_off;     /* large allocations through the heap's lock before this thread gets a chunk again */
    cuh_tc_bin_t bins[CUH_MAX_CLASSES];
} cuh_tcache_t;

/* An empty cache; NULL when out of host memory. */
cuh_tcache_t *cuh_tcache_create(void);
void cuh_tcache_destroy(cuh_tcache_t *tc);

/* The entry of addr, or NULL. */
static inline cuh_tc_entry_t *cuh_tcache_find(cuh_tcache_t *tc, uintptr_t addr)
{
    size_t i = (size_t)(((uint64_t)addr * 0x9E3779B97F4A7C15ull) >> tc->shift);
    for (;; i = (i + 1) & tc->mask) {
        cuh_tc_entry_t *e = &tc->slots[i];
        if (e->addr == addr)
            return e;
        if (!e->addr)
            return NULL;
    }
}

/* A new entry for addr (not in the table), zeroed but for its address; NULL
 * when out of host memory. Entry pointers change when the table grows. */
cuh_tc_entry_t *cuh_tcache_insert(cuh_tcache_t *tc, uintptr_t addr);
/* Removes an entry found by cuh_tcache_find. */
void cuh_tcache_remove(cuh_tcache_t *tc, cuh_tc_entry_t *e);

/* The two moves of an entry, with the books: a LIVE entry becomes CACHED
 * (freed on `stream`; its bin is the caller's), a CACHED one is handed out
 * for a request of `requested` bytes. An object entering the cache is
 * inserted as LIVE with its whole size requested (as the heap counts it),
 * then held; one leaving it is handed out for its whole size, then removed. */
static inline void cuh_tcache_hold(cuh_tcache_t *tc, cuh_tc_entry_t *e, uintptr_t stream)
{
    e->state = CUH_TC_CACHED;
    e->stream = stream;
    tc->cached_bytes += e->size;
    tc->allocated_adjust -= (int64_t)e->size;
    tc->requested_adjust -= (int64_t)e->requested;
}

static inline void cuh_tcache_hand_out(cuh_tcache_t *tc, cuh_tc_entry_t *e, uint32_t requested)
{
    e->state = CUH_TC_LIVE;
    e->requested = requested;
    tc->cached_bytes -= e->size;
    tc->allocated_adjust += (int64_t)e->size;
    tc->requested_adjust += (int64_t)requested;
}

/* The large block's two moves without the heap (the caller holds the
 * cache's lock): handed out for a request of `requested` bytes of its size
 * on its stream (0 if it is not there, or the request is above the one the
 * heap counts), and taken back at its free on that stream (0 if it is not
 * this block). The books: held, the heap counts it as allocated with
 * `counted` requested; handed out, with the program's request. */
static inline uintptr_t cuh_tcache_large_take(cuh_tcache_t *tc, size_t size, size_t requested, uintptr_t stream)
{
    cuh_tc_large_t *l = &tc->large;
    if (l->state != CUH_TC_CACHED || l->size != size || l->stream != stream || requested > l->counted)
        return 0;
    l->state = CUH_TC_LIVE;
    l->requested = requested;
    tc->large_misses = 0;
    tc->allocated_adjust += (int64_t)l->size;
    tc->requested_adjust += (int64_t)requested;
    return l->addr;
}

static inline int cuh_tcache_large_give(cuh_tcache_t *tc, uintptr_t addr, uintptr_t stream)
{
    cuh_tc_large_t *l = &tc->large;
    if (l->state != CUH_TC_LIVE || l->addr != addr || l->stream != stream)
        return 0;
    l->state = CUH_TC_CACHED;
    l->epoch = CUH_TC_EPOCH_UNKNOWN;
    tc->allocated_adjust -= (int64_t)l->size;
    tc->requested_adjust -= (int64_t)l->requested;
    return 1;
}

/* A block of `size` bytes (a multiple of CUH_ALIGN) for a request of
 * `requested` bytes on `stream`, cut by best fit from the cache's chunks for
 * that stream (the caller holds the cache's lock); 0 if none fits. */
uintptr_t cuh_tcache_chunk_take(cuh_tcache_t *tc, size_t size, size_t requested, uintptr_t stream);
/* Takes back a block a chunk of the cache's handed out, freed on that
 * chunk's stream: 1, or 0 if addr is no such block (the heap then judges the
 * free). */
int cuh_tcache_chunk_give(cuh_tcache_t *tc, uintptr_t addr, uintptr_t stream);

/* Puts a cached object on its class's bin; -1 if the bin is full. */
static inline int cuh_tcache_push(cuh_tcache_t *tc, unsigned size_class, uintptr_t addr, uintptr_t stream)
{
    cuh_tc_bin_t *b = &tc->bins[size_class];
    if (b->count == CUH_TC_BIN_MAX)
        return -1;
    b->addr[b->count] = addr;
    b->stream[b->count++] = stream;
    return 0;
}

uintptr_t cuh_tcache_pop_deeper(cuh_tcache_t *tc, unsigned size_class, uintptr_t stream);

/* Takes the newest object of a class freed on `stream` (looking at the
 * newest few only), or returns 0. The newest is checked here, inline: it is
 * nearly always the one. */
static inline uintptr_t cuh_tcache_pop(cuh_tcache_t *tc, unsigned size_class, uintptr_t stream)
{
    cuh_tc_bin_t *b = &tc->bins[size_class];
    if (__builtin_expect(b->count && b->stream[b->count - 1] == stream, 1))
        return b->addr[--b->count];
    return cuh_tcache_pop_deeper(tc, size_class, stream);
}
/* Takes item i out of a bin, keeping the order of the others. */
void cuh_tcache_unbin(cuh_tcache_t *tc, unsigned size_class, uint32_t i);

#endif /* CUH_TCACHE_H */
