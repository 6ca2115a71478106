/* heap_pages.c - virtual memory (vmm:1): the reservation and its pages, mapped
 * on demand, lent to a stream's next block, moved from free memory and given
 * back; recurring moves; and the events that keep pages where they are while
 * work on memory handed over early may still touch them.
 *
 * Rules kept here (heap.h): under vmm:1 the stream rule holds for the
 * physical pages behind blocks wherever a page moves, and a page's old
 * mapping stays until that work is done (the page-rule model); wholly free
 * pages that add up to a request serve it.
 *
 * Virtual memory (vmm:1): the general region is one address reservation and
 * pages move to where blocks need them (cuh_hp_map_range_locked). Unmapping is not
 * stream-ordered, so a page moves to another stream only once a fence shows
 * the GPU passed its free; to the freeing stream's own next block it moves at
 * once, its old mapping kept until the stream's work up to then is done
 * (lend_own_pages_locked, DRAIN extents); so do the pages of cudaFree'd
 * memory a take-back returned early, to any stream, the GPU already ordered
 * (alias moves, steal_pages_locked).
 */
#include "heap_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- virtual memory ---------------------------------------------------------------
 * With vmm:1 the general region is one address reservation. A block's pages
 * are mapped when it is carved; a freed block keeps its pages (they are
 * cached). When a block needs pages, they come first from free memory
 * elsewhere in the reservation: a page lying wholly inside a global free
 * extent (its free is complete, so no GPU work can touch it) is unmapped and
 * mapped again behind the new block. Only when there is no such page is the
 * device asked for a new one. Free memory therefore never sits in pieces too
 * small to use: it is moved, a page at a time, to where it is needed. */

/* The work that memory handed to other streams early may still see
 * (cuh_hp_keep_until_done_locked): unmapping is not stream-ordered, so no page
 * moves before it is done. Drops the events that have completed; with
 * `wait`, the CPU waits for the rest. 1 when none is left. During a graph
 * capture it makes no event call: what is left stays. */
static int settle_unsettled_locked(cuh_heap_t *h, int wait)
{
    if (h->captures)
        return h->num_unsettled == 0;   /* no event call during a capture */
    size_t kept = 0;
    for (size_t i = 0; i < h->num_unsettled; i++) {
        cuh_event_t e = h->unsettled[i].event;
        if (h->dev->ops->event_query(h->dev, e) != CUH_DEV_OK && !wait) {
            h->unsettled[kept++] = h->unsettled[i];
            continue;
        }
        if (wait)
            cuh_hp_cpu_wait_event(h, e);
        cuh_hp_event_put_locked(h, e);
    }
    h->num_unsettled = kept;
    return kept == 0;
}

/* The newest take-back generation whose running work has completed, and
 * every older one's: pages stamped with it or below may be unmapped. Drops
 * the completed events, oldest first (one stream: they complete in order);
 * with `wait`, the CPU waits for the newest first. During a graph capture it
 * makes no event call: the generation known settled before it. */
static uint64_t settled_gen_locked(cuh_heap_t *h, int wait)
{
    if (h->captures)
        return h->settled_gen;   /* no event call during a capture */
    if (wait && h->num_gen_events)
        cuh_hp_cpu_wait_event(h, h->gen_events[h->num_gen_events - 1].event);
    size_t done = 0;
    while (done < h->num_gen_events && h->dev->ops->event_query(h->dev, h->gen_events[done].event) == CUH_DEV_OK) {
        h->settled_gen = h->gen_events[done].gen;
        cuh_hp_event_put_locked(h, h->gen_events[done++].event);
    }
    h->num_gen_events -= done;
    memmove(h->gen_events, h->gen_events + done, h->num_gen_events * sizeof *h->gen_events);
    return h->settled_gen;
}

/* The pages [*first, *end) of the reservation that [addr, addr + size)
 * touches, wholly or in part (size > 0). */
static void pages_touched(const cuh_heap_t *h, uintptr_t addr, size_t size, size_t *first, size_t *end)
{
    *first = (size_t)(addr - h->vm->base) / h->vm_page;
    *end = (size_t)(addr + size - h->vm->base + h->vm_page - 1) / h->vm_page;
}

