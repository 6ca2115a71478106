/* heap_chunks.c - a thread's chunks: the heap sharded per thread, only while
 * threads contend for its lock.
 *
 * A large request that misses the thread caches takes the heap's lock, and
 * with many threads the heap's data travels from core to core with the lock
 * (docs/benchmarks.md, "Threads"). So a thread that keeps finding the lock
 * held or just used by another thread (CHUNK_WAITS of its last 32 large
 * allocations through it) gets a chunk: a range of the heap's memory,
 * allocated as one block for one stream, from which its cache cuts that
 * stream's large blocks by best fit and takes them back at their frees on
 * that stream, all under the cache's own lock (chunk.h, tcache.h). A chunk
 * holds CHUNK_BLOCKS blocks of the request that made it, or the heap's free
 * slack if that is more; a thread holds at most CUH_TC_CHUNKS and gives back
 * the emptiest for a new one. A chunk takes free memory only (under vmm:1,
 * address space with pages mapped behind it as for any block, as far as the
 * limit allows without waiting): it never grows a segment, makes the CPU
 * wait, takes back or gives back, and is simply not made otherwise.
 *
 * Dissolving gives a chunk back: its live pieces become the heap's ordinary
 * blocks, its free pieces free memory private to its stream, as if the
 * program had freed them on it just now (a fence recorded later covers
 * them). No device call. Chunks dissolve:
 *   - when the heap stops seeing contention (the rule of a thread's large
 *     block, heap_tcache.c): what every search sees is then what it was
 *     without chunks, so a replay, one thread, never makes one;
 *   - when the device or the limit refuses memory, with what thread caches
 *     hold (cuh_hp_settle_all_locked), and on release and a new limit; then
 *     no chunk is lent for CHUNKS_SHORT_OPS allocations;
 *   - on statistics, reports, captures, the retirement of their stream and
 *     the exit of their thread;
 *   - one at a time, when the heap's lock path meets one of its blocks (a
 *     free on another stream or by another thread, cudaFree's device-wide
 *     free, record_stream, a double free): then its thread gets no chunk
 *     for CHUNKS_SHORT_OPS allocations, since its blocks do not come back
 *     to it (the GPU check's LD_PRELOAD stress, 8 threads freeing half its
 *     blocks with cudaFree, otherwise lent and took back chunks until it
 *     held 80 GB for 1 GB live under vmm:0).
 * While threads contend a chunk's free memory is its thread's alone: at 16
 * threads on random large sizes the heap held 1.3-1.7x what it held without
 * chunks (docs/benchmarks.md), memory the device had to spare; near the
 * limit the chunks come back as above.
 *
 * Rules kept here (heap.h): the stream rule (a chunk's blocks serve its
 * stream only, and come back from that stream only, and its free memory is
 * that stream's private memory); the books: the heap counts a chunk as one
 * block, allocated whole and requested by nothing, and its cache's books
 * take off its free pieces and add its blocks' requests, so what the program
 * reads is exact. The heap's peak of requested bytes sees what chunks serve
 * at each lending and giving back (note_peak_locked): exact while nobody
 * contends, it may miss a peak reached inside chunks while threads do.
 */
#include "heap_internal.h"

#include <string.h>

/* Of a thread's last 32 large allocations through the heap's lock, how many
 * must have found it held, or come after another thread's, for the thread
 * to get a chunk. */
#define CHUNK_WAITS 8
/* A chunk holds this many blocks of the request that made it. */
#define CHUNK_BLOCKS 8
/* After the heap ran short of memory for a chunk or took chunks back for
 * want of memory, no chunk is lent for this many allocations through the
 * heap's lock: near its limit the heap is shared, not lent out and taken
 * back again and again. */
#define CHUNKS_SHORT_OPS 4096u

/* ---- dissolving --------------------------------------------------------------- */

/* The heap's peak of requested bytes sees what the threads' chunks serve
 * only when the heap's lock meets it: at each lending and giving back. */
