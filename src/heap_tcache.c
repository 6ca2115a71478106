/* heap_tcache.c - where a freed block waits outside the arena: the heap's side
 * of each thread's cache (its small objects and its last large block,
 * tcache.h) and the heap's one parked large block.
 *
 * Rules kept here (heap.h): the stream rule holds through these places (an
 * object or block waits as its stream's private memory), and thread-safety
 * with fast paths that take no heap lock. What they hold goes back before the
 * heap grows, maps pages or reports out-of-memory, when the stream is
 * retired and when the thread exits. Lock order: the registry of thread
 * caches, then a heap, then a thread cache.
 */
#include "heap_internal.h"

#include <pthread.h>
#include <string.h>

static int large_slot_empty_locked(cuh_heap_t *h, cuh_tcache_t *tc);
static void large_unlist_locked(cuh_heap_t *h, cuh_tcache_t *tc);

/* ---- thread caches ------------------------------------------------------------ *
 * A thread's cache (tcache.h) takes the small objects the thread frees on a
 * stream, when the free comes through the heap, and hands them out again to
 * the thread's allocations of their class on that stream, and takes them back
 * at their next free, all without the heap's lock. The object it holds is
 * the freeing stream's private memory exactly as in that stream's ring here:
 * only that stream reuses it. While the cache owns an object (held or handed
 * out), the slab marks it tcached and the heap counts it as allocated, with
 * its whole size as requested; statistics correct for the caches'
 * holdings when read (cuh_heap_stats_locked), and peaks are the heap's, so
 * they may overstate by what the caches held at the time.
 *
 * Every heap path that takes a live block (free, record_stream) first takes
 * it from the cache that owns it (cuh_hp_find_live_locked): a held object freed
 * again is a double free; one handed out becomes an ordinary live block. The
 * caches give all they hold back before the heap reports out of memory, on
 * release_cached and when over a new limit, a stream's objects when the
 * stream is retired, and everything when their thread exits. The fast paths
 * stay shut during graph captures, whose allocations must be recorded. */

_Thread_local cuh_tcache_t *cuh_hp_my_tcaches;   /* this thread's, one per heap */
static pthread_mutex_t tcache_registry = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t tcache_exit_key;
static pthread_once_t tcache_exit_once = PTHREAD_ONCE_INIT;
static int tcache_exit_key_ok;

/* Gives cached object `addr` (its entry e, freed on `stream`, already out of
 * its bin) back to the heap as that stream's free; the entry goes. */
static void tcache_return_locked(cuh_heap_t *h, cuh_tcache_t *tc, cuh_tc_entry_t *e)
{
    uintptr_t addr = e->addr;
    size_t size = e->size;
    cuh_stream_t stream = (cuh_stream_t)e->stream;
    cuh_tcache_hand_out(tc, e, e->size);
    cuh_tcache_remove(tc, e);
    cuh_slab_t *s = cuh_hp_slab_of_locked(h, addr);
    live_block_t b = {.slab = s, .index = (uint32_t)cuh_slab_index(s, addr), .size = size, .requested = size};
    cuh_slab_clear(s->tcached, b.index);
    cuh_hp_stat_set(&h->requested, h->requested.current - size);
    cuh_hp_stat_set(&h->allocated, h->allocated.current - size);
    /* The stream was known when the object came in: found, not created. */
    stream_state_t *st = cuh_hp_stream_get_locked(h, stream);
    if (cuh_likely(st != NULL)) {
        cuh_hp_release_block_locked(h, &b, addr, st);
        return;
    }
    /* Out of host memory for its record after all: safe for everyone the
     * slow way. */
    cuh_slab_clear(s->live, b.index);
    s->num_live--;
    cuh_hp_cpu_wait_device(h);
    cuh_hp_slab_object_home_locked(h, addr);
}

/* Gives back item i of class c's bin. */
static void tcache_return_binned_locked(cuh_heap_t *h, cuh_tcache_t *tc, unsigned c, uint32_t i)
{
    uintptr_t addr = tc->bins[c].addr[i];
    cuh_tcache_unbin(tc, c, i);
    tcache_return_locked(h, tc, cuh_tcache_find(tc, addr));
}

/* Makes an object the cache handed out an ordinary live block of the heap's. */
static void tcache_disown_live_locked(cuh_heap_t *h, cuh_tcache_t *tc, cuh_tc_entry_t *e)
{
    cuh_slab_t *s = cuh_hp_slab_of_locked(h, e->addr);
    uint32_t i = (uint32_t)cuh_slab_index(s, e->addr);
    s->requested[i] = e->requested;
    cuh_slab_clear(s->tcached, i);
    h->requested.current -= e->size - e->requested;
    tc->requested_adjust -= (int64_t)e->requested - (int64_t)e->size;
    cuh_tcache_remove(tc, e);
}

/* Gives back what one cache holds (all streams, or only `stream`'s); with
 * forget_live, its handed-out objects become the heap's live blocks too. */
