/* freebins.h - an index of free extents for best fit in constant time.
 *
 * Two-level segregated fit: sizes (multiples of 512 bytes) fall into 64 bins
 * per doubling, each bin a list; a bitmap per level says which bins hold
 * anything. Inserting and removing an extent is a list push or unlink. Finding
 * a fit scans the request's own bin for the smallest extent that holds it,
 * then takes the smallest of the first non-empty bin above (any extent there
 * fits); a bin spans at most 1/64 of a doubling, so the choice is within 1.6%
 * of exact best fit. Below 32 KiB every bin holds one size exactly. Among
 * extents of one size the lowest rank wins, then the lowest address: the
 * arena ranks an extent by its segment's creation, so which one is chosen
 * does not depend on where the driver put the segments (on an H200 it put
 * allocations from 64 MiB up each below the last and smaller ones above,
 * bench/gpu/segment_addresses.cu; the simulated device puts each above the
 * last: ranked by address, replays and real runs parted).
 *
 * Intrusive: the node lives in the extent, so the index never allocates.
 */
#ifndef CUH_FREEBINS_H
#define CUH_FREEBINS_H

#include <stddef.h>
#include <stdint.h>

#define CUH_BINS_SECOND 64   /* bins per doubling */
#define CUH_BINS_FIRST 48    /* doublings: sizes up to 2^56 bytes */

typedef struct cuh_binnode_s {
    struct cuh_binnode_s *prev, *next;
    size_t size;
    uintptr_t addr;
    uint64_t rank;   /* among equal sizes, lower first (then lower addresses) */
} cuh_binnode_t;

typedef struct cuh_freebins_s {
    uint64_t first_map;
    uint64_t second_map[CUH_BINS_FIRST];
    cuh_binnode_t *head[CUH_BINS_FIRST][CUH_BINS_SECOND];
    size_t count;
    size_t bytes;
} cuh_freebins_t;

void cuh_freebins_insert(cuh_freebins_t *bins, cuh_binnode_t *node, size_t size, uintptr_t addr, uint64_t rank);
void cuh_freebins_remove(cuh_freebins_t *bins, cuh_binnode_t *node);
/* A free node of at least `size` bytes that can hold `size` bytes starting at
 * an `align`-aligned address, chosen as described above; NULL if none. */
cuh_binnode_t *cuh_freebins_find(const cuh_freebins_t *bins, size_t size, size_t align);
/* Walking the bins in size order: every bin is a number, larger for larger
 * sizes. The bin `size` falls in; the lowest bin at or above `from` that
 * holds a node (CUH_BINS_NONE if none); the first node of bin `bin`. */
#define CUH_BINS_NONE (CUH_BINS_FIRST * CUH_BINS_SECOND)
unsigned cuh_freebins_bin(size_t size);
unsigned cuh_freebins_next(const cuh_freebins_t *bins, unsigned from);
static inline cuh_binnode_t *cuh_freebins_head(const cuh_freebins_t *bins, unsigned bin)
{
    return bins->head[bin / CUH_BINS_SECOND][bin % CUH_BINS_SECOND];
}
/* The largest node, or NULL. */
cuh_binnode_t *cuh_freebins_largest(const cuh_freebins_t *bins);
/* Checks that every node sits in its bin, links, bitmaps, count and bytes
 * agree; 0 if sound. */
int cuh_freebins_check(const cuh_freebins_t *bins);

#endif /* CUH_FREEBINS_H */