static void note_peak_locked(cuh_heap_t *h)
{
    int64_t requested = (int64_t)h->requested.current;
    for (cuh_tcache_t *tc = h->tcaches; tc; tc = tc->heap_next) {
        cuh_spin_lock(&tc->lock);
        requested += tc->requested_adjust;
        cuh_spin_unlock(&tc->lock);
    }
    if (requested > (int64_t)h->requested.peak)
        h->requested.peak = (size_t)requested;
}

/* Gives back chunk k of tc (both locks held), piece by piece from its end:
 * 1 once it is gone; 0 if out of host memory for a record, with the chunk
 * still sound, only shorter. */
static int chunk_dissolve_locked(cuh_heap_t *h, cuh_tcache_t *tc, unsigned k)
{
    cuh_chunk_t *c = &tc->chunks[k];
    cuh_extent_t *e = c->ext;
    const stream_state_t *st = c->stream_state;
    uint64_t epoch = h->arena.tags[st->tag].fences_recorded;
    for (;;) {
        cuh_piece_t *p = &c->pieces[c->num_pieces - 1];
        cuh_extent_t *x = e;
        if (c->num_pieces > 1 && !(x = cuh_arena_split_used(&h->arena, e, c->base + p->off)))
            return 0;
        if (p->requested) {
            if (x != e && cuh_ptrmap_insert(&h->blocks, x->addr, x)) {
                cuh_arena_join_used(&h->arena, e);
                return 0;
            }
            x->requested = p->requested;
            h->requested.current += p->requested;
            tc->requested_adjust -= (int64_t)p->requested;
            c->live_bytes -= p->size;
            c->live_requested -= p->requested;
            c->num_live--;
        } else {
            if (x == e)
                cuh_ptrmap_remove(&h->blocks, e->addr);
            h->allocated.current -= p->size;
            tc->allocated_adjust += (int64_t)p->size;
        }
        if (x == e)
            break;
        c->size -= p->size;
        c->num_pieces--;
        if (!p->requested)
            cuh_arena_release_freed_at(&h->arena, x, st->tag, epoch);
    }
    e->chunked = 0;
    e->owner = NULL;
    if (!c->pieces[0].requested)
        cuh_arena_release_freed_at(&h->arena, e, st->tag, epoch);
    cuh_chunk_fini(c);
    if (k != --tc->num_chunks) {
        tc->chunks[k] = tc->chunks[tc->num_chunks];
        memset(&tc->chunks[tc->num_chunks], 0, sizeof tc->chunks[0]);
    }
    h->num_chunks--;
    return 1;
}

/* Gives back tc's chunks (all streams', or only `stream`'s), the peak noted
 * by the caller. Returns how many went. */
static size_t dissolve_tc_locked(cuh_heap_t *h, cuh_tcache_t *tc, int all_streams, cuh_stream_t stream)
{
    size_t gone = 0;
    cuh_spin_lock(&tc->lock);
    for (unsigned k = tc->num_chunks; k-- > 0;)
        if (all_streams || tc->chunks[k].stream == (uintptr_t)stream)
            gone += (size_t)chunk_dissolve_locked(h, tc, k);
    cuh_spin_unlock(&tc->lock);
    return gone;
}

size_t cuh_hp_chunks_dissolve_locked(cuh_heap_t *h, cuh_tcache_t *tc, int all_streams, cuh_stream_t stream)
{
    note_peak_locked(h);
    return dissolve_tc_locked(h, tc, all_streams, stream);
}

size_t cuh_hp_chunks_dissolve_all_locked(cuh_heap_t *h)
{
    if (!h->num_chunks)
        return 0;
    note_peak_locked(h);
    size_t gone = 0;
    for (cuh_tcache_t *tc = h->tcaches; h->num_chunks && tc; tc = tc->heap_next)
        gone += dissolve_tc_locked(h, tc, 1, 0);
    return gone;
}

/* The cache whose chunk holds addr, locked, with the chunk's index in *k;
 * NULL if no chunk holds it. */
static cuh_tcache_t *chunk_holding_locked(cuh_heap_t *h, uintptr_t addr, unsigned *k)
{
    for (cuh_tcache_t *tc = h->tcaches; h->num_chunks && tc; tc = tc->heap_next) {
        cuh_spin_lock(&tc->lock);
        for (*k = 0; *k < tc->num_chunks; ++*k)
            if (cuh_chunk_contains(&tc->chunks[*k], addr))
                return tc;
        cuh_spin_unlock(&tc->lock);
    }
    return NULL;
}

