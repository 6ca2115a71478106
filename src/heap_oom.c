/* heap_oom.c - out of memory: the record of the last failed request, with the
 * proof of its cause (capacity, the limit, memory used outside cuheap, memory
 * waiting for GPU work, fragmentation: stranded segments, partly used pages
 * and units)
 * and one thing that would help.
 *
 * Rule kept here (heap.h): the ladder's last step: an out-of-memory is
 * reported with the heap's state as its proof, and the heap stays usable.
 */
#include "heap_internal.h"

#include <string.h>

/* ---- out of memory ------------------------------------------------------------ */

const char *cuh_oom_cause_name(cuh_oom_cause_t cause)
{
    switch (cause) {
    case CUH_OOM_NONE: return "none";
    case CUH_OOM_CAPACITY: return "capacity";
    case CUH_OOM_FRAGMENTATION: return "fragmentation";
    case CUH_OOM_STREAM_PENDING: return "stream_pending";
    case CUH_OOM_LIMIT: return "limit";
    case CUH_OOM_EXTERNAL: return "external";
    case CUH_OOM_DEVICE_REFUSED: return "device_refused";
    }
    return "unknown";
}

/* Adds `entry` to arr, which holds *n (at most cap) entries in decreasing
 * order of their field f, if it is among the cap largest: the record keeps
 * the streams with the most pending bytes and the largest blocks holding
 * stranded memory this way. */
#define KEEP_LARGEST(arr, n, cap, f, entry)                 \
    do {                                                    \
        __typeof__((arr)[0]) keep_ = (entry);               \
        size_t k_ = *(n);                                   \
        if (k_ == (cap)) {                                  \
            if (keep_.f <= (arr)[k_ - 1].f)                 \
                break;                                      \
            k_--; /* it displaces the smallest */           \
        } else {                                            \
            (*(n))++;                                       \
        }                                                   \
        for (; k_ > 0 && (arr)[k_ - 1].f < keep_.f; k_--)   \
            (arr)[k_] = (arr)[k_ - 1];                      \
        (arr)[k_] = keep_;                                  \
    } while (0)

/* 1 if a plain segment is mostly empty: in use, but at most 1/8 of it. */
static int stranding_segment(const cuh_segment_t *s)
{
    return cuh_hp_returnable_segment(s) && s->used_bytes && s->used_bytes <= s->size / 8;
}

/* Fills o->stranded (see cuh_oom_info_t) for a request of `block` bytes;
 * o's device and limit figures are set already. */
static void find_stranded_locked(const cuh_heap_t *h, cuh_oom_info_t *o, size_t block)
{
    __typeof__(o->stranded) *x = &o->stranded;
    x->known = 1;
    for (const cuh_segment_t *s = h->arena.segments; s; s = s->next) {
        if (!stranding_segment(s))
            continue;
        size_t blocks = 0, free_bytes = s->size - s->used_bytes;
        for (const cuh_extent_t *e = s->first; e; e = e->next)
            blocks += e->state == CUH_EXTENT_BLOCK || e->state == CUH_EXTENT_SLAB;
        x->segments++;
        x->bytes += s->size;
        x->free += free_bytes;
        x->blocks += blocks;
        x->block_bytes += s->used_bytes;
        if (free_bytes <= x->top_size - x->top_used)
            continue;   /* another strands more */
        x->top_base = s->base;
        x->top_size = s->size;
        x->top_used = s->used_bytes;
        x->top_blocks = blocks;
        x->num_top_holders = 0;
        for (const cuh_extent_t *e = s->first; e; e = e->next)
            if (e->state == CUH_EXTENT_BLOCK || e->state == CUH_EXTENT_SLAB)
                KEEP_LARGEST(x->top_holders, &x->num_top_holders, CUH_OOM_TOP_HOLDERS, size,
                             ((__typeof__(x->top_holders[0])){e->addr, e->size}));
    }
    /* Had those blocks lain elsewhere (in the heap's other free memory as
     * far as its bytes go, in a new segment for the rest), the segments
     * could have gone back to the device: would it have had room? */
    const size_t elsewhere = o->cached > x->free ? o->cached - x->free : 0;
    const size_t spill = x->block_bytes > elsewhere ? cuh_align_up(x->block_bytes - elsewhere, CUH_SEGMENT_GRAIN) : 0;
    const size_t fresh = cuh_align_up(block, CUH_SEGMENT_GRAIN) + spill;
    x->would_fit = x->segments && o->device_free + x->bytes >= fresh &&
                   (!o->limit || o->reserved - x->bytes + fresh <= o->limit);
}

/* Under vmm:1 fills o->partial_pages (see cuh_oom_info_t): every free
 * extent's first and last page, where mapped and not wholly inside it. */