/* Stamps every page that [addr, addr + size) touches with generation `gen`
 * of the take-back returning it, if it lies in the reservation. */
void cuh_hp_stamp_pages_locked(cuh_heap_t *h, uintptr_t addr, size_t size, uint64_t gen)
{
    if (!h->vm || addr < h->vm->base || addr - h->vm->base >= h->vm->size)
        return;
    size_t first, end;
    pages_touched(h, addr, size, &first, &end);
    for (size_t p = first; p < end; p++)
        h->page_gen[p] = gen;
}

/* The pages [*first, *end) of the reservation that lie wholly inside free
 * extent e (none beyond the highest page ever mapped). */
static void pages_inside_extent(const cuh_heap_t *h, const cuh_extent_t *e, size_t *first, size_t *end)
{
    size_t page = h->vm_page;
    *first = (size_t)(e->addr - h->vm->base + page - 1) / page;
    *end = cuh_min_size((size_t)(e->addr + e->size - h->vm->base) / page, h->pages_high);
}

/* Takes the page behind page index p out of its place for a new use. */
static void page_leave_locked(cuh_heap_t *h, size_t p, uint64_t *out)
{
    *out = h->page_handle[p];
    h->page_handle[p] = 0;
    h->page_mapped[p >> 6] &= ~((uint64_t)1 << (p & 63));
    h->mapped_pages--;   /* still held: physical_pages unchanged */
    h->num_page_steals++;
}

/* Unmaps the old mappings, page by page, in DRAIN extent x, a page whose
 * unmap fails tried once more. 0 if one stays mapped. */
int cuh_hp_unmap_drain_locked(cuh_heap_t *h, const cuh_extent_t *x)
{
    size_t failed = 0;
    for (uintptr_t va = x->addr; va < x->addr + x->size; va += h->vm_page)
        if (h->dev->ops->vm_unmap(h->dev, va, h->vm_page) != CUH_DEV_OK &&
            h->dev->ops->vm_unmap(h->dev, va, h->vm_page) != CUH_DEV_OK)
            failed++;
    if (failed)
        cuh_log("device %d: %zu old mapping%s at 0x%llx not unmapped: %s", h->dev->ordinal, failed,
                failed == 1 ? "" : "s", (unsigned long long)x->addr, h->dev->last_error);
    return failed == 0;
}

/* Unmaps the old mappings of every drain whose event has completed (with
 * `wait`: of every drain, the CPU waiting for their events). 1 when none is
 * left. During a graph capture it makes no event call and unmaps nothing. */
int cuh_hp_drains_poll_locked(cuh_heap_t *h, int wait)
{
    if (h->captures)
        return h->drains == NULL;   /* no event call during a capture */
    vm_drain_t **link = &h->drains;
    while (*link) {
        vm_drain_t *d = *link;
        if (d->event && h->dev->ops->event_query(h->dev, d->event) != CUH_DEV_OK) {
            if (!wait) {
                link = &d->next;
                continue;
            }
            cuh_hp_cpu_wait_event(h, d->event);
        }
        /* The GPU passed the frees: the ranges become free memory, but for a
         * range an old mapping stays in (the device refused to unmap it):
         * nothing may be placed there, so it stays out of use for good, in
         * stuck_drains, said on stderr. */
        size_t stuck = 0;
        for (size_t i = 0; i < d->num_extents; i++) {
            if (cuh_hp_unmap_drain_locked(h, d->extents[i]))
                cuh_arena_release(&h->arena, d->extents[i], CUH_TAG_GLOBAL);
            else
                d->extents[stuck++] = d->extents[i];
        }
        if (d->event)
            cuh_hp_event_put_locked(h, d->event);
        *link = d->next;
        if (stuck) {
            cuh_log("device %d: %zu range%s kept out of use: an old mapping could not be unmapped", h->dev->ordinal,
                    stuck, stuck == 1 ? "" : "s");
            d->num_extents = stuck;
            d->event = NULL;
            d->next = h->stuck_drains;
            h->stuck_drains = d;
        } else {
            free(d);
        }
    }
    return h->drains == NULL;
}

/* A drain with room for `cap` extents, and the event that will close it;
 * NULL if out of host memory or events. */
