/* heap_stats.c - what the heap says about itself: statistics and the
 * timeline, the consistency check of its books (cuh_heap_check, which the
 * tests run after every step), and snapshots, the one data model every
 * report is rendered from.
 *
 * Rule kept here: statistics are exact when read (what thread caches hold
 * counts as free), and the books agree with what they count.
 */
#include "heap_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- statistics ------------------------------------------------------------ */

__attribute__((noinline)) void cuh_hp_sample_locked(cuh_heap_t *h)
{
    if (h->num_samples == CUH_TIMELINE_SAMPLES) {
        for (size_t i = 0; i < CUH_TIMELINE_SAMPLES / 2; i++)
            h->timeline[i] = h->timeline[2 * i + 1];
        h->num_samples = CUH_TIMELINE_SAMPLES / 2;
        h->sample_every *= 2;
    }
    h->timeline[h->num_samples++] = (cuh_sample_t){
        .t = cuh_hp_seconds_since(&h->born), .live = h->requested.current, .reserved = h->reserved.current,
        .cached = h->cached.current};
    h->ops_since_sample = 0;
    h->last_sampled_reserved = h->reserved.current;
}

void cuh_heap_set_sample_interval(cuh_heap_t *h, uint64_t every)
{
    cuh_hp_lock(h);
    h->sample_every = every ? every : 1;
    cuh_unlock(&h->lock);
}

/* ---- steps ------------------------------------------------------------------
 * A program that marks its steps (cuheap_mark_step; cuheap's PyTorch package
 * marks every optimizer step) sees in its reports what each of the last steps
 * asked of the device: pages mapped and moved under vmm:1 and the map and
 * unmap calls they took, new device memory, CPU waits. A step that is slow
 * because pages moved says so there. With step_plan, a program that marks
 * none has its steps found in its allocations (heap_plan.c, step_detect.h),
 * and they are marked here alike. */

void cuh_heap_mark_step(cuh_heap_t *h)
{
    cuh_hp_lock(h);
    cuh_hp_plan_program_marks_locked(h);
    cuh_hp_mark_step_locked(h);
    cuh_unlock(&h->lock);
}

void cuh_hp_mark_step_locked(cuh_heap_t *h)
{
    const double now = cuh_hp_seconds_since(&h->born);
    cuh_snap_step_t x = {
        .index = h->steps.marked + 1,
        .end = now,
        .seconds = now - h->steps.at,
        .page_maps = h->num_page_maps - h->steps.page_maps,
        .page_moves = h->num_page_steals - h->steps.page_moves,
        .map_calls = h->num_map_calls - h->steps.map_calls,
        .device_allocs = h->num_segment_allocs - h->steps.device_allocs,
        .cpu_waits = h->num_cpu_waits - h->steps.cpu_waits,
    };
    h->steps.ring[h->steps.marked % CUH_STEP_HISTORY] = x;
    if (x.page_maps > h->steps.most_maps.page_maps)
        h->steps.most_maps = x;
    h->steps.marked++;
    h->steps.at = now;
    h->steps.page_maps = h->num_page_maps;
    h->steps.page_moves = h->num_page_steals;
    h->steps.map_calls = h->num_map_calls;
    h->steps.device_allocs = h->num_segment_allocs;
    h->steps.cpu_waits = h->num_cpu_waits;
    if (h->cfg.step_plan)
        cuh_hp_plan_step_locked(h, x.page_moves);
}

static void snapshot_steps_locked(const cuh_heap_t *h, cuh_heap_snapshot_t *snap)
{
    const uint64_t kept = h->steps.marked < CUH_STEP_HISTORY ? h->steps.marked : CUH_STEP_HISTORY;
    snap->steps_marked = h->steps.marked;
    snap->num_steps = (size_t)kept;
    for (uint64_t i = 0; i < kept; i++)
        snap->steps[i] = h->steps.ring[(h->steps.marked - kept + i) % CUH_STEP_HISTORY];
    snap->most_maps = h->steps.most_maps;
    const plan_t *p = &h->plan;
    snap->plan = (cuh_snap_plan_t){.active = p->active, .made = p->made, .steps_followed = p->steps_followed,
                                   .placed = p->placed, .missed = p->missed, .dropped = p->dropped,
                                   .room_bytes = p->room_bytes, .found_period = p->detect.period,
                                   .steps_found = p->detect.steps, .last_period = p->found_period};
}