int cuh_hp_chunk_dissolve_at_locked(cuh_heap_t *h, uintptr_t addr)
{
    unsigned k;
    note_peak_locked(h);
    cuh_tcache_t *tc = chunk_holding_locked(h, addr, &k);
    if (!tc)
        return 0;
    chunk_dissolve_locked(h, tc, k);
    tc->chunks_off = CHUNKS_SHORT_OPS;
    cuh_spin_unlock(&tc->lock);
    return 1;
}

/* ---- lending ------------------------------------------------------------------ */


void cuh_hp_chunks_short_locked(cuh_heap_t *h)
{
    h->chunks_short_at = h->num_allocs + 1;   /* 0: never */
}

/* The bytes of a new chunk for blocks of `block` bytes: CHUNK_BLOCKS of
 * them, or the heap's free slack if that is more, in whole pages under
 * virtual memory. */
static size_t chunk_bytes_locked(const cuh_heap_t *h, size_t block)
{
    size_t bytes = block > SIZE_MAX / CHUNK_BLOCKS ? block : CHUNK_BLOCKS * block;
    size_t slack = cuh_hp_free_slack_locked(h);
    if (bytes < slack)
        bytes = slack;
    return cuh_align_up(bytes, h->vm ? h->vm_page : CUH_ALIGN);
}

/* The chunk of tc with the fewest live bytes (tc's lock held). */
static unsigned emptiest_chunk(const cuh_tcache_t *tc)
{
    unsigned best = 0;
    for (unsigned k = 1; k < tc->num_chunks; k++)
        if (tc->chunks[k].live_bytes < tc->chunks[best].live_bytes)
            best = k;
    return best;
}

/* A large request of `size` bytes on st (stream `stream`) that missed the
 * thread caches, under the heap's lock, which the caller found held
 * (`waited`) or not: a block cut from a new chunk for this thread, when the
 * thread contends by the rule above. 0 if it gets none (then the heap serves
 * the request as always). */
uintptr_t cuh_hp_chunk_alloc_locked(cuh_heap_t *h, stream_state_t *st, cuh_stream_t stream, size_t size,
                                    int waited)
{
    if (!h->cfg.thread_cache || !h->contended || h->captures || cuh_hp_own_segment_locked(h) ||
        (h->chunks_short_at && h->num_allocs + 1 - h->chunks_short_at < CHUNKS_SHORT_OPS))
        return 0;
    cuh_tcache_t *tc = cuh_hp_tcache_mine_locked(h);
    if (!tc)
        return 0;
    /* Another thread's allocation came between: the heap's data comes from
     * that thread's core, as it would after a wait for the lock. */
    int shared = h->last_chunk_asker != tc;
    h->last_chunk_asker = tc;
    cuh_spin_lock(&tc->lock);
    tc->waits = tc->waits << 1 | (uint32_t)(waited || shared || h->assume_waits);
    int full = tc->num_chunks == CUH_TC_CHUNKS;
    int contends = __builtin_popcount(tc->waits) >= CHUNK_WAITS && !tc->chunks_off;
    tc->chunks_off -= tc->chunks_off != 0;
    if (contends && full)
        full = !chunk_dissolve_locked(h, tc, emptiest_chunk(tc));
    cuh_spin_unlock(&tc->lock);
    if (!contends || full)
        return 0;
    size_t block = cuh_align_up(size, CUH_ALIGN);
    cuheap_status_t status = CUHEAP_OK;
    grow_result_t why = GROW_OK;
    h->chunk_call = 1;
    cuh_extent_t *e =
        cuh_hp_extent_alloc_locked(h, st, chunk_bytes_locked(h, block), CUH_ALIGN, CUH_EXTENT_BLOCK, &status, &why);
    h->chunk_call = 0;
    if (!e) {
        cuh_hp_chunks_short_locked(h);
        return 0;
    }
    if (cuh_ptrmap_insert(&h->blocks, e->addr, e)) {
        cuh_arena_release(&h->arena, e, st->tag);
        return 0;
    }
    /* Allocated whole (nobody else may use it), requested by what it serves. */
    cuh_hp_large_mark_live_locked(h, e, 0);
    uintptr_t addr = 0;
    cuh_spin_lock(&tc->lock);
    cuh_chunk_t *c = &tc->chunks[tc->num_chunks];
    int made = cuh_chunk_init(c, e->addr, e->size) == 0;
    if (made) {
        c->stream = (uintptr_t)stream;
        c->ext = e;
        c->stream_state = st;
        tc->num_chunks++;
        tc->allocated_adjust -= (int64_t)e->size;
        e->chunked = 1;
        e->owner = tc;
        h->num_chunks++;
        h->num_chunks_lent++;
        addr = cuh_tcache_chunk_take(tc, block, size, (uintptr_t)stream);
    }
    cuh_spin_unlock(&tc->lock);
    if (!made) {
        cuh_ptrmap_remove(&h->blocks, e->addr);
        h->allocated.current -= e->size;
        cuh_arena_release(&h->arena, e, st->tag);
    }
    note_peak_locked(h);
    return addr;
}