static vm_drain_t *drain_new_locked(cuh_heap_t *h, size_t cap)
{
    vm_drain_t *d = malloc(sizeof *d + cap * sizeof d->extents[0]);
    cuh_event_t ev = d ? cuh_hp_event_get_locked(h) : NULL;
    if (!ev) {
        free(d);
        return NULL;
    }
    *d = (vm_drain_t){.event = ev};
    return d;
}

/* Carves pages [p, run) out of free extent *rest into a DRAIN extent of d,
 * tagged `tag` (nothing is placed there), their physical pages to out[]:
 * mapped at their new place by the caller, their old mapping kept until d's
 * event has completed. *rest becomes the free part after them, or NULL. 0
 * when out of host memory for the records. */
static int drain_carve_locked(cuh_heap_t *h, vm_drain_t *d, cuh_extent_t **rest, size_t p, size_t run, uint32_t tag,
                              uint64_t *out)
{
    cuh_extent_t *x = cuh_arena_take_at(&h->arena, *rest, cuh_hp_page_va(h, p), (run - p) * h->vm_page,
                                        CUH_EXTENT_DRAIN, tag);
    if (!x)
        return 0;
    d->extents[d->num_extents++] = x;
    for (size_t i = 0; p < run; p++, i++)
        page_leave_locked(h, p, &out[i]);
    *rest = x->next && x->next->state == CUH_EXTENT_FREE ? x->next : NULL;
    return 1;
}

/* Closes drain d with its event recorded on `stream` now: once the work
 * issued there so far is done, its old mappings go (cuh_hp_drains_poll_locked).
 * Without an event the CPU waits for the device, and they go now. */
static void drain_close_locked(cuh_heap_t *h, vm_drain_t *d, cuh_stream_t stream)
{
    if (!d->num_extents) {
        cuh_hp_event_put_locked(h, d->event);
        free(d);
        return;
    }
    if (h->dev->ops->event_record(h->dev, d->event, stream) != CUH_DEV_OK) {
        cuh_hp_event_put_locked(h, d->event);
        d->event = NULL;
        cuh_hp_cpu_wait_device(h);
    }
    vm_drain_t **link = &h->drains;
    while (*link)
        link = &(*link)->next;
    *link = d;
    if (!d->event)
        cuh_hp_drains_poll_locked(h, 0);
}

/* Moves up to `want` pages lying wholly inside free extents of `tag` (of
 * the reservation, oldest first) whose take-back generation is above
 * `settled` (`running`) or not, to out[], their old mappings kept: each run
 * of them becomes a DRAIN extent of one drain, closed with an event recorded
 * on `stream` now. Returns how many. Lending and alias moves both. */
static size_t drain_runs_locked(cuh_heap_t *h, uint32_t tag, int running, uint64_t settled, cuh_stream_t stream,
                                uint64_t *out, size_t want)
{
    vm_drain_t *d = NULL;
    size_t got = 0;
    for (cuh_extent_t *e = h->arena.tags[tag].oldest, *older; e && got < want; e = older) {
        older = e->tag_prev;
        if (e->segment != h->vm)
            continue;
        size_t p, end;
        pages_inside_extent(h, e, &p, &end);
        cuh_extent_t *rest = e;   /* the free part still after the runs carved */
        while (p < end && got < want && rest) {
            if (!h->page_handle[p] || (h->page_gen[p] > settled) != running) {
                p++;
                continue;
            }
            size_t run = p;
            while (run < end && run - p < want - got && h->page_handle[run] && (h->page_gen[run] > settled) == running)
                run++;
            if (!d && !(d = drain_new_locked(h, want)))
                return 0;   /* no drain, nothing carved yet */
            if (!drain_carve_locked(h, d, &rest, p, run, tag, out + got))
                break;   /* out of host memory for records: move what there is */
            got += run - p;
            p = run;
        }
    }
    if (d)
        drain_close_locked(h, d, stream);
    return got;
}

/* Lends up to `want` pages lying wholly inside free extents private to
 * stream `own` to a new block of `own`: memory the stream freed whose work
 * the GPU may not have passed yet. The new block's work runs after that
 * work (one stream), so a page may serve it at once; only the old mapping
 * must stay until that work is done, for unmapping is not stream-ordered.
 * So the page is mapped at its new place beside its old one, whose address
 * range becomes a DRAIN extent (nothing is placed there) until an event
 * recorded on `own` now has completed. Without this a busy GPU leaves a
 * stream's recent frees unmovable: the CPU waits for them, or the heap
 * takes new pages. Returns how many. */
