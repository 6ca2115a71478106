/* heap_devicewide.c - device-wide frees (cudaFree's promise): blocks wait in
 * batches fenced over every stream, and come back early when the GPU, not the
 * CPU, is made to wait for their work (take-backs); reuse across streams
 * takes other streams' freed memory the same way.
 *
 * Rule kept here (heap.h, cuh_heap_free_device_wide): a block freed
 * device-wide is handed out again only after all work issued before the free,
 * on every stream, has finished, or once every stream's later work waits for
 * that work on the GPU; no such free waits.
 *
 * Device-wide frees (cudaFree: no stream, all earlier work on every stream
 * may still use the block) wait in batches fenced on every known stream;
 * see free_batch_t.
 */
#include "heap_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- device-wide frees -------------------------------------------------------------- */

/* Turns a live block into global free memory: the caller knows no work on
 * any stream can still touch it. */
void cuh_hp_release_block_global_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr)
{
    if (b->ext) {
        cuh_ptrmap_remove(&h->blocks, addr);
        cuh_arena_release(&h->arena, b->ext, CUH_TAG_GLOBAL);
        return;
    }
    cuh_slab_clear(b->slab->live, b->index);
    b->slab->num_live--;
    cuh_hp_slab_object_home_locked(h, addr);
}

static void batch_recycle_locked(cuh_heap_t *h, free_batch_t *batch);

/* Batch entry x is held no more (its fence is done, or it is handed out
 * again): its mark goes, and its bytes from the held ones. Returns its index
 * in its slab (0 for a block). */
static uint32_t entry_unhold_locked(cuh_heap_t *h, const batch_entry_t *x)
{
    uint32_t index = 0;
    if (x->slab) {
        index = (uint32_t)cuh_slab_index(x->slab, x->addr);
        cuh_slab_clear(x->slab->held, index);
    } else {
        x->ext->held = 0;
    }
    h->held_bytes -= x->size;
    h->held_requested -= x->requested;
    return index;
}

/* The batch's events have all completed, or a take-back returns its blocks
 * early: they become global. A nonzero `gen` is that take-back's generation
 * (cuh_hp_gen_open_locked), stamped on their pages. */
static void batch_finish_locked(cuh_heap_t *h, free_batch_t *batch, uint64_t gen)
{
    for (size_t i = 0; i < batch->num_entries; i++) {
        const batch_entry_t *x = &batch->entries[i];
        live_block_t b;
        if (cuh_unlikely(gen))
            cuh_hp_stamp_pages_locked(h, x->addr, x->size, gen);
        /* Still live to the heap: a small object's slab stays (the object
         * is not avail), a block's extent is in use. */
        b = (live_block_t){.ext = x->ext, .slab = x->slab, .size = x->size, .requested = x->requested};
        b.index = entry_unhold_locked(h, x);
        if (cuh_unlikely(cuh_hp_plan_in_force(h)) && x->ext && cuh_hp_plan_room_finished_locked(h, x->ext))
            continue;   /* a step plan's block: back to its room (heap_plan.c) */
        cuh_hp_release_block_global_locked(h, &b, x->addr);
    }
    batch_recycle_locked(h, batch);
}

/* A finished batch's events go back to the spares, and the batch itself
 * too. */
static void batch_recycle_locked(cuh_heap_t *h, free_batch_t *batch)
{
    for (size_t i = 0; i < batch->num_events; i++) {
        if (cuh_unlikely(batch->events[i] == h->asked_event))
            h->asked_event = NULL;
        cuh_hp_event_put_locked(h, batch->events[i]);
    }
    /* Kept for the next batch with its arrays: with PyTorch's cache off every
     * cudaFree opens and closes one, and four host allocations and frees a
     * cudaFree were a cost per tensor (issue 45). */
    if (!h->spare_batch) {
        batch->num_entries = 0;
        batch->num_events = batch->num_blocks = 0;
        batch->bytes = 0;
        batch->next = NULL;
        h->spare_batch = batch;
        return;
    }
    cuh_hp_batch_free(batch);
}

/* A batch with room for one entry and one event inside it, in two whole
 * cache lines, or NULL when host memory runs out. */
free_batch_t *cuh_hp_batch_new(void)
{
    _Static_assert(sizeof(free_batch_t) <= 128, "a batch of one entry and one event fits two cache lines");
    free_batch_t *batch = aligned_alloc(64, 128);
    if (!batch)
        return NULL;
    memset(batch, 0, sizeof *batch);
    batch->entries = batch->first_entry;
    batch->cap_entries = 1;
    batch->events = batch->first_event;
    batch->event_streams = batch->first_stream;
    batch->cap_events = 1;
    return batch;
}

void cuh_hp_batch_free(free_batch_t *batch)
{
    if (!batch)
        return;
    if (batch->events != batch->first_event)
        free(batch->events);
    if (batch->event_streams != batch->first_stream)
        free(batch->event_streams);
    if (batch->entries != batch->first_entry)
        free(batch->entries);
    free(batch);
}

