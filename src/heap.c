/* heap.c - one device's heap: streams, fences, the allocation ladder, small
 * objects and statistics (the rules it keeps are listed in heap.h).
 *
 * Device-wide frees (cudaFree: no stream, all earlier work on every stream
 * may still use the block) wait in batches fenced on every known stream;
 * see free_batch_t.
 *
 * The allocation ladder, cheapest step first:
 *   1. best fit in global memory and the stream's own;
 *   2. poll outstanding fences (a query each), retry;
 *   3. fence other streams that hold private memory, poll, retry;
 *   4. grow: a new segment from the device, within the limit (if that
 *      sets a new peak, first return idle segments too small for the request);
 *   5. refused: wait for every fence (host blocks), retry;
 *   6. release fully free segments to the device and grow again;
 *   7. out of memory, with the state recorded as its proof.
 *
 * Concurrency: one mutex per heap guards everything here. Functions whose
 * names end in _locked expect it held. In front of it, each thread has a
 * cache of small objects per heap (tcache.h; "thread caches" below) that its
 * fast paths use without the heap's lock. Lock order: the registry of
 * thread caches, then a heap, then a thread cache.
 */
#include "heap_internal.h"

#include <stdlib.h>
#include <string.h>

/* Fenced stream by stream with streams besides the default one known, a
 * take-back (and a batch close) costs calls on every stream: at most one per
 * TAKE_BACK_EVERY allocations per known stream. A poll closes a batch at
 * most once per POLL_CLOSE_SECONDS. */
#define TAKE_BACK_EVERY 1u
#define POLL_CLOSE_SECONDS 0.001

static void batch_finish_locked(cuh_heap_t *h, free_batch_t *batch, uint64_t gen);

/* ---- the allocation ladder ----------------------------------------------------- */

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
 * there was none to take (or wait_before_grow:0, or a capture is underway). */