void cuh_hp_tcache_flush_one_locked(cuh_heap_t *h, cuh_tcache_t *tc, int all_streams, cuh_stream_t stream,
                                    int forget_live)
{
    if (tc->num_chunks)
        cuh_hp_chunks_dissolve_locked(h, tc, all_streams, stream);
    cuh_spin_lock(&tc->lock);
    for (unsigned c = 0; c < CUH_MAX_CLASSES; c++)
        for (uint32_t i = tc->bins[c].count; i-- > 0;) {
            if (all_streams || tc->bins[c].stream[i] == (uintptr_t)stream)
                tcache_return_binned_locked(h, tc, c, i);
        }
    if (forget_live)
        for (size_t i = 0; i <= tc->mask; i++) {
            cuh_tc_entry_t *e = &tc->slots[i];
            /* A removal may shift a later entry into slot i: look again. */
            while (e->addr && e->state == CUH_TC_LIVE && (all_streams || e->stream == (uintptr_t)stream))
                tcache_disown_live_locked(h, tc, e);
        }
    cuh_spin_unlock(&tc->lock);
}

void cuh_hp_tcache_flush_locked(cuh_heap_t *h)
{
    if (h->num_chunks) {
        cuh_hp_chunks_short_locked(h);   /* memory is short, or the program gives it back */
        cuh_hp_chunks_dissolve_all_locked(h);
    }
    for (cuh_tcache_t *tc = h->tcaches; tc; tc = tc->heap_next)
        cuh_hp_tcache_flush_one_locked(h, tc, 1, 0, 0);
    if (h->large_tcs)
        cuh_hp_large_slots_empty_locked(h, LARGE_ALL_HELD);
}

/* The cache that owns small object addr of slab s (tcached) gives it up: a
 * held one is a double free (error set); one handed out becomes the heap's. */
cuheap_status_t cuh_hp_tcache_take_locked(cuh_heap_t *h, const cuh_slab_t *s, uintptr_t addr)
{
    for (cuh_tcache_t *tc = h->tcaches; tc; tc = tc->heap_next) {
        cuh_spin_lock(&tc->lock);
        cuh_tc_entry_t *e = cuh_tcache_find(tc, addr);
        if (!e) {
            cuh_spin_unlock(&tc->lock);
            continue;
        }
        cuheap_status_t status = CUHEAP_OK;
        if (e->state == CUH_TC_CACHED) {
            cuh_set_error("double free: 0x%llx (%zu-byte object) on device %d is already free (held in a thread's "
                          "cache)",
                          (unsigned long long)addr, s->obj_size, h->dev->ordinal);
            status = CUHEAP_ERR_DOUBLE_FREE;
        } else {
            tcache_disown_live_locked(h, tc, e);
        }
        cuh_spin_unlock(&tc->lock);
        return status;
    }
    cuh_set_error("internal error: 0x%llx is marked as in a thread cache that does not hold it",
                  (unsigned long long)addr);
    return CUHEAP_ERR_INVALID_ARGUMENT;
}

/* Unlinks a cache from its heap after giving everything back. */
static void tcache_detach_locked(cuh_heap_t *h, cuh_tcache_t *tc)
{
    cuh_hp_tcache_flush_one_locked(h, tc, 1, 0, 1);
    if (tc->large_listed) {
        cuh_spin_lock(&tc->lock);
        large_slot_empty_locked(h, tc);
        cuh_spin_unlock(&tc->lock);
        large_unlist_locked(h, tc);
    }
    /* Its counts stay in the heap's. */
    h->num_allocs += tc->num_allocs;
    h->num_cache_hits += tc->num_allocs;
    h->num_frees += tc->num_frees;
    if (tc->heap_prev)
        tc->heap_prev->heap_next = tc->heap_next;
    else
        h->tcaches = tc->heap_next;
    if (tc->heap_next)
        tc->heap_next->heap_prev = tc->heap_prev;
}

/* At thread exit: every cache of the thread gives back what it owns. */
static void tcache_thread_exit(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&tcache_registry);
    for (cuh_tcache_t *tc = cuh_hp_my_tcaches, *next; tc; tc = next) {
        next = tc->thread_next;
        if (!tc->dead) {
            cuh_heap_t *h = (cuh_heap_t *)(uintptr_t)tc->heap;
            cuh_hp_lock(h);
            cuh_hp_unpark_locked(h);
            tcache_detach_locked(h, tc);
            cuh_unlock(&h->lock);
        }
        cuh_tcache_destroy(tc);
    }
    cuh_hp_my_tcaches = NULL;
    pthread_mutex_unlock(&tcache_registry);
}

static void tcache_exit_key_create(void)
{
    tcache_exit_key_ok = pthread_key_create(&tcache_exit_key, tcache_thread_exit) == 0;
}

/* Heap h is being destroyed: threads free their caches of it when they next
 * look or exit. */