/* A batch's array (`array`, of `item`-byte items) grown to `cap` items, its
 * items kept: the first one copied out of the batch's own storage
 * (`inline_items`, which holds one), the others by realloc. NULL when host
 * memory runs out (the array is as it was). */
static void *batch_grown(void *array, const void *inline_items, size_t item, size_t cap)
{
    if (array != inline_items)
        return realloc(array, cap * item);
    void *grown = malloc(cap * item);
    if (grown)
        memcpy(grown, inline_items, item);
    return grown;
}

/* Closes the open batch: one device-wide event (cuh_hp_record_all_locked), or one
 * event on every live stream the heap knows and on the default stream. If an
 * event cannot be recorded the device is synchronized instead and the batch
 * is finished at once (slow, never wrong). Never during a graph capture. */
void cuh_hp_batch_close_locked(cuh_heap_t *h)
{
    free_batch_t *batch = h->open_batch;
    if (!batch || h->captures)
        return;
    cuh_event_t all = NULL;
    const cuh_dev_status_t fenced = cuh_hp_record_all_locked(h, &all);
    if (fenced == CUH_DEV_CAPTURING)
        return;   /* stays open until the capture ends */
    const int fenced_all = fenced == CUH_DEV_OK;
    h->open_batch = NULL;
    h->allocs_at_close = h->num_allocs;
    int synced = 0;
    if (batch->cap_events < h->num_streams + 1) {
        const size_t cap = (size_t)h->num_streams + 1;
        cuh_event_t *events = batch_grown(batch->events, batch->first_event, sizeof *events, cap);
        if (events)
            batch->events = events;
        cuh_stream_t *where = batch_grown(batch->event_streams, batch->first_stream, sizeof *where, cap);
        if (where)
            batch->event_streams = where;
        if (events && where)
            batch->cap_events = cap;
        synced = !events || !where;
    }
    if (fenced_all && !synced) {
        batch->event_streams[0] = ALL_STREAMS;
        batch->events[batch->num_events++] = all;
    } else if (fenced_all) {
        cuh_hp_event_put_locked(h, all);   /* no room for it: the device is synchronized below */
    }
    cuh_stream_t handle;
    for (uint32_t i = 0; !synced && !fenced_all && cuh_hp_next_live_stream(h, &i, &handle);) {
        cuh_event_t ev = cuh_hp_event_get_locked(h);
        if (!ev || h->dev->ops->event_record(h->dev, ev, handle) != CUH_DEV_OK) {
            if (ev)
                cuh_hp_event_put_locked(h, ev);
            synced = 1;
            break;
        }
        batch->event_streams[batch->num_events] = handle;
        batch->events[batch->num_events++] = ev;
    }
    if (synced) {
        cuh_hp_cpu_wait_device(h);
        batch_finish_locked(h, batch, 0);
        return;
    }
    free_batch_t **tail = &h->closed_batches;
    while (*tail)
        tail = &(*tail)->next;
    *tail = batch;
}

/* Finishes every closed batch whose events have completed (wait: waits for
 * them); then, if none is left in flight, closes the open one so the next
 * frees are already on their way (rationed with other streams known).
 * Returns 1 if any batch finished. */
int cuh_hp_batches_poll_locked(cuh_heap_t *h, int wait)
{
    int any = 0;
    if (h->captures)
        return 0;
    for (free_batch_t **p = &h->closed_batches; *p;) {
        free_batch_t *batch = *p;
        if (!cuh_hp_events_done_locked(h, batch->events, &batch->num_events, wait)) {
            p = &batch->next;
            continue;
        }
        *p = batch->next;
        batch_finish_locked(h, batch, 0);
        any = 1;
    }
    /* Fenced stream by stream, a close records an event on every known
     * stream: with other streams than the default one, at most once per N
     * allocations with N streams known, or a program whose GPU keeps up
     * would pay one per cudaFree (33 event records with PyTorch's stream
     * pool). A device-wide event costs one. */
    if (!h->closed_batches && h->open_batch &&
        (wait || !cuh_hp_fences_per_stream_locked(h) ||
         h->num_allocs - h->allocs_at_close >= cuh_hp_covered_streams_locked(h)))
        cuh_hp_batch_close_locked(h);
    return any;
}

/* How much cudaFree'd memory may wait in the open batch before a free
 * fences it. A fence (an event recorded over the device) and its query cost
 * 0.3-0.6 us on an H100, two to four times the rest of a cudaMalloc+cudaFree
 * pair (bench/gpu/preload_pairs.c), and a program that frees and allocates as
 * it goes (PyTorch without its cache: a pair per tensor) paid one per tensor.
 * So the free of a small object closes the open batch only once it holds
 * over half of this: a 64th of what the heap holds, at least the device's
 * page (2 MiB without a reservation: what cudaMalloc rounds to). Small
 * objects are served from their slabs meanwhile, and take what the batch
 * holds back (one fence) only when a slab runs out, before the heap would
 * grow. A block (an extent) still closes the batch at its free and is taken
 * back, whatever is held, at the next allocation of a block: placed around
 * freed memory rather than in it, blocks made three corpus jobs hold 1.3-2.4%
 * more under LD_PRELOAD (heap.c, the allocation ladder), and a fence
 * recorded only at that allocation is seldom done by then, so the GPU would
 * be made to wait as well. */