static size_t lend_own_pages_locked(cuh_heap_t *h, stream_state_t *own, uint64_t *out, size_t want,
                                    uint64_t settled)
{
    if (!own || own->tag == CUH_TAG_GLOBAL || own->retired || h->captures || !want)
        return 0;
    return drain_runs_locked(h, own->tag, 0, settled, own->handle, out, want);
}

/* Unmaps up to `want` pages lying wholly inside global free extents of the
 * reservation; their physical pages go to out[]. Then, for a block of
 * stream `own`, up to `lend_max` pages its own recent frees lend
 * (lend_own_pages_locked), after the others in out[], their count added to
 * *lent. Returns how many in all. Pages work a take-back left running may
 * still touch (page_gen) are left where they are unless `may_wait` (then
 * the CPU waits for that work first) or `alias` (then they move, their old
 * mappings kept until that work is done); while other streams' work may touch
 * memory handed over early (unsettled), no page moves unless `may_wait`. */
static size_t steal_pages_locked(cuh_heap_t *h, uint64_t *out, size_t want, int may_wait, int alias,
                                 stream_state_t *own, size_t lend_max, size_t *lent)
{
    size_t n;
    /* Neither are pages lent while work may still touch them: the stream's
     * own frees may hold such memory (its work is ordered behind the
     * take-back's or hand-over's GPU-side waits, but the heap does not lean
     * on that). */
    if (h->num_unsettled && !settle_unsettled_locked(h, may_wait))
        return 0;
    const uint64_t settled = settled_gen_locked(h, may_wait);
    size_t got = 0, page = h->vm_page;
    /* Oldest free memory first: the newest is the likeliest to be reused soon,
     * and taking its pages would only move them back again. */
    for (cuh_extent_t *e = h->arena.tags[CUH_TAG_GLOBAL].oldest; e && got < want; e = e->tag_prev) {
        if (e->segment != h->vm)
            continue;
        size_t first, end;
        pages_inside_extent(h, e, &first, &end);
        for (size_t p = first; p < end && got < want; p++) {
            if (!h->page_handle[p] || h->page_gen[p] > settled)
                continue;
            if (h->dev->ops->vm_unmap(h->dev, cuh_hp_page_va(h, p), page) != CUH_DEV_OK) {
                cuh_log("device %d: %s", h->dev->ordinal, h->dev->last_error);
                continue;
            }
            page_leave_locked(h, p, &out[got++]);
        }
    }
    /* With `alias`, then pages a take-back returned while the work before
     * their frees may still run (alias moves, docs/design.md): the take-back
     * made every later piece of work, on every stream, wait on the GPU for
     * that work, so a page may back a new block at once; only its old
     * mapping stays (a DRAIN extent) until an event recorded on the default
     * stream now, behind that wait, has completed. No event call during a
     * capture. */
    if (alias && got < want && !h->captures)
        got += drain_runs_locked(h, CUH_TAG_GLOBAL, 1, settled, 0, out + got, want - got);
    n = lend_own_pages_locked(h, own, out + got, cuh_min_size(want - got, lend_max), settled);
    *lent += n;
    return got + n;
}

/* ---- recurring moves --------------------------------------------------------------
 * Above vmm_margin a block's missing pages are moved from free memory. While
 * the layout settles that is cheap memory: GPT-2's logits needed moved pages
 * in 2 of their 80 mappings. But a loop whose blocks come back every step to
 * where free memory lies scattered has the same pages moved every step,
 * about 55 us a page on an H200 each time: a conv net fed by a side stream
 * moved 485 pages a step and ran at 2.2-2.4x native's step time. A block
 * size at least half of whose last 8 mappings needed moved pages gets new
 * pages instead (paid once, about 35 us a page, and memory); pages still
 * move when the limit or the device refuses new ones (cuh_hp_map_range_locked).
 *
 * "Paid once" holds for one block of the size. Several live at once (GPT-2's
 * three 3 GiB logits) may each land where no pages are, one after another,
 * and each would get new pages while the pages they left lie free: replayed
 * as under LD_PRELOAD with the GPU keeping up (cuheap-replay --cudafree 0
 * --streams 32 --conf vmm:1,vmm_margin:0.03, gpt2_nocache), the heap grew to
 * 1.375x the live peak, more than the 1.088x of the default margin. So new
 * pages for recurring moves stop where the heap would hold more than
 * (1 + RECURRING_MARGINS x vmm_margin) times the live peak (1.089x there);
 * beyond, pages move. At the default margin (1.3x) no bundled or plugin
 * trace reaches it: the side-stream job holds 1.19x. */
