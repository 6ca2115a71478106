/* chunk.c - the pieces of a thread's chunk (see chunk.h).
 *
 * Two sorted arrays: every piece by address, the free ones by size then
 * address. A carve cuts the front of a free piece (its rest stays free, after
 * it); a release merges the piece with its free neighbours. Both arrays have
 * room for cap_pieces, so that a release, which never adds a piece, never
 * allocates.
 */
#include "chunk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_INITIAL_PIECES 16u

/* ---- the size index ------------------------------------------------------------ */

static int free_before(const cuh_free_piece_t *a, size_t size, size_t off)
{
    return a->size < size || (a->size == size && a->off < off);
}

/* Where (size, off) is or would go in the size index. */
static size_t free_lower_bound(const cuh_chunk_t *c, size_t size, size_t off)
{
    size_t lo = 0, hi = c->num_free;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (free_before(&c->free[mid], size, off))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void free_insert(cuh_chunk_t *c, size_t size, size_t off)
{
    size_t i = free_lower_bound(c, size, off);
    memmove(&c->free[i + 1], &c->free[i], (c->num_free - i) * sizeof c->free[0]);
    c->free[i] = (cuh_free_piece_t){.size = size, .off = off};
    c->num_free++;
}

static void free_remove(cuh_chunk_t *c, size_t size, size_t off)
{
    size_t i = free_lower_bound(c, size, off);
    memmove(&c->free[i], &c->free[i + 1], (c->num_free - i - 1) * sizeof c->free[0]);
    c->num_free--;
}

/* The piece at offset `off` (which a piece starts at). */
static size_t piece_at(const cuh_chunk_t *c, size_t off)
{
    size_t lo = 0, hi = c->num_pieces;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->pieces[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---- the chunk ------------------------------------------------------------------- */

int cuh_chunk_init(cuh_chunk_t *c, uintptr_t base, size_t size)
{
    memset(c, 0, sizeof *c);
    c->pieces = malloc(CHUNK_INITIAL_PIECES * sizeof *c->pieces);
    c->free = malloc(CHUNK_INITIAL_PIECES * sizeof *c->free);
    if (!c->pieces || !c->free) {
        free(c->pieces);
        free(c->free);
        memset(c, 0, sizeof *c);
        return -1;
    }
    c->cap_pieces = CHUNK_INITIAL_PIECES;
    c->pieces[0] = (cuh_piece_t){.off = 0, .size = size, .requested = 0};
    c->num_pieces = 1;
    c->free[0] = (cuh_free_piece_t){.size = size, .off = 0};
    c->num_free = 1;
    c->base = base;
    c->size = size;
    return 0;
}

void cuh_chunk_fini(cuh_chunk_t *c)
{
    free(c->pieces);
    free(c->free);
    memset(c, 0, sizeof *c);
}

ptrdiff_t cuh_chunk_fit(const cuh_chunk_t *c, size_t size)
{
    size_t i = free_lower_bound(c, size, 0);
    return i < c->num_free ? (ptrdiff_t)piece_at(c, c->free[i].off) : -1;
}

size_t cuh_chunk_fit_size(const cuh_chunk_t *c, size_t size)
{
    if (!c->num_free || c->free[c->num_free - 1].size < size)
        return 0;
    return c->free[free_lower_bound(c, size, 0)].size;
}

/* Room for one more piece in both arrays; -1 if out of host memory. */
static int make_room(cuh_chunk_t *c)
{
    if (c->num_pieces < c->cap_pieces)
        return 0;
    size_t cap = 2 * c->cap_pieces;
    cuh_piece_t *pieces = realloc(c->pieces, cap * sizeof *pieces);
    if (!pieces)
        return -1;
    c->pieces = pieces;
    cuh_free_piece_t *frees = realloc(c->free, cap * sizeof *frees);
    if (!frees)
        return -1;   /* the pieces' larger array is kept; cap_pieces stays */
    c->free = frees;
    c->cap_pieces = cap;
    return 0;
}

uintptr_t cuh_chunk_carve(cuh_chunk_t *c, size_t i, size_t size, size_t requested)
{
    if (c->pieces[i].size > size && make_room(c))
        return 0;
    cuh_piece_t *p = &c->pieces[i];
    free_remove(c, p->size, p->off);
    if (p->size > size) {
        memmove(p + 2, p + 1, (c->num_pieces - i - 1) * sizeof *p);
        p[1] = (cuh_piece_t){.off = p->off + size, .size = p->size - size, .requested = 0};
        p->size = size;
        c->num_pieces++;
        free_insert(c, p[1].size, p[1].off);
    }
    p->requested = requested;
    c->live_bytes += p->size;
    c->live_requested += requested;
    c->num_live++;
    return c->base + p->off;
}

ptrdiff_t cuh_chunk_find(const cuh_chunk_t *c, uintptr_t addr)
{
    if (!cuh_chunk_contains(c, addr))
        return -1;
    size_t off = (size_t)(addr - c->base), i = piece_at(c, off);
    return i < c->num_pieces && c->pieces[i].off == off ? (ptrdiff_t)i : -1;
}

void cuh_chunk_release(cuh_chunk_t *c, size_t i)
{
    cuh_piece_t *p = &c->pieces[i];
    c->live_bytes -= p->size;
    c->live_requested -= p->requested;
    c->num_live--;
    p->requested = 0;
    size_t first = i, last = i;   /* the run of free pieces [first, last] merges */
    if (first > 0 && !c->pieces[first - 1].requested)
        first--;
    if (last + 1 < c->num_pieces && !c->pieces[last + 1].requested)
        last++;
    size_t size = 0;
    for (size_t k = first; k <= last; k++) {
        if (k != i)
            free_remove(c, c->pieces[k].size, c->pieces[k].off);
        size += c->pieces[k].size;
    }
    c->pieces[first].size = size;
    memmove(&c->pieces[first + 1], &c->pieces[last + 1], (c->num_pieces - last - 1) * sizeof *p);
    c->num_pieces -= last - first;
    free_insert(c, size, c->pieces[first].off);
}

int cuh_chunk_check(const cuh_chunk_t *c, char *msg, size_t len)
{
    size_t off = 0, live_bytes = 0, live_requested = 0, num_live = 0, num_free = 0;
    for (size_t i = 0; i < c->num_pieces; i++) {
        const cuh_piece_t *p = &c->pieces[i];
        if (p->off != off || !p->size) {
            snprintf(msg, len, "chunk 0x%llx: piece %zu at offset %zu (%zu bytes), expected offset %zu",
                     (unsigned long long)c->base, i, p->off, p->size, off);
            return -1;
        }
        if (i && !p->requested && !c->pieces[i - 1].requested) {
            snprintf(msg, len, "chunk 0x%llx: free pieces %zu and %zu side by side", (unsigned long long)c->base,
                     i - 1, i);
            return -1;
        }
        if (p->requested) {
            live_bytes += p->size;
            live_requested += p->requested;
            num_live++;
        } else {
            size_t k = free_lower_bound(c, p->size, p->off);
            if (k == c->num_free || c->free[k].size != p->size || c->free[k].off != p->off) {
                snprintf(msg, len, "chunk 0x%llx: free piece at offset %zu is missing from the size index",
                         (unsigned long long)c->base, p->off);
                return -1;
            }
            num_free++;
        }
        off += p->size;
    }
    for (size_t k = 1; k < c->num_free; k++)
        if (!free_before(&c->free[k - 1], c->free[k].size, c->free[k].off)) {
            snprintf(msg, len, "chunk 0x%llx: the size index is out of order at %zu", (unsigned long long)c->base, k);
            return -1;
        }
    if (off != c->size || live_bytes != c->live_bytes || live_requested != c->live_requested ||
        num_live != c->num_live || num_free != c->num_free) {
        snprintf(msg, len,
                 "chunk 0x%llx: pieces cover %zu of %zu bytes, %zu live (%zu bytes, %zu requested), %zu free; books "
                 "say %zu (%zu, %zu), %zu free",
                 (unsigned long long)c->base, off, c->size, num_live, live_bytes, live_requested, num_free,
                 c->num_live, c->live_bytes, c->live_requested, c->num_free);
        return -1;
    }
    return 0;
}