size_t cuh_hp_free_slack_locked(const cuh_heap_t *h)
{
    const size_t floor = h->vm ? h->vm_page : (size_t)2 << 20;
    return cuh_max_size(cuh_hp_reserved_bytes(h) / 64, floor);
}

/* Adds live block b at addr to the open batch. -1 when host memory runs out. */
int cuh_hp_batch_add_locked(cuh_heap_t *h, uintptr_t addr, const live_block_t *b)
{
    const size_t size = b->size, requested = b->requested;
    free_batch_t *batch = h->open_batch;
    if (!batch) {
        batch = h->spare_batch ? h->spare_batch : cuh_hp_batch_new();
        if (!batch)
            return -1;
        h->spare_batch = NULL;
        h->open_batch = batch;
    }
    if (batch->num_entries == batch->cap_entries) {
        const uint32_t cap = batch->cap_entries < 64 ? 64 : 2 * batch->cap_entries;
        batch_entry_t *grown = NULL;
        if (batch->cap_entries <= UINT32_MAX / 2)
            grown = batch_grown(batch->entries, batch->first_entry, sizeof *grown, cap);
        if (!grown)
            return -1;
        batch->entries = grown;
        batch->cap_entries = cap;
    }
    if (b->slab)
        cuh_slab_set(b->slab->held, b->index);
    else
        b->ext->held = 1;
    batch->num_blocks += b->ext != NULL;
    batch->entries[batch->num_entries++] = (batch_entry_t){addr, size, requested, b->slab, b->ext};
    batch->bytes += size;
    h->held_bytes += size;
    h->held_requested += requested;
    return 0;
}

/* ---- take-backs: the GPU waits, not the CPU ----------------------------------------- */

/* Orders the work every live stream (and the default stream) is given from
 * now on after the running events: running[k], recorded on where[k], or NULL
 * once complete. The GPU waits, not the CPU. A wait by every other stream on
 * every running event would cost streams x events calls: with PyTorch's
 * stream pool and NCCL's streams under DDP, about 165 streams and 50 running
 * events, 8,000 waits and 1.7 ms of CPU per take-back. So when it is cheaper,
 * the events are first joined on the default stream: it waits for the other
 * streams' events and records one event, and every other stream waits for
 * that one (streams + events calls; ordering is transitive). A device-wide
 * event (where[k] == ALL_STREAMS) takes one device-wide wait. 1 when done; 0
 * if a wait or a record could not be enqueued (the caller makes the CPU wait
 * instead); -1 if a graph capture is underway (nothing was enqueued, and no
 * event call may be made now). */
static int order_streams_after_locked(cuh_heap_t *h, cuh_event_t **running, const cuh_stream_t *where, size_t n)
{
    const size_t num_streams = cuh_hp_covered_streams_locked(h);
    size_t num_running = 0;
    int default_running = 0;
    for (size_t k = 0; k < n; k++) {
        if (running[k] && where[k] == ALL_STREAMS) {
            /* A device-wide event: one device-wide wait, streams to come included. */
            cuh_dev_status_t rc = h->dev->ops->wait_all(h->dev, *running[k]);
            if (rc != CUH_DEV_OK) {
                cuh_hp_device_fences_refused_locked(h, rc);
                return rc == CUH_DEV_CAPTURING ? -1 : 0;
            }
        } else if (running[k]) {
            num_running++;
            default_running |= where[k] == 0;
        }
    }
    if (!num_running)
        return 1;
    h->took_back = 1;   /* a stream heard of later must wait too (stream_joins_locked) */
    cuh_stream_t waiter;
    const size_t direct = num_running * (num_streams - 1);
    const size_t joined = (num_running - (size_t)default_running) + 1 + (num_streams - 1);
    if (direct <= joined) {
        for (size_t k = 0; k < n; k++)
            for (uint32_t i = 0; running[k] && where[k] != ALL_STREAMS && cuh_hp_next_live_stream(h, &i, &waiter);)
                if (waiter != where[k] && h->dev->ops->stream_wait(h->dev, waiter, *running[k]) != CUH_DEV_OK)
                    return 0;
        return 1;
    }
    cuh_event_t join = cuh_hp_event_get_locked(h);
    int ok = join != NULL;
    for (size_t k = 0; ok && k < n; k++)
        if (running[k] && where[k] != 0 && where[k] != ALL_STREAMS)
            ok = h->dev->ops->stream_wait(h->dev, 0, *running[k]) == CUH_DEV_OK;
    ok = ok && h->dev->ops->event_record(h->dev, join, 0) == CUH_DEV_OK;
    for (uint32_t i = 0; ok && cuh_hp_next_live_stream(h, &i, &waiter);)
        if (waiter != 0)
            ok = h->dev->ops->stream_wait(h->dev, waiter, join) == CUH_DEV_OK;
    /* A wait holds the record it was enqueued behind: the event may be
     * recorded again for something else at once. */
    if (join)
        cuh_hp_event_put_locked(h, join);
    return ok;
}