#define RECURRING_MARGINS 3.0

/* The index of the entry following block size `pages`, or -1. */
static int mover_index(const cuh_heap_t *h, size_t pages)
{
    for (int i = 0; i < MOVERS; i++)
        if (h->movers[i].pages == pages)
            return i;
    return -1;
}

/* Records a mapping of a block of `pages` pages: whether it needed moved
 * pages (`moved`); a size not yet followed is taken up at its first such
 * mapping. Returns 1 if at least half of its 8 mappings before this one
 * needed moved pages. */
static int mover_recurs_locked(cuh_heap_t *h, size_t pages, int moved)
{
    int i = mover_index(h, pages);
    if (i < 0) {
        if (!moved)
            return 0;
        i = (int)(h->movers_next++ % MOVERS);
        h->movers[i].pages = pages;
        h->movers[i].history = 0;
        h->movers[i].seen = 0;
    }
    int recurs = h->movers[i].seen >= 8 && __builtin_popcount(h->movers[i].history) >= 4;
    h->movers[i].history = (uint8_t)(h->movers[i].history << 1 | (moved ? 1 : 0));
    if (h->movers[i].seen < 255)
        h->movers[i].seen++;
    return recurs;
}

/* Maps every unmapped page of [addr, addr+size) in the reservation: pages
 * taken from free memory first, then new ones from the device. 1 when all
 * are mapped; 0 with *why (the device or the limit refused, or an error). */
