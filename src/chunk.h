/* chunk.h - a thread's chunk: a piece of a heap's memory that one thread cuts
 * its large blocks from, without the heap's lock, while threads contend.
 *
 * Every large request that misses the thread caches takes the heap's lock,
 * and with many threads the heap's own data (free bins, extents, the block
 * map) travels from core to core with it: random large sizes from 16 threads
 * ran at 0.14x one thread's throughput. A chunk shards the heap the way an
 * arena per thread does, only for as long as threads contend: the heap
 * lends a thread one large range of its memory, for one stream, and the
 * thread serves that stream's large requests from it by best fit under its
 * own cache's lock, which stays on its core. What a chunk holds goes back
 * when the heap asks (its free pieces to the arena, its live ones as the
 * heap's own blocks: heap_chunks.c keeps those rules).
 *
 * This file holds the data structure only: the pieces that tile a chunk in
 * address order, each live (a block handed out) or free, no two free ones
 * side by side, and the free ones again by size: best fit and the lookup
 * by address are binary searches (a scan of a thread's pieces cost more
 * than the heap's lock path it replaces).
 */
#ifndef CUH_CHUNK_H
#define CUH_CHUNK_H

#include <stddef.h>
#include <stdint.h>

typedef struct cuh_piece_s {
    size_t off;               /* from the chunk's base */
    size_t size;              /* a multiple of CUH_ALIGN */
    size_t requested;         /* live: the program's request (> 0); free: 0 */
} cuh_piece_t;

/* A free piece in the size index: by size, then by offset. */
typedef struct cuh_free_piece_s {
    size_t size;
    size_t off;
} cuh_free_piece_t;

typedef struct cuh_chunk_s {
    uintptr_t base;           /* 0: the slot is empty */
    size_t size;
    uintptr_t stream;         /* the one stream its blocks serve and are freed on */
    void *ext;                /* the heap's record of the range (a live extent) */
    void *stream_state;       /* the heap's record of `stream` */
    size_t live_bytes;        /* pieces handed out, their sizes added up */
    size_t live_requested;    /* and their requests */
    size_t num_live;
    size_t num_pieces, cap_pieces;
    cuh_piece_t *pieces;      /* tile [0, size) in address order */
    size_t num_free;
    cuh_free_piece_t *free;   /* the free pieces by size (room for cap_pieces) */
} cuh_chunk_t;

/* Makes c one free piece covering [base, base + size); -1 if out of host
 * memory (c is then empty). */
int cuh_chunk_init(cuh_chunk_t *c, uintptr_t base, size_t size);
/* Frees c's pieces; c becomes an empty slot. */
void cuh_chunk_fini(cuh_chunk_t *c);

/* The smallest free piece of at least `size` bytes (the lowest among
 * equals), or -1. */
ptrdiff_t cuh_chunk_fit(const cuh_chunk_t *c, size_t size);
/* The size of the piece cuh_chunk_fit would take, 0 if none fits. */
size_t cuh_chunk_fit_size(const cuh_chunk_t *c, size_t size);
/* Hands out the first `size` bytes of free piece i for a request of
 * `requested` bytes; the rest stays free. The block's address, or 0 if out of
 * host memory (nothing changed). */
uintptr_t cuh_chunk_carve(cuh_chunk_t *c, size_t i, size_t size, size_t requested);
/* The piece that starts at addr, or -1 (addr is in the chunk's range or not). */
ptrdiff_t cuh_chunk_find(const cuh_chunk_t *c, uintptr_t addr);
/* Frees live piece i, merged with free neighbours. */
void cuh_chunk_release(cuh_chunk_t *c, size_t i);

static inline int cuh_chunk_contains(const cuh_chunk_t *c, uintptr_t addr)
{
    return addr - c->base < c->size;
}

/* Verifies the tiling and the counts; 0 if sound, else -1 with a description
 * in msg. */
int cuh_chunk_check(const cuh_chunk_t *c, char *msg, size_t len);

#endif /* CUH_CHUNK_H */