void cuh_hp_tcaches_orphan(cuh_heap_t *h)
{
    pthread_mutex_lock(&tcache_registry);
    for (cuh_tcache_t *tc = h->tcaches; tc; tc = tc->heap_next) {
        cuh_spin_lock(&tc->lock);
        tc->dead = 1;
        cuh_spin_unlock(&tc->lock);
    }
    pthread_mutex_unlock(&tcache_registry);
}

/* This thread's cache of heap h, made on first use; NULL if none can be
 * (out of host memory: the heap then serves the thread without one). */
cuh_tcache_t *cuh_hp_tcache_mine_locked(cuh_heap_t *h)
{
    cuh_tcache_t *tc = cuh_hp_my_tcache(h);
    if (tc)
        return tc;
    pthread_once(&tcache_exit_once, tcache_exit_key_create);
    /* Without the exit hook a cache would keep its objects after its thread. */
    if (!tcache_exit_key_ok || pthread_setspecific(tcache_exit_key, (void *)1) != 0)
        return NULL;
    /* Caches of heaps destroyed since go now. */
    for (cuh_tcache_t **link = &cuh_hp_my_tcaches; *link;) {
        cuh_tcache_t *old = *link;
        cuh_spin_lock(&old->lock);
        int dead = old->dead;
        cuh_spin_unlock(&old->lock);
        if (dead) {
            *link = old->thread_next;
            cuh_tcache_destroy(old);
        } else {
            link = &old->thread_next;
        }
    }
    if (!(tc = cuh_tcache_create()))
        return NULL;
    tc->heap = h;
    tc->heap_id = h->id;
    tc->heap_next = h->tcaches;
    if (h->tcaches)
        h->tcaches->heap_prev = tc;
    h->tcaches = tc;
    tc->thread_next = cuh_hp_my_tcaches;
    cuh_hp_my_tcaches = tc;
    return tc;
}

/* Before a cache takes an object of `size` bytes and class c that it has no
 * room for, it gives back its oldest objects in one go (so that the next
 * frees find room without the heap's lock): the older half of c's bin when
 * that is full; when the bytes are, the older halves of bins from the
 * largest class down, until a quarter of thread_cache is free. */
static void tcache_make_room_locked(cuh_heap_t *h, cuh_tcache_t *tc, unsigned c, size_t size)
{
    if (tc->bins[c].count == CUH_TC_BIN_MAX)
        for (uint32_t k = CUH_TC_BIN_MAX / 2; k > 0; k--)
            tcache_return_binned_locked(h, tc, c, 0);
    size_t cap = h->cfg.thread_cache, want = cap - cap / 4;
    if (tc->cached_bytes + size <= cap)
        return;
    for (unsigned k = CUH_MAX_CLASSES; k-- > 0 && tc->cached_bytes + size > want;) {
        for (uint32_t n = (tc->bins[k].count + 1) / 2; n > 0 && tc->cached_bytes + size > want; n--)
            tcache_return_binned_locked(h, tc, k, 0);
    }
}

/* A small object the program freed on `stream` through the heap goes to the
 * freeing thread's cache instead of the stream's ring, if there is room.
 * The caller has counted the free; 1 if the cache took it. */
int cuh_hp_tcache_adopt_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr, cuh_stream_t stream)
{
    if (!h->cfg.thread_cache || h->captures || b->size > h->cfg.thread_cache)
        return 0;
    cuh_tcache_t *tc = cuh_hp_tcache_mine_locked(h);
    if (!tc)
        return 0;
    cuh_slab_t *s = b->slab;
    int took = 0;
    cuh_spin_lock(&tc->lock);
    tcache_make_room_locked(h, tc, s->size_class, b->size);
    if (tc->cached_bytes + b->size <= h->cfg.thread_cache && tc->bins[s->size_class].count < CUH_TC_BIN_MAX) {
        cuh_tc_entry_t *e = cuh_tcache_insert(tc, addr);
        if (e) {
            e->size = (uint32_t)b->size;
            e->requested = (uint32_t)b->size;
            e->size_class = (uint16_t)s->size_class;
            e->state = CUH_TC_LIVE;
            cuh_tcache_hold(tc, e, (uintptr_t)stream);
            cuh_tcache_push(tc, s->size_class, addr, (uintptr_t)stream);
            took = 1;
        }
    }
    cuh_spin_unlock(&tc->lock);
    if (took) {
        s->requested[b->index] = (uint32_t)b->size;
        cuh_slab_set(s->tcached, b->index);
        cuh_hp_stat_set(&h->requested, h->requested.current + b->size);
        cuh_hp_stat_set(&h->allocated, h->allocated.current + b->size);
    }
    return took;
}