static void cuh_heap_stats_locked(cuh_heap_t *h, cuheap_stats_t *out);

void cuh_heap_stats(cuh_heap_t *h, cuheap_stats_t *out)
{
    cuh_hp_lock(h);
    cuh_hp_unpark_all_locked(h);   /* so that the largest free extent is what a search would see */
    cuh_heap_stats_locked(h, out);
    cuh_unlock(&h->lock);
}

static void cuh_heap_stats_locked(cuh_heap_t *h, cuheap_stats_t *out)
{
    memset(out, 0, sizeof *out);
#define COPY_STAT(name)                      \
    out->name.current = h->name.current;     \
    out->name.peak = h->name.peak
    COPY_STAT(requested);
    COPY_STAT(allocated);
    COPY_STAT(reserved);
    COPY_STAT(cached);
    COPY_STAT(pending);
#undef COPY_STAT
    /* What thread caches hold is free to the program; what they served,
     * allocations, frees and cache hits. */
    int64_t allocated_adjust = 0, requested_adjust = 0;
    uint64_t tc_allocs = 0, tc_frees = 0;
    for (cuh_tcache_t *tc = h->tcaches; tc; tc = tc->heap_next) {
        cuh_spin_lock(&tc->lock);
        allocated_adjust += tc->allocated_adjust;
        requested_adjust += tc->requested_adjust;
        tc_allocs += tc->num_allocs;
        tc_frees += tc->num_frees;
        cuh_spin_unlock(&tc->lock);
    }
    out->allocated.current = (size_t)((int64_t)h->allocated.current + allocated_adjust);
    out->requested.current = (size_t)((int64_t)h->requested.current + requested_adjust);
    /* Cached is what is reserved and not allocated, counted now: moves
     * between thread caches and the heap's books do not refresh the heap's
     * own figure at once. */
    out->reserved.current = cuh_hp_reserved_bytes(h);
    if (out->reserved.peak < out->reserved.current)
        out->reserved.peak = out->reserved.current;
    out->cached.current = out->reserved.current - out->allocated.current;
    if (out->cached.peak < out->cached.current)
        out->cached.peak = out->cached.current;
    out->num_allocs = h->num_allocs + tc_allocs;
    out->num_frees = h->num_frees + tc_frees;
    out->num_segment_allocs = h->num_segment_allocs;
    out->num_segment_frees = h->num_segment_frees;
    out->num_cache_hits = h->num_cache_hits + tc_allocs;
    out->num_retries = h->num_retries;
    out->num_cpu_waits = h->num_cpu_waits;
    out->num_ooms = h->num_ooms;
    out->largest_free_extent = cuh_hp_largest_free_locked(h, out->cached.current);
    out->num_free_extents = h->arena.free_extents;
    out->limit = h->limit;
    out->workspace = h->workspace ? h->workspace->size : 0;
    out->device_total = h->device_total;
}

void cuh_heap_reset_peaks(cuh_heap_t *h)
{
    cuh_hp_lock(h);
    h->requested.peak = h->requested.current;
    h->allocated.peak = h->allocated.current;
    h->reserved.peak = h->reserved.current;
    h->cached.peak = h->cached.current;
    h->pending.peak = h->pending.current;
    cuh_unlock(&h->lock);
}

/* ---- consistency ------------------------------------------------------------------ */

static int compare_events(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(cuh_event_t const *)a, y = (uintptr_t)*(cuh_event_t const *)b;
    return (x > y) - (x < y);
}

/* The events the heap holds, recorded ones only (one made during a capture
 * is NULL until the capture ends): into `out` when it is not NULL; the count.
 * Every place an event may be held is listed here, once. */
static size_t collect_events_locked(const cuh_heap_t *h, cuh_event_t *out)
{
    size_t k = 0;
#define ADD(e)                  \
    do {                        \
        if (e) {                \
            if (out)            \
                out[k] = (e);   \
            k++;                \
        }                       \
    } while (0)
    for (size_t i = 0; i < h->num_spare_events; i++)
        ADD(h->spare_events[i]);
    for (size_t i = 0; i < h->num_unsettled; i++)
        ADD(h->unsettled[i].event);
    for (uint32_t i = 0; i < h->num_streams; i++)
        for (size_t j = 0; j < h->streams[i]->num_fences; j++)
            ADD(h->streams[i]->fences[j].event);
    const free_batch_t *lists[2] = {h->open_batch, h->closed_batches};
    for (int l = 0; l < 2; l++)
        for (const free_batch_t *b = lists[l]; b; b = l ? b->next : NULL)
            for (size_t j = 0; j < b->num_events; j++)
                ADD(b->events[j]);
    for (size_t i = 0; i < h->num_holds; i++)
        for (size_t j = 0; j < h->holds[i]->num_events; j++)
            ADD(h->holds[i]->events[j]);
    for (const cuh_heap_fence_t *f = h->fences; f; f = f->next)
        for (size_t j = 0; j < f->num_events; j++)
            ADD(f->events[j]);
    for (const vm_drain_t *d = h->drains; d; d = d->next)
        ADD(d->event);
#undef ADD
    return k;
}

