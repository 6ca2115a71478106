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
 * (alias moves, steal_pages_locked). A unit that moves stays mapped where it
 * was (kept mappings) until something else is mapped there.
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

/* The device's map and unmap calls, counted: the driver charges per call
 * (about 35 us for a unit of 2 MiB, 63 us for 512 MiB), so the steps'
 * records show the calls beside the pages. */
static cuh_dev_status_t vm_unmap_counted(cuh_heap_t *h, uintptr_t va, size_t size)
{
    h->num_map_calls++;
    return h->dev->ops->vm_unmap(h->dev, va, size);
}

/* ---- physical units ----------------------------------------------------------------
 * A unit is one physical allocation mapped over consecutive pages
 * (page_plan.h says why): every page of it holds the unit's handle in
 * page_handle[], so a unit is a run of equal handles, which no two units
 * share. It is mapped, moved and unmapped whole. */

/* The first page of the unit holding page p (mapped). */
static size_t unit_head(const cuh_heap_t *h, size_t p)
{
    while (p > 0 && h->page_handle[p - 1] == h->page_handle[p])
        p--;
    return p;
}

/* The page after the unit whose first page is p. */
static size_t unit_end(const cuh_heap_t *h, size_t p)
{
    size_t q = p + 1;
    while (q < h->pages_high && h->page_handle[q] == h->page_handle[p])
        q++;
    return q;
}

/* The newest take-back generation stamped on pages [p, q). */
static uint64_t unit_gen(const cuh_heap_t *h, size_t p, size_t q)
{
    uint64_t gen = 0;
    for (; p < q; p++)
        if (h->page_gen[p] > gen)
            gen = h->page_gen[p];
    return gen;
}

/* The next unit lying wholly in pages [*p, end) whose take-back generation
 * is above `settled` (`running`) or not: [*head, *q), and *p moves past
 * it. 0 when there is none. */
static int next_unit(const cuh_heap_t *h, size_t *p, size_t end, uint64_t settled, int running, size_t *head,
                     size_t *q)
{
    while (*p < end) {
        if (!h->page_handle[*p]) {
            (*p)++;
            continue;
        }
        const size_t at = *p;
        *head = unit_head(h, at);
        *q = unit_end(h, *head);
        *p = *q;
        if (*head == at && *q <= end && (unit_gen(h, *head, *q) > settled) == running)
            return 1;
    }
    return 0;
}

/* ---- kept mappings -----------------------------------------------------------------
 * A unit that moves from free memory to a block is not unmapped where it
 * was: the unmap is a third of a move's cost (16-20 us a unit on an H100 of
 * 53-58, docs/benchmarks.md), and the range it leaves, free memory without
 * pages as far as the heap knows, is often never mapped again, or mapped
 * again with the same unit, which then costs no call at all (replayed, half
 * of the map and unmap calls of the corpus's jobs that move pages in every
 * step; bench/HISTORY.md, "Kept mappings"). The driver lets one allocation
 * be mapped at several ranges at once. A kept mapping is unmapped when
 * another unit is mapped over any of its pages, before its unit goes back
 * to the device (an allocation's memory stays while a mapping of it
 * remains), when a peer is granted access (a kept mapping lacks the grant),
 * and with the heap. No block lies on a kept mapping, so nothing reaches a
 * unit through it: the stream and page rules hold where the unit is used.
 * A kept mapping that the device refused to unmap as its unit went back is
 * marked KEPT_ORPHAN: the range stays mapped until an unmap succeeds, and no
 * later unit, whatever its handle (the driver may hand out a released one's
 * again), is taken to be mapped there. */
#define KEPT_ORPHAN UINT64_MAX

static int kept_head_at(const cuh_heap_t *h, size_t p)
{
    return (int)((h->kept_head[p >> 6] >> (p & 63)) & 1);
}

/* The page after the kept mapping that begins at page p. */
static size_t kept_end(const cuh_heap_t *h, size_t p)
{
    size_t q = p + 1;
    while (q < h->pages_high && h->kept_handle[q] == h->kept_handle[p] && !kept_head_at(h, q))
        q++;
    return q;
}