/* ---- the parked block ----------------------------------------------------------- *
 * A program that frees a large block and asks for the same size again on the
 * same stream (a loop's buffer, a layer's activations) would pay for a
 * coalesce and a split each time. The last large block freed on a stream
 * waits outside the arena instead, and such a request takes it back at once.
 * Every other operation gives it back to the arena first, as its free would
 * have done, so what every search sees is what it would have seen without
 * the parking: only the block a same-size request gets can differ. */

/* Parks block b (the last free on stream st); the caller has counted the
 * free. What cuh_hp_release_block_locked does for a segment the free leaves idle
 * happens now: a fence, recorded after the free, covers it. */
void cuh_hp_park_locked(cuh_heap_t *h, const live_block_t *b, stream_state_t *st)
{
    h->parked = b->ext;
    h->parked_st = st;
    h->parked_epoch = h->arena.tags[st->tag].fences_recorded;
    h->parked_tc = cuh_hp_my_tcache(h);
    const cuh_segment_t *seg = b->ext->segment;
    cuh_hp_fence_if_left_idle_locked(h, st, seg, seg->used_bytes - b->ext->size);
}

/* Gives a parked or held block, freed on st when st had recorded `epoch`
 * fences, to the arena as its free would have: private to its stream from
 * the fence after the free, or global if that fence completed. No device
 * call (it runs when a capture begins, and at exit). */
static void release_parked_locked(cuh_heap_t *h, cuh_extent_t *e, const stream_state_t *st, uint64_t epoch)
{
    cuh_ptrmap_remove(&h->blocks, e->addr);
    if (epoch < st->completed)
        cuh_arena_release(&h->arena, e, CUH_TAG_GLOBAL);
    else
        cuh_arena_release_freed_at(&h->arena, e, st->tag, epoch);
}

/* The heap's parked block, if any, goes back. */
static void unpark_one_locked(cuh_heap_t *h)
{
    cuh_extent_t *e = h->parked;
    if (cuh_likely(!e))
        return;
    h->parked = NULL;
    h->parked_tc = NULL;
    release_parked_locked(h, e, h->parked_st, h->parked_epoch);
}

/* ---- a thread's large block ----------------------------------------------------- *
 * The parked block serves one thread that frees a large block and asks for
 * its size again, under the heap's lock; with several threads it is
 * everybody's, and each takes it from the others. So when thread caches are
 * on, a large block a thread frees through the heap on a stream is parked
 * in that thread's cache instead: the thread's next request of its size on
 * that stream takes it without the heap's lock, and its free on that stream
 * puts it back, also without the lock (tcache.h, cuh_tc_large_t).
 *
 * While nobody contends for the heap's lock, every heap operation first
 * empties every such cache slot (a held block goes to the arena as with the
 * parked block, a handed-out one becomes an ordinary live block): what
 * every search sees, so every placement and figure, is what it was with the
 * one parked block, and a replay (one thread) gives the same results. Once
 * an allocation or free has found the lock held, an operation gives back
 * only its own thread's held block, so that every thread keeps its own;
 * then a search does not see other threads' held blocks until it finds no
 * fit: they all go back before the heap grows, maps pages or reports out of
 * memory, and on release, limit, statistics, reports, captures and stream
 * retirement. The first rule returns after CONTENDED_HOLD allocations and
 * frees that found the lock free.
 *
 * The books: held, the block is counted as allocated with the request it had
 * when the cache took it; handed out, with the program's request, which may
 * not be larger (a larger one goes to the heap). What the program reads is
 * exact; peaks are exact while nobody contends, and while threads do they
 * may count other threads' held blocks. */

/* A thread whose held blocks went back unused this many times in a row
 * parks its frees as before (in the heap's one parked block, under the
 * lock), until it takes one of those back: a thread whose large requests
 * never repeat a size would only pay for the slot and hide its frees from
 * the other threads (at 16 threads on random large sizes, 20-45% slower). */
#define LARGE_MISSES_OFF 4

/* A held block leaves tc's books and the heap's count of allocated bytes
 * (tc's lock held); the slot is the caller's to clear. */
static void large_slot_uncount_locked(cuh_heap_t *h, cuh_tcache_t *tc)
{
    const cuh_tc_large_t *l = &tc->large;
    h->allocated.current -= l->size;
    h->requested.current -= l->counted;
    tc->allocated_adjust += (int64_t)l->size;
    tc->requested_adjust += (int64_t)l->counted;
    ((cuh_extent_t *)l->ext)->owner = NULL;
}

static int device_wide_slot_empty_locked(cuh_heap_t *h, cuh_tcache_t *tc);

/* Empties tc's slot (tc's lock held; tc stays listed): a held block goes to
 * the arena as its free would have (private to its stream from the fence
 * that covers the free, or global if that fence completed), a handed-out one
 * becomes an ordinary live block. No device call. 1 if a held block went. */
