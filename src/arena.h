/* arena.h - segments cut into extents: where every byte of the heap is.
 *
 * Glossary
 *   segment  device memory obtained in one piece from the device. It belongs
 *            to a region: the workspace (preallocated, searched first, never
 *            released) or the general region (grown and released on demand).
 *   extent   a contiguous range inside a segment: used (a large block or a
 *            slab of small objects) or free. A segment's extents tile it in
 *            address order.
 *   tag      who may reuse a free extent at once. Tag 0 is global (any
 *            stream). Tag t > 0 is one stream's private memory: freed on that
 *            stream and reusable there at once, reusable elsewhere only after
 *            a fence recorded on that stream after the free has completed.
 *   epoch    the fence that covers a private extent: the stream's fence
 *            counter at the time of the free. A fence with number >= epoch,
 *            once complete, makes the extent global.
 *
 * Free extents sit in one index per (tag, region) (freebins.h: segregated
 * fit, constant time), so best fit for a stream is the better of two
 * lookups: the global index and its own. Freeing merges an extent with free neighbours that it may absorb:
 * neighbours of its own tag (the later epoch wins) and global ones (which
 * become its own: safe, since global memory is safe for everyone), except in
 * a virtual-memory reservation, whose global free space is the whole unused
 * address range. Private extents of two different streams never merge.
 *
 * The arena only keeps books; it never calls the device. Byte counts per tag
 * (global, private unfenced, private fenced) are kept exact on every change,
 * so the heap's cached and pending statistics are sums, not walks.
 */
#ifndef CUH_ARENA_H
#define CUH_ARENA_H

#include "freebins.h"

#include <stddef.h>
#include <stdint.h>

#define CUH_TAG_GLOBAL 0u

typedef enum { CUH_REGION_WORKSPACE = 0, CUH_REGION_GENERAL = 1, CUH_NUM_REGIONS = 2 } cuh_region_t;
/* DRAIN: under virtual memory, address space whose pages moved to a new
 * block before the GPU passed their free; nothing may be placed there until
 * the old mappings are gone (heap_pages.c, lend_own_pages_locked). */
typedef enum { CUH_EXTENT_FREE = 0, CUH_EXTENT_BLOCK = 1, CUH_EXTENT_SLAB = 2, CUH_EXTENT_DRAIN = 3 } cuh_extent_state_t;

typedef struct cuh_segment_s cuh_segment_t;
typedef struct cuh_extent_s cuh_extent_t;

struct cuh_extent_s {
    cuh_binnode_t node;             /* free-index linkage, while free */
    uintptr_t addr;
    size_t size;
    cuh_extent_t *prev, *next;      /* address neighbours in the segment */
    cuh_segment_t *segment;
    cuh_extent_t *tag_prev, *tag_next;  /* free extents of the same tag */
    uint64_t epoch;                 /* free & private: the fence that covers it */
    size_t requested;               /* used: bytes the program asked for */
    void *owner;                    /* used as slab: the slab record; block: the thread cache holding it, or NULL */
    uint32_t tag;                   /* free: who may reuse; used: allocating stream's tag */
    uint8_t state;                  /* cuh_extent_state_t */
    uint8_t chunked;                /* block: a thread's chunk (chunk.h); `owner` is that thread's cache */
    uint8_t held;                   /* block: freed by cudaFree, waiting in a batch for its fence (heap_devicewide.c) */
    uint8_t label;                  /* block: its allocator's label (cuh_heap_malloc_labelled), 0 for none */
    uint64_t seq;                   /* block, with step_plan: its number among the heap's block allocations (heap_plan.c) */
    uint32_t plan;                  /* block: the step plan that placed it (heap_plan.c), 0 for none */
};

struct cuh_segment_s {
    uintptr_t base;
    size_t size;
    cuh_region_t region;
    int virtual_space;              /* a virtual-memory reservation: pages mapped on demand */
    cuh_extent_t *first;            /* lowest extent */
    size_t used_bytes;              /* bytes in used extents */
    cuh_segment_t *prev, *next;     /* all segments, in creation order */
    uint64_t serial;
};

typedef struct cuh_tag_books_s {
    cuh_freebins_t bins[CUH_NUM_REGIONS];
    cuh_extent_t *list;             /* every free extent of this tag, newest first */
    cuh_extent_t *oldest;           /* the list's last element */
    size_t unfenced_bytes;          /* private: epoch >= fences recorded */
    size_t fenced_bytes;            /* private: a fence covers it, not yet complete */
    uint64_t fences_recorded;       /* private: the stream's fence counter */
} cuh_tag_books_t;

typedef struct cuh_extent_chunk_s cuh_extent_chunk_t;

typedef struct cuh_arena_s {
    cuh_tag_books_t *tags;
    uint32_t num_tags;
    cuh_segment_t *segments;        /* list head */
    cuh_segment_t **by_address;     /* sorted by base, for lookups */
    size_t num_segments, cap_segments;
    size_t reserved;                /* bytes in all segments */
    size_t used;                    /* bytes in used extents */
    size_t free_extents;            /* count */
    size_t fenced_bytes;            /* sum of every tag's fenced_bytes */
    uint64_t next_serial;
    uint64_t index_changes;         /* changes to the free index (index_insert, index_remove): while it
                                       stands still, a search finds what it found before */
    cuh_extent_t *spare;            /* free list of extent records */
    cuh_extent_chunk_t *chunks;
} cuh_arena_t;

void cuh_arena_init(cuh_arena_t *arena);
/* Frees the books; the caller returns the segments to the device first. */
void cuh_arena_destroy(cuh_arena_t *arena);
/* Makes tags [0, n) valid. -1 if out of host memory. */
int cuh_arena_reserve_tags(cuh_arena_t *arena, uint32_t n);