/* The free extent a block released as global memory would become: where it
 * starts (the block's own start: a free neighbour below it fails the test
 * before), its size, and its segment's rank (freebins.h: ties go to the
 * older segment, then the lower address). */
typedef struct {
    uintptr_t addr;
    size_t size;
    uint64_t serial;
} merged_t;

/* Whether free extent r comes before m in the search (freebins.h, and the
 * stream's own memory first on a tie, cuh_arena_find). */
static int comes_before(const cuh_extent_t *r, const merged_t *m)
{
    if (r->size != m->size)
        return r->size < m->size;
    if (r->tag != CUH_TAG_GLOBAL)
        return 1;
    return r->segment->serial != m->serial ? r->segment->serial < m->serial : r->addr < m->addr;
}

/* How many free extents other_fit_before looks at before it gives up (and
 * says yes: the round trip then runs, never wrong). */
#define OTHER_FITS_LOOKED_AT 16

/* Whether a global free extent of `bins`, other than n (which the block
 * would absorb), holds `size` bytes and comes before m: the search's best
 * fit is n, so any other is at least n's size, in n's bin or above. */
static int other_fit_before(const cuh_freebins_t *bins, const cuh_extent_t *n, size_t size, const merged_t *m)
{
    int looked = 0;
    const unsigned last = cuh_freebins_bin(m->size);
    for (unsigned bin = cuh_freebins_next(bins, cuh_freebins_bin(n->size)); bin != CUH_BINS_NONE && bin <= last;
         bin = bin + 1 < CUH_BINS_NONE ? cuh_freebins_next(bins, bin + 1) : CUH_BINS_NONE)
        for (const cuh_binnode_t *x = cuh_freebins_head(bins, bin); x; x = x->next) {
            if (x == &n->node || x->size < size)
                continue;
            if (++looked > OTHER_FITS_LOOKED_AT || comes_before(cuh_container_of(x, cuh_extent_t, node), m))
                return 1;
        }
    return 0;
}

/* Whether the search would hand block e out again, at its address, were it
 * released as global memory, for a request of its size on st (the
 * allocation ladder's first steps, heap.c): released, it merges with no
 * free neighbour below it (the merged extent would start lower), and the
 * extent it becomes (with a global free neighbour above it absorbed) is the
 * best fit (freebins.h: the first region, the smallest size, the stream's
 * own memory on a tie, then the older segment and the lower address). At
 * the growth edge of the reservation (cuh_hp_at_growth_edge) the search
 * takes any other fit on mapped pages first, so there it must be the only
 * fit. The block's own pages are mapped: no page rule applies. */
static int search_would_take(cuh_heap_t *h, const cuh_extent_t *e, const stream_state_t *st)
{
    const cuh_extent_t *n = e->next;
    if (cuh_arena_absorbs(e->prev, CUH_TAG_GLOBAL))
        return 0;
    const int absorbs = cuh_arena_absorbs(n, CUH_TAG_GLOBAL);
    const merged_t m = {e->addr, e->size + (absorbs ? n->size : 0), e->segment->serial};
    const int edge = cuh_hp_range_at_growth_edge(h, e->segment, m.addr + m.size, absorbs ? n->next : n);
    const cuh_extent_t *r = cuh_arena_find(&h->arena, e->size, CUH_ALIGN, st->tag);
    if (r && r != n) {
        /* The best fit now, absorbed neighbour aside: the merged extent
         * must come before it, and at the edge there must be none. */
        if (r->segment->region != e->segment->region)
            return r->segment->region > e->segment->region && !edge;
        return !edge && !comes_before(r, &m);
    }
    if (!r)
        return 1;
    /* n itself is the best fit: the next best must come after the merged
     * extent (at the edge: there must be none), global or the stream's own. */
    const merged_t bound = edge ? (merged_t){UINTPTR_MAX, SIZE_MAX, UINT64_MAX} : m;
    const cuh_region_t region = (cuh_region_t)e->segment->region;
    if (other_fit_before(&h->arena.tags[CUH_TAG_GLOBAL].bins[region], n, e->size, &bound))
        return 0;
    if (st->tag == CUH_TAG_GLOBAL)
        return 1;
    const cuh_binnode_t *own = cuh_freebins_find(&h->arena.tags[st->tag].bins[region], e->size, CUH_ALIGN);
    return !own || own->size > bound.size;
}

/* A program that cudaFrees a block and asks for its size again (PyTorch
 * without its cache: a pair per tensor) would have it merged back into the
 * arena when its batch finished, and the same bytes split off again by the
 * search: 40% of such a pair's instructions. When a take-back for a
 * device-wide block finds the only memory cudaFree gave back to be one
 * block of exactly the request's size, in the one closed batch, with no
 * work left running on the GPU that it waits for, and the search would hand
 * out that block (search_would_take), the request takes it as it is: the
 * same block, the same device calls, and the same heap afterwards, without
 * the round trip. Returns that block, or NULL. */