static int large_slot_empty_locked(cuh_heap_t *h, cuh_tcache_t *tc)
{
    cuh_tc_large_t *l = &tc->large;
    cuh_extent_t *e = l->ext;
    int gave = 0;
    if (l->state && l->stream == CUH_TC_DEVICE_WIDE) {
        gave = device_wide_slot_empty_locked(h, tc);
    } else if (l->state == CUH_TC_CACHED) {
        stream_state_t *st = l->stream_state;
        tc->large_misses += tc->large_misses < UINT32_MAX;   /* given back unused */
        large_slot_uncount_locked(h, tc);
        release_parked_locked(h, e, st,
                              l->epoch == CUH_TC_EPOCH_UNKNOWN ? h->arena.tags[st->tag].fences_recorded : l->epoch);
        gave = 1;
    } else if (l->state == CUH_TC_LIVE) {
        h->requested.current -= l->counted - l->requested;
        tc->requested_adjust -= (int64_t)l->requested - (int64_t)l->counted;
        e->requested = l->requested;
        e->owner = NULL;
    }
    memset(l, 0, sizeof *l);
    return gave;
}

/* Takes the cache *link points at off the heap's list of caches holding a
 * large block. */
static void large_unlink(cuh_tcache_t **link)
{
    cuh_tcache_t *tc = *link;
    *link = tc->large_next;
    tc->large_next = NULL;
    tc->large_listed = 0;
}

static void large_unlist_locked(cuh_heap_t *h, cuh_tcache_t *tc)
{
    for (cuh_tcache_t **link = &h->large_tcs; *link; link = &(*link)->large_next)
        if (*link == tc) {
            large_unlink(link);
            return;
        }
}

/* Empties the slots that hold a block (which: this thread's, every thread's)
 * or all slots. Returns how many held blocks went back to the arena. */
size_t cuh_hp_large_slots_empty_locked(cuh_heap_t *h, large_which_t which)
{
    cuh_tcache_t *mine = which == LARGE_MINE_HELD ? cuh_hp_my_tcache(h) : NULL;
    size_t gave = 0;
    for (cuh_tcache_t **link = &h->large_tcs; *link;) {
        cuh_tcache_t *tc = *link;
        if (which == LARGE_MINE_HELD && tc != mine) {
            link = &tc->large_next;
            continue;
        }
        cuh_spin_lock(&tc->lock);
        int empty = which == LARGE_ALL || tc->large.state == CUH_TC_CACHED;
        if (empty)
            gave += (size_t)large_slot_empty_locked(h, tc);
        cuh_spin_unlock(&tc->lock);
        if (empty)
            large_unlink(link);
        else
            link = &tc->large_next;
    }
    return gave;
}

/* Every heap operation first (cuh_hp_unpark_locked, where one of them is
 * there): the parked block goes back, and the threads' large blocks by the
 * rule above. */
void cuh_hp_unpark_held_locked(cuh_heap_t *h)
{
    unpark_one_locked(h);
    if (cuh_unlikely(h->large_tcs != NULL))
        cuh_hp_large_slots_empty_locked(h, h->contended ? LARGE_MINE_HELD : LARGE_ALL);
    if (cuh_unlikely(h->num_chunks) && !h->contended)
        cuh_hp_chunks_dissolve_all_locked(h);
}

/* The same, with every thread's slot emptied whoever contends. */
void cuh_hp_unpark_all_locked(cuh_heap_t *h)
{
    unpark_one_locked(h);
    if (cuh_unlikely(h->large_tcs != NULL))
        cuh_hp_large_slots_empty_locked(h, LARGE_ALL);
    if (cuh_unlikely(h->num_chunks))
        cuh_hp_chunks_dissolve_all_locked(h);
}

/* Block ext (size bytes, requested asked for) has just been set in tc's
 * slot, tc's spin lock held, which this releases: the cache counts it as
 * cached, the slot owns it, and the heap counts it again as it was before
 * the free (no new peak); tc is listed among the caches that hold a block. */
static void slot_filled_locked(cuh_heap_t *h, cuh_tcache_t *tc, cuh_extent_t *ext, size_t size, size_t requested)
{
    tc->allocated_adjust -= (int64_t)size;
    tc->requested_adjust -= (int64_t)requested;
    cuh_spin_unlock(&tc->lock);
    ext->owner = tc;
    h->allocated.current += size;
    h->requested.current += requested;
    if (!tc->large_listed) {
        tc->large_next = h->large_tcs;
        h->large_tcs = tc;
        tc->large_listed = 1;
    }
}

/* A large block the program freed on st through the heap (the free is
 * counted) goes to the freeing thread's cache; 0 if there is none. What
 * cuh_hp_park_locked does for a segment the free leaves idle happens here too. */