int cuh_hp_map_range_locked(cuh_heap_t *h, uintptr_t addr, size_t size, stream_state_t *st, grow_result_t *why)
{
    size_t page = h->vm_page, first, end;
    pages_touched(h, addr, size, &first, &end);
    size_t need = 0, whole = 0;
    *why = GROW_OK;
    for (size_t p = first; p < end; p++)
        if (!h->page_handle[p]) {
            need++;
            whole += (size_t)cuh_hp_page_inside(h, p, addr, size);
        }
    const size_t block_pages = (size + page - 1) / page;
    if (!need) {
        (void)mover_recurs_locked(h, block_pages, 0);
        return 1;
    }
    /* A lent page is safe only for this stream until the GPU has passed its
     * old work: it may back only pages the block covers whole, never one
     * whose rest is free memory another stream could take. handles[i] was
     * lent when lent_flag[i]. */
    uint64_t *handles = malloc(need * sizeof *handles);
    uint8_t *lent_flag = handles ? calloc(need, 1) : NULL;
    size_t lent = 0;
    if (!lent_flag) {
        free(handles);
        cuh_set_error("out of host memory for page handles");
        *why = GROW_ERROR;
        return 0;
    }
    /* New pages are cheap to get while the heap holds little more than the
     * most the program has had live: below that margin take them from the
     * device; above it, move free pages (each move is an unmap and a map). */
    size_t live_peak = cuh_max_size(h->allocated.peak, h->allocated.current + size);
    const double held = (double)(cuh_hp_reserved_bytes(h) + need * page);
    int move_first = held > (double)live_peak * (1.0 + h->cfg.vmm_margin);
    if (mover_recurs_locked(h, block_pages, move_first) &&
        held <= (double)live_peak * (1.0 + RECURRING_MARGINS * h->cfg.vmm_margin))
        move_first = 0;   /* recurring moves: new pages instead, within bounds */
    if (h->drains)
        cuh_hp_drains_poll_locked(h, 0);
    size_t got = 0;
#define STEAL(may_wait, alias, own)                                                                       \
    do {                                                                                                  \
        size_t before = lent, n = steal_pages_locked(h, handles + got, need - got, may_wait, alias, own,  \
                                                     whole - lent, &lent);                                \
        memset(lent_flag + got + n - (lent - before), 1, lent - before);                                  \
        got += n;                                                                                         \
    } while (0)
    if (move_first)
        STEAL(0, 0, st);
    if (got < need && move_first && !h->captures) {
        /* Memory freed on streams becomes stealable once their work is done:
         * fence them all (our own too: unmapping is not stream-ordered). */
        for (uint32_t i = 0; i < h->num_streams; i++)
            if (!h->streams[i]->num_fences)
                cuh_hp_stream_fence_locked(h, h->streams[i]);
        if (cuh_hp_poll_all_locked(h, 0))
            STEAL(0, 0, st);
        /* Last before growing: pages whose old mappings must stay a while,
         * for a block that keeps the live bytes under their peak so far. One
         * that raises it gets new pages: the heap must grow to the new peak
         * anyway, and the memory just freed is the likeliest wanted back. */
        if (got < need && h->allocated.current + size <= h->allocated.peak)
            STEAL(0, 1, st);
    }
    while (got < need) {
        if (!move_first && got == 0 && h->limit && cuh_hp_reserved_bytes(h) + need * page > h->limit) {
            /* The limit would refuse: move free pages after all (a chunk
             * does not wait for them: heap_chunks.c). */
            STEAL(!h->chunk_call, 0, st);
            move_first = 1;
            continue;
        }
        if (h->limit && cuh_hp_reserved_bytes(h) + page > h->limit) {
            *why = GROW_LIMIT;
            break;
        }
        uint64_t handle = 0;
        cuh_dev_status_t rc = h->dev->ops->vm_create(h->dev, page, &handle);
        if (rc != CUH_DEV_OK) {
            *why = rc == CUH_DEV_OOM ? GROW_DEVICE : GROW_ERROR;
            if (rc != CUH_DEV_OOM)
                cuh_set_error("device %d: %s", h->dev->ordinal, h->dev->last_error);
            break;
        }
        handles[got++] = handle;
        h->physical_pages++;
        h->num_segment_allocs++;
    }
    if (got < need && *why != GROW_ERROR && !h->captures && !h->chunk_call) {
        cuh_hp_settle_all_locked(h);
        STEAL(1, 0, NULL);
    }
#undef STEAL
    /* Map what there is, lent pages where the block covers the page whole.
     * On a shortfall the caller frees the block: the pages mapped behind it
     * stay there, cached, not lost. */
    int ok = got == need;
    size_t next_lent = 0, next_other = 0;
    for (size_t p = first; p < end; p++) {
        if (h->page_handle[p])
            continue;
        while (next_lent < got && !lent_flag[next_lent])
            next_lent++;
        while (next_other < got && lent_flag[next_other])
            next_other++;
        size_t k = cuh_hp_page_inside(h, p, addr, size) && next_lent < got ? next_lent++ : next_other++;
        if (k >= got) {
            ok = 0;   /* no page may go here (a shortfall) */
            continue;
        }
        if (h->dev->ops->vm_map(h->dev, cuh_hp_page_va(h, p), page, handles[k]) != CUH_DEV_OK) {
            cuh_set_error("device %d: %s", h->dev->ordinal, h->dev->last_error);
            h->dev->ops->vm_release(h->dev, handles[k]);
            h->physical_pages--;
            h->num_segment_frees++;
            *why = GROW_ERROR;
            ok = 0;
            continue;
        }
        h->page_handle[p] = handles[k];
        h->page_mapped[p >> 6] |= (uint64_t)1 << (p & 63);
        h->mapped_pages++;
        h->num_page_maps++;
        if (p + 1 > h->pages_high)
            h->pages_high = p + 1;
    }
    free(handles);
    free(lent_flag);
    return ok;
}

/* 1 if a block at [addr, addr + size) of the reservation lacks a page. On
 * every fit under vmm:1, so it tests 64 pages a word: a 3 GiB block spans
 * 1,536 pages of 2 MiB. */
int cuh_hp_needs_pages_locked(const cuh_heap_t *h, uintptr_t addr, size_t size)
{
    size_t first, end;
    pages_touched(h, addr, size, &first, &end);
    return !cuh_bits_all_set(h->page_mapped, first, end - 1);
}