static cuh_extent_t *same_candidate_locked(const cuh_heap_t *h, const stream_state_t *st, size_t size, size_t align)
{
    const free_batch_t *batch = h->closed_batches;
    if (!st || st != &h->device_wide || !batch || batch->next || batch->num_entries != 1 || h->open_batch ||
        h->cfg.step_plan || h->chunk_call || cuh_hp_own_segment_locked(h))   /* a plan: placed by heap_plan.c */
        return NULL;
    cuh_extent_t *e = batch->entries[0].ext;
    if (!e || e->size != size || e->addr % align || e->tag != st->tag || e->chunked)
        return NULL;
    return e;
}

/* A search finds the same with the free index unchanged, and a block handed
 * out again leaves it as it was: the pair's answer is found once (issue 45:
 * the search was a fifth of a block pair's instructions). 1 if candidate
 * e's answer is kept. */
static int same_answer_kept(const cuh_heap_t *h, const cuh_extent_t *e)
{
    return e == h->same_ok && h->arena.index_changes == h->same_ok_changes;
}

/* The short way's block (take_back_locked): the candidate, its answer
 * kept, in the one closed batch fenced by one device-wide event; NULL if
 * the short way does not apply. */
static cuh_extent_t *short_way_block_locked(const cuh_heap_t *h, const stream_state_t *st, size_t size,
                                            size_t align)
{
    const free_batch_t *b = h->closed_batches;
    cuh_extent_t *e;
    if (!b || b->num_events != 1 || b->event_streams[0] != ALL_STREAMS ||
        !(e = same_candidate_locked(h, st, size, align)) || !same_answer_kept(h, e))
        return NULL;
    return e;
}

static cuh_extent_t *same_block_locked(cuh_heap_t *h, const stream_state_t *st, size_t size, size_t align)
{
    cuh_extent_t *e = same_candidate_locked(h, st, size, align);
    if (!e || same_answer_kept(h, e))
        return e;
    if (!search_would_take(h, e, st))
        return NULL;
    h->same_ok = e;
    return e;
}

/* The batch holding only block e finishes with e handed out again: as the
 * release and the take would leave it (cuh_arena_take_at). It stays in the
 * block map, where the caller would put it back (h->same_in_map). */
static void hand_out_same_locked(cuh_heap_t *h, cuh_extent_t *e)
{
    free_batch_t *batch = h->closed_batches;
    entry_unhold_locked(h, &batch->entries[0]);
    h->closed_batches = NULL;
    batch_recycle_locked(h, batch);
    h->same_in_map = e;   /* still in the block map: cuh_hp_large_alloc_locked leaves it there */
    const uint64_t changes = h->arena.index_changes;
    if (cuh_arena_absorbs(e->next, CUH_TAG_GLOBAL))
        cuh_arena_requeue(&h->arena, e->next);   /* the rest of the merged extent, cut anew */
    cuh_arena_fresh_take(e, CUH_EXTENT_BLOCK, e->tag);
    h->last_take_tag = CUH_TAG_GLOBAL;   /* the take was from global memory */
    /* The answer stands for the index as it is now, unless the requeue
     * moved the neighbour to its bin's head: a bin's scan is bounded
     * (freebins.c), so its order may matter; the next pair asks again. */
    h->same_ok_changes = h->arena.index_changes;
    if (h->arena.index_changes != changes)
        h->same_ok = NULL;
}

/* Device-wide frees (cudaFree under LD_PRELOAD) wait in batches until the
 * GPU has passed them. A program that frees and allocates as it goes -
 * PyTorch without its cache: a cudaFree per tensor - would otherwise make
 * the heap grow by everything the CPU has freed ahead of the GPU. So the
 * batches can be taken back at once, all together, and the GPU, not the CPU,
 * waits, so that no work issued from now on (the only work that can touch a
 * block handed out now) runs before the work issued before the frees has
 * finished. With device-wide fences the newest batch's event covers every
 * stream and one device-wide wait orders them all, streams created later
 * included. Fenced stream by stream, every stream cuheap knows, and the
 * legacy default stream (which every blocking stream waits for), gets a wait
 * on the newest event still running on each other stream (a later event on a
 * stream stands for the earlier ones; with several running, they are joined
 * on the default stream first: order_streams_after_locked); idle streams
 * cost one event query each and no wait. Only when a wait cannot be enqueued
 * does the CPU wait. Returns 1 when memory came back (try again), 0 when
 * there was none to take (or wait_before_grow:0, or a capture is underway).
 * The open batch is closed and taken with the rest only `with_open`. */