/* Every event the heap holds is in one place only: the spare pool, a
 * stream's fences, a batch, a hold, a fence for memory outside the heap, an
 * old mapping's drain or the events kept until done. An event in two would
 * be recorded for one and found complete for the other. */
static int check_events_locked(const cuh_heap_t *h, char *msg, size_t len)
{
    const size_t n = collect_events_locked(h, NULL);
    if (!n)
        return 0;
    cuh_event_t *all = malloc(n * sizeof *all);
    if (!all)
        return 0;   /* no room to check: nothing is wrong for that */
    collect_events_locked(h, all);
    qsort(all, n, sizeof *all, compare_events);
    int rc = 0;
    for (size_t i = 1; i < n && !rc; i++)
        if (all[i] == all[i - 1]) {
            snprintf(msg, len, "event %p is held in two places (recorded for one, it would pass for the other)",
                     (void *)all[i]);
            rc = -1;
        }
    free(all);
    return rc;
}

void cuh_heap_live_by_label(cuh_heap_t *h, uint64_t by_label[256])
{
    cuh_hp_lock(h);
    for (cuh_segment_t *seg = h->arena.segments; seg; seg = seg->next)
        for (const cuh_extent_t *e = seg->first; e; e = e->next) {
            if (e->state == CUH_EXTENT_BLOCK && e->label) {
                by_label[e->label] += e->requested;
            } else if (e->state == CUH_EXTENT_SLAB) {
                const cuh_slab_t *s = e->owner;
                for (uint32_t i = 0; i < s->num_objs; i++)
                    if (s->labels[i])
                        by_label[s->labels[i]] += s->requested[i];
            }
        }
    cuh_unlock(&h->lock);
}

