/* heap_place.c - placement, the allocation ladder's search: which free extent
 * a block or a slab takes. Best fit over global memory and the stream's own
 * (arena.c), then the heap's preferences: a whole segment for a block that
 * must start its own, and under vmm:1 a fit on mapped pages before one that
 * needs pages, the growth edge last. Plain segments get plain best fit: the
 * rules that once ordered room in segments above GROW_CAP (for GPT-2's and
 * BERT's bundled traces) changed no job of the corpus and were deleted
 * (docs/design.md, "Plain segments").
 *
 * Rule kept here (heap.h): the stream rule's half that a search could break:
 * a fit lies in global free memory or in the requesting stream's own, never
 * in another stream's.
 */
#include "heap_internal.h"

/* Cuts a block of `size` bytes for st from free extent free_ext (all of it
 * for a block that starts its own segment), noting whose memory it was. */
cuh_extent_t *cuh_hp_take_locked(cuh_heap_t *h, cuh_extent_t *free_ext, size_t size, size_t align,
                                 cuh_extent_state_t state, stream_state_t *st)
{
    if (cuh_unlikely(cuh_hp_own_segment_locked(h)))
        size = free_ext->size;   /* the whole segment (cuh_hp_find_fit_locked) */
    h->last_take_tag = free_ext->tag;
    return cuh_arena_take(&h->arena, free_ext, size, align, state, st->tag);
}

/* The smallest free extent, global or the stream's own, that holds `size`
 * bytes at an `align`-aligned start and that `accept` takes, or NULL. A walk
 * of the free lists, for the rare fits that the size-indexed search cannot
 * judge (first among equals wins). */
static cuh_extent_t *smallest_free_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag, extent_test_t accept)
{
    cuh_extent_t *best = NULL;
    const uint32_t tags[2] = {CUH_TAG_GLOBAL, tag};
    for (int k = 0; k < (tag == CUH_TAG_GLOBAL ? 1 : 2); k++)
        for (cuh_extent_t *e = h->arena.tags[tags[k]].list; e; e = e->tag_next)
            if (e->size >= size && (!best || e->size < best->size) && e->addr % align == 0 && accept(h, e, size))
                best = e;
    return best;
}

/* Under vmm:1: whether the first `size` bytes of free extent e lie on mapped
 * pages of the reservation. Best fit by size alone may pick an extent that
 * reaches into unmapped address space while another, larger one lies on
 * mapped pages; each page moved there costs an unmap, a map and an access
 * grant (about 55 us on an H200, bench/gpu/vm_costs.cu), so the fit that
 * needs no page wins (smallest_free_locked, taken only when the first fit
 * would need pages). */
static int mapped_fits(const cuh_heap_t *h, const cuh_extent_t *e, size_t size)
{
    return e->segment == h->vm && !cuh_hp_needs_pages_locked(h, e->addr, size);
}

/* Under vmm:1: whether free extent e lies at the growth edge, the top of
 * the memory in use, with nothing but unused address space above it (or is
 * that space itself). A block placed there pins the edge: the next larger
 * request finds the free memory below it too short and maps new pages
 * above. So, as PyTorch's expandable segments count the free block below a
 * segment's unmapped end as large as it could grow, a fit at the edge is
 * taken last: when the best fit by size lies there, the smallest fit on
 * mapped pages elsewhere serves instead, if there is one. Replays of the
 * plugin traces as on the H200 (cuheap-replay --lag 300 --conf vmm:1):
 * ResNet-50 6,190,792,704 bytes instead of 6,201,278,464 (expandable
 * segments: 6,192,889,856, and so did cuheap on the H200), llama_ckpt
 * 1.0061x its live peak instead of 1.0222; BERT 1.0120x instead of 1.0114,
 * the bundled ResNet-50 trace 1.0120x instead of 1.0092 (expandable
 * segments: 1.0103). */
int cuh_hp_range_at_growth_edge(const cuh_heap_t *h, const cuh_segment_t *seg, uintptr_t end,
                                const cuh_extent_t *above)
{
    if (seg != h->vm)
        return 0;
    const uintptr_t top = seg->base + seg->size;
    return end == top || (above && above->state == CUH_EXTENT_FREE && above->addr + above->size == top);
}