int cuh_hp_large_slot_adopt_locked(cuh_heap_t *h, const live_block_t *b, stream_state_t *st, cuh_stream_t stream)
{
    if (!h->cfg.thread_cache)
        return 0;
    cuh_tcache_t *tc = cuh_hp_tcache_mine_locked(h);
    if (!tc)
        return 0;
    cuh_spin_lock(&tc->lock);
    if (tc->large_misses >= LARGE_MISSES_OFF) {
        cuh_spin_unlock(&tc->lock);
        return 0;
    }
    large_slot_empty_locked(h, tc);   /* a block it handed out, kept while threads contend */
    tc->large = (cuh_tc_large_t){.addr = b->ext->addr,
                                 .stream = (uintptr_t)stream,
                                 .size = b->size,
                                 .counted = b->requested,
                                 .ext = b->ext,
                                 .stream_state = st,
                                 .epoch = h->arena.tags[st->tag].fences_recorded,
                                 .state = CUH_TC_CACHED};
    slot_filled_locked(h, tc, b->ext, b->size, b->requested);
    const cuh_segment_t *seg = b->ext->segment;
    cuh_hp_fence_if_left_idle_locked(h, st, seg, seg->used_bytes - b->size);
    return 1;
}

/* ---- a thread's cudaFree'd block ------------------------------------------------- *
 * Under LD_PRELOAD with PyTorch's cache off, a program cudaFrees a block and
 * asks for its size again, a pair per tensor; through the heap's lock each
 * pair closes a batch and takes it back by the short way
 * (heap_devicewide.c, take_back_locked), 900 instructions above the least
 * that keeps cudaFree's promise (issue 45). So when a free leaves the one
 * closed batch holding only its block, and the next cudaMalloc of its size
 * would take that block by the short way and change nothing else
 * (cuh_hp_same_batch_adoptable_locked), the block and its batch's device-wide
 * fence wait in the freeing thread's slot instead (tcache.h,
 * cuh_tc_large_t, stream CUH_TC_DEVICE_WIDE). The thread's next cudaMalloc
 * of that size takes it without the heap's lock once a query finds the
 * fence done, and its cudaFree puts it back behind a new device-wide fence,
 * also without the lock: the same device calls as the short way's.
 *
 * Every operation that takes the heap's lock first empties every such slot,
 * whoever contends (cuh_hp_lock): a held block goes back to the closed
 * batches with its fence, as its free would have left it, a handed-out one
 * becomes an ordinary live block, and the takes and frees the slot served
 * are added to the heap's counts as the heap would have made them. So every
 * operation sees the heap as it would have been, and a replay gives the
 * same results; and every fence a slot recorded is older than any batch
 * closed after it, which the take-backs rely on (the newest device-wide
 * event stands for the older). A slot serves at most the operations left
 * before the timeline's next sample (heap_stats.c, its budget); the
 * operation that takes the sample is served by the slot too when the slot
 * is the heap's only one and the lock is free (cuh_hp_device_wide_slot_
 * sample_take and _free): the slot's operations are counted, the sample is
 * taken from the books as they would stand had the heap served them, and
 * the slot goes on with a new budget. Through the heap, that operation
 * cost a block's pair about 35 instructions on average while the timeline
 * samples every 64 operations (issue 45). */

/* The takes and frees a slot holding a cudaFree'd block served since the
 * heap last counted them, added to the heap's counts as the heap would have
 * made them. They alternate, so the slot's state says which came last. */
static void device_wide_slot_count_locked(cuh_heap_t *h, cuh_tc_large_t *l)
{
    const uint64_t ops = l->ops, odd = ops & 1;
    const uint64_t takes = ops / 2 + (odd && l->state == CUH_TC_LIVE), frees = ops / 2 + (odd && l->state == CUH_TC_CACHED);
    h->num_allocs += takes;
    h->num_cache_hits += takes;
    h->num_frees += frees;
    h->ops_since_sample += ops;
    if (takes)
        h->allocs_at_take_back = h->num_allocs - 1;
    if (frees)
        h->allocs_at_close = h->num_allocs - (l->state == CUH_TC_LIVE);
    l->ops = 0;
}

/* Operations a slot may serve before the one that takes the timeline's
 * next sample; at most one fewer than its 16-bit count holds, since the
 * slot counts that one too (a longer interval is served in parts, each
 * counted under the lock). */
static uint16_t device_wide_slot_budget_locked(const cuh_heap_t *h)
{
    uint64_t budget = h->sample_every > h->ops_since_sample ? h->sample_every - h->ops_since_sample - 1 : 0;
    return (uint16_t)(budget < UINT16_MAX - 1 ? budget : UINT16_MAX - 1);
}

/* Empties tc's slot holding a cudaFree'd block (tc's lock held; tc stays
 * listed). 1 if a held block went back. */