static int take_back_locked(cuh_heap_t *h, int with_open, const stream_state_t *st, size_t size, size_t align,
                            cuh_extent_t **same)
{
    if (!h->cfg.wait_before_grow || h->captures || (!(with_open && h->open_batch) && !h->closed_batches))
        return 0;
    const size_t held_before = h->held_bytes;
    if (with_open)
        cuh_hp_batch_close_locked(h);   /* may finish it at once, or leave it open (a capture underway) */
    /* A program that frees and allocates a block as it goes (PyTorch without
     * its cache): one closed batch, fenced over the device, holding the one
     * block asked for again, whose answer is kept. Its fence's query decides
     * at once; still running, it goes the long way below, not asked twice.
     * What follows would do the same, in about 150 more instructions. */
    const cuh_event_t *asked = NULL;
    if (same) {
        free_batch_t *b = h->closed_batches;
        cuh_extent_t *e = short_way_block_locked(h, st, size, align);
        if (e) {
            /* A thread's slot found it running just now (heap_tcache.c). */
            if (b->events[0] != h->asked_event && h->dev->ops->event_query(h->dev, b->events[0]) == CUH_DEV_OK) {
                hand_out_same_locked(h, e);
                h->allocs_at_take_back = h->num_allocs;
                *same = e;
                return 1;
            }
            asked = &b->events[0];
        }
    }
    const int others = cuh_hp_other_streams_locked(h);
    int per_stream = 0, device_wide = 0;   /* batches fenced stream by stream, and over the device */
    for (free_batch_t *b = h->closed_batches; b; b = b->next)
        for (size_t e = 0; e < b->num_events; e++) {
            per_stream |= b->event_streams[e] != ALL_STREAMS;
            device_wide |= b->event_streams[e] == ALL_STREAMS;
        }
    uint64_t stamp = 0;   /* the generation of the blocks returned before their work is done */
    if (h->closed_batches && (others || h->vm || device_wide)) {
        /* The newest event of each stream (batches are oldest first, so a
         * later one takes its stream's place), and the newest device-wide
         * one (ALL_STREAMS); NULL once it has completed. */
        size_t cap = h->num_streams + 2, n = 0;
        /* On the stack for the usual few streams: a take-back comes at every
         * cudaMalloc that wants memory a cudaFree gave back (issue 45). */
        enum { ON_STACK = 64 };
        cuh_event_t **running_stack[ON_STACK];
        cuh_stream_t where_stack[ON_STACK];
        const int heap_arrays = cap > ON_STACK;
        cuh_event_t **running = heap_arrays ? malloc(cap * sizeof *running) : running_stack;   /* its slot in its batch */
        cuh_stream_t *where = heap_arrays ? malloc(cap * sizeof *where) : where_stack;
        int waited = running && where;
        for (free_batch_t *b = h->closed_batches; waited && b; b = b->next)
            for (size_t e = 0; e < b->num_events; e++) {
                size_t k = 0;
                while (k < n && where[k] != b->event_streams[e])
                    k++;
                if (k == cap)
                    continue;
                if (k == n)
                    where[n++] = b->event_streams[e];
                running[k] = &b->events[e];
            }
        for (size_t e = 0; waited && e < n; e++)
            if (running[e] != asked && h->dev->ops->event_query(h->dev, *running[e]) == CUH_DEV_OK)
                running[e] = NULL;   /* complete: none older on its stream runs */
        if ((others || device_wide) && waited) {
            const int ordered = order_streams_after_locked(h, running, where, n);
            if (ordered < 0) {
                /* A capture began since the batches closed: they wait for
                 * its end (no event call now, the CPU's wait included). */
                if (heap_arrays) {
                    free(running);
                    free(where);
                }
                return h->held_bytes < held_before;
            }
            waited = ordered;
        }
        if (!waited) {   /* the CPU waits instead */
            for (free_batch_t *b = h->closed_batches; b; b = b->next)
                cuh_hp_events_done_locked(h, b->events, &b->num_events, 1);
        } else if (h->vm) {
            /* No page of these blocks may be unmapped before the running
             * work is done: their pages are stamped with a new generation
             * as the batches finish below (cuh_hp_gen_open_locked). */
            int any_running = 0;
            for (size_t e = 0; e < n; e++)
                any_running |= running[e] != NULL;
            if (any_running && !(stamp = cuh_hp_gen_open_locked(h)))
                for (size_t e = 0; e < n; e++)
                    if (running[e])
                        cuh_hp_cpu_wait_event(h, *running[e]);   /* no event: the CPU waits instead */
        }
        if (heap_arrays) {
            free(running);
            free(where);
        }
    }
    cuh_extent_t *e = same && !stamp ? same_block_locked(h, st, size, align) : NULL;
    if (e)
        hand_out_same_locked(h, e);
    while (h->closed_batches) {
        free_batch_t *oldest = h->closed_batches;
        h->closed_batches = oldest->next;
        batch_finish_locked(h, oldest, stamp);
    }
    if (per_stream)
        h->took_back = 1;   /* a stream heard of later must wait too (stream_joins_locked) */
    h->allocs_at_take_back = h->num_allocs;
    if (same)
        *same = e;
    return h->held_bytes < held_before;
}