int cuh_heap_check(cuh_heap_t *h, char *msg, size_t len)
{
    cuh_hp_lock(h);
    int rc = cuh_arena_check(&h->arena, msg, len);
    size_t allocated = 0, requested = 0, ring_objs = 0, slab_spare = 0, tcached = 0, large_owned = 0, chunked = 0;
    size_t chunks = 0, room = 0, blocks = 0;
    for (cuh_segment_t *seg = h->arena.segments; !rc && seg; seg = seg->next)
        for (cuh_extent_t *e = seg->first; e; e = e->next) {
            if (cuh_unlikely(cuh_hp_plan_is_room(e))) {
                room += e->size;   /* a step plan's room: no block's (heap_plan.c) */
            } else if (e->state == CUH_EXTENT_BLOCK) {
                allocated += e->size;
                requested += e->requested;
                if (e->label && (e->held || e->owner || e == h->parked)) {
                    snprintf(msg, len, "block 0x%llx keeps label %u after its free", (unsigned long long)e->addr,
                             e->label);
                    rc = -1;
                }
                large_owned += e->owner != NULL && !e->chunked;
                chunked += e->chunked;
                blocks++;
                if (cuh_ptrmap_get(&h->blocks, e->addr) != e) {
                    snprintf(msg, len, "block 0x%llx is missing from the block map", (unsigned long long)e->addr);
                    rc = -1;
                }
            } else if (e->state == CUH_EXTENT_SLAB) {
                cuh_slab_t *s = e->owner;
                uint32_t live = 0, avail = 0;
                for (uint32_t i = 0; i < s->num_objs; i++) {
                    live += (uint32_t)cuh_slab_bit(s->live, i);
                    avail += (uint32_t)cuh_slab_bit(s->avail, i);
                    if (cuh_slab_bit(s->live, i) && cuh_slab_bit(s->avail, i))
                        rc = -1;
                    if (cuh_slab_bit(s->tcached, i) && !cuh_slab_bit(s->live, i))
                        rc = -1;
                    tcached += (size_t)cuh_slab_bit(s->tcached, i);
                    if (cuh_slab_bit(s->live, i))
                        requested += s->requested[i];
                    /* A label only on a live object the program holds. */
                    if (s->labels[i] && (!cuh_slab_bit(s->live, i) || cuh_slab_bit(s->held, i) ||
                                         cuh_slab_bit(s->tcached, i)))
                        rc = -1;
                }
                if (rc || live != s->num_live || avail != s->num_avail || cuh_pagemap_get(&h->pages, e->addr) != s) {
                    snprintf(msg, len, "slab 0x%llx: bitmaps disagree with counts, labels or page map",
                             (unsigned long long)e->addr);
                    rc = -1;
                } else if (avail == s->num_objs || h->kept_slab == s) {
                    /* Small objects pin no memory: a slab all of whose
                     * objects are avail went back to the arena (one kept
                     * for an allocation, heap_small.c, is let go before the
                     * allocation returns). */
                    snprintf(msg, len, "slab 0x%llx: every object avail, yet the slab was not given back%s",
                             (unsigned long long)e->addr, h->kept_slab == s ? " (kept for an allocation)" : "");
                    rc = -1;
                }
                allocated += s->num_live * s->obj_size;
                slab_spare += s->num_objs - s->num_live - s->num_avail;
            }
        }
    if (!rc)
        rc = cuh_hp_plan_check_locked(h, room, msg, len);
    if (!rc) {
        uint32_t live_others = 0;
        cuh_stream_t handle;
        for (uint32_t i = 0; cuh_hp_next_live_stream(h, &i, &handle);)
            live_others += handle != 0;
        if (live_others != h->live_other_streams) {
            snprintf(msg, len, "%u live streams besides the default one, books say %u", live_others,
                     h->live_other_streams);
            rc = -1;
        }
    }
    if (!rc && h->vm) {
        /* Every page under a used extent is mapped; the counts agree. */
        size_t mapped = 0;
        for (size_t p = 0; p < h->num_pages; p++) {
            mapped += h->page_handle[p] != 0;
            if (!rc && ((h->page_mapped[p >> 6] >> (p & 63)) & 1) != (h->page_handle[p] != 0)) {
                snprintf(msg, len, "vmm: the mapped-page bitmap disagrees with page 0x%llx",
                         (unsigned long long)cuh_hp_page_va(h, p));
                rc = -1;
            }
        }
        /* Kept mappings lie only where no unit is in use, each a run from
         * its first page; the count agrees. */
        size_t kept = 0;
        for (size_t p = 0; !rc && p < h->num_pages; p++) {
            const int head = (int)((h->kept_head[p >> 6] >> (p & 63)) & 1);
            kept += h->kept_handle[p] != 0;
            if ((h->kept_handle[p] && h->page_handle[p]) || (head && !h->kept_handle[p]) ||
                (h->kept_handle[p] && !head && (!p || h->kept_handle[p - 1] != h->kept_handle[p]))) {
                snprintf(msg, len, "vmm: the kept mapping at page 0x%llx is not sound",
                         (unsigned long long)cuh_hp_page_va(h, p));
                rc = -1;
            }
        }
        if (!rc && kept != h->kept_pages) {
            snprintf(msg, len, "vmm: %zu pages kept mapped, books say %zu", kept, h->kept_pages);
            rc = -1;
        }
        if (!rc && (mapped != h->mapped_pages || h->mapped_pages > h->physical_pages)) {
            snprintf(msg, len, "vmm: %zu pages mapped, books say %zu (physical %zu)", mapped, h->mapped_pages,
                     h->physical_pages);
            rc = -1;
        }
        /* DRAIN extents are whole unmapped pages, each in one drain. */
        size_t draining = 0, listed = 0;
        for (cuh_extent_t *e = h->vm->first; !rc && e; e = e->next)
            if (e->state == CUH_EXTENT_DRAIN) {
                draining++;
                if ((e->addr - h->vm->base) % h->vm_page || e->size % h->vm_page)
                    rc = -1;
                for (uintptr_t va = e->addr; !rc && va < e->addr + e->size; va += h->vm_page)
                    rc = h->page_handle[(va - h->vm->base) / h->vm_page] ||
                                 h->kept_handle[(va - h->vm->base) / h->vm_page] ||
                                 !h->drain_handle[(va - h->vm->base) / h->vm_page]
                             ? -1 : 0;
                if (rc)
                    snprintf(msg, len, "vmm: draining range at 0x%llx is not whole pages left by known units",
                             (unsigned long long)e->addr);
            }
        for (const vm_drain_t *d = h->drains; !rc && d; d = d->next)
            listed += d->num_extents;
        if (!rc && draining != listed) {
            snprintf(msg, len, "vmm: %zu draining ranges, drains list %zu", draining, listed);
            rc = -1;
        }
        for (cuh_extent_t *e = h->vm->first; !rc && e; e = e->next) {
            if (e->state == CUH_EXTENT_FREE || e->state == CUH_EXTENT_DRAIN || cuh_hp_plan_is_room(e))
                continue;   /* a plan's room keeps the pages it has, mapped or not */
            size_t first = (size_t)(e->addr - h->vm->base) / h->vm_page;
            size_t end = (size_t)(e->addr + e->size - h->vm->base + h->vm_page - 1) / h->vm_page;
            for (size_t p = first; p < end; p++)
                if (!h->page_handle[p]) {
                    snprintf(msg, len, "vmm: block at 0x%llx has an unmapped page at 0x%llx",
                             (unsigned long long)e->addr, (unsigned long long)cuh_hp_page_va(h, p));
                    rc = -1;
                    break;
                }
        }
    }
    for (uint32_t i = 0; !rc && i < h->num_streams; i++) {
        stream_state_t *st = h->streams[i];
        size_t fenced = 0, unfenced = 0;
        for (unsigned c = 0; c < h->num_classes; c++) {
            small_ring_t *r = &st->small[c];
            for (uint32_t k = 0; k < r->count; k++) {
                small_entry_t e = r->entries[(r->head + k) & (r->capacity - 1)];
                if (e.epoch < h->arena.tags[st->tag].fences_recorded)
                    fenced += h->classes[c].size;
                else
                    unfenced += h->classes[c].size;
            }
            ring_objs += r->count;
        }
        if (fenced != st->small_fenced || unfenced != st->small_unfenced) {
            snprintf(msg, len, "stream %u: small cache holds %zu fenced / %zu unfenced bytes, books say %zu / %zu",
                     st->tag, fenced, unfenced, st->small_fenced, st->small_unfenced);
            rc = -1;
        }
    }
    /* The parked block is still a used extent, counted as freed. */
    size_t parked = h->parked ? h->parked->size : 0, parked_requested = h->parked ? h->parked->requested : 0;
    if (!rc && h->parked && cuh_ptrmap_get(&h->blocks, h->parked->addr) != h->parked) {
        snprintf(msg, len, "the parked block 0x%llx is missing from the block map", (unsigned long long)h->parked->addr);
        rc = -1;
    }
    if (!rc && (allocated != h->allocated.current + h->held_bytes + parked ||
                requested != h->requested.current + h->held_requested + parked_requested || ring_objs != slab_spare)) {
        snprintf(msg, len,
                 "allocated %zu (books %zu + held %zu), requested %zu (books %zu + held %zu), cached small objects "
                 "%zu (slabs say %zu)",
                 allocated, h->allocated.current, h->held_bytes, requested, h->requested.current, h->held_requested,
                 ring_objs, slab_spare);
        rc = -1;
    }
    /* Every object a slab marks tcached is in exactly one thread cache; the
     * cached ones are in their bins, and the books agree. */
    size_t owned = 0;
    for (cuh_tcache_t *tc = h->tcaches; !rc && tc; tc = tc->heap_next) {
        cuh_spin_lock(&tc->lock);
        size_t entries = 0, cached = 0, binned = 0, cached_bytes = 0;
        int64_t requested_adjust = 0, allocated_adjust = 0;
        /* Its large block: the heap's record points back at it, and it is
         * counted as allocated with the request the cache took it with. */
        const cuh_tc_large_t *l = &tc->large;
        if (l->state) {
            const cuh_extent_t *e = l->ext;
            if (!tc->large_listed || !e || e->owner != tc || e->state != CUH_EXTENT_BLOCK || e->addr != l->addr ||
                e->size != l->size || e->requested != l->counted || cuh_ptrmap_get(&h->blocks, l->addr) != e ||
                (l->state == CUH_TC_LIVE && l->requested > l->counted)) {
                snprintf(msg, len, "thread cache: its large block 0x%llx disagrees with the heap's record",
                         (unsigned long long)l->addr);
                rc = -1;
            }
            large_owned--;
            allocated_adjust -= l->state == CUH_TC_CACHED ? (int64_t)l->size : 0;
            requested_adjust += l->state == CUH_TC_CACHED ? -(int64_t)l->counted
                                                          : (int64_t)l->requested - (int64_t)l->counted;
        } else if (tc->large_listed) {
            snprintf(msg, len, "thread cache: listed as holding a large block, holds none");
            rc = -1;
        }
        if (!rc)
            rc = cuh_hp_chunks_check_locked(h, tc, &allocated_adjust, &requested_adjust, &chunks, msg, len);
        for (size_t i = 0; i <= tc->mask; i++) {
            const cuh_tc_entry_t *e = &tc->slots[i];
            if (!e->addr)
                continue;
            entries++;
            cuh_slab_t *s = cuh_hp_slab_of_locked(h, e->addr);
            int64_t idx = s ? cuh_slab_index(s, e->addr) : -1;
            if (idx < 0 || !cuh_slab_bit(s->tcached, (uint32_t)idx) || s->obj_size != e->size) {
                snprintf(msg, len, "thread cache: 0x%llx is not a tcached object of its size",
                         (unsigned long long)e->addr);
                rc = -1;
            }
            if (e->state == CUH_TC_CACHED) {
                cached++;
                cached_bytes += e->size;
                requested_adjust -= (int64_t)e->size;
            } else {
                requested_adjust += (int64_t)e->requested - (int64_t)e->size;
            }
        }
        for (unsigned c = 0; c < CUH_MAX_CLASSES; c++)
            for (uint32_t k = 0; k < tc->bins[c].count; k++) {
                const cuh_tc_entry_t *e = cuh_tcache_find(tc, tc->bins[c].addr[k]);
                binned += e && e->state == CUH_TC_CACHED && e->size_class == c;
            }
        allocated_adjust -= (int64_t)cached_bytes;
        if (!rc && (entries != tc->count || binned != cached || cached_bytes != tc->cached_bytes ||
                    tc->allocated_adjust != allocated_adjust || tc->requested_adjust != requested_adjust)) {
            snprintf(msg, len,
                     "thread cache: %zu entries (books %zu), %zu cached (%zu in bins, %zu bytes, books %zu), "
                     "adjustments %lld / %lld, expected %lld / %lld",
                     entries, tc->count, cached, binned, cached_bytes, tc->cached_bytes,
                     (long long)tc->allocated_adjust, (long long)tc->requested_adjust, (long long)allocated_adjust,
                     (long long)requested_adjust);
            rc = -1;
        }
        owned += entries;
        cuh_spin_unlock(&tc->lock);
    }
    if (!rc && (chunks != chunked || chunks != h->num_chunks)) {
        snprintf(msg, len, "%zu blocks marked as chunks, thread caches hold %zu, books say %zu", chunked, chunks,
                 h->num_chunks);
        rc = -1;
    }
    if (!rc && owned != tcached) {
        snprintf(msg, len, "slabs mark %zu objects tcached, thread caches own %zu", tcached, owned);
        rc = -1;
    }
    /* The heap's list of caches holding a large block is exactly those. */
    size_t listed = 0, flagged = 0;
    for (const cuh_tcache_t *tc = h->tcaches; tc; tc = tc->heap_next)
        flagged += tc->large_listed != 0;
    for (const cuh_tcache_t *tc = h->large_tcs; tc && listed <= flagged; tc = tc->large_next)   /* no cycle */
        listed++;
    if (!rc && h->blocks.count != blocks) {
        snprintf(msg, len, "the block map holds %zu blocks, the arena %zu", h->blocks.count, blocks);
        rc = -1;
    }
    if (!rc && (large_owned != 0 || listed != flagged)) {
        snprintf(msg, len, "blocks marked as in thread caches: %lld more than the caches hold; %zu caches listed, %zu "
                 "flagged", (long long)large_owned, listed, flagged);
        rc = -1;
    }
    /* Every held block is in exactly one hold list or batch; in the map if
     * in a hold list, marked held (and live) if in a batch. */
    size_t held = 0, unmarked = 0;
    for (size_t k = 0; k < h->num_holds; k++)
        held += h->holds[k]->size;
    const free_batch_t *lists[2] = {h->open_batch, h->closed_batches};
    for (int l = 0; l < 2; l++) {
        for (const free_batch_t *batch = lists[l]; batch; batch = l ? batch->next : NULL) {
            for (size_t k = 0; k < batch->num_entries; k++) {
                const batch_entry_t *x = &batch->entries[k];
                held += x->size;
                if (x->slab) {
                    int64_t i = cuh_slab_index(x->slab, x->addr);
                    unmarked += i < 0 || !cuh_slab_bit(x->slab->held, (uint32_t)i) ||
                                !cuh_slab_bit(x->slab->live, (uint32_t)i);
                } else {
                    unmarked += !x->ext || !x->ext->held || x->ext->state != CUH_EXTENT_BLOCK ||
                                x->ext->addr != x->addr || cuh_ptrmap_get(&h->blocks, x->addr) != x->ext;
                }
            }
        }
    }
    if (!rc && unmarked) {
        snprintf(msg, len, "held blocks: %zu in batches without their held mark (and live)", unmarked);
        rc = -1;
    }
    if (!rc && (held != h->held_bytes || h->num_holds != h->held.count)) {
        snprintf(msg, len, "held blocks: %zu bytes in lists and batches, books say %zu bytes; %zu holds, %zu in the map",
                 held, h->held_bytes, h->num_holds, h->held.count);
        rc = -1;
    }
    if (!rc)
        rc = check_events_locked(h, msg, len);
    cuh_unlock(&h->lock);
    return rc;
}

