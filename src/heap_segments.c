/* heap_segments.c - growth and release: the plain segments the heap asks the
 * device for (sized geometrically, and at most GROW_CAP beyond the request)
 * and gives back (idle ones before a growth sets a new peak, whole free ones
 * when memory runs short).
 *
 * Rule kept here (heap.h): the release step of "when the device (or the
 * limit) refuses a segment, the heap ... releases cached segments and
 * retries"; a segment goes back only once the GPU has passed the frees in
 * it.
 */
#include "heap_internal.h"

/* ---- segments ---------------------------------------------------------------- */

/* The size of the next segment: the request rounded to 2 MiB, but at least
 * segment_min and at least grow_fraction of what is already reserved (capped
 * at 1 GiB). Growing geometrically keeps the number of device calls
 * logarithmic and gives best fit larger contiguous ranges to work in; the
 * cap and the fraction bound the memory a fresh segment can leave idle. */
static size_t segment_size_for(const cuh_heap_t *h, size_t needed)
{
    if (cuh_hp_own_segment_locked(h))
        return needed;   /* a segment per block */
    size_t seg = cuh_max_size(needed, h->cfg.segment_min);
    size_t geometric = (size_t)((double)cuh_hp_reserved_bytes(h) * h->cfg.grow_fraction);
    geometric = cuh_align_up(cuh_min_size(geometric, GROW_CAP), CUH_SEGMENT_GRAIN);
    return cuh_max_size(seg, geometric);
}

static int return_segment_locked(cuh_heap_t *h, cuh_segment_t *s);

/* After a free on st that leaves `used` bytes in use in seg: a segment left
 * idle can go back to the device when the heap next grows
 * (release_idle_segments_locked), but only once the GPU has passed this free:
 * a fence now (unless one is in flight already) is likely complete by then,
 * where one recorded then would not be. */
void cuh_hp_fence_if_left_idle_locked(cuh_heap_t *h, stream_state_t *st, const cuh_segment_t *seg, size_t used)
{
    if (!used && !st->num_fences && cuh_hp_returnable_segment(seg))
        cuh_hp_stream_fence_locked(h, st);
}

/* The state of the stream that owns private memory tagged `tag`. */
static stream_state_t *stream_of_tag(const cuh_heap_t *h, uint32_t tag) { return h->streams[tag - 1]; }

/* A segment that holds no block and is too small for a growth of `needed`
 * bytes (release_idle_segments_locked). */
static int idle_for_growth(const cuh_segment_t *s, size_t needed)
{
    return cuh_hp_returnable_segment(s) && !s->used_bytes && s->size < needed;
}

/* 1 if st's private free memory lies in a segment idle_for_growth. */
static int stream_frees_in_idle_segments(const cuh_heap_t *h, const stream_state_t *st, size_t needed)
{
    for (const cuh_segment_t *s = h->arena.segments; s; s = s->next)
        if (idle_for_growth(s, needed))
            for (const cuh_extent_t *e = s->first; e; e = e->next)
                if (e->tag == st->tag)
                    return 1;
    return 0;
}

/* Before the heap grows for `needed` bytes it gives back the segments that
 * hold no block and are too small to serve the request: kept, they would
 * count in the peak beside the new segment. BERT with varying sequence
 * length grows a larger segment for each new longest sequence and would
 * keep every smaller one; GPT-2's logits leave a segment idle while the
 * next step's gradient needs a larger one.
 *
 * A segment's private free memory (freed in stream order) goes back once
 * the GPU has passed its frees: the CPU waits for them here, on the streams
 * that freed it. Returning memory to the driver waits for the device anyway
 * (on an H200 cuMemFree returned after 200 ms with a 200 ms kernel running on
 * another stream, in 0.08 ms on an idle GPU: bench/gpu/free_sync.cu), so the
 * wait costs about what the return would, and only a segment that then goes
 * back is waited for. Without it a GPU running behind kept the segments its
 * last frees had left idle, just when the growth set a new peak. Replayed with the GPU 100 events behind,
 * the ResNet-50 traces held 1.07-1.09x their live peak and the plugin traces
 * of BERT, `kv_generate`, `llama_ckpt` and the side-stream job 1.17-1.70x;
 * with the wait every trace holds what it holds when the GPU keeps up
 * (1.02-1.33x), at 2-10 CPU waits a replay (bench/HISTORY.md).
 * Returns how many segments went back. */
