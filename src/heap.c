/* heap.c - one device's heap, its front: the public heap API, a request's
 * path through it (malloc, free, device-wide free), the allocation ladder,
 * and the heap's creation and end. The rooms behind it, one concern each,
 * are mapped in heap_internal.h.
 *
 * Rules kept here (heap.h): every block is aligned to CUH_ALIGN (the ladder
 * is asked for that alignment, and for CUH_SLAB_PAGE by slabs, whose objects
 * are multiples of it); when the device or the limit refuses, the heap waits,
 * gives back, releases and retries before it reports out-of-memory (the
 * ladder below); a double free or a pointer the heap does not own is an
 * error that changes nothing (cuh_hp_find_live_locked); every function is
 * thread-safe (one lock, below).
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
 * Concurrency: one mutex per heap guards all of the heap. Functions whose
 * names end in _locked expect it held. In front of it, each thread has a
 * cache of small objects per heap (tcache.h, heap_tcache.c) that its
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

/* ---- the allocation ladder ----------------------------------------------------- */

/* An extent of `size` bytes aligned to `align` for stream st, or NULL after
 * the whole ladder with *status saying why; for an out-of-memory, *why says
 * what refused the last segment (the caller records the OOM). */
static cuh_extent_t *extent_alloc_once_locked(cuh_heap_t *h, stream_state_t *st, size_t size, size_t align,
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
    int tried_vm_take_back = 0, tried_page_aligned = 0, tried_private = 0;
    if (h->held_bytes && !cuh_hp_fences_per_stream_locked(h)) {
        if (state == CUH_EXTENT_SLAB) {
            cuh_hp_take_back_all_locked(h);
        } else if (cuh_hp_take_back_for_block_locked(h, st, size, align, &e) && e) {
            h->num_cache_hits++;
            return e;   /* the block cudaFree gave back, where the search would find it */
        }
    } else if (h->held_bytes >= size) {
        cuh_hp_batches_poll_locked(h, 0);   /* those the GPU has passed: no wait */
        if (h->held_bytes >= size &&
            h->num_allocs - h->allocs_at_take_back >= TAKE_BACK_EVERY * cuh_hp_covered_streams_locked(h))
            cuh_hp_take_back_all_locked(h);
    }
    e = cuh_hp_find_fit_locked(h, size, align, st->tag);
    if (cuh_likely(e != NULL))
        goto hit;
    if (h->chunk_call) {
        /* A chunk takes free memory (under vmm:1, address space it maps
         * pages behind, as far as the limit allows without waiting), and is
         * not made rather than grow a segment, wait, take back or give
         * back. */
        *status = CUHEAP_ERR_OUT_OF_MEMORY;
        return NULL;
    }
retry_after_take_back:
    if (cuh_hp_poll_all_locked(h, 0) && (e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;
    if (cuh_hp_fence_others_locked(h, st, size) && cuh_hp_poll_all_locked(h, 0) &&
        (e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;

    if (cuh_hp_take_back_all_locked(h) && (e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
        goto hit;
    if (!tried_private && (tried_private = 1, cuh_hp_take_private_locked(h, st, size)) &&
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
        } else if (h->held_bytes >= size && !tried_vm_take_back && !h->chunk_call) {
            /* Under vmm:1 a fit in unmapped address space is growth too:
             * memory cudaFree gave back comes first there as well. */
            tried_vm_take_back = 1;
            /* The extents may have merged: find the fit again. */
            if (cuh_hp_take_back_all_locked(h)) {
                if (!(e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
                    goto retry_after_take_back;
                goto hit;
            }
        } else if (!tried_private && !h->chunk_call && cuh_hp_may_take_private_locked(h, st, size)) {
            /* ... and so does other streams' private memory. */
            tried_private = 1;
            if (cuh_hp_take_private_locked(h, st, size) && !(e = cuh_hp_find_fit_locked(h, size, align, st->tag)))
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

cuh_extent_t *cuh_hp_extent_alloc_locked(cuh_heap_t *h, stream_state_t *st, size_t size, size_t align,
                                         cuh_extent_state_t state, cuheap_status_t *status, grow_result_t *why_out)
{
    cuh_extent_t *e = extent_alloc_once_locked(h, st, size, align, state, status, why_out);
    if (cuh_unlikely(!e && *status == CUHEAP_ERR_OUT_OF_MEMORY && cuh_hp_plan_in_force(h) && !h->captures &&
                     !h->chunk_call)) {
        /* A step plan's room may be what is missing: it goes back, and the
         * ladder runs once more (heap_plan.c). */
        cuh_hp_plan_drop_locked(h);
        e = extent_alloc_once_locked(h, st, size, align, state, status, why_out);
    }
    return e;
}

/* Counts large block e as handed out for a request of `size` bytes. */
void cuh_hp_large_mark_live_locked(cuh_heap_t *h, cuh_extent_t *e, size_t size)
{
    e->requested = size;
    h->marked_label = &e->label;
    h->marked_addr = e->addr;
    cuh_hp_stat_set(&h->requested, h->requested.current + size);
    cuh_hp_stat_set(&h->allocated, h->allocated.current + e->size);   /* > the rounded size only for an own segment */
}

cuheap_status_t cuh_hp_large_alloc_locked(cuh_heap_t *h, stream_state_t *st, size_t size, uintptr_t *addr)
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
    const int in_map = e == h->same_in_map;   /* handed out again as it was: in the map already */
    h->same_in_map = NULL;
    if (!in_map && cuh_ptrmap_insert(&h->blocks, e->addr, e)) {
        cuh_arena_release(&h->arena, e, st->tag);
        cuh_set_error("out of host memory for the block map");
        return CUHEAP_ERR_OUT_OF_MEMORY;
    }
    cuh_hp_large_mark_live_locked(h, e, size);
    *addr = e->addr;
    return CUHEAP_OK;
}

/* Heap ids, never the same twice in a process: a thread cache knows its heap
 * by address and id (tcache.h, heap_id), and a new heap may get a destroyed
 * one's address. */
static _Atomic uint64_t next_heap_id = 1;

/* ---- public heap API -------------------------------------------------------------- */

cuh_heap_t *cuh_heap_create(cuh_device_t *dev, const cuh_config_t *cfg, char *err, size_t errlen)
{
    size_t free_bytes = 0, total = 0;
    if (dev->ops->mem_info(dev, &free_bytes, &total) != CUH_DEV_OK) {
        snprintf(err, errlen, "device %d: reading its memory size failed: %s", dev->ordinal, cuh_dev_error_text(dev));
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
    h->keep_class = CUH_MAX_CLASSES;
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
    /* Blocks threads' slots hold go back to the batches freed below. */
    cuh_hp_lock(h);
    cuh_unlock(&h->lock);
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
        cuh_hp_batch_free(batch);
    }
    cuh_hp_batch_free(h->spare_batch);
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
                    cuh_hp_keep_drain_locked(h, d->extents[i]);   /* unmapped below with the other kept ones */
                if (d->event)
                    h->dev->ops->event_destroy(h->dev, d->event);
                free(d);
            }
            h->drains = NULL;
            cuh_hp_unmap_all_units_locked(h);
            h->dev->ops->vm_unreserve(h->dev, s->base, s->size);
        } else {
            h->dev->ops->mem_free(h->dev, s->base, s->size);
        }
    }
    free(h->page_handle);
    free(h->page_mapped);
    free(h->page_gen);
    free(h->drain_head);
    free(h->drain_handle);
    free(h->kept_handle);
    free(h->kept_head);
    cuh_hp_plan_free_records(h);
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

/* A device that met a sticky error (its context is lost: CUDA answers every
 * call with that error from then on): the heap refuses allocations and
 * frees with the device's error and changes nothing, so that the program
 * hears what CUDA would tell it; its books and reports stay as they were. */
static cuheap_status_t refuse_lost(cuh_heap_t *h)
{
    int code = atomic_load_explicit(&h->dev->lost, memory_order_relaxed);
    cuh_note_lost(code);
    cuh_set_error("device %d is lost (error %d, a sticky error: %s): cuheap refuses new work; reports can still be "
                  "written", h->dev->ordinal, code,
                  cuh_dev_lost_text(h->dev)[0] ? cuh_dev_lost_text(h->dev) : "no message");
    return CUHEAP_ERR_DEVICE;
}

/* The device was lost while a malloc found its block (a synchronize failed,
 * or a sticky error struck): that block may not be known free on the GPU,
 * and no kernel will run on the device again. The block goes back at once,
 * and the call answers with the device's error, as CUDA would. */
static cuheap_status_t lost_during_malloc_locked(cuh_heap_t *h, uintptr_t *addr)
{
    live_block_t b;
    if (cuh_hp_find_live_locked(h, *addr, &b) == CUHEAP_OK) {
        cuh_hp_stat_set(&h->requested, h->requested.current - b.requested);
        cuh_hp_stat_set(&h->allocated, h->allocated.current - b.size);
        cuh_hp_release_block_global_locked(h, &b, *addr);
    }
    *addr = 0;
    return refuse_lost(h);
}

/* How heap_malloc allocates: for every stream at once, and then with a
 * segment of its own (cuh_heap_malloc_shareable). Flags rather than two
 * arguments: a seventh would go on the stack, on every malloc. */
enum { MALLOC_DEVICE_WIDE = 1, MALLOC_SHAREABLE = 2 };

/* Allocates for stream `stream`, or for every stream at once, a block
 * labelled `label` (0: none; only under the lock, never from a thread's
 * cache). */
static cuheap_status_t heap_malloc(cuh_heap_t *h, size_t size, unsigned how, cuh_stream_t stream, unsigned label,
                                   uintptr_t *addr)
{
    const int device_wide = (how & MALLOC_DEVICE_WIDE) != 0, shareable = (how & MALLOC_SHAREABLE) != 0;
    *addr = 0;
    if (cuh_unlikely(atomic_load_explicit(&h->dev->lost, memory_order_relaxed)))
        return refuse_lost(h);
    if (size == 0)
        return CUHEAP_OK;
    if (size > ((size_t)1 << 60)) {
        cuh_set_error("request of %zu bytes is larger than any device", size);
        return CUHEAP_ERR_OUT_OF_MEMORY;
    }
    int waited = cuh_hp_heap_lock(h);
    h->marked_label = NULL;   /* only a block counted live by this call takes its label */
    if (cuh_unlikely(!h->started))
        start_locked(h);
    cuheap_status_t status;
    stream_state_t *st = device_wide ? &h->device_wide : cuh_hp_stream_get_locked(h, stream);
    if (cuh_unlikely(h->parked != NULL || h->large_tcs != NULL) && !device_wide && st && size > h->cfg.small_max) {
        /* The block parked or held for this size and stream (heap_tcache.c). */
        cuh_extent_t *e = cuh_hp_take_parked_locked(h, st, size);
        if (e) {
            e->tag = st->tag;
            e->label = (uint8_t)label;
            if (cuh_unlikely(h->cfg.step_plan))
                cuh_hp_plan_note_alloc_locked(h, e, stream, size);
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
    } else if (cuh_unlikely(h->contended) && !device_wide && !label && !h->cfg.step_plan &&
               (*addr = cuh_hp_chunk_alloc_locked(h, st, stream, size, waited))) {
        status = CUHEAP_OK;   /* cut from a new chunk of this thread's (heap_chunks.c) */
    } else if (cuh_unlikely(h->cfg.step_plan)) {
        status = cuh_hp_plan_alloc_locked(h, st, stream, device_wide, size, addr);   /* heap_plan.c */
    } else {
        status = cuh_hp_large_alloc_locked(h, st, size, addr);
    }
    h->shareable_call = 0;
    if (cuh_unlikely(atomic_load_explicit(&h->dev->lost, memory_order_relaxed)) && status == CUHEAP_OK)
        status = lost_during_malloc_locked(h, addr);
    /* Every block a labelled malloc can hand out was counted live by this
     * call, which left where its label goes (the parked one, above, takes
     * it there): no lookup. */
    if (status == CUHEAP_OK && label && h->marked_label && h->marked_addr == *addr)
        *h->marked_label = (uint8_t)label;
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
    /* The thread's cache first, without the lock (heap_malloc checks the
     * rest: a lost device, a size of 0 or larger than any device). */
    if (cuh_likely(size - 1 < ((size_t)1 << 60)) &&
        cuh_likely(!atomic_load_explicit(&h->dev->lost, memory_order_relaxed)) &&
        (*addr = cuh_hp_tcache_alloc(h, size, stream)))
        return CUHEAP_OK;
    return heap_malloc(h, size, 0, stream, 0, addr);
}

/* A device-wide malloc's block from the cudaFree'd block this thread's
 * slot holds, without the lock (heap_tcache.c, "a thread's cudaFree'd
 * block"); 0 if none. Called only where some slot holds one. */
static __attribute__((noinline)) uintptr_t malloc_device_wide_fast(cuh_heap_t *h, size_t size, unsigned label)
{
    if (size - 1 >= ((size_t)1 << 60) || atomic_load_explicit(&h->dev->lost, memory_order_relaxed))
        return 0;
    return cuh_hp_tcache_alloc_device_wide(h, size, label);
}

/* Whether a thread's slot holds a cudaFree'd block: the fast paths' test. */
static inline int device_wide_slots(const cuh_heap_t *h)
{
    return atomic_load_explicit(&h->device_wide_slots, memory_order_relaxed) != 0;
}

cuheap_status_t cuh_heap_malloc_device_wide(cuh_heap_t *h, size_t size, uintptr_t *addr)
{
    if (cuh_unlikely(device_wide_slots(h)) && (*addr = malloc_device_wide_fast(h, size, 0)))
        return CUHEAP_OK;
    return heap_malloc(h, size, MALLOC_DEVICE_WIDE, 0, 0, addr);
}

cuheap_status_t cuh_heap_malloc_shareable(cuh_heap_t *h, size_t size, uintptr_t *addr)
{
    return heap_malloc(h, size, MALLOC_DEVICE_WIDE | MALLOC_SHAREABLE, 0, 0, addr);
}

cuheap_status_t cuh_heap_malloc_labelled(cuh_heap_t *h, size_t size, int device_wide, int shareable,
                                         cuh_stream_t stream, unsigned label, uintptr_t *addr)
{
    if (label > UINT8_MAX) {
        *addr = 0;
        cuh_set_error("label %u is over %d", label, UINT8_MAX);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    if (cuh_unlikely(device_wide_slots(h)) && device_wide && !shareable &&
        (*addr = malloc_device_wide_fast(h, size, label)))
        return CUHEAP_OK;
    const unsigned how = device_wide ? MALLOC_DEVICE_WIDE | (shareable ? MALLOC_SHAREABLE : 0) : 0;
    return heap_malloc(h, size, how, stream, label, addr);
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

/* A free of a block that an earlier free left waiting for GPU work (held:
 * in the held map, or in a batch by its own held mark). */
static cuheap_status_t held_double_free(const cuh_heap_t *h, uintptr_t addr)
{
    cuh_set_error("double free: 0x%llx on device %d was already freed (it waits for GPU work before reuse)",
                  (unsigned long long)addr, h->dev->ordinal);
    return CUHEAP_ERR_DOUBLE_FREE;
}

/* Finds the live block at addr; an error status (message set) if there is
 * none: already free, held back, inside a block, or not cuheap's. */
cuheap_status_t cuh_hp_find_live_locked(cuh_heap_t *h, uintptr_t addr, live_block_t *b)
{
    memset(b, 0, sizeof *b);
    /* A block of a thread's chunk reaches the lock path (freed on another
     * stream or by another thread, record_stream, a double free): the
     * chunks go back, and the heap judges it as its own block. */
    if (cuh_unlikely(h->num_chunks)) {
        cuh_extent_t *e = cuh_ptrmap_get(&h->blocks, addr);
        if ((e && e->chunked) || (!e && !cuh_hp_slab_of_locked(h, addr)))
            cuh_hp_chunk_dissolve_at_locked(h, addr);
    }
    if (cuh_unlikely(h->held.count) && cuh_ptrmap_get(&h->held, addr))
        return held_double_free(h, addr);
    cuh_slab_t *s = h->last_slab;
    if (!s || addr - s->base >= s->span) {
        if ((b->ext = cuh_ptrmap_get(&h->blocks, addr))) {
            if (cuh_unlikely(b->ext->held))
                return held_double_free(h, addr);
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
            b->label = b->ext->label;
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
    if (cuh_unlikely(cuh_slab_bit(s->held, (uint32_t)idx)))
        return held_double_free(h, addr);
    if (cuh_unlikely(cuh_slab_bit(s->tcached, (uint32_t)idx))) {
        cuheap_status_t status = cuh_hp_tcache_take_locked(h, s, addr);
        if (status != CUHEAP_OK)
            return status;
    }
    b->slab = s;
    b->index = (uint32_t)idx;
    b->size = s->obj_size;
    b->requested = s->requested[idx];
    b->label = s->labels[idx];
    return CUHEAP_OK;
}

/* A block being freed gives its label and requested bytes to `freed` (if
 * any), and its record forgets the label: a later holder of the memory
 * that came by a path that sets none (a thread's cache) must not inherit it. */
static void hand_back_label(const live_block_t *b, cuh_heap_freed_t *freed)
{
    if (freed) {
        freed->requested = b->requested;
        freed->label = b->label;
    }
    if (b->ext)
        b->ext->label = 0;
    else if (b->slab)
        b->slab->labels[b->index] = 0;
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

static cuheap_status_t heap_free_device_wide(cuh_heap_t *h, uintptr_t addr, cuh_heap_freed_t *freed)
{
    if (!addr)
        return CUHEAP_OK;
    if (cuh_unlikely(atomic_load_explicit(&h->dev->lost, memory_order_relaxed)))
        return refuse_lost(h);
    if (cuh_unlikely(device_wide_slots(h)) && cuh_hp_tcache_free_device_wide(h, addr, freed))
        return CUHEAP_OK;
    cuh_hp_lock(h);
    cuh_hp_unpark_locked(h);
    live_block_t b;
    cuheap_status_t status = cuh_hp_find_live_locked(h, addr, &b);
    if (status == CUHEAP_OK) {
        hand_back_label(&b, freed);
        if (cuh_unlikely(h->cfg.step_plan) && b.ext)
            cuh_hp_plan_note_free_locked(h, b.ext, 0, 1);
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
        } else if (cuh_hp_batch_add_locked(h, addr, &b)) {
            /* No room to track it: wait for the whole device instead. */
            if (!h->captures)
                cuh_hp_cpu_wait_device(h);
            cuh_hp_release_block_global_locked(h, &b, addr);
        } else if (b.ext || cuh_hp_fences_per_stream_locked(h) ||
                   h->open_batch->bytes > cuh_hp_free_slack_locked(h) / 2) {
            /* A block's free fences at once (its next cudaMalloc takes it
             * back, and finds the fence done sooner); small objects' once
             * over half the slack is freed, not per free. */
            cuh_hp_batches_poll_locked(h, 0);
        }
        if (cuh_unlikely(h->num_holds))
            cuh_hp_holds_poll_locked(h, 0);
    }
    cuh_hp_refresh_stats_locked(h);
    /* After the statistics, which count it freed: a block the next
     * cudaMalloc of its size would take again waits in this thread's slot
     * (heap_tcache.c, "a thread's cudaFree'd block"). */
    if (status == CUHEAP_OK && b.ext && h->cfg.thread_cache)
        cuh_hp_device_wide_slot_adopt_locked(h, b.ext);
    cuh_unlock(&h->lock);
    return status;
}

static cuheap_status_t heap_free(cuh_heap_t *h, uintptr_t addr, cuh_stream_t stream, cuh_heap_freed_t *freed)
{
    if (!addr)
        return CUHEAP_OK;
    if (cuh_unlikely(atomic_load_explicit(&h->dev->lost, memory_order_relaxed)))
        return refuse_lost(h);
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
        hand_back_label(&b, freed);
        cuh_hp_stat_set(&h->requested, h->requested.current - b.requested);
        cuh_hp_stat_set(&h->allocated, h->allocated.current - b.size);
        if (cuh_unlikely(h->cfg.step_plan) && b.ext)
            cuh_hp_plan_note_free_locked(h, b.ext, stream, 0);
        int held = cuh_unlikely(h->graph.count || h->captures || h->uses.count) &&
                   cuh_hp_maybe_hold_locked(h, addr, b.size, b.requested, st);
        if (held || (b.slab && cuh_hp_tcache_adopt_locked(h, &b, addr, stream))) {
            /* held, or in this thread's cache */
        } else if (cuh_unlikely(cuh_hp_plan_in_force(h)) && b.ext) {
            /* With a step plan in force: back to its room, or to the arena,
             * never parked (a take the plan did not place). */
            if (!cuh_hp_plan_room_locked(h, &b, addr, stream))
                cuh_hp_release_block_locked(h, &b, addr, st);
        } else if (b.ext && !h->captures && !h->cfg.ipc_safe) {
            /* With step_plan never held by a thread, whose takes take no
             * lock and so are not recorded; parked, the take recorded
             * (heap_malloc). */
            if (h->cfg.step_plan || !cuh_hp_large_slot_adopt_locked(h, &b, st, stream))
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

cuheap_status_t cuh_heap_free(cuh_heap_t *h, uintptr_t addr, cuh_stream_t stream)
{
    return heap_free(h, addr, stream, NULL);
}

cuheap_status_t cuh_heap_free_device_wide(cuh_heap_t *h, uintptr_t addr)
{
    return heap_free_device_wide(h, addr, NULL);
}

cuheap_status_t cuh_heap_free_labelled(cuh_heap_t *h, uintptr_t addr, int device_wide, cuh_stream_t stream,
                                       cuh_heap_freed_t *freed)
{
    *freed = (cuh_heap_freed_t){0, 0};
    return device_wide ? heap_free_device_wide(h, addr, freed) : heap_free(h, addr, stream, freed);
}

void cuh_heap_set_limit(cuh_heap_t *h, size_t limit)
{
    cuh_hp_lock(h);
    cuh_hp_unpark_all_locked(h);
    h->limit = limit;
    if (limit && cuh_hp_reserved_bytes(h) > limit && !h->captures) {
        cuh_hp_plan_drop_locked(h);   /* its room may be what is over */
        cuh_hp_settle_all_locked(h);
        cuh_hp_release_free_segments_locked(h);
    }
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
}

size_t cuh_heap_device_total(cuh_heap_t *h) { return h->device_total; }

int cuh_heap_segment_of(cuh_heap_t *h, uintptr_t addr, uintptr_t *base, size_t *size)
{
    cuh_hp_lock(h);
    cuh_segment_t *seg = cuh_arena_segment_of(&h->arena, addr);
    if (seg) {
        *base = seg->base;
        *size = seg->size;
    }
    cuh_unlock(&h->lock);
    return seg != NULL;
}

int cuh_heap_in_virtual_memory(cuh_heap_t *h, uintptr_t addr)
{
    cuh_hp_lock(h);
    cuh_segment_t *seg = cuh_arena_segment_of(&h->arena, addr);
    int in = seg && seg->virtual_space;
    cuh_unlock(&h->lock);
    return in;
}

void cuh_heap_poll(cuh_heap_t *h)
{
    cuh_hp_lock(h);
    cuh_hp_poll_all_locked(h, 0);
    if (h->drains)
        cuh_hp_drains_poll_locked(h, 0);
    /* Whoever polls wants to see freed memory come back (cudaMemGetInfo
     * counts it as free): the open batch goes out, at most once a
     * millisecond from here (libraries may ask for memory info often), or a
     * program that frees and then waits for free memory would wait for ever.
     * The clock is read here only: a close at a cudaFree does not read it. */
    if (!h->closed_batches && h->open_batch) {
        const double now = cuh_hp_seconds_since(&h->born);
        if (now - h->poll_closed_at >= POLL_CLOSE_SECONDS) {
            h->poll_closed_at = now;
            cuh_hp_batch_close_locked(h);
        }
    }
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
}

int cuh_heap_owns(cuh_heap_t *h, uintptr_t addr)
{
    cuh_hp_lock(h);
    int owns = cuh_arena_segment_of(&h->arena, addr) != NULL;
    cuh_unlock(&h->lock);
    return owns;
}

size_t cuh_heap_block_size(cuh_heap_t *h, uintptr_t addr)
{
    size_t size = 0;
    cuh_hp_lock(h);
    cuh_extent_t *e = cuh_ptrmap_get(&h->blocks, addr);
    cuh_slab_t *s;
    /* In a thread's chunk, its cache keeps the block's request. */
    size_t in_chunk = cuh_unlikely(h->num_chunks) ? cuh_hp_chunk_block_size_locked(h, addr) : SIZE_MAX;
    if (in_chunk != SIZE_MAX) {
        size = in_chunk;
    } else if (e && e->owner) {
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
    cuh_hp_lock(h);
    cuh_hp_unpark_all_locked(h);
    if (!h->captures)
        cuh_hp_plan_drop_locked(h);   /* a step plan's room is cached memory too (heap_plan.c) */
    cuh_hp_settle_all_locked(h);
    if (!h->captures)
        cuh_hp_release_free_segments_locked(h);
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
    return CUHEAP_OK;
}

cuh_device_t *cuh_heap_device(cuh_heap_t *h) { return h->dev; }