/* ---- snapshot ---------------------------------------------------------------------- */

/* The mapped ranges of the vmm:1 reservation, into snap->runs (none if out
 * of host memory: `mapped` still says how much). */
static void snapshot_runs_locked(const cuh_heap_t *h, cuh_heap_snapshot_t *snap, cuh_snap_segment_t *ss)
{
    size_t n = 0;
    for (size_t p = 0; (p = cuh_bits_next(h->page_mapped, p, h->pages_high, 1)) < h->pages_high; n++)
        p = cuh_bits_next(h->page_mapped, p, h->pages_high, 0);
    ss->first_run = snap->num_runs;
    snap->runs = n ? malloc(n * sizeof *snap->runs) : NULL;
    if (!snap->runs)
        return;
    for (size_t p = 0; (p = cuh_bits_next(h->page_mapped, p, h->pages_high, 1)) < h->pages_high;) {
        size_t q = cuh_bits_next(h->page_mapped, p, h->pages_high, 0);
        snap->runs[snap->num_runs++] = (cuh_snap_run_t){cuh_hp_page_va(h, p), (uint64_t)(q - p) * h->vm_page};
        p = q;
    }
    ss->num_runs = snap->num_runs - ss->first_run;
}

cuh_heap_snapshot_t *cuh_heap_snapshot(cuh_heap_t *h, int ask_device)
{
    cuh_heap_snapshot_t *snap = calloc(1, sizeof *snap);
    if (!snap)
        return NULL;
    /* At exit (ask_device 0) another thread may be inside the heap, or may
     * have died holding its lock: wait a little, then report without it. */
    if (ask_device) {
        cuh_hp_lock(h);
    } else {
        int tries = 0;
        while (!cuh_trylock(&h->lock)) {
            if (++tries > 200) {
                free(snap);
                return NULL;
            }
            struct timespec pause = {0, 1000000};
            nanosleep(&pause, NULL);
        }
    }
    cuh_hp_unpark_all_locked(h);
    cuh_heap_stats_locked(h, &snap->stats);
    snap->device = h->dev->ordinal;
    snap->device_kind = h->dev->kind;
    snap->config = h->cfg;
    snap->device_total = h->device_total;
    snap->device_free_unknown = !ask_device;
    snap->no_virtual_memory = cuh_hp_vm_unavailable(h);
    if (ask_device && h->dev->ops->mem_info(h->dev, &snap->device_free, &snap->device_total) != CUH_DEV_OK) {
        snap->device_free = 0;   /* the device could not say (a lost one, say): the report says so */
        snap->device_total = h->device_total;
        snap->device_free_unknown = 1;
    }
    size_t num_extents = 0;
    for (cuh_segment_t *seg = h->arena.segments; seg; seg = seg->next)
        for (cuh_extent_t *e = seg->first; e; e = e->next)
            num_extents++;
    snap->segments = calloc(h->arena.num_segments + 1, sizeof *snap->segments);
    snap->extents = calloc(num_extents + 1, sizeof *snap->extents);
    snap->streams = calloc(h->num_streams + 1, sizeof *snap->streams);
    if (!snap->segments || !snap->extents || !snap->streams) {
        cuh_unlock(&h->lock);
        cuh_heap_snapshot_free(snap);
        return NULL;
    }
    for (size_t i = 0; i < h->arena.num_segments; i++) {
        const cuh_segment_t *seg = h->arena.by_address[i];
        cuh_snap_segment_t *ss = &snap->segments[snap->num_segments++];
        ss->base = seg->base;
        ss->size = seg->size;
        ss->workspace = seg->region == CUH_REGION_WORKSPACE;
        ss->virtual_space = seg->virtual_space;
        ss->mapped = seg->virtual_space ? (uint64_t)h->mapped_pages * h->vm_page : seg->size;
        if (seg->virtual_space) {
            ss->page_size = h->vm_page;
            ss->page_maps = h->num_page_maps;
            ss->page_moves = h->num_page_steals;
            ss->map_calls = h->num_map_calls;
            ss->kept_pages = h->kept_pages;
            ss->kept_hits = h->num_kept_hits;
            snapshot_runs_locked(h, snap, ss);
        }
        ss->first_extent = snap->num_extents;
        for (const cuh_extent_t *e = seg->first; e; e = e->next) {
            cuh_snap_extent_t *x = &snap->extents[snap->num_extents++];
            x->addr = e->addr;
            x->size = e->size;
            if (e->state == CUH_EXTENT_FREE) {
                x->kind = CUH_SNAP_FREE;
                x->stream_tag = e->tag;
                x->pending = e->tag != CUH_TAG_GLOBAL && e->epoch < h->arena.tags[e->tag].fences_recorded;
            } else if (e->state == CUH_EXTENT_DRAIN) {   /* address space only: its pages moved */
                ss->draining += e->size;
                x->kind = CUH_SNAP_FREE;
                x->stream_tag = e->tag;
                x->pending = 1;
            } else if (e->state == CUH_EXTENT_BLOCK) {
                x->kind = CUH_SNAP_BLOCK;
                x->requested = e->requested;
            } else {
                const cuh_slab_t *sl = e->owner;
                x->kind = CUH_SNAP_SLAB;
                x->size_class = sl->size_class;
                x->objs = sl->num_objs;
                x->live = sl->num_live;
                x->requested = sl->num_live * sl->obj_size;
                snap->classes[sl->size_class].slabs++;
                snap->classes[sl->size_class].objs += sl->num_objs;
                snap->classes[sl->size_class].live += sl->num_live;
            }
        }
        ss->num_extents = snap->num_extents - ss->first_extent;
    }
    snap->num_classes = h->num_classes;
    for (unsigned c = 0; c < h->num_classes; c++) {
        snap->classes[c].size = h->classes[c].size;
        snap->classes[c].slab_bytes = h->classes[c].slab_bytes;
    }
    for (uint32_t i = 0; i < h->num_streams; i++) {
        const stream_state_t *st = h->streams[i];
        const cuh_tag_books_t *b = &h->arena.tags[st->tag];
        cuh_snap_stream_t *x = &snap->streams[snap->num_streams++];
        x->handle = st->handle;
        x->private_bytes = b->fenced_bytes + b->unfenced_bytes + st->small_fenced + st->small_unfenced;
        x->pending_bytes = b->fenced_bytes + st->small_fenced;
        x->fences_outstanding = st->num_fences;
        for (unsigned c = 0; c < h->num_classes; c++)
            snap->classes[c].cached += st->small[c].count;
    }
    snap->has_oom = h->has_oom;
    snap->oom = h->last_oom;
    snap->uptime = cuh_hp_seconds_since(&h->born);
    snapshot_steps_locked(h, snap);
    snap->timeline = malloc((h->num_samples + 1) * sizeof *snap->timeline);
    if (snap->timeline) {
        memcpy(snap->timeline, h->timeline, h->num_samples * sizeof *snap->timeline);
        snap->num_samples = h->num_samples;
    }
    cuh_unlock(&h->lock);
    return snap;
}

void cuh_heap_snapshot_free(cuh_heap_snapshot_t *snap)
{
    if (!snap)
        return;
    free(snap->segments);
    free(snap->extents);
    free(snap->runs);
    free(snap->streams);
    free(snap->timeline);
    free(snap);
}