static int take_back_all_locked(cuh_heap_t *h)
{
    if (!h->cfg.wait_before_grow || h->captures || (!h->open_batch && !h->closed_batches))
        return 0;
    const size_t held_before = h->held_bytes;
    cuh_hp_batch_close_locked(h);   /* may finish it at once, or leave it open (a capture underway) */
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
        cuh_event_t **running = malloc(cap * sizeof *running);   /* its slot in its batch */
        cuh_stream_t *where = malloc(cap * sizeof *where);
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
            if (h->dev->ops->event_query(h->dev, *running[e]) == CUH_DEV_OK)
                running[e] = NULL;   /* complete: none older on its stream runs */
        if ((others || device_wide) && waited) {
            const int ordered = order_streams_after_locked(h, running, where, n);
            if (ordered < 0) {
                /* A capture began since the batches closed: they wait for
                 * its end (no event call now, the CPU's wait included). */
                free(running);
                free(where);
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
        free(running);
        free(where);
    }
    while (h->closed_batches) {
        free_batch_t *oldest = h->closed_batches;
        h->closed_batches = oldest->next;
        batch_finish_locked(h, oldest, stamp);
    }
    if (per_stream)
        h->took_back = 1;   /* a stream heard of later must wait too (stream_joins_locked) */
    h->allocs_at_take_back = h->num_allocs;
    return h->held_bytes < held_before;
}

/* 1 if reuse_across_streams may give st (or a device-wide request) `size`
 * bytes: memory the other streams freed in order that no fence has shown
 * the GPU has passed yet, what only its stream may reuse otherwise. */
static int may_take_private_locked(const cuh_heap_t *h, const stream_state_t *st, size_t size)
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
 * (take_back_all_locked): every stream is fenced, every stream known and
 * the default stream wait on the GPU for the fences still running, and the
 * memory turns global at once; the CPU does not wait. Under vmm:1 the
 * running fences are kept until they complete: no page of that memory is
 * unmapped before. Returns 1 when memory turned global, 0 when there was
 * none or a wait could not be enqueued (the heap then grows, as without).
 * The caller checks may_take_private_locked first, as for the next one. */
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
static int take_private_locked(cuh_heap_t *h, stream_state_t *st, size_t size)
{
    if (!may_take_private_locked(h, st, size))
        return 0;
    return st == &h->device_wide ? take_back_private_locked(h) : borrow_private_locked(h, st);
}

/* An extent of `size` bytes aligned to `align` for stream st, or NULL after
 * the whole ladder with *status saying why; for an out-of-memory, *why says
 * what refused the last segment (the caller records the OOM). */
cuh_extent_t *cuh_hp_extent_alloc_locked(cuh_heap_t *h, stream_state_t *st, size_t size, size_t align,
                                         cuh_extent_state_t state, cuheap_status_t *status, grow_result_t *why_out)
{
    /* Memory cudaFree gave back comes first, as it would with stream-ordered
     * frees: left in its batches while other free memory is cut up, its
     * holes stop matching the requests that follow (cuheap-replay
     * --cudafree 100: GPT-2 reserved 34 GiB instead of 28). With
     * device-wide fences, or while the default stream is the only one
     * known, a take-back costs an event record and a wait whatever it
     * returns, so all of it, whenever any is held: free memory is then what
     * it would be with stream-ordered frees (taking back only once as much
     * as the request was held, BERT without PyTorch's cache reserved 18.86
     * GiB under --cudafree 1000 --streams 32 instead of 16.73, while the
     * bundled ResNet-50 held 5.84 instead of 5.99: bench/HISTORY.md).
     * Fenced stream by stream with other streams, first what the GPU has
     * passed (a query per event); a take-back of the rest costs an event
     * record, a query and a wait per stream (about 1 us each on an H200,
     * bench/gpu/sync_costs.cu), so at most one per TAKE_BACK_EVERY
     * allocations per known stream, and always before growing. PyTorch
     * creates 32 streams for its pool, used or not. */
    cuh_extent_t *e;
    int tried_vm_take_back = 0, tried_page_aligned = 0, tried_private = 0, tried_huge_cut = 0;
    if (h->held_bytes && !cuh_hp_fences_per_stream_locked(h)) {
        take_back_all_locked(h);
    } else if (h->held_bytes >= size) {
        cuh_hp_batches_poll_locked(h, 0);   /* those the GPU has passed: no wait */
        if (h->held_bytes >= size &&
            h->num_allocs - h->allocs_at_take_back >= TAKE_BACK_EVERY * cuh_hp_covered_streams_locked(h))
            take_back_all_locked(h);
    }
    e = cuh_hp_find_fit_locked(h, size, align, st->tag);
    if (cuh_likely(e != NULL))
        goto hit;
retry_after_take_back:
    if (cuh_hp_poll_all_locked(h, 0) && (e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;
    if (cuh_hp_fence_others_locked(h, st, size) && cuh_hp_poll_all_locked(h, 0) &&
        (e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;

    if (take_back_all_locked(h) && (e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;
    if (!tried_private && (tried_private = 1, take_private_locked(h, st, size)) &&
        (e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;
    /* Blocks other threads hold (only while threads contend) come before growth. */
    if (cuh_unlikely(h->large_tcs != NULL) && cuh_hp_large_slots_empty_locked(h, LARGE_ALL_HELD) &&
        (e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;

    grow_result_t why = cuh_hp_grow_locked(h, size, align);
    if (why == GROW_ERROR) {
        *status = CUHEAP_ERR_DEVICE;
        return NULL;
    }
    if (why == GROW_OK)
        goto grown;
    /* Refused: wait for all freed memory, then give back what is whole. */
    cuh_hp_settle_all_locked(h);
    if ((e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;
    h->num_retries++;
    /* Freeing device memory during a graph capture would invalidate it. */
    if (!h->captures && cuh_hp_release_free_segments_locked(h)) {
        why = cuh_hp_grow_locked(h, size, align);
        if (why == GROW_ERROR) {
            *status = CUHEAP_ERR_DEVICE;
            return NULL;
        }
        if (why == GROW_OK)
            goto grown;
    }
    *why_out = why;
    *status = CUHEAP_ERR_OUT_OF_MEMORY;
    return NULL;

grown:
    e = cuh_hp_find_fit_locked(h, size, align, st->tag);
    if (!e) {
        cuh_set_error("internal error: a new segment does not fit its own request");
        *status = CUHEAP_ERR_DEVICE;
        return NULL;
    }
    e = cuh_hp_take_locked(h, e, size, align, state, st);
    if (!e)
        goto host_oom;
    return e;
hit:
    if (cuh_unlikely(cuh_hp_cuts_huge_segment(e, size)) && !tried_huge_cut) {
        tried_huge_cut = 1;   /* see "a huge size comes back" */
        if (h->held_bytes >= size && take_back_all_locked(h)) {
            e = cuh_hp_find_fit_locked(h, size, align, st->tag);   /* e was whole and free: still there */
            if (!cuh_hp_cuts_huge_segment(e, size))
                goto hit;
        }
        if (!cuh_hp_size_live_in_huge_segments(h, size) && cuh_hp_take_released_huge_locked(h, size)) {
            grow_result_t grew = cuh_hp_grow_locked(h, size, align);
            if (grew == GROW_OK)
                goto grown;
            if (grew == GROW_ERROR)
                cuh_log("%s; the block is cut from a free segment instead", cuh_get_error());
        }
    }
    if (cuh_unlikely(e->segment->virtual_space) && cuh_hp_at_growth_edge(h, e)) {
        cuh_extent_t *inside =
            cuh_hp_smallest_fit_by_bins_locked(h, size, align, st->tag, cuh_hp_mapped_fits_off_the_edge);
        if (inside)
            e = inside;   /* the edge is taken last (cuh_hp_at_growth_edge) */
    }
    if (cuh_unlikely(e->segment->virtual_space) && cuh_hp_needs_pages_locked(h, e->addr, size)) {
        /* Mapping pages is growth too: blocks other threads hold come first. */
        if (cuh_unlikely(h->large_tcs != NULL) && cuh_hp_large_slots_empty_locked(h, LARGE_ALL_HELD)) {
            if (!(e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
                goto retry_after_take_back;
            goto hit;
        }
        cuh_extent_t *mapped = cuh_hp_smallest_mapped_fit_locked(h, size, align, st->tag);
        uintptr_t at = 0;
        if (mapped) {
            e = mapped;
        } else if (h->held_bytes >= size && !tried_vm_take_back) {
            /* Under vmm:1 a fit in unmapped address space is growth too:
             * memory cudaFree gave back comes first there as well. */
            tried_vm_take_back = 1;
            /* The extents may have merged: find the fit again. */
            if (take_back_all_locked(h)) {
                if (!(e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
                    goto retry_after_take_back;
                goto hit;
            }
        } else if (!tried_private && may_take_private_locked(h, st, size)) {
            /* ... and so does other streams' private memory. */
            tried_private = 1;
            if (take_private_locked(h, st, size) && !(e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
                goto retry_after_take_back;
            goto hit;
        } else if ((mapped = cuh_hp_fewest_new_pages_fit_locked(h, size, align, st->tag, &at))) {
            h->last_take_tag = mapped->tag;
            e = at + size > mapped->addr + mapped->size
                    ? cuh_arena_take_spanning(&h->arena, mapped, at, size, state, st->tag)
                    : cuh_arena_take_at(&h->arena, mapped, at, size, state, st->tag);
            if (!e)
                goto host_oom;
            goto taken;
        }
    }
    e = cuh_hp_take_locked(h, e, size, align, state, st);
    if (!e)
        goto host_oom;
taken:
    if (e->segment->virtual_space) {
        grow_result_t mapped_why;
        /* Pages lent from the stream's own frees are safe for it alone: not
         * behind a slab, whose objects are every stream's. */
        stream_state_t *lender = state == CUH_EXTENT_BLOCK ? st : NULL;
        if (!cuh_hp_map_range_locked(h, e->addr, e->size, lender, &mapped_why)) {
            size_t page = h->vm_page, off = (size_t)(e->addr - e->segment->base) % page;
            int extra_page = (off + size + page - 1) / page > (size + page - 1) / page;
            cuh_arena_release(&h->arena, e, st->tag);
            if (mapped_why == GROW_ERROR) {
                *status = CUHEAP_ERR_DEVICE;
                return NULL;
            }
            /* Off a page boundary the block spans a page more than it must,
             * and under a tight limit that may be the page missing: free
             * pages that add up to the request must serve it. */
            if (extra_page && !tried_page_aligned) {
                tried_page_aligned = 1;
                align = page;
                if ((e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
                    goto hit;
            }
            h->num_retries++;
            *why_out = mapped_why;
            *status = CUHEAP_ERR_OUT_OF_MEMORY;
            return NULL;
        }
    }
    h->num_cache_hits++;
    return e;
host_oom:
    cuh_set_error("out of host memory for block records");
    *status = CUHEAP_ERR_OUT_OF_MEMORY;
    return NULL;
}

/* Counts large block e as handed out for a request of `size` bytes. */
void cuh_hp_large_mark_live_locked(cuh_heap_t *h, cuh_extent_t *e, size_t size)
{
    e->requested = size;
    cuh_hp_stat_set(&h->requested, h->requested.current + size);
    cuh_hp_stat_set(&h->allocated, h->allocated.current + e->size);   /* > the rounded size only for an own segment */
}

static cuheap_status_t large_alloc_locked(cuh_heap_t *h, stream_state_t *st, size_t size, uintptr_t *addr)
{
    size_t block = cuh_align_up(size, CUH_ALIGN);
    cuheap_status_t status = CUHEAP_OK;
    grow_result_t why = GROW_OK;
    cuh_extent_t *e = cuh_hp_extent_alloc_locked(h, st, block, CUH_ALIGN, CUH_EXTENT_BLOCK, &status, &why);
    if (!e) {
        if (status == CUHEAP_ERR_OUT_OF_MEMORY && why != GROW_OK)
            cuh_hp_record_oom_locked(h, st, size, block, CUH_ALIGN, why);
        return status;
    }
    if (cuh_ptrmap_insert(&h->blocks, e->addr, e)) {
        cuh_arena_release(&h->arena, e, st->tag);
        cuh_set_error("out of host memory for the block map");
        return CUHEAP_ERR_OUT_OF_MEMORY;
    }
    cuh_hp_large_mark_live_locked(h, e, size);
    *addr = e->addr;
    return CUHEAP_OK;
}

static _Atomic uint64_t next_heap_id = 1;

/* ---- public heap API -------------------------------------------------------------- */

cuh_heap_t *cuh_heap_create(cuh_device_t *dev, const cuh_config_t *cfg, char *err, size_t errlen)
{
    size_t free_bytes = 0, total = 0;
    if (dev->ops->mem_info(dev, &free_bytes, &total) != CUH_DEV_OK) {
        snprintf(err, errlen, "device %d: reading its memory size failed: %s", dev->ordinal, dev->last_error);
        return NULL;
    }
    size_t limit = cuh_config_limit(cfg, total);
    if (limit && cfg->workspace > limit) {
        char a[32], b[32];
        snprintf(err, errlen, "workspace (%s) is larger than limit (%s)", cuh_format_bytes(a, sizeof a, cfg->workspace),
                 cuh_format_bytes(b, sizeof b, limit));
        return NULL;
    }
    if (cfg->ipc_safe && (cfg->vmm || cfg->workspace)) {
        snprintf(err, errlen, "ipc_safe:1 gives every block a segment of its own; it cannot be combined with %s",
                 cfg->vmm ? "vmm:1 (virtual memory cannot be shared by IPC handles)" : "a workspace");
        return NULL;
    }
    cuh_heap_t *h = aligned_alloc(_Alignof(cuh_heap_t), sizeof *h);   /* sizeof is a multiple of the alignment */
    if (h)
        memset(h, 0, sizeof *h);
    if (!h || cuh_ptrmap_init(&h->blocks, 1024) || cuh_pagemap_init(&h->pages) || cuh_ptrmap_init(&h->held, 16) ||
        cuh_ptrmap_init(&h->uses, 16) || cuh_ptrmap_init(&h->graph, 16)) {
        if (h) {
            cuh_ptrmap_destroy(&h->blocks);
            cuh_pagemap_destroy(&h->pages);
            cuh_ptrmap_destroy(&h->held);
            cuh_ptrmap_destroy(&h->uses);
            cuh_ptrmap_destroy(&h->graph);
            free(h);
        }
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    cuh_lock_init(&h->lock);   /* spins before it sleeps: see lock.h */
    h->dev = dev;
    h->cfg = *cfg;
    h->device_fences = cfg->device_fences && dev->ops->event_record_all && dev->ops->wait_all;
    h->id = atomic_fetch_add(&next_heap_id, 1);
    h->device_wide = (stream_state_t){.tag = CUH_TAG_GLOBAL, .retired = 1};
    clock_gettime(CLOCK_MONOTONIC, &h->born);
    h->sample_every = 64;
    h->device_total = total;
    h->limit = limit;
    cuh_arena_init(&h->arena);
    h->num_classes = cuh_sizeclass_count(cfg->small_max);
    for (unsigned i = 0; i < h->num_classes; i++) {
        h->classes[i].size = cuh_sizeclass_size(i);
        h->classes[i].slab_bytes = cuh_sizeclass_slab_bytes(i);
    }
    return h;
}

void cuh_heap_destroy(cuh_heap_t *h)
{
    if (!h)
        return;
    cuh_hp_tcaches_orphan(h);
    for (uint32_t i = 0; i < h->num_streams; i++) {
        stream_state_t *st = h->streams[i];
        for (size_t f = 0; f < st->num_fences; f++)
            h->dev->ops->event_destroy(h->dev, st->fences[f].event);
        for (unsigned c = 0; c < CUH_MAX_CLASSES; c++)
            free(st->small[c].entries);
        free(st->fences);
        free(st);
    }
    for (size_t k = 0; k < h->num_holds; k++) {
        for (size_t i = 0; i < h->holds[k]->num_events; i++)
            h->dev->ops->event_destroy(h->dev, h->holds[k]->events[i]);
        free(h->holds[k]);
    }
    free(h->holds);
    free(h->pools_to_release);
    if (h->open_batch) {
        h->open_batch->next = h->closed_batches;
        h->closed_batches = h->open_batch;
    }
    for (free_batch_t *batch = h->closed_batches, *next; batch; batch = next) {
        next = batch->next;
        for (size_t i = 0; i < batch->num_events; i++)
            h->dev->ops->event_destroy(h->dev, batch->events[i]);
        free(batch->events);
        free(batch->event_streams);
        free(batch->entries);
        free(batch);
    }
    for (size_t i = 0; i <= h->uses.mask; i++)
        if (h->uses.slots[i].key)
            free(h->uses.slots[i].value);
    cuh_ptrmap_destroy(&h->held);
    cuh_ptrmap_destroy(&h->uses);
    cuh_ptrmap_destroy(&h->graph);
    for (size_t i = 0; i < h->num_spare_events; i++)
        h->dev->ops->event_destroy(h->dev, h->spare_events[i]);
    for (cuh_segment_t *s = h->arena.segments; s; s = s->next) {
        for (cuh_extent_t *e = s->first; e; e = e->next)
            if (e->state == CUH_EXTENT_SLAB)
                cuh_slab_destroy(e->owner);
        if (s->virtual_space) {
            for (vm_drain_t *d = h->drains, *next; d; d = next) {
                next = d->next;
                for (size_t i = 0; i < d->num_extents; i++)
                    cuh_hp_unmap_drain_locked(h, d->extents[i]);
                if (d->event)
                    h->dev->ops->event_destroy(h->dev, d->event);
                free(d);
            }
            h->drains = NULL;
            for (size_t p = 0; p < h->pages_high; p++)
                if (h->page_handle[p]) {
                    h->dev->ops->vm_unmap(h->dev, cuh_hp_page_va(h, p), h->vm_page);
                    h->dev->ops->vm_release(h->dev, h->page_handle[p]);
                }
            h->dev->ops->vm_unreserve(h->dev, s->base, s->size);
        } else {
            h->dev->ops->mem_free(h->dev, s->base, s->size);
        }
    }
    free(h->page_handle);
    free(h->page_mapped);
    free(h->page_gen);
    cuh_arena_destroy(&h->arena);
    cuh_ptrmap_destroy(&h->blocks);
    cuh_pagemap_destroy(&h->pages);
    free(h->streams);
    free(h->spare_events);
    for (size_t i = 0; i < h->num_unsettled; i++)
        h->dev->ops->event_destroy(h->dev, h->unsettled[i].event);
    free(h->unsettled);
    for (size_t i = 0; i < h->num_gen_events; i++)
        h->dev->ops->event_destroy(h->dev, h->gen_events[i].event);
    for (cuh_heap_fence_t *f = h->fences, *next; f; f = next) {
        next = f->next;
        for (size_t i = 0; i < f->num_events; i++)
            h->dev->ops->event_destroy(h->dev, f->events[i]);
        free(f);
    }
    free(h);
}

/* At first use: the virtual-memory reservation (vmm:1), then the workspace. A
 * workspace the device cannot give is reported on stderr once and the heap
 * runs without it. */
static void start_locked(cuh_heap_t *h)
{
    h->started = 1;
    if (h->cfg.vmm)
        cuh_hp_start_vm_locked(h);
    if (!h->cfg.workspace)
        return;
    uintptr_t base = 0;
    cuh_dev_status_t rc = h->dev->ops->mem_alloc(h->dev, h->cfg.workspace, &base);
    if (rc == CUH_DEV_OK) {
        h->workspace = cuh_arena_add_segment(&h->arena, base, h->cfg.workspace, CUH_REGION_WORKSPACE);
        if (h->workspace) {
            h->num_segment_allocs++;
            cuh_hp_refresh_stats_locked(h);
            return;
        }
        h->dev->ops->mem_free(h->dev, base, h->cfg.workspace);
    }
    size_t free_bytes = 0, total = 0;
    h->dev->ops->mem_info(h->dev, &free_bytes, &total);
    char a[32], b[32];
    cuh_log("device %d: could not preallocate workspace:%s (the device has %s free); running without a "
            "workspace",
            h->dev->ordinal, cuh_format_bytes(a, sizeof a, h->cfg.workspace),
            cuh_format_bytes(b, sizeof b, free_bytes));
}

/* Allocates for stream `stream`, or for every stream at once (device_wide). */
static cuheap_status_t heap_malloc(cuh_heap_t *h, size_t size, int device_wide, int shareable, cuh_stream_t stream,
                                   uintptr_t *addr)
{
    *addr = 0;
    if (size == 0)
        return CUHEAP_OK;
    if (size > ((size_t)1 << 60)) {
        cuh_set_error("request of %zu bytes is larger than any device", size);
        return CUHEAP_ERR_OUT_OF_MEMORY;
    }
    if (!device_wide && (*addr = cuh_hp_tcache_alloc(h, size, stream)))
        return CUHEAP_OK;
    cuh_hp_heap_lock(h);
    if (cuh_unlikely(!h->started))
        start_locked(h);
    cuheap_status_t status;
    stream_state_t *st = device_wide ? &h->device_wide : cuh_hp_stream_get_locked(h, stream);
    if (cuh_unlikely(h->parked != NULL || h->large_tcs != NULL) && !device_wide && st && size > h->cfg.small_max) {
        cuh_extent_t *e = cuh_hp_take_parked_locked(h, st, size);
        if (e) {
            e->tag = st->tag;
            h->num_cache_hits++;
            h->num_allocs++;
            *addr = e->addr;
            cuh_hp_refresh_stats_locked(h);
            cuh_unlock(&h->lock);
            return CUHEAP_OK;
        }
    }
    cuh_hp_unpark_locked(h);
    h->shareable_call = shareable;
    if (!st) {
        cuh_set_error("out of host memory for stream records");
        status = CUHEAP_ERR_OUT_OF_MEMORY;
    } else if (size <= h->cfg.small_max && !cuh_hp_own_segment_locked(h)) {
        status = cuh_hp_small_alloc_locked(h, st, size, addr);
    } else {
        status = large_alloc_locked(h, st, size, addr);
    }
    h->shareable_call = 0;
    if (status == CUHEAP_OK) {
        h->num_allocs++;
        /* A block allocated during a capture belongs to the graph's pool: its
         * replays write it even after the program frees it. */
        if (cuh_unlikely(h->captures) &&
            cuh_ptrmap_insert(&h->graph, *addr, (void *)(uintptr_t)h->capture_pool)) {
            cuh_set_error("out of host memory for graph pool records");
            status = CUHEAP_ERR_OUT_OF_MEMORY;
        }
    }
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
    return status;
}

cuheap_status_t cuh_heap_malloc(cuh_heap_t *h, size_t size, cuh_stream_t stream, uintptr_t *addr)
{
    return heap_malloc(h, size, 0, 0, stream, addr);
}

cuheap_status_t cuh_heap_malloc_device_wide(cuh_heap_t *h, size_t size, uintptr_t *addr)
{
    return heap_malloc(h, size, 1, 0, 0, addr);
}

cuheap_status_t cuh_heap_malloc_shareable(cuh_heap_t *h, size_t size, uintptr_t *addr)
{
    return heap_malloc(h, size, 1, 1, 0, addr);
}

/* Explains an address that is neither a live block nor a slab object. */
static cuheap_status_t diagnose_free_locked(cuh_heap_t *h, uintptr_t addr)
{
    cuh_segment_t *seg = cuh_arena_segment_of(&h->arena, addr);
    if (!seg) {
        cuh_set_error("0x%llx was not allocated by cuheap on device %d", (unsigned long long)addr, h->dev->ordinal);
        return CUHEAP_ERR_NOT_OWNED;
    }
    const cuh_extent_t *e = seg->first;
    while (e && !(addr >= e->addr && addr < e->addr + e->size))
        e = e->next;
    if (e && e->state == CUH_EXTENT_FREE) {
        cuh_set_error("double free: 0x%llx on device %d is already free", (unsigned long long)addr, h->dev->ordinal);
        return CUHEAP_ERR_DOUBLE_FREE;
    }
    cuh_set_error("0x%llx is inside a live block of %zu bytes at 0x%llx on device %d, not its start (freed "
                  "twice after reuse, or a pointer into a block?)",
                  (unsigned long long)addr, e ? e->size : 0, (unsigned long long)(e ? e->addr : 0), h->dev->ordinal);
    return CUHEAP_ERR_INVALID_ARGUMENT;
}

/* Finds the live block at addr; an error status (message set) if there is
 * none: already free, held back, inside a block, or not cuheap's. */
cuheap_status_t cuh_hp_find_live_locked(cuh_heap_t *h, uintptr_t addr, live_block_t *b)
{
    memset(b, 0, sizeof *b);
    if (cuh_unlikely(h->held.count) && cuh_ptrmap_get(&h->held, addr)) {
        cuh_set_error("double free: 0x%llx on device %d was already freed (it waits for GPU work before reuse)",
                      (unsigned long long)addr, h->dev->ordinal);
        return CUHEAP_ERR_DOUBLE_FREE;
    }
    cuh_slab_t *s = h->last_slab;
    if (!s || addr - s->base >= s->span) {
        if ((b->ext = cuh_ptrmap_get(&h->blocks, addr))) {
            if (cuh_unlikely(b->ext == h->parked)) {
                cuh_set_error("double free: 0x%llx on device %d is already free", (unsigned long long)addr,
                              h->dev->ordinal);
                return CUHEAP_ERR_DOUBLE_FREE;
            }
            if (cuh_unlikely(b->ext->owner != NULL)) {
                cuheap_status_t status = cuh_hp_large_slot_take_back_locked(h, b->ext);
                if (status != CUHEAP_OK)
                    return status;
            }
            b->size = b->ext->size;
            b->requested = b->ext->requested;
            return CUHEAP_OK;
        }
        if (!(s = cuh_hp_slab_of_locked(h, addr)))
            return diagnose_free_locked(h, addr);
    }
    int64_t idx = cuh_slab_index(s, addr);
    if (idx < 0) {
        cuh_set_error("0x%llx is inside a slab of %zu-byte objects but not at an object's start",
                      (unsigned long long)addr, s->obj_size);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    if (!cuh_slab_bit(s->live, (uint32_t)idx)) {
        cuh_set_error("double free: 0x%llx (%zu-byte object) on device %d is already free", (unsigned long long)addr,
                      s->obj_size, h->dev->ordinal);
        return CUHEAP_ERR_DOUBLE_FREE;
    }
    if (cuh_unlikely(cuh_slab_bit(s->tcached, (uint32_t)idx))) {
        cuheap_status_t status = cuh_hp_tcache_take_locked(h, s, addr);
        if (status != CUHEAP_OK)
            return status;
    }
    b->slab = s;
    b->index = (uint32_t)idx;
    b->size = s->obj_size;
    b->requested = s->requested[idx];
    return CUHEAP_OK;
}

/* Turns a live block into st's private free memory (the statistics of
 * requested and allocated bytes are the caller's). */
void cuh_hp_release_block_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr, stream_state_t *st)
{
    if (b->ext) {
        cuh_segment_t *seg = b->ext->segment;
        cuh_ptrmap_remove(&h->blocks, addr);
        cuh_arena_release(&h->arena, b->ext, st->tag);
        cuh_hp_fence_if_left_idle_locked(h, st, seg, seg->used_bytes);
        return;
    }
    cuh_slab_t *s = b->slab;
    cuh_slab_clear(s->live, b->index);
    s->num_live--;
    if (cuh_hp_cache_small_locked(h, st, s, addr) == 0)
        return;
    /* No room to cache it: make it safe for everyone the slow way. */
    cuh_hp_wait_for_stream_locked(h, st);
    cuh_hp_slab_object_home_locked(h, addr);
}

/* ---- device-wide frees -------------------------------------------------------------- */

/* Turns a live block into global free memory: the caller knows no work on
 * any stream can still touch it. */
static void release_block_global_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr)
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
        if (cuh_hp_unhold_locked(h, x->addr, x->size, x->requested, &b))
            release_block_global_locked(h, &b, x->addr);
    }
    for (size_t i = 0; i < batch->num_events; i++)
        cuh_hp_event_put_locked(h, batch->events[i]);
    free(batch->events);
    free(batch->event_streams);
    free(batch->entries);
    free(batch);
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
    h->closed_at = cuh_hp_seconds_since(&h->born);
    batch->events = malloc((h->num_streams + 1) * sizeof *batch->events);
    batch->event_streams = malloc((h->num_streams + 1) * sizeof *batch->event_streams);
    int synced = !batch->events || !batch->event_streams;
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

/* Adds a block to the open batch. -1 when host memory runs out. */
static int batch_add_locked(cuh_heap_t *h, uintptr_t addr, size_t size, size_t requested)
{
    free_batch_t *batch = h->open_batch;
    if (!batch && !(batch = h->open_batch = calloc(1, sizeof *batch)))
        return -1;
    if (batch->num_entries == batch->cap_entries) {
        size_t cap = batch->cap_entries ? 2 * batch->cap_entries : 64;
        batch_entry_t *grown = realloc(batch->entries, cap * sizeof *grown);
        if (!grown)
            return -1;
        batch->entries = grown;
        batch->cap_entries = cap;
    }
    if (cuh_ptrmap_insert(&h->held, addr, batch))
        return -1;
    batch->entries[batch->num_entries++] = (batch_entry_t){addr, size, requested};
    h->held_bytes += size;
    h->held_requested += requested;
    return 0;
}

cuheap_status_t cuh_heap_free_device_wide(cuh_heap_t *h, uintptr_t addr)
{
    if (!addr)
        return CUHEAP_OK;
    cuh_lock(&h->lock);
    cuh_hp_unpark_locked(h);
    live_block_t b;
    cuheap_status_t status = cuh_hp_find_live_locked(h, addr, &b);
    if (status == CUHEAP_OK) {
        cuh_hp_stat_set(&h->requested, h->requested.current - b.requested);
        cuh_hp_stat_set(&h->allocated, h->allocated.current - b.size);
        h->num_frees++;
        /* Streams that record_stream named must be covered by the batch's
         * events: make sure the heap knows them. */
        use_list_t *uses = h->uses.count ? cuh_ptrmap_remove(&h->uses, addr) : NULL;
        for (size_t i = 0; uses && i < uses->count; i++)
            cuh_hp_stream_get_locked(h, uses->streams[i]);
        free(uses);
        stream_state_t *st0 = NULL;
        int graph = h->captures || (h->graph.count && cuh_ptrmap_get(&h->graph, addr));
        if (graph && (st0 = cuh_hp_stream_get_locked(h, 0)) &&
            cuh_hp_maybe_hold_locked(h, addr, b.size, b.requested, st0)) {
            /* held for its graph pool, freed when the pool is released */
        } else if (batch_add_locked(h, addr, b.size, b.requested)) {
            /* No room to track it: wait for the whole device instead. */
            if (!h->captures)
                cuh_hp_cpu_wait_device(h);
            release_block_global_locked(h, &b, addr);
        } else {
            cuh_hp_batches_poll_locked(h, 0);
        }
        if (cuh_unlikely(h->num_holds))
            cuh_hp_holds_poll_locked(h, 0);
    }
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
    return status;
}

cuheap_status_t cuh_heap_free(cuh_heap_t *h, uintptr_t addr, cuh_stream_t stream)
{
    if (!addr)
        return CUHEAP_OK;
    if (cuh_hp_tcache_free(h, addr, stream))
        return CUHEAP_OK;
    cuh_hp_heap_lock(h);
    cuh_hp_unpark_locked(h);
    cuheap_status_t status;
    live_block_t b;
    stream_state_t *st = cuh_hp_stream_get_locked(h, stream);
    if (!st) {
        cuh_set_error("out of host memory for stream records");
        status = CUHEAP_ERR_OUT_OF_MEMORY;
    } else if ((status = cuh_hp_find_live_locked(h, addr, &b)) == CUHEAP_OK) {
        cuh_hp_stat_set(&h->requested, h->requested.current - b.requested);
        cuh_hp_stat_set(&h->allocated, h->allocated.current - b.size);
        int held = cuh_unlikely(h->graph.count || h->captures || h->uses.count) &&
                   cuh_hp_maybe_hold_locked(h, addr, b.size, b.requested, st);
        if (held || (b.slab && cuh_hp_tcache_adopt_locked(h, &b, addr, stream))) {
            /* held, or in this thread's cache */
        } else if (b.ext && !h->captures && !h->cfg.ipc_safe) {
            if (!cuh_hp_large_slot_adopt_locked(h, &b, st, stream))
                cuh_hp_park_locked(h, &b, st);
        } else {
            cuh_hp_release_block_locked(h, &b, addr, st);
        }
        h->num_frees++;
        if (cuh_unlikely(h->num_holds))
            cuh_hp_holds_poll_locked(h, 0);
        if (cuh_unlikely(h->closed_batches != NULL))
            cuh_hp_batches_poll_locked(h, 0);
    }
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
    return status;
}

void cuh_heap_set_limit(cuh_heap_t *h, size_t limit)
{
    cuh_lock(&h->lock);
    cuh_hp_unpark_all_locked(h);
    h->limit = limit;
    if (limit && cuh_hp_reserved_bytes(h) > limit && !h->captures) {
        cuh_hp_settle_all_locked(h);
        cuh_hp_release_free_segments_locked(h);
    }
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
}

size_t cuh_heap_device_total(cuh_heap_t *h) { return h->device_total; }

int cuh_heap_segment_of(cuh_heap_t *h, uintptr_t addr, uintptr_t *base, size_t *size)
{
    cuh_lock(&h->lock);
    cuh_segment_t *seg = cuh_arena_segment_of(&h->arena, addr);
    if (seg) {
        *base = seg->base;
        *size = seg->size;
    }
    cuh_unlock(&h->lock);
    return seg != NULL;
}

void cuh_heap_poll(cuh_heap_t *h)
{
    cuh_lock(&h->lock);
    cuh_hp_poll_all_locked(h, 0);
    if (h->drains)
        cuh_hp_drains_poll_locked(h, 0);
    /* Whoever polls wants to see freed memory come back (cudaMemGetInfo
     * counts it as free): the open batch goes out, at most once a
     * millisecond (libraries may ask for memory info often), or a program
     * that frees and then waits for free memory would wait for ever. */
    if (!h->closed_batches && h->open_batch && cuh_hp_seconds_since(&h->born) - h->closed_at >= POLL_CLOSE_SECONDS)
        cuh_hp_batch_close_locked(h);
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
}

int cuh_heap_owns(cuh_heap_t *h, uintptr_t addr)
{
    cuh_lock(&h->lock);
    int owns = cuh_arena_segment_of(&h->arena, addr) != NULL;
    cuh_unlock(&h->lock);
    return owns;
}

size_t cuh_heap_block_size(cuh_heap_t *h, uintptr_t addr)
{
    size_t size = 0;
    cuh_lock(&h->lock);
    cuh_extent_t *e = cuh_ptrmap_get(&h->blocks, addr);
    cuh_slab_t *s;
    if (e && e->owner) {
        /* A thread's cache keeps the request of the block it handed out. */
        cuh_tcache_t *tc = e->owner;
        cuh_spin_lock(&tc->lock);
        size = tc->large.state == CUH_TC_LIVE ? tc->large.requested : 0;
        cuh_spin_unlock(&tc->lock);
    } else if (e) {
        size = e == h->parked ? 0 : e->requested;
    } else if ((s = cuh_pagemap_get(&h->pages, addr))) {
        int64_t i = cuh_slab_index(s, addr);
        if (i >= 0 && cuh_slab_bit(s->live, (uint32_t)i))
            size = s->requested[i];
        /* A thread cache keeps the request of an object it handed out. */
        for (cuh_tcache_t *tc = h->tcaches; i >= 0 && cuh_slab_bit(s->tcached, (uint32_t)i) && tc; tc = tc->heap_next) {
            cuh_spin_lock(&tc->lock);
            const cuh_tc_entry_t *te = cuh_tcache_find(tc, addr);
            if (te)
                size = te->state == CUH_TC_LIVE ? te->requested : 0;
            cuh_spin_unlock(&tc->lock);
        }
    }
    cuh_unlock(&h->lock);
    return size;
}

/* During a graph capture nothing goes back: freeing device memory (or
 * waiting for the frees before it) would invalidate the capture. */
cuheap_status_t cuh_heap_release_cached(cuh_heap_t *h)
{
    cuh_lock(&h->lock);
    cuh_hp_unpark_all_locked(h);
    cuh_hp_settle_all_locked(h);
    if (!h->captures)
        cuh_hp_release_free_segments_locked(h);
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
    return CUHEAP_OK;
}

cuh_device_t *cuh_heap_device(cuh_heap_t *h) { return h->dev; }