/* A thread's slot (heap_tcache.c, "a thread's cudaFree'd block") may keep
 * block e, just freed, and the one closed batch holding it, if the next
 * cudaMalloc of its size would take it by the short way above and change
 * nothing else: no other batch, the batch fenced over the device, e's
 * answer kept and its free neighbour above, if any, first in its bin
 * already (cut anew, it stays there), and nothing the next allocation or
 * free would poll. cuh_hp_same_batch_take_locked then takes the batch out
 * of the heap's books, with e still a block. */
int cuh_hp_same_batch_adoptable_locked(const cuh_heap_t *h, const cuh_extent_t *e)
{
    return short_way_block_locked(h, &h->device_wide, e->size, CUH_ALIGN) == e && h->cfg.wait_before_grow &&
           !h->captures && !h->num_holds && !cuh_hp_fences_per_stream_locked(h) &&
           !(cuh_arena_absorbs(e->next, CUH_TAG_GLOBAL) && !cuh_arena_queued_first(e->next));
}

free_batch_t *cuh_hp_same_batch_take_locked(cuh_heap_t *h)
{
    free_batch_t *batch = h->closed_batches;
    entry_unhold_locked(h, &batch->entries[0]);
    h->closed_batches = NULL;
    return batch;
}

/* The slot's block goes back held in its batch, the newest closed one, as
 * its last free would have left it; `requested` is its last request, and
 * `asked` says a take found the batch's fence running. */
void cuh_hp_same_batch_return_locked(cuh_heap_t *h, free_batch_t *batch, size_t requested, int asked)
{
    batch_entry_t *x = &batch->entries[0];
    x->requested = requested;
    x->ext->held = 1;
    h->held_bytes += x->size;
    h->held_requested += requested;
    batch->next = NULL;
    free_batch_t **tail = &h->closed_batches;
    while (*tail)
        tail = &(*tail)->next;
    *tail = batch;
    if (asked)
        h->asked_event = batch->events[0];
}

/* The slot's block was handed out: its batch finishes as the short way
 * would have finished it. */
void cuh_hp_same_batch_recycle_locked(cuh_heap_t *h, free_batch_t *batch)
{
    batch_recycle_locked(h, batch);
}

int cuh_hp_take_back_all_locked(cuh_heap_t *h)
{
    return take_back_locked(h, 1, NULL, 0, 0, NULL);
}

/* What a block's allocation takes back first (the ladder's first step,
 * cuh_hp_extent_alloc_locked): every closed batch, but not an open batch of
 * small objects only, when closed batches are there to take. A block's free
 * closes its batch at once, so a program that frees and allocates blocks and
 * small objects in turn (PyTorch without its cache) found small frees in
 * the open batch at nearly every block's allocation, and closing it cost a
 * second fence there (bench_per_tensor's mixed live set: 0.69 fences a pair
 * for 0.38 blocks) for memory a block can use only once a whole slab of it
 * has come back. That batch goes out as before: once it holds over half the
 * free slack, when a slab runs out, and at every later step of the ladder.
 * Tuning corpus (2026-12-06): the same median, `llama_ckpt` under LD_PRELOAD
 * 1.1890x -> 1.1833x its live peak, the most calls a step 891 -> 811. */
int cuh_hp_take_back_for_block_locked(cuh_heap_t *h, const stream_state_t *st, size_t size, size_t align,
                                      cuh_extent_t **same)
{
    const free_batch_t *open = h->open_batch;
    if (same)
        *same = NULL;
    return take_back_locked(h, !open || open->num_blocks || !h->closed_batches, st, size, align, same);
}

/* ---- reuse across streams ----------------------------------------------------------- */

/* 1 if reuse_across_streams may give st (or a device-wide request) `size`
 * bytes: memory the other streams freed in order that no fence has shown
 * the GPU has passed yet, what only its stream may reuse otherwise. */
int cuh_hp_may_take_private_locked(const cuh_heap_t *h, const stream_state_t *st, size_t size)
{
    /* A retired stream cannot be made to wait (the device-wide state is
     * marked retired only so that nothing is ever recorded on it). */
    if (!h->cfg.reuse_across_streams || h->captures || (st->retired && st != &h->device_wide))
        return 0;
    size_t bytes = 0;
    for (uint32_t i = 0; i < h->num_streams; i++) {
        const cuh_tag_books_t *books = &h->arena.tags[h->streams[i]->tag];
        if (h->streams[i] != st)
            bytes += books->unfenced_bytes + books->fenced_bytes;
    }
    return bytes >= size;
}