static int device_wide_slot_empty_locked(cuh_heap_t *h, cuh_tcache_t *tc)
{
    cuh_tc_large_t *l = &tc->large;
    cuh_extent_t *e = l->ext;
    device_wide_slot_count_locked(h, l);
    atomic_fetch_sub_explicit(&h->device_wide_slots, 1, memory_order_relaxed);
    /* The fast paths keep no books: the cache's are as adoption left them. */
    if (l->state == CUH_TC_LIVE) {
        tc->allocated_adjust += (int64_t)l->size;
        tc->requested_adjust += (int64_t)l->counted;
        h->requested.current -= l->counted - l->requested;
        e->requested = l->requested;
        e->label = l->label;
        e->owner = NULL;
        cuh_hp_same_batch_recycle_locked(h, l->batch);
        memset(l, 0, sizeof *l);
        return 0;
    }
    const size_t last = l->requested;   /* the request of its last take */
    large_slot_uncount_locked(h, tc);
    e->requested = last;
    cuh_hp_same_batch_return_locked(h, l->batch, last, l->asked);
    memset(l, 0, sizeof *l);
    return 1;
}

void cuh_hp_device_wide_slots_empty_locked(cuh_heap_t *h)
{
    for (cuh_tcache_t **link = &h->large_tcs; *link;) {
        cuh_tcache_t *tc = *link;
        cuh_spin_lock(&tc->lock);
        const int dw = tc->large.state && tc->large.stream == CUH_TC_DEVICE_WIDE;
        if (dw)
            device_wide_slot_empty_locked(h, tc);
        cuh_spin_unlock(&tc->lock);
        if (dw)
            large_unlink(link);
        else
            link = &tc->large_next;
    }
}

/* At the end of a device-wide free of block e, after the statistics: e and
 * its fence go to this thread's slot if the rule above allows. */
void cuh_hp_device_wide_slot_adopt_locked(cuh_heap_t *h, cuh_extent_t *e)
{
    const uint16_t budget = device_wide_slot_budget_locked(h);
    cuh_tcache_t *tc;
    /* An empty slot: one that holds a block keeps it while threads contend. */
    if (!cuh_hp_same_batch_adoptable_locked(h, e) || !budget || !(tc = cuh_hp_tcache_mine_locked(h)) ||
        tc->large.state)
        return;
    free_batch_t *batch = cuh_hp_same_batch_take_locked(h);
    cuh_spin_lock(&tc->lock);
    tc->large = (cuh_tc_large_t){.addr = e->addr,
                                 .stream = CUH_TC_DEVICE_WIDE,
                                 .size = e->size,
                                 .counted = e->requested,
                                 .requested = e->requested,   /* its last take's, as far as the heap knows */
                                 .ext = e,
                                 .stream_state = &h->device_wide,
                                 .batch = batch,
                                 .event = batch->events[0],
                                 .lowest = cuh_max_size(h->cfg.small_max + 1, e->size - CUH_ALIGN + 1),
                                 .budget = budget,
                                 .state = CUH_TC_CACHED};
    slot_filled_locked(h, tc, e, e->size, e->requested);
    atomic_fetch_add_explicit(&h->device_wide_slots, 1, memory_order_relaxed);
}

unsigned cuh_heap_device_wide_slots(cuh_heap_t *h)
{
    return atomic_load_explicit(&h->device_wide_slots, memory_order_relaxed);
}

void cuh_heap_device_wide_slot_samples(cuh_heap_t *h, uint64_t *frees, uint64_t *takes)
{
    cuh_lock(&h->lock);   /* not cuh_hp_lock, which would empty the slots */
    *frees = h->slot_samples[0];
    *takes = h->slot_samples[1];
    cuh_unlock(&h->lock);
}

/* tc's slot has just served the operation that takes the timeline's sample
 * (the heap's lock and tc's held): its operations are counted, and the
 * statistics are refreshed and the sample taken from the heap's books as
 * they would stand had the heap served them all (a block held in the slot
 * is free and held in its batch; a block handed out counts its request),
 * which the slot's books then replace again. */
static void device_wide_slot_sample_locked(cuh_heap_t *h, cuh_tc_large_t *l)
{
    device_wide_slot_count_locked(h, l);
    h->ops_since_sample--;   /* the refresh counts the operation just served, as the heap's own would */
    const size_t allocated = h->allocated.current, requested = h->requested.current, held = h->held_bytes;
    if (l->state == CUH_TC_LIVE) {
        h->requested.current -= l->counted - l->requested;
    } else {
        h->allocated.current -= l->size;
        h->requested.current -= l->counted;
        h->held_bytes += l->size;
    }
    cuh_hp_refresh_stats_locked(h);
    h->allocated.current = allocated;
    h->requested.current = requested;
    h->held_bytes = held;
    l->budget = device_wide_slot_budget_locked(h);
    h->slot_samples[l->state == CUH_TC_LIVE]++;
}

/* Whether a slot may serve the operation that takes the timeline's sample:
 * it is the heap's only slot and its budget is spent (the heap's lock and
 * its tc's held). */
static int device_wide_slot_samples_locked(const cuh_heap_t *h, const cuh_tc_large_t *l)
{
    return atomic_load_explicit(&h->device_wide_slots, memory_order_relaxed) == 1 && l->ops >= l->budget;
}