/* Keeps unit `handle` mapped over pages [p, q), which it has just left. */
static void kept_add_locked(cuh_heap_t *h, size_t p, size_t q, uint64_t handle)
{
    h->kept_head[p >> 6] |= (uint64_t)1 << (p & 63);
    for (size_t i = p; i < q; i++)
        h->kept_handle[i] = handle;
    h->kept_pages += q - p;
}

/* Forgets the kept mapping over pages [p, q), which begins at p: it was
 * unmapped, or its unit is in use there again. */
static void kept_forget_locked(cuh_heap_t *h, size_t p, size_t q)
{
    h->kept_head[p >> 6] &= ~((uint64_t)1 << (p & 63));
    for (size_t i = p; i < q; i++)
        h->kept_handle[i] = 0;
    h->kept_pages -= q - p;
}

/* Unmaps the kept mapping that begins at page p. 0 when the device refused:
 * it stays, and the error is set. */
static int kept_drop_locked(cuh_heap_t *h, size_t p)
{
    const size_t q = kept_end(h, p);
    if (vm_unmap_counted(h, cuh_hp_page_va(h, p), (q - p) * h->vm_page) != CUH_DEV_OK) {
        cuh_set_error("device %d: %s", h->dev->ordinal, cuh_dev_error_text(h->dev));
        return 0;
    }
    kept_forget_locked(h, p, q);
    return 1;
}

/* Unmaps every kept mapping over any of pages [first, end). 0 if one stays. */
static int kept_clear_locked(cuh_heap_t *h, size_t first, size_t end)
{
    int ok = 1;
    if (!h->kept_pages)
        return 1;
    /* A mapping over `first` may begin before it. */
    size_t p = first;
    if (p < h->pages_high && h->kept_handle[p])
        while (!kept_head_at(h, p))
            p--;
    for (end = cuh_min_size(end, h->pages_high); p < end; p++) {
        if (!h->kept_handle[p])
            continue;
        const size_t q = kept_end(h, p);
        ok &= kept_drop_locked(h, p);
        p = q - 1;
    }
    return ok;
}

/* Unmaps every kept mapping of unit `handle` (of every unit: 0), before the
 * unit goes back to the device. One the device refuses to unmap becomes an
 * orphan (KEPT_ORPHAN, above). 0 if one stays. */
static int kept_drop_unit_locked(cuh_heap_t *h, uint64_t handle)
{
    int ok = 1;
    for (size_t p = 0; h->kept_pages && (p = cuh_bits_next(h->kept_head, p, h->pages_high, 1)) < h->pages_high;) {
        const size_t q = kept_end(h, p);
        if ((!handle || h->kept_handle[p] == handle) && !kept_drop_locked(h, p)) {
            ok = 0;
            for (size_t i = p; i < q; i++)
                h->kept_handle[i] = KEPT_ORPHAN;
        }
        p = q;
    }
    return ok;
}

/* Unmaps every kept mapping before memory goes back (the heap goes, or its
 * cache is released); one that stays is said on stderr. */
static void kept_drop_all_locked(cuh_heap_t *h)
{
    if (h->kept_pages && !kept_drop_unit_locked(h, 0))
        cuh_log_rate_limited("device %d: kept mappings stay mapped: %s", h->dev->ordinal, cuh_get_error());
}

/* Returns unit `handle` of `pages` pages, mapped nowhere in use, to the
 * device: its kept mappings go first. */
static void unit_release_locked(cuh_heap_t *h, uint64_t handle, size_t pages)
{
    if (h->kept_pages && !kept_drop_unit_locked(h, handle))
        cuh_log_rate_limited("device %d: a kept mapping of a unit given back stays mapped: %s", h->dev->ordinal,
                             cuh_get_error());
    /* An old mapping of it still draining will be kept as an orphan. */
    for (const vm_drain_t *d = h->drains; d; d = d->next)
        for (size_t i = 0; i < d->num_extents; i++) {
            const cuh_extent_t *x = d->extents[i];
            const size_t first = (size_t)(x->addr - h->vm->base) / h->vm_page, end = first + x->size / h->vm_page;
            for (size_t p = first; p < end; p++)
                if (h->drain_handle[p] == handle)
                    h->drain_handle[p] = KEPT_ORPHAN;
        }
    h->dev->ops->vm_release(h->dev, handle);
    h->physical_pages -= pages;
    h->num_segment_frees++;
}

