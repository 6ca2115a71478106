/* tcache.c - a thread cache's table and bins (see tcache.h).
 *
 * The table is open addressing with linear probing, keyed by address
 * (Fibonacci hashing spreads the 512-byte-aligned addresses), half full at
 * most; a removal shifts the following entries of its run back, so lookups
 * need no tombstones. Bins are small stacks: a pop looks at the newest few
 * objects for one freed on the asking stream.
 */
#include "tcache.h"

#include <stdlib.h>
#include <string.h>

#define TC_INITIAL_SLOTS 64u
/* A pop looks at most this many objects down its bin for the asking stream. */
#define TC_POP_SCAN 4u

cuh_tcache_t *cuh_tcache_create(void)
{
    /* Line-aligned, so that no two threads' caches share a cache line. */
    cuh_tcache_t *tc = aligned_alloc(64, (sizeof *tc + 63) & ~(size_t)63);
    if (!tc)
        return NULL;
    memset(tc, 0, sizeof *tc);
    tc->slots = calloc(TC_INITIAL_SLOTS, sizeof *tc->slots);
    if (!tc->slots) {
        free(tc);
        return NULL;
    }
    tc->mask = TC_INITIAL_SLOTS - 1;
    tc->shift = 64 - (unsigned)__builtin_ctzll(TC_INITIAL_SLOTS);
    cuh_spin_init(&tc->lock);
    return tc;
}

void cuh_tcache_destroy(cuh_tcache_t *tc)
{
    if (!tc)
        return;
    for (unsigned i = 0; i < tc->num_chunks; i++)
        cuh_chunk_fini(&tc->chunks[i]);
    free(tc->slots);
    free(tc);
}

static cuh_tc_entry_t *slot_for(cuh_tcache_t *tc, uintptr_t addr)
{
    size_t i = (size_t)(((uint64_t)addr * 0x9E3779B97F4A7C15ull) >> tc->shift);
    while (tc->slots[i].addr)
        i = (i + 1) & tc->mask;
    return &tc->slots[i];
}

static int grow(cuh_tcache_t *tc)
{
    size_t old_n = tc->mask + 1, n = 2 * old_n;
    cuh_tc_entry_t *old = tc->slots, *slots = calloc(n, sizeof *slots);
    if (!slots)
        return -1;
    tc->slots = slots;
    tc->mask = n - 1;
    tc->shift--;
    for (size_t i = 0; i < old_n; i++)
        if (old[i].addr)
            *slot_for(tc, old[i].addr) = old[i];
    free(old);
    return 0;
}

cuh_tc_entry_t *cuh_tcache_insert(cuh_tcache_t *tc, uintptr_t addr)
{
    if (2 * (tc->count + 1) > tc->mask + 1 && grow(tc) != 0)
        return NULL;
    cuh_tc_entry_t *e = slot_for(tc, addr);
    memset(e, 0, sizeof *e);
    e->addr = addr;
    tc->count++;
    return e;
}

void cuh_tcache_remove(cuh_tcache_t *tc, cuh_tc_entry_t *e)
{
    size_t hole = (size_t)(e - tc->slots);
    for (size_t i = (hole + 1) & tc->mask; tc->slots[i].addr; i = (i + 1) & tc->mask) {
        size_t home = (size_t)(((uint64_t)tc->slots[i].addr * 0x9E3779B97F4A7C15ull) >> tc->shift);
        /* The entry at i may fill the hole if its home is not in (hole, i]. */
        if (((i - home) & tc->mask) >= ((i - hole) & tc->mask)) {
            tc->slots[hole] = tc->slots[i];
            hole = i;
        }
    }
    memset(&tc->slots[hole], 0, sizeof tc->slots[hole]);
    tc->count--;
}

void cuh_tcache_unbin(cuh_tcache_t *tc, unsigned size_class, uint32_t i)
{
    cuh_tc_bin_t *b = &tc->bins[size_class];
    uint32_t after = b->count - i - 1;
    memmove(&b->addr[i], &b->addr[i + 1], after * sizeof b->addr[0]);
    memmove(&b->stream[i], &b->stream[i + 1], after * sizeof b->stream[0]);
    b->count--;
}

/* cuh_tcache_pop past the newest object (which it has checked). */
uintptr_t cuh_tcache_pop_deeper(cuh_tcache_t *tc, unsigned size_class, uintptr_t stream)
{
    cuh_tc_bin_t *b = &tc->bins[size_class];
    uint32_t stop = b->count > TC_POP_SCAN ? b->count - TC_POP_SCAN : 0;
    for (uint32_t i = b->count; i-- > stop;)
        if (b->stream[i] == stream) {
            uintptr_t addr = b->addr[i];
            cuh_tcache_unbin(tc, size_class, i);
            return addr;
        }
    return 0;
}

uintptr_t cuh_tcache_chunk_take(cuh_tcache_t *tc, size_t size, size_t requested, uintptr_t stream)
{
    cuh_chunk_t *best = NULL;
    size_t best_size = SIZE_MAX;
    for (unsigned k = 0; k < tc->num_chunks; k++) {
        cuh_chunk_t *c = &tc->chunks[k];
        size_t fit = c->stream == stream ? cuh_chunk_fit_size(c, size) : 0;
        if (fit && fit < best_size) {
            best = c;
            best_size = fit;
        }
    }
    if (!best)
        return 0;
    uintptr_t addr = cuh_chunk_carve(best, (size_t)cuh_chunk_fit(best, size), size, requested);
    if (addr) {
        tc->allocated_adjust += (int64_t)size;
        tc->requested_adjust += (int64_t)requested;
    }
    return addr;
}

int cuh_tcache_chunk_give(cuh_tcache_t *tc, uintptr_t addr, uintptr_t stream)
{
    for (unsigned k = 0; k < tc->num_chunks; k++) {
        cuh_chunk_t *c = &tc->chunks[k];
        if (!cuh_chunk_contains(c, addr))
            continue;
        ptrdiff_t i = c->stream == stream ? cuh_chunk_find(c, addr) : -1;
        if (i < 0 || !c->pieces[i].requested)
            return 0;
        tc->allocated_adjust -= (int64_t)c->pieces[i].size;
        tc->requested_adjust -= (int64_t)c->pieces[i].requested;
        cuh_chunk_release(c, (size_t)i);
        return 1;
    }
    return 0;
}