uintptr_t cuh_hp_device_wide_slot_sample_take(cuh_heap_t *h, cuh_tcache_t *tc, size_t size, unsigned label)
{
    if (!cuh_trylock(&h->lock))
        return 0;   /* threads contend: the heap serves it, and counts that */
    uintptr_t addr = 0;
    cuh_spin_lock(&tc->lock);
    cuh_tc_large_t *l = &tc->large;
    if (cuh_hp_slot_serves(l, size) && device_wide_slot_samples_locked(h, l)) {
        if (h->dev->ops->event_query(h->dev, l->event) == CUH_DEV_OK) {
            if (h->contended)
                h->contended--;   /* as the heap's own allocation, which found the lock free */
            addr = cuh_hp_slot_take(l, size, label);
            device_wide_slot_sample_locked(h, l);
        } else {
            l->asked = 1;
        }
    }
    cuh_spin_unlock(&tc->lock);
    cuh_unlock(&h->lock);
    return addr;
}

int cuh_hp_device_wide_slot_sample_free(cuh_heap_t *h, cuh_tcache_t *tc, uintptr_t addr, cuh_heap_freed_t *freed)
{
    if (!cuh_trylock(&h->lock))
        return 0;
    int done = 0;
    cuh_spin_lock(&tc->lock);
    cuh_tc_large_t *l = &tc->large;
    if (cuh_hp_slot_handed_out(l, addr) && device_wide_slot_samples_locked(h, l) &&
        h->dev->ops->event_record_all(h->dev, l->event) == CUH_DEV_OK) {
        cuh_hp_slot_give(l, freed);
        device_wide_slot_sample_locked(h, l);
        done = 1;
    }
    cuh_spin_unlock(&tc->lock);
    cuh_unlock(&h->lock);
    return done;
}

/* A held block of `block` bytes freed on st, taken for a request of `size`
 * bytes under the heap's lock (another thread's, or this one's when the
 * request is larger than its books allow); NULL if none. */
static cuh_extent_t *large_slot_claim_locked(cuh_heap_t *h, stream_state_t *st, size_t block, size_t size)
{
    for (cuh_tcache_t **link = &h->large_tcs; *link; link = &(*link)->large_next) {
        cuh_tcache_t *tc = *link;
        cuh_spin_lock(&tc->lock);
        cuh_tc_large_t *l = &tc->large;
        cuh_extent_t *e = NULL;
        if (l->state == CUH_TC_CACHED && l->stream_state == st && l->size == block) {
            e = l->ext;
            large_slot_uncount_locked(h, tc);
            memset(l, 0, sizeof *l);
        }
        cuh_spin_unlock(&tc->lock);
        if (e) {
            large_unlink(link);
            cuh_hp_large_mark_live_locked(h, e, size);
            return e;
        }
    }
    return NULL;
}

/* A free or record_stream reached the heap for block e that a thread's cache
 * owns: held there, it is a double free (error set); handed out, it becomes
 * an ordinary live block. */
cuheap_status_t cuh_hp_large_slot_take_back_locked(cuh_heap_t *h, cuh_extent_t *e)
{
    cuh_tcache_t *tc = e->owner;
    cuh_spin_lock(&tc->lock);
    int held = tc->large.state == CUH_TC_CACHED;
    if (!held)
        large_slot_empty_locked(h, tc);
    cuh_spin_unlock(&tc->lock);
    if (held) {
        cuh_set_error("double free: 0x%llx on device %d is already free (held in a thread's cache)",
                      (unsigned long long)e->addr, h->dev->ordinal);
        return CUHEAP_ERR_DOUBLE_FREE;
    }
    large_unlist_locked(h, tc);
    return CUHEAP_OK;
}

/* The block parked or held for a request of `size` bytes on st, as its own
 * thread's fast path would take it, counted as live; NULL if none. */
cuh_extent_t *cuh_hp_take_parked_locked(cuh_heap_t *h, stream_state_t *st, size_t size)
{
    cuh_extent_t *e = h->parked;
    size_t block = cuh_align_up(size, CUH_ALIGN);
    if (e && st == h->parked_st && block == e->size) {
        h->parked = NULL;
        cuh_hp_large_mark_live_locked(h, e, size);
        /* Its own thread took it again: that thread holds its blocks again. */
        cuh_tcache_t *mine = h->parked_tc ? cuh_hp_my_tcache(h) : NULL;
        if (mine && mine == h->parked_tc) {
            cuh_spin_lock(&mine->lock);
            mine->large_misses = 0;
            cuh_spin_unlock(&mine->lock);
        }
        h->parked_tc = NULL;
    } else {
        e = h->large_tcs ? large_slot_claim_locked(h, st, block, size) : NULL;
    }
    return e;
}

void cuh_heap_assume_contention(cuh_heap_t *h, unsigned ops)
{
    cuh_hp_lock(h);
    h->contended = ops;
    cuh_unlock(&h->lock);
}
