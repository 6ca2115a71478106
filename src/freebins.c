/* freebins.c - two-level segregated fit (see freebins.h).
 *
 * Bin of a size: u = size / 512 units. Below 64 units, first level 0 and
 * second level u (one size per bin). Otherwise, with l = floor(log2 u),
 * first level l - 5 and second level the next six bits of u below its top
 * bit. Bins grow in size with their indices, so "the next non-empty bin" is
 * the next set bit in the bitmaps.
 */
#include "freebins.h"

#include "common.h"

/* Looking at more nodes of one bin finds a slightly better fit at a cost in
 * time; this many is plenty in practice (bins are narrow). */
#define SCAN_LIMIT 32

static unsigned log2_floor(uint64_t x) { return (unsigned)(63 - __builtin_clzll(x)); }

static void bin_of(size_t size, unsigned *first, unsigned *second)
{
    uint64_t u = (uint64_t)size >> 9;
    if (u < CUH_BINS_SECOND) {
        *first = 0;
        *second = (unsigned)u;
        return;
    }
    unsigned l = log2_floor(u);
    *first = l - 5;
    *second = (unsigned)(u >> (l - 6)) & (CUH_BINS_SECOND - 1);
}

void cuh_freebins_insert(cuh_freebins_t *b, cuh_binnode_t *n, size_t size, uintptr_t addr, uint64_t rank)
{
    unsigned f, s;
    bin_of(size, &f, &s);
    n->size = size;
    n->addr = addr;
    n->rank = rank;
    n->prev = NULL;
    n->next = b->head[f][s];
    if (n->next)
        n->next->prev = n;
    b->head[f][s] = n;
    b->first_map |= (uint64_t)1 << f;
    b->second_map[f] |= (uint64_t)1 << s;
    b->count++;
    b->bytes += size;
}

void cuh_freebins_remove(cuh_freebins_t *b, cuh_binnode_t *n)
{
    unsigned f, s;
    bin_of(n->size, &f, &s);
    if (n->prev)
        n->prev->next = n->next;
    else
        b->head[f][s] = n->next;
    if (n->next)
        n->next->prev = n->prev;
    if (!b->head[f][s]) {
        b->second_map[f] &= ~((uint64_t)1 << s);
        if (!b->second_map[f])
            b->first_map &= ~((uint64_t)1 << f);
    }
    n->prev = n->next = NULL;
    b->count--;
    b->bytes -= n->size;
}

static int fits(const cuh_binnode_t *n, size_t size, size_t align)
{
    uintptr_t start = cuh_addr_align_up(n->addr, align);
    return start - n->addr + size <= n->size;
}

/* 1 if n comes before m among nodes of one size. */
static int ranks_before(const cuh_binnode_t *n, const cuh_binnode_t *m)
{
    return n->rank < m->rank || (n->rank == m->rank && n->addr < m->addr);
}

/* The smallest node of a bin that holds the request (the first by rank and
 * address among equals), looking at SCAN_LIMIT nodes at most. */
static cuh_binnode_t *best_in_bin(cuh_binnode_t *n, size_t size, size_t align)
{
    cuh_binnode_t *best = NULL;
    for (int i = 0; n && i < SCAN_LIMIT; n = n->next, i++)
        if (fits(n, size, align) &&
            (!best || n->size < best->size || (n->size == best->size && ranks_before(n, best))))
            best = n;
    return best;
}

cuh_binnode_t *cuh_freebins_find(const cuh_freebins_t *b, size_t size, size_t align)
{
    /* The request's own bin, then the bins above that hold a node: only an
     * aligned request can miss a whole bin. */
    for (unsigned bin = cuh_freebins_bin(size); bin != CUH_BINS_NONE; bin = cuh_freebins_next(b, bin + 1)) {
        cuh_binnode_t *best = best_in_bin(cuh_freebins_head(b, bin), size, align);
        if (best)
            return best;
    }
    return NULL;
}

unsigned cuh_freebins_bin(size_t size)
{
    unsigned f, s;
    bin_of(size, &f, &s);
    return f * CUH_BINS_SECOND + s;
}

unsigned cuh_freebins_next(const cuh_freebins_t *b, unsigned from)
{
    if (from >= CUH_BINS_NONE)
        return CUH_BINS_NONE;
    unsigned f = from / CUH_BINS_SECOND, s = from % CUH_BINS_SECOND;
    uint64_t here = b->second_map[f] & (~(uint64_t)0 << s);
    if (here)
        return f * CUH_BINS_SECOND + (unsigned)__builtin_ctzll(here);
    uint64_t firsts = f + 1 < CUH_BINS_FIRST ? b->first_map & (~(uint64_t)0 << (f + 1)) : 0;
    if (!firsts)
        return CUH_BINS_NONE;
    f = (unsigned)__builtin_ctzll(firsts);
    return f * CUH_BINS_SECOND + (unsigned)__builtin_ctzll(b->second_map[f]);
}

cuh_binnode_t *cuh_freebins_largest(const cuh_freebins_t *b)
{
    if (!b->first_map)
        return NULL;
    unsigned f = log2_floor(b->first_map);
    unsigned s = log2_floor(b->second_map[f]);
    cuh_binnode_t *largest = NULL;
    for (cuh_binnode_t *n = b->head[f][s]; n; n = n->next)
        if (!largest || n->size > largest->size)
            largest = n;
    return largest;
}

int cuh_freebins_check(const cuh_freebins_t *b)
{
    size_t count = 0, bytes = 0;
    for (unsigned f = 0; f < CUH_BINS_FIRST; f++) {
        if (!!(b->first_map >> f & 1) != !!b->second_map[f])
            return -1;
        for (unsigned s = 0; s < CUH_BINS_SECOND; s++) {
            const cuh_binnode_t *n = b->head[f][s];
            if (!!(b->second_map[f] >> s & 1) != !!n)
                return -1;
            for (const cuh_binnode_t *prev = NULL; n; prev = n, n = n->next) {
                unsigned nf, ns;
                bin_of(n->size, &nf, &ns);
                if (nf != f || ns != s || n->prev != prev || n->size == 0)
                    return -1;
                count++;
                bytes += n->size;
            }
        }
    }
    return count == b->count && bytes == b->bytes ? 0 : -1;
}