/* ---- what the rest of the heap asks -------------------------------------------- */

/* The request of the live block at addr in a chunk, 0 if addr is a free
 * piece or inside one; SIZE_MAX if no chunk holds addr. */
size_t cuh_hp_chunk_block_size_locked(cuh_heap_t *h, uintptr_t addr)
{
    unsigned k;
    cuh_tcache_t *tc = chunk_holding_locked(h, addr, &k);
    if (!tc)
        return SIZE_MAX;
    const cuh_chunk_t *c = &tc->chunks[k];
    ptrdiff_t i = cuh_chunk_find(c, addr);
    size_t size = i >= 0 ? c->pieces[i].requested : 0;
    cuh_spin_unlock(&tc->lock);
    return size;
}

/* The consistency check's part for tc's chunks (tc's lock held): each is
 * sound, is the heap's block at its base, owned by tc, counted whole; adds
 * what tc's books should correct for them to *allocated_adjust and
 * *requested_adjust, and the chunks to *count. 0 if sound, else -1 with
 * msg. */
int cuh_hp_chunks_check_locked(cuh_heap_t *h, const cuh_tcache_t *tc, int64_t *allocated_adjust,
                               int64_t *requested_adjust, size_t *count, char *msg, size_t len)
{
    for (unsigned k = 0; k < tc->num_chunks; k++) {
        const cuh_chunk_t *c = &tc->chunks[k];
        const cuh_extent_t *e = c->ext;
        if (cuh_chunk_check(c, msg, len))
            return -1;
        if (!e || !e->chunked || e->owner != tc || e->state != CUH_EXTENT_BLOCK || e->addr != c->base ||
            e->size != c->size || e->requested != 0 || cuh_ptrmap_get(&h->blocks, c->base) != e ||
            ((const stream_state_t *)c->stream_state)->handle != (cuh_stream_t)c->stream) {
            snprintf(msg, len, "chunk 0x%llx disagrees with the heap's record of it", (unsigned long long)c->base);
            return -1;
        }
        *allocated_adjust -= (int64_t)(c->size - c->live_bytes);
        *requested_adjust += (int64_t)c->live_requested;
    }
    *count += tc->num_chunks;
    return 0;
}

void cuh_heap_assume_waits(cuh_heap_t *h, int on)
{
    cuh_hp_lock(h);
    h->assume_waits = on;
    cuh_unlock(&h->lock);
}

size_t cuh_heap_chunks(cuh_heap_t *h, size_t *bytes, uint64_t *lent)
{
    size_t n = 0, total = 0;
    cuh_hp_lock(h);
    for (cuh_tcache_t *tc = h->tcaches; tc; tc = tc->heap_next) {
        cuh_spin_lock(&tc->lock);
        for (unsigned k = 0; k < tc->num_chunks; k++)
            total += tc->chunks[k].size;
        n += tc->num_chunks;
        cuh_spin_unlock(&tc->lock);
    }
    if (lent)
        *lent = h->num_chunks_lent;
    cuh_unlock(&h->lock);
    if (bytes)
        *bytes = total;
    return n;
}