static size_t release_idle_segments_locked(cuh_heap_t *h, size_t needed)
{
    if (h->captures)
        return 0;
    int candidates = 0;
    for (cuh_segment_t *s = h->arena.segments; s; s = s->next) {
        if (!idle_for_growth(s, needed))
            continue;
        candidates = 1;
        for (cuh_extent_t *e = s->first; e; e = e->next)
            if (e->tag != CUH_TAG_GLOBAL)
                cuh_hp_stream_fence_locked(h, stream_of_tag(h, e->tag));
    }
    if (!candidates)
        return 0;
    cuh_hp_poll_all_locked(h, 0);
    /* What the GPU has not passed yet: wait (a poll merges extents, so each
     * stream's memory is looked for afresh). */
    for (uint32_t i = 0; i < h->num_streams; i++)
        if (h->streams[i]->num_fences && stream_frees_in_idle_segments(h, h->streams[i], needed))
            cuh_hp_stream_poll_locked(h, h->streams[i], 1);
    size_t released = 0;
    for (cuh_segment_t *s = h->arena.segments, *next; s; s = next) {
        next = s->next;
        if (idle_for_growth(s, needed) && cuh_arena_segment_is_free(s)) {
            if (!return_segment_locked(h, s))
                continue;
            released++;
        }
    }
    return released;
}

grow_result_t cuh_hp_grow_locked(cuh_heap_t *h, size_t size, size_t align)
{
    if (h->vm && !cuh_hp_own_segment_locked(h)) {
        /* Under virtual memory the reservation is the whole general region:
         * no fit means its address space is used up. A block legacy IPC may
         * share gets a plain segment of its own beside it: an IPC handle
         * names a cuMemAlloc allocation, which virtual memory is not. */
        cuh_set_error("device %d: the %zu-byte virtual address reservation has no room for %zu bytes", h->dev->ordinal,
                      h->vm->size, size);
        return GROW_DEVICE;
    }
    size_t needed = cuh_align_up(size + (align > CUH_ALIGN ? align : 0), CUH_SEGMENT_GRAIN);
    /* Idle segments go back only when this growth would set a new peak:
     * below it, keeping them costs nothing, and returning them would only
     * make the heap ask for them again (with grow_fraction:0, resnet50's
     * replay returned 333 segments in 12 steps, 140 with this rule). */
    size_t seg = segment_size_for(h, needed);
    if (cuh_hp_reserved_bytes(h) + seg > h->reserved.peak && release_idle_segments_locked(h, needed))
        seg = segment_size_for(h, needed);
    if (h->limit && cuh_hp_reserved_bytes(h) + seg > h->limit) {
        seg = needed;
        if (cuh_hp_reserved_bytes(h) + seg > h->limit)
            return GROW_LIMIT;
    }
    uintptr_t base = 0;
    cuh_dev_status_t rc = h->dev->ops->mem_alloc(h->dev, seg, &base);
    if (rc == CUH_DEV_OOM && seg > needed) {
        seg = needed;
        rc = h->dev->ops->mem_alloc(h->dev, seg, &base);
    }
    if (rc == CUH_DEV_OOM)
        return GROW_DEVICE;
    if (rc != CUH_DEV_OK) {
        cuh_set_error("device %d: allocating a segment of %zu bytes failed: %s", h->dev->ordinal, seg,
                      cuh_dev_error_text(h->dev));
        return GROW_ERROR;
    }
    if (!cuh_arena_add_segment(&h->arena, base, seg, CUH_REGION_GENERAL)) {
        h->dev->ops->mem_free(h->dev, base, seg);
        cuh_set_error("out of host memory for segment records");
        return GROW_ERROR;
    }
    h->num_segment_allocs++;
    return GROW_OK;
}

/* Gives a general segment that is one global free extent back to the device;
 * 1 if it went. A free the driver refused leaves the segment in the books
 * (free memory the heap still holds, tried again at the next release):
 * memory the device may still count is never dropped from them. */
static int return_segment_locked(cuh_heap_t *h, cuh_segment_t *s)
{
    if (h->dev->ops->mem_free(h->dev, s->base, s->size) != CUH_DEV_OK) {
        cuh_log("device %d: returning a segment of %zu bytes failed, kept: %s", h->dev->ordinal, s->size,
                cuh_dev_error_text(h->dev));
        return 0;
    }
    cuh_arena_remove_segment(&h->arena, s);
    h->num_segment_frees++;
    return 1;
}

/* Returns every general segment that is one global free extent, and under
 * virtual memory every page wholly inside global free memory; the count. */
size_t cuh_hp_release_free_segments_locked(cuh_heap_t *h)
{
    size_t released = cuh_hp_release_free_pages_locked(h);
    cuh_segment_t *s = h->arena.segments;
    while (s) {
        cuh_segment_t *next = s->next;
        if (cuh_hp_returnable_segment(s) && cuh_arena_segment_is_free(s))
            released += (size_t)return_segment_locked(h, s);
        s = next;
    }
    return released;
}