/* A device-wide allocation (cudaMalloc under LD_PRELOAD, or the C API's)
 * may be used on any stream at once, so it takes only memory no stream's
 * work can still touch: memory a stream freed in order (cudaFreeAsync) stays
 * that stream's until a fence on it completes, and fences are recorded only
 * when memory is needed, so they are rarely complete when it is. A program
 * that frees on many streams and allocates device-wide then grows the heap
 * at such requests while the GPU runs behind (tests/gpu/preload_stress.cu on
 * an H200: 14-20 GiB reserved for 1 GiB live, 8 threads on 32 streams).
 * With reuse_across_streams:1, before a device-wide request grows the heap
 * (or maps new pages) that memory is taken as cudaFree'd batches are
 * (cuh_hp_take_back_all_locked): every stream is fenced, every stream known and
 * the default stream wait on the GPU for the fences still running, and the
 * memory turns global at once; the CPU does not wait. Under vmm:1 the
 * running fences are kept until they complete: no page of that memory is
 * unmapped before. Returns 1 when memory turned global, 0 when there was
 * none or a wait could not be enqueued (the heap then grows, as without).
 * The caller checks cuh_hp_may_take_private_locked first, as for the next one. */
static int take_back_private_locked(cuh_heap_t *h)
{
    cuh_event_t **running = malloc(h->num_streams * sizeof *running);
    cuh_stream_t *where = malloc(h->num_streams * sizeof *where);
    stream_state_t **owner = malloc(h->num_streams * sizeof *owner);
    size_t n = 0;
    int ok = running && where && owner, any = 0;
    for (uint32_t i = 0; ok && i < h->num_streams; i++) {
        stream_state_t *st = h->streams[i];
        if (cuh_hp_stream_fence_locked(h, st) < 0 || !st->num_fences)
            continue;   /* nothing private, or made global by a synchronize */
        running[n] = &st->fences[st->num_fences - 1].event;   /* the newest stands for the older */
        where[n] = st->handle;
        owner[n++] = st;
    }
    for (size_t k = 0; ok && k < n; k++)
        if (h->dev->ops->event_query(h->dev, *running[k]) == CUH_DEV_OK)
            running[k] = NULL;   /* complete: nothing to wait for */
    ok = ok && n && order_streams_after_locked(h, running, where, n) > 0;
    for (size_t k = 0; ok && k < n; k++) {
        stream_state_t *st = owner[k];
        if (h->vm && running[k] && !cuh_hp_keep_until_done_locked(h, st)) {
            ok = 0;   /* no event to keep: this and the rest stay private */
            break;
        }
        cuh_hp_stream_all_done_locked(h, st);   /* every stream is ordered after its fences */
        any = 1;
    }
    if (any)
        h->took_back = 1;   /* a stream heard of later must wait too (stream_joins_locked) */
    free(running);
    free(where);
    free(owner);
    return any;
}

/* With reuse_across_streams:1, an allocation on stream `to` that would make
 * the heap grow (or map new pages) takes the memory other streams freed
 * whose fences have not completed, as cudaMallocAsync's pools do by default
 * (cudaMemPoolReuseAllowInternalDependencies): `to` waits on the GPU for
 * each such stream's newest fence (recorded now if its last frees had none),
 * and the memory that fence covers becomes `to`'s own. Safe: all the work
 * `to` runs from now on starts after the work issued on the freeing stream
 * before its free; other streams get that memory only through a fence on
 * `to`, which orders them after both. The price is an ordering between
 * streams the program did not ask for (a side stream that copies the next
 * batch would wait for the step's compute), hence a setting, off by
 * default. A fence found complete simply turns its memory global. Returns 1
 * when memory came to `to` or turned global. */
static int borrow_private_locked(cuh_heap_t *h, stream_state_t *to)
{
    int any = 0;
    for (uint32_t i = 0; i < h->num_streams; i++) {
        stream_state_t *st = h->streams[i];
        const cuh_tag_books_t *books = &h->arena.tags[st->tag];
        if (st == to || (!books->unfenced_bytes && !books->fenced_bytes))
            continue;
        if (cuh_hp_stream_fence_locked(h, st) < 0) {
            any = 1;   /* the device was synchronized: all of it is global */
            continue;
        }
        if (!st->num_fences)
            continue;
        const fence_t *newest = &st->fences[st->num_fences - 1];
        if (h->dev->ops->event_query(h->dev, newest->event) == CUH_DEV_OK) {
            any |= cuh_hp_stream_poll_locked(h, st, 0);
            continue;
        }
        if (h->vm && !cuh_hp_keep_until_done_locked(h, st))
            continue;
        if (h->dev->ops->stream_wait(h->dev, to->handle, newest->event) != CUH_DEV_OK)
            continue;   /* not ordered: the memory stays where it is */
        cuh_arena_hand_over(&h->arena, st->tag, newest->number + 1, to->tag);
        any = 1;
    }
    return any;
}

/* Other streams' private memory for a request on st that would otherwise
 * grow the heap or map new pages: taken with every stream waiting for a
 * device-wide request, with st waiting for a request on a stream. */
int cuh_hp_take_private_locked(cuh_heap_t *h, stream_state_t *st, size_t size)
{
    if (!cuh_hp_may_take_private_locked(h, st, size))
        return 0;
    return st == &h->device_wide ? take_back_private_locked(h) : borrow_private_locked(h, st);
}