/* Returns to the device every page lying wholly inside global free memory
 * of the reservation; the count. */
size_t cuh_hp_release_free_pages_locked(cuh_heap_t *h)
{
    if (!h->vm)
        return 0;
    uint64_t batch[256];
    size_t released = 0, n;
    /* A page released while an old mapping of it remains would stay
     * allocated on the device: the old mappings go first. */
    cuh_hp_drains_poll_locked(h, 1);
    size_t none = 0;
    while ((n = steal_pages_locked(h, batch, 256, 1, 0, NULL, 0, &none)) > 0) {
        for (size_t i = 0; i < n; i++)
            h->dev->ops->vm_release(h->dev, batch[i]);
        h->physical_pages -= n;
        h->num_segment_frees += n;
        released += n;
    }
    return released;
}

/* The largest piece of free memory a request could get at once. Under
 * virtual memory, free pages move to wherever they are needed, so all cached
 * memory (`cached`, counted as the caller counts it: the statistics count
 * what thread caches hold as free) is one piece; the reservation's unmapped
 * address space is not memory and does not count. */
size_t cuh_hp_largest_free_locked(const cuh_heap_t *h, size_t cached)
{
    if (!h->vm)
        return cuh_arena_largest_free(&h->arena);
    size_t largest = cached;
    for (uint32_t t = 0; t < h->arena.num_tags; t++) {
        const cuh_binnode_t *n = cuh_freebins_largest(&h->arena.tags[t].bins[CUH_REGION_WORKSPACE]);
        if (n && n->size > largest)
            largest = n->size;
    }
    return largest;
}

/* ---- memory handed over while its work runs ------------------------------------ */

/* Keeps `e`, recorded on `stream` just now, until it completes
 * (settle_unsettled_locked). Work on a stream completes in order, so it
 * stands for every event kept for its stream and takes their place: at most
 * one per stream. If there is no room to keep it, waits for it now. */
static void unsettled_add_locked(cuh_heap_t *h, cuh_event_t e, cuh_stream_t stream)
{
    size_t kept = 0;
    for (size_t i = 0; i < h->num_unsettled; i++) {
        kept_event_t *k = &h->unsettled[i];
        if (k->stream == stream)
            cuh_hp_event_put_locked(h, k->event);   /* the new one stands for it */
        else
            h->unsettled[kept++] = *k;
    }
    h->num_unsettled = kept;
    if (h->num_unsettled == h->cap_unsettled) {
        size_t cap = h->cap_unsettled ? 2 * h->cap_unsettled : 8;
        kept_event_t *grown = realloc(h->unsettled, cap * sizeof *grown);
        if (!grown) {
            cuh_hp_cpu_wait_event(h, e);
            cuh_hp_event_put_locked(h, e);
            return;
        }
        h->unsettled = grown;
        h->cap_unsettled = cap;
    }
    h->unsettled[h->num_unsettled++] = (kept_event_t){e, stream};
}

/* Opens take-back generation take_back_gen + 1 for the blocks a take-back
 * returns while work issued before their frees may still run: an event
 * recorded now on the default stream, which the take-back made wait for
 * that work (order_streams_after_locked; without other streams the work is
 * its own), completes after it. Returns the generation, 0 if no event could
 * be recorded. */
uint64_t cuh_hp_gen_open_locked(cuh_heap_t *h)
{
    cuh_event_t e = cuh_hp_event_get_locked(h);
    if (!e || h->dev->ops->event_record(h->dev, e, 0) != CUH_DEV_OK) {
        if (e)
            cuh_hp_event_put_locked(h, e);
        return 0;
    }
    (void)settled_gen_locked(h, 0);   /* drop those done */
    const uint64_t gen = h->take_back_gen + 1;
    if (h->num_gen_events == GEN_EVENTS_MAX) {
        /* The newest stands for the one it replaces, and for its generation. */
        cuh_hp_event_put_locked(h, h->gen_events[GEN_EVENTS_MAX - 1].event);
        h->gen_events[GEN_EVENTS_MAX - 1] = (gen_event_t){e, gen};
    } else {
        h->gen_events[h->num_gen_events++] = (gen_event_t){e, gen};
    }
    h->take_back_gen = gen;
    return gen;
}