int cuh_hp_at_growth_edge(const cuh_heap_t *h, const cuh_extent_t *e)
{
    return cuh_hp_range_at_growth_edge(h, e->segment, e->addr + e->size, e->next);
}

int cuh_hp_mapped_fits_off_the_edge(const cuh_heap_t *h, const cuh_extent_t *e, size_t size)
{
    return mapped_fits(h, e, size) && !cuh_hp_at_growth_edge(h, e);
}

/* smallest_free_locked(h, size, align, tag, accept), bin by bin from the
 * request's size up, stopping at the first bin that holds an extent accept
 * takes: for mapped_fits, a fit needs pages only where the best fit by size
 * did, and the walk over every free extent was most of what an allocation
 * cost under vmm:1. Bins hold disjoint sizes, and a bin's list keeps its tag
 * list's order, so the choice is the same: the smallest, global memory's
 * first among equals. */
cuh_extent_t *cuh_hp_smallest_fit_by_bins_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag,
                                                 extent_test_t accept)
{
    const cuh_freebins_t *bins[2] = {&h->arena.tags[CUH_TAG_GLOBAL].bins[CUH_REGION_GENERAL],
                                     tag != CUH_TAG_GLOBAL ? &h->arena.tags[tag].bins[CUH_REGION_GENERAL] : NULL};
    for (unsigned bin = cuh_freebins_bin(size);; bin++) {
        unsigned next = cuh_freebins_next(bins[0], bin);
        unsigned own = bins[1] ? cuh_freebins_next(bins[1], bin) : CUH_BINS_NONE;
        if (own < next)
            next = own;
        if (next == CUH_BINS_NONE)
            return NULL;
        bin = next;
        cuh_extent_t *best = NULL;
        for (int k = 0; k < 2 && bins[k]; k++)
            for (cuh_binnode_t *n = cuh_freebins_head(bins[k], bin); n; n = n->next) {
                cuh_extent_t *e = cuh_container_of(n, cuh_extent_t, node);
                if (e->size >= size && (!best || e->size < best->size) && e->addr % align == 0 &&
                    accept(h, e, size))
                    best = e;
            }
        if (best)
            return best;
    }
}

cuh_extent_t *cuh_hp_smallest_mapped_fit_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag)
{
    return cuh_hp_smallest_fit_by_bins_locked(h, size, align, tag, mapped_fits);
}

/* Under vmm:1, when no free extent starts on enough mapped pages: where a
 * block needs the fewest pages it does not have. Free extents merge across
 * mapped and unmapped address space, so a run of mapped free pages can lie
 * past an extent's unmapped start (under LD_PRELOAD, GPT-2's second step
 * found 7.3 GB of them while it mapped new pages for 200 MB blocks), and a
 * block that fits no run can still lean on one. Placements tried in each
 * free extent, global or the stream's own: the extent's start, and each run
 * of mapped pages inside it, from the run's start and up to its end.
 *
 * A stream's own free extent also reaches into free global address space
 * right after it: in the reservation the unused top is global and never
 * merges with one stream's frees (arena.c, absorbable), so without this a
 * block that outgrew the freed memory at the top mapped all of its pages
 * above it, never those of the free memory below. Taking them is what
 * expandable segments do at a segment's end (cuheap-replay --conf vmm:1
 * --lag 10: side-stream job 1.857 -> 1.592 GiB, kv_generate 1.311 ->
 * 1.307, ResNet-50 plugin 5.785 -> 5.775; with pages never moved,
 * vmm_margin:1, GPT-2 plugin 27.48 -> 25.97). Except for blocks of
 * SPAN_MAX and more: GPT-2's 3 GiB logits then took the top run each step
 * and missed by 20-50 MB, mapping those anew every time, where a fresh
 * range for them starts the page moves that pack its memory once (GPT-2
 * plugin 24.42 GiB either way; 25.97 with them spanning).
 *
 * Ranked by pages missing, then (none missing) the shortest run of mapped
 * pages, as in a best fit, or (some missing) the smaller extent. The extent
 * and the start in *at; NULL if no free extent of the reservation holds
 * `size` bytes. */
#define SPAN_MAX CUH_GiB

typedef struct {
    cuh_extent_t *extent;
    uintptr_t at;
    size_t missing, rank;
} page_fit_t;