/* Adds a segment as one global free extent. NULL if out of host memory. */
cuh_segment_t *cuh_arena_add_segment(cuh_arena_t *arena, uintptr_t base, size_t size, cuh_region_t region);
/* Removes a segment that is one global free extent (see segment_is_free). */
void cuh_arena_remove_segment(cuh_arena_t *arena, cuh_segment_t *seg);
int cuh_arena_segment_is_free(const cuh_segment_t *seg);
/* The segment holding addr, or NULL. */
cuh_segment_t *cuh_arena_segment_of(const cuh_arena_t *arena, uintptr_t addr);

/* Best fit for `size` bytes aligned to `align` that tag `tag` may use at once:
 * the workspace region first, then the general one. NULL if none. */
cuh_extent_t *cuh_arena_find(cuh_arena_t *arena, size_t size, size_t align, uint32_t tag);
/* Carves [aligned start, +size) out of free extent `ext` (from find); the
 * rest stays free with ext's tag and epoch. Returns the used extent, with
 * state and tag set, or NULL if out of host memory (nothing changed). */
cuh_extent_t *cuh_arena_take(cuh_arena_t *arena, cuh_extent_t *ext, size_t size, size_t align,
                             cuh_extent_state_t state, uint32_t tag);
/* Carves exactly [start, start + size) out of free extent `ext`, which must
 * contain it; otherwise as cuh_arena_take. */
cuh_extent_t *cuh_arena_take_at(cuh_arena_t *arena, cuh_extent_t *ext, uintptr_t start, size_t size,
                                cuh_extent_state_t state, uint32_t tag);
/* Carves exactly [start, start + size) out of free extent `ext`, a private
 * one, and the free global extent after it, which the range reaches into:
 * the global bytes it covers become ext's (safe: global memory is safe for
 * every stream). Otherwise as cuh_arena_take. */
cuh_extent_t *cuh_arena_take_spanning(cuh_arena_t *arena, cuh_extent_t *ext, uintptr_t start, size_t size,
                                     cuh_extent_state_t state, uint32_t tag);
/* Cuts used extent `ext` in two at `at` (inside it, past its start): ext
 * keeps [addr, at), the returned extent, used alike (state, tag, nothing
 * requested), is [at, end). NULL if out of host memory (nothing changed). */
cuh_extent_t *cuh_arena_split_used(cuh_arena_t *arena, cuh_extent_t *ext, uintptr_t at);
/* Undoes a split: used extent `ext` takes in the used extent after it. */
void cuh_arena_join_used(cuh_arena_t *arena, cuh_extent_t *ext);
/* Frees a used extent into `tag` with the tag's current epoch, merging with
 * the neighbours it may absorb. */
void cuh_arena_release(cuh_arena_t *arena, cuh_extent_t *ext, uint32_t tag);
/* The same for memory the program freed when the tag's count of recorded
 * fences was `epoch` (the fence numbered `epoch` is the first that covers
 * it), released only now. */
void cuh_arena_release_freed_at(cuh_arena_t *arena, cuh_extent_t *ext, uint32_t tag, uint64_t epoch);
/* The fields of a used extent as a take leaves them (state, tag, and every
 * mark of its last use cleared): for a caller that hands a used extent out
 * again without a release and a take. */
void cuh_arena_fresh_take(cuh_extent_t *ext, cuh_extent_state_t state, uint32_t tag);
/* Whether a release into `tag` of an extent next to n would absorb n (the
 * merge rule of cuh_arena_release; n NULL: no neighbour, no). */
int cuh_arena_absorbs(const cuh_extent_t *n, uint32_t tag);
/* Puts free extent ext first in its index's lists, where a free extent
 * just made (a release, the rest of a take) goes: for a caller that skips
 * a release and a take that would have made it anew. */
void cuh_arena_requeue(cuh_arena_t *arena, cuh_extent_t *ext);
/* Whether free extent ext is first in its index's lists already (a
 * requeue would change nothing). */
static inline int cuh_arena_queued_first(const cuh_extent_t *ext) { return !ext->node.prev && !ext->tag_prev; }

/* A fence was recorded for `tag`: its unfenced bytes become fenced. Returns
 * the fence's number (the epoch it covers). */
uint64_t cuh_arena_fence_recorded(cuh_arena_t *arena, uint32_t tag);
/* Fences [0, completed) of `tag` have completed: the extents they cover
 * become global and merge with global neighbours. */
void cuh_arena_fence_completed(cuh_arena_t *arena, uint32_t tag, uint64_t completed);

/* The stream of tag `to` now waits (on the GPU) for fences [0, completed) of
 * tag `from`: the extents they cover become `to`'s, unfenced, and merge with
 * global and `to`'s free neighbours. */
void cuh_arena_hand_over(cuh_arena_t *arena, uint32_t from, uint64_t completed, uint32_t to);

/* Sizes of free memory. */
size_t cuh_arena_free_bytes(const cuh_arena_t *arena);
size_t cuh_arena_pending_bytes(const cuh_arena_t *arena);
size_t cuh_arena_largest_free(const cuh_arena_t *arena);

/* Walks every extent; used by reports and by the consistency check. */
typedef void (*cuh_extent_visitor_t)(void *ctx, const cuh_segment_t *seg, const cuh_extent_t *ext);
void cuh_arena_visit(const cuh_arena_t *arena, cuh_extent_visitor_t visit, void *ctx);
/* Verifies every invariant (tiling, trees, lists, counts); 0 if sound, else -1
 * with a description in msg. */
int cuh_arena_check(const cuh_arena_t *arena, char *msg, size_t len);

#endif /* CUH_ARENA_H */