/* Takes the unit over pages [p, q) out of its place for a new use; its
 * handle. */
static uint64_t unit_leave_locked(cuh_heap_t *h, size_t p, size_t q)
{
    const uint64_t handle = h->page_handle[p];
    for (; p < q; p++) {
        h->page_handle[p] = 0;
        h->page_mapped[p >> 6] &= ~((uint64_t)1 << (p & 63));
        h->mapped_pages--;   /* still held: physical_pages unchanged */
        h->num_page_steals++;
    }
    return handle;
}

/* Once the GPU has passed the work on DRAIN extent x, its old mappings
 * become kept ones, a unit at a time (drain_head marks where each begins):
 * no device call. */
void cuh_hp_keep_drain_locked(cuh_heap_t *h, const cuh_extent_t *x)
{
    const size_t first = (size_t)(x->addr - h->vm->base) / h->vm_page, end = first + x->size / h->vm_page;
    for (size_t p = first, q; p < end; p = q) {
        for (q = p + 1; q < end && !((h->drain_head[q >> 6] >> (q & 63)) & 1);)
            q++;
        kept_add_locked(h, p, q, h->drain_handle[p]);
        for (size_t i = p; i < q; i++)
            h->drain_handle[i] = 0;
        h->drain_head[p >> 6] &= ~((uint64_t)1 << (p & 63));
    }
}

/* Frees the DRAIN extents of every drain whose event has completed (with
 * `wait`: of every drain, the CPU waiting for their events), their old
 * mappings kept. 1 when none is left. During a graph capture it makes no
 * event call. */
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
        /* The GPU passed the frees: the ranges become free memory. */
        for (size_t i = 0; i < d->num_extents; i++) {
            cuh_hp_keep_drain_locked(h, d->extents[i]);
            cuh_arena_release(&h->arena, d->extents[i], CUH_TAG_GLOBAL);
        }
        if (d->event)
            cuh_hp_event_put_locked(h, d->event);
        *link = d->next;
        free(d);
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

/* Carves unit [p, q) out of free extent *rest into a DRAIN extent of d,
 * tagged `tag` (nothing is placed there), and places its physical
 * allocation in the plan at `dest`: mapped at its new place by the caller,
 * its old mapping kept until d's event has completed. *rest becomes the
 * free part after it, or NULL. 0 when out of host memory for the records
 * (nothing carved). */