static void consider_placement(const cuh_heap_t *h, page_fit_t *best, cuh_extent_t *e, uintptr_t start,
                               size_t size, uintptr_t reach, size_t run)
{
    if (start < e->addr || start + size > reach)
        return;
    const size_t page = h->vm_page;
    size_t first = (size_t)(start - h->vm->base) / page;
    size_t stop = (size_t)(start + size - h->vm->base + page - 1) / page;
    size_t missing = stop - first - cuh_bits_count(h->page_mapped, first, cuh_min_size(stop, h->pages_high));
    size_t rank = missing ? e->size : run;
    if (missing < best->missing || (missing == best->missing && rank < best->rank))
        *best = (page_fit_t){.extent = e, .at = start, .missing = missing, .rank = rank};
}

cuh_extent_t *cuh_hp_fewest_new_pages_fit_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag,
                                                 uintptr_t *at)
{
    const uint32_t tags[2] = {CUH_TAG_GLOBAL, tag};
    const size_t page = h->vm_page;
    page_fit_t best = {.missing = SIZE_MAX};
    for (int k = 0; k < (tag != CUH_TAG_GLOBAL ? 2 : 1); k++)
        for (cuh_extent_t *e = h->arena.tags[tags[k]].oldest; e; e = e->tag_prev) {
            if (e->segment != h->vm)
                continue;
            const uintptr_t end = e->addr + e->size;
            uintptr_t reach = end;
            if (e->tag != CUH_TAG_GLOBAL && size < SPAN_MAX && e->next && e->next->state == CUH_EXTENT_FREE &&
                e->next->tag == CUH_TAG_GLOBAL)
                reach = e->next->addr + e->next->size;
            if (reach - e->addr < size)
                continue;
            consider_placement(h, &best, e, cuh_addr_align_up(e->addr, align), size, reach, SIZE_MAX);
            size_t p = (size_t)(e->addr - h->vm->base) / page;
            const size_t last = cuh_min_size((size_t)(end - h->vm->base + page - 1) / page, h->pages_high);
            while ((p = cuh_bits_next(h->page_mapped, p, last, 1)) < last) {
                size_t q = cuh_bits_next(h->page_mapped, p, last, 0);
                uintptr_t lo = cuh_hp_page_va(h, p) > e->addr ? cuh_hp_page_va(h, p) : e->addr;
                uintptr_t hi = cuh_hp_page_va(h, q) < end ? cuh_hp_page_va(h, q) : end;
                consider_placement(h, &best, e, cuh_addr_align_up(lo, align), size, reach, (size_t)(hi - lo));
                if (hi - e->addr >= size)
                    consider_placement(h, &best, e, (hi - size) & ~((uintptr_t)align - 1), size, reach,
                                       (size_t)(hi - lo));
                p = q;
            }
        }
    *at = best.at;
    return best.extent;
}

/* For a block that must start its own segment (cuh_hp_own_segment_locked) only a
 * whole free segment no more than a quarter larger than a new one would be
 * will do: the block takes it whole, so that it starts its segment (an IPC
 * handle names exactly it) and no other block ever shares the segment. */
static int whole_segment_fits(const cuh_heap_t *h, const cuh_extent_t *e, size_t size)
{
    (void)h;
    return e->addr == e->segment->base && e->size == e->segment->size && e->size >= size &&
           e->size <= cuh_align_up(size, CUH_SEGMENT_GRAIN) + size / 4;
}

/* The best free extent for `size` (see whole_segment_fits for blocks that
 * must start their own segment). */
cuh_extent_t *cuh_hp_find_fit_locked(cuh_heap_t *h, size_t size, size_t align, uint32_t tag)
{
    cuh_extent_t *e = cuh_arena_find(&h->arena, size, align, tag);
    if (cuh_likely(!cuh_hp_own_segment_locked(h)))
        return e;
    if (!e || whole_segment_fits(h, e, size))
        return e;
    /* Best fit found a piece of a segment: the smallest whole free segment
     * that fits (with ipc_safe:1 every free extent is a whole segment, so
     * the first fit above nearly always is one). */
    return smallest_free_locked(h, size, align, tag, whole_segment_fits);
}