static void find_partial_pages_locked(const cuh_heap_t *h, cuh_oom_info_t *o)
{
    const size_t page = h->vm_page;
    size_t counted = SIZE_MAX;   /* the last page counted: extents come in address order */
    o->partial_pages.known = 1;
    for (const cuh_extent_t *e = h->vm->first; e; e = e->next) {
        if (e->state != CUH_EXTENT_FREE)
            continue;
        const size_t first = (size_t)(e->addr - h->vm->base) / page;
        const size_t last = (size_t)(e->addr + e->size - 1 - h->vm->base) / page;
        for (size_t p = first; p <= last; p = p == last ? last + 1 : last) {
            if (p >= h->pages_high || !h->page_handle[p] || cuh_hp_page_inside(h, p, e->addr, e->size))
                continue;
            uintptr_t lo = cuh_hp_page_va(h, p) > e->addr ? cuh_hp_page_va(h, p) : e->addr;
            uintptr_t hi =
                cuh_hp_page_va(h, p) + page < e->addr + e->size ? cuh_hp_page_va(h, p) + page : e->addr + e->size;
            o->partial_pages.free += (size_t)(hi - lo);
            if (p != counted)
                o->partial_pages.pages++;
            counted = p;
        }
    }
}

void cuh_hp_record_oom_locked(cuh_heap_t *h, stream_state_t *st, size_t request, size_t block, size_t align,
                              grow_result_t why)
{
    cuh_oom_info_t *o = &h->last_oom;
    memset(o, 0, sizeof *o);
    o->request = request;
    o->block = block;
    o->stream = st->handle;
    o->live = h->requested.current;
    o->allocated = h->allocated.current;
    o->reserved = cuh_hp_reserved_bytes(h);
    o->cached = o->reserved - h->allocated.current;
    /* Pending for this request: what it cannot use until GPU work finishes:
     * memory other streams freed (fenced or not), and held blocks. */
    o->pending = h->held_bytes;
    for (uint32_t i = 0; i < h->num_streams; i++) {
        const stream_state_t *s = h->streams[i];
        if (s != st)
            o->pending += h->arena.tags[s->tag].fenced_bytes + h->arena.tags[s->tag].unfenced_bytes +
                          s->small_fenced + s->small_unfenced;
    }
    o->largest_free = cuh_hp_largest_free_locked(h, o->cached);
    o->num_free_extents = h->arena.free_extents;
    o->limit = h->limit;
    o->t = cuh_hp_seconds_since(&h->born);
    for (uint32_t i = 0; i < h->num_streams; i++) {
        const stream_state_t *s = h->streams[i];
        if (s == st)
            continue;
        uint64_t pend = h->arena.tags[s->tag].fenced_bytes + h->arena.tags[s->tag].unfenced_bytes + s->small_fenced +
                        s->small_unfenced;
        if (!pend)
            continue;
        KEEP_LARGEST(o->pending_by_stream, &o->num_pending_streams,
                     sizeof o->pending_by_stream / sizeof o->pending_by_stream[0], pending,
                     ((__typeof__(o->pending_by_stream[0])){(uint64_t)s->handle, pend}));
    }
    /* A device that cannot say what it has free (a lost one, say) is taken
     * to hold nothing outside cuheap: the cause is then decided from what
     * cuheap knows, and no refusal is blamed on the driver. */
    const int device_said = h->dev->ops->mem_info(h->dev, &o->device_free, &o->device_total) == CUH_DEV_OK;
    if (!device_said) {
        o->device_total = h->device_total;
        o->device_free = o->device_total > o->reserved ? o->device_total - o->reserved : 0;
    }
    size_t accounted = o->device_free + o->reserved;
    o->external = o->device_total > accounted ? o->device_total - accounted : 0;

    find_stranded_locked(h, o, block);
    if (h->vm) {
        find_partial_pages_locked(h, o);
        o->partial_units.known = cuh_hp_partly_used_units_locked(h, &o->partial_units.units, &o->partial_units.free);
    }

    size_t need = o->allocated + block + (align > CUH_ALIGN ? align : 0);
    size_t device_room = o->device_total - o->external;
    char a[32], b[32];
    if (h->limit && why == GROW_LIMIT && need > h->limit && need <= device_room) {
        o->cause = CUH_OOM_LIMIT;
        /* What this request needs is all the heap knows for sure; the job
         * may need more at its next request, so the advice says so and how
         * to learn the whole job's need, rather than give a figure that
         * fails again a step later. */
        char c[32];
        snprintf(o->action, sizeof o->action,
                 "raise limit in CUHEAP_CONF from %s (the device has room): this request alone needs at least %s, "
                 "and the job's live bytes have peaked at %s so far, but later requests may need more; record the "
                 "job with trace:PATH, and cuheap-replay --min-capacity gives the limit the whole job needs",
                 cuh_format_bytes(a, sizeof a, h->limit), cuh_format_bytes(b, sizeof b, cuh_align_up(need, CUH_MiB)),
                 cuh_format_bytes(c, sizeof c, h->requested.peak));
    } else if (need > o->device_total || (h->limit && need > h->limit)) {
        o->cause = CUH_OOM_CAPACITY;
        snprintf(o->action, sizeof o->action,
                 "the job needs more than %s live at once: use a smaller batch, activation checkpointing, "
                 "or a device with more memory",
                 cuh_format_bytes(a, sizeof a, h->limit && h->limit < o->device_total ? h->limit : o->device_total));
    } else if (need > device_room) {
        o->cause = CUH_OOM_EXTERNAL;
        snprintf(o->action, sizeof o->action,
                 "%s of device memory is used outside cuheap (other processes or allocators): free it, "
                 "or route those allocations through cuheap",
                 cuh_format_bytes(a, sizeof a, o->external));
    } else if (o->pending && o->cached + o->device_free - o->pending < block && o->cached + o->device_free >= block) {
        /* Enough memory counting what waits for GPU work, not enough without. */
        o->cause = CUH_OOM_STREAM_PENDING;
        snprintf(o->action, sizeof o->action,
                 "%s were freed on other streams whose GPU work has not been seen to finish%s: synchronize "
                 "those streams (or free on the stream that allocates) before allocating",
                 cuh_format_bytes(a, sizeof a, o->pending),
                 h->captures ? " (a CUDA graph capture was underway, so cuheap could not wait)" : "");
    } else if (why == GROW_DEVICE && device_said && o->device_free >= block) {
        /* The device said it had the room and refused it anyway: no layout
         * of cuheap's explains that. */
        o->cause = CUH_OOM_DEVICE_REFUSED;
        snprintf(o->action, sizeof o->action,
                 "the driver refused %s while it reported %s free: the refusal is the driver's (another context's "
                 "reservations, a device limit, or a driver fault), not a lack of room; the driver's own message "
                 "is above, if it gave one",
                 cuh_format_bytes(a, sizeof a, block), cuh_format_bytes(b, sizeof b, o->device_free));
    } else {
        o->cause = CUH_OOM_FRAGMENTATION;
        /* No workspace is suggested: best fit inside one fragments too (the
         * bundled traces, with a workspace of their live peak, reserved
         * 1.06-1.24x it against 1.04-1.11x without). */
        if (h->vm)
            /* Pages move only when wholly free, units only whole: the rest
             * sits in pages or units that blocks still partly use. */
            snprintf(o->action, sizeof o->action,
                     "free memory lies in %s that live blocks still partly use: %s%sgive the job more memory "
                     "(record it with trace:PATH, and cuheap-replay --min-capacity says how much it needs)",
                     o->partial_units.units ? "pages and units of several pages" : "pages",
                     h->vm_page > CUH_SEGMENT_GRAIN ? "a smaller vmm_page in CUHEAP_CONF (2M) strands less of it, or "
                                                    : "",
                     o->partial_units.units && h->unit_pages != 1
                         ? "vmm_unit:2M in CUHEAP_CONF (a unit a page) lets every whole free page move, or "
                         : "");
        else if (cuh_hp_vm_unavailable(h))
            snprintf(o->action, sizeof o->action,
                     "free memory is split into pieces smaller than the request, on plain segments because "
                     "this device gave no CUDA virtual memory: give the job more memory (record it with "
                     "trace:PATH, and cuheap-replay --min-capacity says how much it needs)");
        else
            snprintf(o->action, sizeof o->action,
                     "free memory is split into pieces smaller than the request: drop vmm:0 (or ipc_safe:1) from "
                     "CUHEAP_CONF (vmm:1, the default, moves free pages to where a request needs them), or give "
                     "the job more memory (record it with trace:PATH, and cuheap-replay --min-capacity says how "
                     "much it needs)");
    }
    h->has_oom = 1;
    h->num_ooms++;
    cuh_hp_sample_locked(h);
    char stranded[256] = "";
    if (o->cause == CUH_OOM_FRAGMENTATION && (o->partial_pages.pages || o->partial_units.units))
        snprintf(stranded, sizeof stranded,
                 "; %zu of the cached bytes lie in %zu page%s that blocks partly use, %zu in whole free pages of %zu "
                 "unit%s that blocks partly use",
                 o->partial_pages.free, o->partial_pages.pages, o->partial_pages.pages == 1 ? "" : "s",
                 o->partial_units.free, o->partial_units.units, o->partial_units.units == 1 ? "" : "s");
    else if (o->cause == CUH_OOM_FRAGMENTATION && o->stranded.segments)
        snprintf(stranded, sizeof stranded,
                 "; %zu of the cached bytes lie in %zu mostly empty segment%s, held there by %zu block%s of %zu "
                 "bytes%s",
                 o->stranded.free, o->stranded.segments, o->stranded.segments == 1 ? "" : "s", o->stranded.blocks,
                 o->stranded.blocks == 1 ? "" : "s", o->stranded.block_bytes,
                 o->stranded.would_fit ? " (without them the request would have fit)" : "");
    cuh_set_error("out of memory on device %d: %zu bytes requested; cause: %s (live %zu, reserved %zu, "
                  "cached %zu, largest free extent %zu, device free %zu of %zu%s); %s",
                  h->dev->ordinal, request, cuh_oom_cause_name(o->cause), o->live, o->reserved, o->cached,
                  o->largest_free, o->device_free, o->device_total, stranded, o->action);
}

int cuh_heap_last_oom(cuh_heap_t *h, cuh_oom_info_t *out)
{
    cuh_hp_lock(h);
    int has = h->has_oom;
    if (has)
        *out = h->last_oom;
    cuh_unlock(&h->lock);
    return has;
}