static int drain_carve_locked(cuh_heap_t *h, vm_drain_t *d, cuh_extent_t **rest, size_t p, size_t q, uint32_t tag,
                              cuh_page_plan_t *pl, size_t dest, int lent)
{
    cuh_extent_t *x = cuh_arena_take_at(&h->arena, *rest, cuh_hp_page_va(h, p), (q - p) * h->vm_page,
                                        CUH_EXTENT_DRAIN, tag);
    if (!x)
        return 0;
    h->drain_head[p >> 6] |= (uint64_t)1 << (p & 63);
    *rest = x->next && x->next->state == CUH_EXTENT_FREE ? x->next : NULL;
    /* A unit right after the last one carved joins its extent: a run of
     * them drains as one range. */
    cuh_extent_t *last = d->num_extents ? d->extents[d->num_extents - 1] : NULL;
    if (last && last->next == x && last->addr + last->size == x->addr)
        cuh_arena_join_used(&h->arena, last);
    else
        d->extents[d->num_extents++] = x;
    const uint64_t handle = unit_leave_locked(h, p, q);
    for (size_t i = p; i < q; i++)
        h->drain_handle[i] = handle;   /* kept there once the drain is done */
    (void)cuh_page_plan_place(pl, handle, dest, q - p, lent);   /* where it fits: cannot fail */
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

/* Moves units lying wholly inside free extents of `tag` (of the
 * reservation, oldest first) whose take-back generation is above `settled`
 * (`running`) or not into the plan, where they fit, their old mappings
 * kept: each becomes a DRAIN extent of one drain, closed with an event
 * recorded on `stream` now. `lent`: placed as safe for the block's stream
 * only. Returns the pages placed. Lending and alias moves both. */
static size_t drain_units_locked(cuh_heap_t *h, cuh_page_plan_t *pl, uint32_t tag, int running, uint64_t settled,
                                 cuh_stream_t stream, int lent)
{
    vm_drain_t *d = NULL;
    size_t got = 0;
    for (cuh_extent_t *e = h->arena.tags[tag].oldest, *older; e && pl->lacking; e = older) {
        older = e->tag_prev;
        if (e->segment != h->vm)
            continue;
        size_t p, end;
        pages_inside_extent(h, e, &p, &end);
        cuh_extent_t *rest = e;   /* the free part still after the units carved */
        size_t head, q, dest;
        while (pl->lacking && rest && next_unit(h, &p, end, settled, running, &head, &q)) {
            if (!cuh_page_plan_fit(pl, q - head, lent, &dest))
                continue;
            if (!d && !(d = drain_new_locked(h, pl->lacking)))
                return got;   /* no drain, nothing carved by it */
            if (!drain_carve_locked(h, d, &rest, head, q, tag, pl, dest, lent))
                break;   /* out of host memory for records: move what there is */
            got += q - head;
        }
    }
    if (d)
        drain_close_locked(h, d, stream);
    return got;
}

/* Lends units lying wholly inside free extents private to stream `own` to a
 * new block of `own`: memory the stream freed whose work the GPU may not
 * have passed yet. The new block's work runs after that work (one stream),
 * so a unit may serve it at once; only the old mapping must stay until that
 * work is done, for unmapping is not stream-ordered. So the unit is mapped
 * at its new place beside its old one, whose address range becomes a DRAIN
 * extent (nothing is placed there) until an event recorded on `own` now has
 * completed. It goes only over pages the block covers whole: the rest of a
 * partly covered page is free memory another stream could take at once.
 * Without this a busy GPU leaves a stream's recent frees unmovable: the CPU
 * waits for them, or the heap takes new pages. Returns the pages placed. */
static size_t lend_own_units_locked(cuh_heap_t *h, cuh_page_plan_t *pl, stream_state_t *own, uint64_t settled)
{
    if (!own || own->tag == CUH_TAG_GLOBAL || own->retired || h->captures || !pl->lacking)
        return 0;
    return drain_units_locked(h, pl, own->tag, 0, settled, own->handle, 1);
}

/* Drops what a take-back or a hand-over left running, as far as it has
 * completed (with `may_wait`: the CPU waits for it). The generation below
 * which pages may move, or UINT64_MAX if none may move (work memory handed
 * over early may still touch runs). */
static uint64_t movable_gen_locked(cuh_heap_t *h, int may_wait)
{
    if (h->num_unsettled && !settle_unsettled_locked(h, may_wait))
        return UINT64_MAX;
    return settled_gen_locked(h, may_wait);
}

/* Unmaps units lying wholly inside global free extents of the reservation
 * whose take-back generation is at most `settled`, oldest free memory
 * first (the newest is the likeliest to be reused soon, and taking its
 * pages would only move them back again). With a plan, a unit is unmapped
 * only where it fits and placed there, until the plan lacks nothing;
 * without, each goes back to the device, until `want` pages have gone.
 * Returns the pages placed or released. */
static size_t unmap_free_units_locked(cuh_heap_t *h, uint64_t settled, cuh_page_plan_t *pl, size_t want)
{
    size_t done = 0, head, q, dest = 0;
    for (cuh_extent_t *e = h->arena.tags[CUH_TAG_GLOBAL].oldest; e && (pl ? pl->lacking : done < want);
         e = e->tag_prev) {
        if (e->segment != h->vm)
            continue;
        size_t p, end;
        pages_inside_extent(h, e, &p, &end);
        while ((pl ? pl->lacking : done < want) && next_unit(h, &p, end, settled, 0, &head, &q)) {
            if (pl && !cuh_page_plan_fit(pl, q - head, 0, &dest))
                continue;
            if (!pl && vm_unmap_counted(h, cuh_hp_page_va(h, head), (q - head) * h->vm_page) != CUH_DEV_OK) {
                cuh_log_rate_limited("device %d: returning a free page: %s", h->dev->ordinal,
                                     cuh_dev_error_text(h->dev));
                continue;
            }
            const uint64_t handle = unit_leave_locked(h, head, q);
            if (pl) {
                kept_add_locked(h, head, q, handle);   /* a move keeps its old mapping (kept mappings) */
                (void)cuh_page_plan_place(pl, handle, dest, q - head, 0);   /* where it fits: cannot fail */
            } else {
                unit_release_locked(h, handle, q - head);
            }
            done += q - head;
        }
    }
    return done;
}

/* Moves units lying wholly inside global free extents of the reservation
 * into the plan where they fit: each is unmapped and placed. Then, for a
 * block of stream `own`, the units its own recent frees lend
 * (lend_own_units_locked). Returns the pages placed. Units work a take-back
 * left running may still touch (page_gen) stay where they are unless
 * `may_wait` (then the CPU waits for that work first) or `alias` (then they
 * move, their old mappings kept until that work is done); while other
 * streams' work may touch memory handed over early (unsettled), nothing
 * moves unless `may_wait`. */
static size_t steal_units_locked(cuh_heap_t *h, cuh_page_plan_t *pl, int may_wait, int alias, stream_state_t *own)
{
    /* Neither are units lent while work may still touch them: the stream's
     * own frees may hold such memory (its work is ordered behind the
     * take-back's or hand-over's GPU-side waits, but the heap does not lean
     * on that). */
    const uint64_t settled = movable_gen_locked(h, may_wait);
    if (settled == UINT64_MAX)
        return 0;
    size_t got = unmap_free_units_locked(h, settled, pl, 0);
    /* With `alias`, then units a take-back returned while the work before
     * their frees may still run (alias moves, docs/design.md): the take-back
     * made every later piece of work, on every stream, wait on the GPU for
     * that work, so a unit may back a new block at once; only its old
     * mapping stays (a DRAIN extent) until an event recorded on the default
     * stream now, behind that wait, has completed. No event call during a
     * capture. */
    if (alias && pl->lacking && !h->captures)
        got += drain_units_locked(h, pl, CUH_TAG_GLOBAL, 1, settled, 0, 0);
    return got + lend_own_units_locked(h, pl, own, settled);
}

/* Returns to the device units lying wholly inside global free memory of
 * the reservation, oldest free memory first, until `want` pages have gone
 * (SIZE_MAX: all). Units work may still touch stay unless `may_wait` (the
 * CPU then waits for it). Returns the pages released. */
static size_t release_units_locked(cuh_heap_t *h, size_t want, int may_wait)
{
    const uint64_t settled = movable_gen_locked(h, may_wait);
    return settled == UINT64_MAX ? 0 : unmap_free_units_locked(h, settled, NULL, want);
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

/* The most pages a new unit may hold. A unit costs the driver the same
 * whatever its length (docs/benchmarks.md: a 2 MiB page 35 us, 512 MiB 63),
 * and pages of their own cost a call each wherever a block lacks them: the
 * steps that bring a job's new largest shapes map thousands. But a unit a
 * live block partly covers strands the rest, which no other block can use
 * elsewhere. So with vmm_unit:auto a unit holds up to 1/UNIT_FRACTION of the
 * smaller of what the heap holds and what the device has free: what a
 * unit can strand stays a small share of the heap, and units come down to a
 * page as the device fills, where stranding is what runs a job out of
 * memory. 1024: over the tuning corpus (bench/HISTORY.md, "Units that grow
 * with the heap") half the map calls a step, every job's peak within 0.5% of
 * a unit a page; 512 made two jobs hold more, 2048 took off a third of the
 * calls. Units made before the device fills still strand there: the
 * smallest device a job fits in grew by up to 2.2%, so a unit a page stays
 * the default. A device that cannot say what it has free gets units of a
 * page. */
#define UNIT_FRACTION 1024

/* The pages the device has free as far as a unit's size goes: under
 * vmm_unit:auto asked once a mapping (create_units_locked counts down what
 * it creates), 0 if the device cannot say. During a graph capture the
 * device is not asked (no call beyond what the capture needs): units of a
 * page. */
static size_t device_free_pages_locked(cuh_heap_t *h)
{
    size_t free_bytes = 0, total = 0;
    if (h->unit_pages || h->captures || h->dev->ops->mem_info(h->dev, &free_bytes, &total) != CUH_DEV_OK)
        return 0;
    return free_bytes / h->vm_page;
}

static size_t unit_pages_locked(const cuh_heap_t *h, size_t device_free_pages)
{
    if (h->unit_pages)
        return h->unit_pages;   /* vmm_unit:SIZE */
    return cuh_max_size(cuh_min_size(h->physical_pages, device_free_pages) / UNIT_FRACTION, 1);
}

/* Creates a unit for each run of pages the plan still lacks, of at most
 * unit_pages_locked() pages (a shorter one where the limit leaves less
 * room, or the device refuses: down to a page). 0 with *why when the limit
 * or the device refused, or on an error; what was created stays placed. */
static int create_units_locked(cuh_heap_t *h, cuh_page_plan_t *pl, grow_result_t *why)
{
    const size_t page = h->vm_page;
    size_t device_free = pl->lacking ? device_free_pages_locked(h) : 0;
    while (pl->lacking) {
        const cuh_page_run_t r = pl->runs[0];
        size_t k = cuh_min_size(r.len, unit_pages_locked(h, device_free));
        if (h->limit) {
            size_t reserved = cuh_hp_reserved_bytes(h);
            size_t room = h->limit > reserved ? (h->limit - reserved) / page : 0;
            if (!room) {
                *why = GROW_LIMIT;
                return 0;
            }
            k = cuh_min_size(k, room);
        }
        uint64_t handle = 0;
        cuh_dev_status_t rc;
        while ((rc = h->dev->ops->vm_create(h->dev, k * page, &handle)) == CUH_DEV_OOM && k > 1)
            k /= 2;   /* the device may still hold less */
        if (rc != CUH_DEV_OK) {
            *why = rc == CUH_DEV_OOM ? GROW_DEVICE : GROW_ERROR;
            if (rc != CUH_DEV_OOM)
                cuh_set_error("device %d: %s", h->dev->ordinal, cuh_dev_error_text(h->dev));
            return 0;
        }
        h->physical_pages += k;
        device_free -= cuh_min_size(device_free, k);
        h->num_segment_allocs++;
        (void)cuh_page_plan_place(pl, handle, r.start, k, 0);   /* cannot fail: a run's start, room for a unit a page */
    }
    return 1;
}

/* Maps unit u at its place in the plan: where a kept mapping of its own
 * lies there, by taking it back (no call); else kept mappings over those
 * pages are unmapped first. 0 with the error set if the device refused. */
static int map_unit_locked(cuh_heap_t *h, const cuh_unit_place_t *u)
{
    const size_t d = u->dest, e = u->dest + u->pages;
    if (h->kept_pages && h->kept_handle[d] == u->handle && kept_head_at(h, d) && kept_end(h, d) == e) {
        kept_forget_locked(h, d, e);
        h->num_kept_hits++;
        return 1;
    }
    if (!kept_clear_locked(h, d, e))
        return 0;
    h->num_map_calls++;
    if (h->dev->ops->vm_map(h->dev, cuh_hp_page_va(h, d), u->pages * h->vm_page, u->handle) != CUH_DEV_OK) {
        cuh_set_error("device %d: %s", h->dev->ordinal, cuh_dev_error_text(h->dev));
        return 0;
    }
    return 1;
}

/* Maps every unmapped page of [addr, addr+size) in the reservation: units
 * moved from free memory first, then new ones from the device. 1 when all
 * are mapped; 0 with *why (the device or the limit refused, or an error). */
int cuh_hp_map_range_locked(cuh_heap_t *h, uintptr_t addr, size_t size, stream_state_t *st, grow_result_t *why)
{
    size_t page = h->vm_page, first, end;
    pages_touched(h, addr, size, &first, &end);
    *why = GROW_OK;
    const size_t block_pages = (size + page - 1) / page;
    if (cuh_bits_all_set(h->page_mapped, first, end - 1)) {
        (void)mover_recurs_locked(h, block_pages, 0);
        return 1;
    }
    /* A lent unit is safe only for this stream until the GPU has passed its
     * old work: it may back only pages the block covers whole. */
    cuh_page_plan_t plan;
    if (!cuh_page_plan_init(&plan, h->page_mapped, first, end,
                            first + !cuh_hp_page_inside(h, first, addr, size),
                            end - !cuh_hp_page_inside(h, end - 1, addr, size))) {
        cuh_set_error("out of host memory for page handles");
        *why = GROW_ERROR;
        return 0;
    }
    const size_t need = plan.lacking;
    /* New pages are cheap to get while the heap holds little more than the
     * most the program has had live: below that margin take them from the
     * device; above it, move free units (each move is an unmap and a map). */
    size_t live_peak = cuh_max_size(h->allocated.peak, h->allocated.current + size);
    const double held = (double)(cuh_hp_reserved_bytes(h) + need * page);
    int move_first = held > (double)live_peak * (1.0 + h->cfg.vmm_margin);
    if (mover_recurs_locked(h, block_pages, move_first) &&
        held <= (double)live_peak * (1.0 + RECURRING_MARGINS * h->cfg.vmm_margin))
        move_first = 0;   /* recurring moves: new pages instead, within bounds */
    if (h->plan.mapping)
        move_first = 1;   /* a planned block's pages: the heap's own, moved (heap_plan.c) */
    if (h->drains)
        cuh_hp_drains_poll_locked(h, 0);
    if (move_first)
        (void)steal_units_locked(h, &plan, 0, 0, st);
    if (plan.lacking && move_first && !h->captures) {
        /* Memory freed on streams becomes stealable once their work is done:
         * fence them all (our own too: unmapping is not stream-ordered). */
        for (uint32_t i = 0; i < h->num_streams; i++)
            if (!h->streams[i]->num_fences)
                cuh_hp_stream_fence_locked(h, h->streams[i]);
        if (cuh_hp_poll_all_locked(h, 0))
            (void)steal_units_locked(h, &plan, 0, 0, st);
        /* Last before growing: units whose old mappings must stay a while,
         * for a block that keeps the live bytes under their peak so far. One
         * that raises it gets new pages: the heap must grow to the new peak
         * anyway, and the memory just freed is the likeliest wanted back. */
        if (plan.lacking && h->allocated.current + size <= h->allocated.peak)
            (void)steal_units_locked(h, &plan, 0, 1, st);
    }
    if (!move_first && plan.lacking && h->limit && cuh_hp_reserved_bytes(h) + plan.lacking * page > h->limit) {
        /* The limit would refuse: move and give back free units after all
         * (a chunk does not wait for them: heap_chunks.c). */
        (void)steal_units_locked(h, &plan, !h->chunk_call, 0, st);
        if (plan.lacking)
            (void)release_units_locked(h, plan.lacking, !h->chunk_call);
    }
    int ok = create_units_locked(h, &plan, why);
    if (!ok && *why != GROW_ERROR && !h->captures && !h->chunk_call) {
        /* Refused: wait for the work on free units, move what fits, give
         * back what does not, and try once more. */
        cuh_hp_settle_all_locked(h);
        (void)steal_units_locked(h, &plan, 1, 0, NULL);
        if (plan.lacking && release_units_locked(h, plan.lacking, 1))
            ok = create_units_locked(h, &plan, why);
        ok = ok || !plan.lacking;
    }
    /* Map what there is. On a shortfall the caller frees the block: the
     * units mapped behind it stay there, cached, not lost. */
    ok = ok && !plan.lacking;
    for (size_t i = 0; i < plan.num_placed; i++) {
        const cuh_unit_place_t *u = &plan.placed[i];
        if (!map_unit_locked(h, u)) {
            unit_release_locked(h, u->handle, u->pages);
            *why = GROW_ERROR;
            ok = 0;
            continue;
        }
        for (size_t p = u->dest; p < u->dest + u->pages; p++) {
            h->page_handle[p] = u->handle;
            h->page_mapped[p >> 6] |= (uint64_t)1 << (p & 63);
        }
        h->mapped_pages += u->pages;
        h->num_page_maps += u->pages;
        if (u->dest + u->pages > h->pages_high)
            h->pages_high = u->dest + u->pages;
    }
    cuh_page_plan_free(&plan);
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

/* Unmaps every unit still mapped and returns it to the device (the heap is
 * going away). */
void cuh_hp_unmap_all_units_locked(cuh_heap_t *h)
{
    kept_drop_all_locked(h);
    for (size_t p = 0, q; p < h->pages_high; p = q) {
        if (!h->page_handle[p]) {
            q = p + 1;
            continue;
        }
        q = unit_end(h, p);
        h->dev->ops->vm_unmap(h->dev, cuh_hp_page_va(h, p), (q - p) * h->vm_page);
        h->dev->ops->vm_release(h->dev, h->page_handle[p]);
    }
}

/* Returns to the device every unit lying wholly inside global free memory
 * of the reservation; the pages released. */
size_t cuh_hp_release_free_pages_locked(cuh_heap_t *h)
{
    if (!h->vm)
        return 0;
    /* A unit released while an old mapping of it remains would stay
     * allocated on the device: the old mappings go first (the kept ones all
     * at once, rather than a search for each unit's). */
    cuh_hp_drains_poll_locked(h, 1);
    kept_drop_all_locked(h);
    return release_units_locked(h, SIZE_MAX, 1);
}

/* A bit a page: the pages lying wholly in free extents; then each unit of
 * several pages with some of them, but not all. */
int cuh_hp_partly_used_units_locked(const cuh_heap_t *h, size_t *units, size_t *free_bytes)
{
    uint64_t *free_page = calloc(h->pages_high / 64 + 1, sizeof *free_page);
    if (!free_page)
        return 0;
    for (const cuh_extent_t *e = h->vm->first; e; e = e->next) {
        if (e->state != CUH_EXTENT_FREE)
            continue;
        size_t p, end;
        pages_inside_extent(h, e, &p, &end);
        for (; p < end; p++)
            free_page[p >> 6] |= (uint64_t)1 << (p & 63);
    }
    *units = *free_bytes = 0;
    for (size_t p = 0, q; p < h->pages_high; p = q) {
        q = h->page_handle[p] ? unit_end(h, p) : p + 1;
        size_t whole_free = 0;
        for (size_t i = p; i < q; i++)
            whole_free += (free_page[i >> 6] >> (i & 63)) & 1;
        if (q - p > 1 && whole_free && whole_free < q - p) {
            (*units)++;
            *free_bytes += whole_free * h->vm_page;
        }
    }
    free(free_page);
    return 1;
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
                cuh_dev_error_text(h->dev));
        return;
    }
    h->page_handle = calloc(size / page, sizeof *h->page_handle);
    h->page_mapped = calloc((size / page + 63) / 64, sizeof *h->page_mapped);
    h->page_gen = calloc(size / page, sizeof *h->page_gen);
    h->drain_head = calloc((size / page + 63) / 64, sizeof *h->drain_head);
    h->drain_handle = calloc(size / page, sizeof *h->drain_handle);
    h->kept_handle = calloc(size / page, sizeof *h->kept_handle);
    h->kept_head = calloc((size / page + 63) / 64, sizeof *h->kept_head);
    cuh_segment_t *seg = h->page_handle && h->page_mapped && h->page_gen && h->drain_head && h->drain_handle &&
                                 h->kept_handle && h->kept_head
                             ? cuh_arena_add_segment(&h->arena, va, size, CUH_REGION_GENERAL) : NULL;
    if (!seg) {
        free(h->page_handle);
        free(h->page_mapped);
        free(h->page_gen);
        free(h->drain_head);
        free(h->drain_handle);
        free(h->kept_handle);
        free(h->kept_head);
        h->drain_head = NULL;
        h->drain_handle = NULL;
        h->kept_handle = NULL;
        h->kept_head = NULL;
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
    h->unit_pages = h->cfg.vmm_unit ? cuh_max_size(h->cfg.vmm_unit / page, 1) : 0;   /* 0: auto */
    h->num_pages = size / page;
}

cuheap_status_t cuh_heap_allow_peer(cuh_heap_t *h, int peer)
{
    cuh_hp_lock(h);
    cuheap_status_t status = CUHEAP_OK;
    if (h->cfg.vmm) {   /* the reservation may come later: the device remembers the peer */
        const cuh_device_ops_t *ops = h->dev->ops;
        /* A kept mapping would lack the grant if its unit came back there. */
        int ok = !h->kept_pages || kept_drop_unit_locked(h, 0);
        ok = ok && ops->vm_allow_peer(h->dev, peer, 0, 0) == CUH_DEV_OK;
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
            cuh_set_error("device %d: peer access for device %d: %s", h->dev->ordinal, peer,
                          cuh_dev_error_text(h->dev));
            status = CUHEAP_ERR_DEVICE;
        }
    }
    cuh_unlock(&h->lock);
    return status;
}