/* Under vmm:1, when other streams get memory st freed before the GPU has
 * passed the frees: unmapping is not stream-ordered, so no page of it may
 * move before st's work up to now is done, whatever the new users wait for
 * (steal_pages_locked waits for every kept event). An event recorded now
 * covers that work and is the newest on st (kept as fresh:
 * unsettled_add_locked). 0 if none could be recorded. */
int cuh_hp_keep_until_done_locked(cuh_heap_t *h, stream_state_t *st)
{
    cuh_event_t done = cuh_hp_event_get_locked(h);
    if (!done || h->dev->ops->event_record(h->dev, done, st->handle) != CUH_DEV_OK) {
        if (done)
            cuh_hp_event_put_locked(h, done);
        return 0;
    }
    unsettled_add_locked(h, done, st->handle);
    return 1;
}

/* ---- the reservation, and peers ------------------------------------------------ */

/* Sets up the virtual-memory reservation (vmm:1): four times the device's
 * memory of address space, so that free address ranges whose pages moved
 * elsewhere never crowd out new blocks. A device without virtual memory
 * management keeps plain segments, and says so. */
void cuh_hp_start_vm_locked(cuh_heap_t *h)
{
    size_t granularity = h->dev->ops->vm_granularity ? h->dev->ops->vm_granularity(h->dev) : 0;
    if (!granularity) {
        cuh_log("device %d: no CUDA virtual memory management; vmm:1 cannot apply, using plain segments",
                h->dev->ordinal);
        return;
    }
    /* A page is vmm_page bytes, a whole number of the device's granules:
     * created, mapped, granted and moved as one piece. */
    size_t page = cuh_align_up(cuh_max_size(h->cfg.vmm_page, granularity), granularity);
    size_t size = cuh_align_up(4 * h->device_total, page);
    uintptr_t va = 0;
    if (h->dev->ops->vm_reserve(h->dev, size, &va) != CUH_DEV_OK) {
        cuh_log("device %d: reserving address space for vmm:1 failed (%s); using plain segments", h->dev->ordinal,
                h->dev->last_error);
        return;
    }
    h->page_handle = calloc(size / page, sizeof *h->page_handle);
    h->page_mapped = calloc((size / page + 63) / 64, sizeof *h->page_mapped);
    h->page_gen = calloc(size / page, sizeof *h->page_gen);
    cuh_segment_t *seg = h->page_handle && h->page_mapped && h->page_gen
                             ? cuh_arena_add_segment(&h->arena, va, size, CUH_REGION_GENERAL) : NULL;
    if (!seg) {
        free(h->page_handle);
        free(h->page_mapped);
        free(h->page_gen);
        h->page_handle = NULL;
        h->page_mapped = NULL;
        h->page_gen = NULL;
        h->dev->ops->vm_unreserve(h->dev, va, size);
        cuh_log("device %d: out of host memory for vmm:1; using plain segments", h->dev->ordinal);
        return;
    }
    seg->virtual_space = 1;
    h->vm = seg;
    h->vm_page = page;
    h->num_pages = size / page;
}

cuheap_status_t cuh_heap_allow_peer(cuh_heap_t *h, int peer)
{
    cuh_lock(&h->lock);
    cuheap_status_t status = CUHEAP_OK;
    if (h->cfg.vmm) {   /* the reservation may come later: the device remembers the peer */
        const cuh_device_ops_t *ops = h->dev->ops;
        int ok = ops->vm_allow_peer(h->dev, peer, 0, 0) == CUH_DEV_OK;
        /* The mapped pages, a run of neighbours at a time. */
        for (size_t p = 0; ok && p < h->pages_high;) {
            if (!h->page_handle[p]) {
                p++;
                continue;
            }
            size_t end = p;
            while (end < h->pages_high && h->page_handle[end])
                end++;
            ok = ops->vm_allow_peer(h->dev, peer, cuh_hp_page_va(h, p), (end - p) * h->vm_page) == CUH_DEV_OK;
            p = end;
        }
        if (!ok) {
            cuh_set_error("device %d: peer access for device %d: %s", h->dev->ordinal, peer, h->dev->last_error);
            status = CUHEAP_ERR_DEVICE;
        }
    }
    cuh_unlock(&h->lock);
    return status;
}
