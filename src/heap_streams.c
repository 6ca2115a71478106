/* heap_streams.c - streams and fences: the heap's record of every stream (its
 * tag, its fences, its rings of small objects), the events it records on
 * them, and fences for memory outside the heap (cuh_heap_fence).
 *
 * Rule kept here (heap.h): a block freed on stream s is reusable on s at once
 * and on another stream only after an event recorded on s after the free has
 * completed. The rooms that keep freed memory elsewhere keep the rule through
 * these fences: slab objects (heap_small.c), pages (heap_pages.c), thread
 * caches and the parked block (heap_tcache.c).
 *
 * Stream-ordered reuse. Memory freed on stream s becomes s's private memory
 * (arena tag of s; for small objects, s's per-class cache): s may reuse it at
 * once, since its own work is ordered. Other streams may not until an event
 * recorded on s after the free has completed. cuheap records such events
 * (fences) lazily: only when another stream would otherwise have to grow the
 * heap, when memory runs short, or when a free leaves a segment with no block
 * (so that it can go back to the device). A fence covers every private byte freed on
 * s before it; when it completes those bytes become global. A busy stream's
 * fence completes later, so until then it keeps using its own memory and
 * nobody waits: the CPU blocks only on the out-of-memory path.
 */
#include "heap_internal.h"

#include <stdlib.h>
#include <string.h>

/* The only two ways the heap makes the CPU wait for the GPU, counted: a
 * user whose job runs slower under cuheap can see whether it stalled. An
 * event that cannot be waited for is answered by waiting for the whole
 * device; a device that cannot be waited for is lost (device.h), and the
 * heap refuses new work from then on. */
cuh_dev_status_t cuh_hp_cpu_wait_event(cuh_heap_t *h, cuh_event_t e)
{
    h->num_cpu_waits++;
    if (h->dev->ops->event_wait(h->dev, e) == CUH_DEV_OK)
        return CUH_DEV_OK;
    cuh_log("device %d: %s; waiting for the whole device instead", h->dev->ordinal, cuh_dev_error_text(h->dev));
    return cuh_hp_cpu_wait_device(h);
}

cuh_dev_status_t cuh_hp_cpu_wait_device(cuh_heap_t *h)
{
    h->num_cpu_waits++;
    return h->dev->ops->synchronize(h->dev);
}

/* ---- events and streams ------------------------------------------------------ */

cuh_event_t cuh_hp_event_get_locked(cuh_heap_t *h)
{
    if (h->num_spare_events)
        return h->spare_events[--h->num_spare_events];
    cuh_event_t e = NULL;
    if (h->dev->ops->event_create(h->dev, &e) != CUH_DEV_OK)
        return NULL;
    return e;
}

void cuh_hp_event_put_locked(cuh_heap_t *h, cuh_event_t e)
{
    if (h->num_spare_events == h->cap_spare_events) {
        size_t cap = h->cap_spare_events ? 2 * h->cap_spare_events : 16;
        cuh_event_t *grown = realloc(h->spare_events, cap * sizeof *grown);
        if (!grown) {
            h->dev->ops->event_destroy(h->dev, e);
            return;
        }
        h->spare_events = grown;
        h->cap_spare_events = cap;
    }
    h->spare_events[h->num_spare_events++] = e;
}

/* ---- device-wide fences ------------------------------------------------------
 * cudaFree's promise covers every stream. With CUDA 12.5's device-wide event
 * and wait (device.h: event_record_all, wait_all) that costs two calls
 * whatever the number of streams (about 0.3 us each on an H200 with 33 or
 * 161 streams, against 70 us and 262 us for an event and a wait per stream:
 * bench/gpu/ctx_fence.cu), and streams cuheap never heard of are covered
 * too. Without them (device_fences:0, an older driver, a capture underway)
 * every known stream gets an event and a wait. */

/* A device-wide call answered rc: a capture underway only defers it; a
 * device without them, or an error, turns them off for good (an error is
 * told: the caller fences stream by stream instead, never wrong). */
void cuh_hp_device_fences_refused_locked(cuh_heap_t *h, cuh_dev_status_t rc)
{
    if (rc == CUH_DEV_CAPTURING)
        return;
    if (rc != CUH_DEV_UNSUPPORTED)
        cuh_log("device-wide fences turned off: %s", cuh_dev_error_text(h->dev));
    h->device_fences = 0;
}

/* An event over the work issued so far on every stream, in *out:
 * CUH_DEV_OK; CUH_DEV_CAPTURING while a graph capture is underway (no event
 * call may be made now: an event recorded on a capturing stream would join
 * the graph); anything else when device-wide fences are off or no event was
 * to be had (the caller fences stream by stream). */
cuh_dev_status_t cuh_hp_record_all_locked(cuh_heap_t *h, cuh_event_t *out)
{
    if (!h->device_fences || h->captures)
        return CUH_DEV_UNSUPPORTED;
    cuh_event_t e = cuh_hp_event_get_locked(h);
    if (!e)
        return CUH_DEV_UNSUPPORTED;
    cuh_dev_status_t rc = h->dev->ops->event_record_all(h->dev, e);
    if (rc != CUH_DEV_OK) {
        cuh_hp_event_put_locked(h, e);
        cuh_hp_device_fences_refused_locked(h, rc);
        return rc;
    }
    *out = e;
    return CUH_DEV_OK;
}

static int stream_is_drained(const cuh_heap_t *h, const stream_state_t *st)
{
    const cuh_tag_books_t *b = &h->arena.tags[st->tag];
    return !st->num_fences && !b->unfenced_bytes && !b->fenced_bytes && !st->small_unfenced && !st->small_fenced;
}

/* Walks the live streams the heap knows, then the default stream (0) once:
 *     for (uint32_t i = 0; cuh_hp_next_live_stream(h, &i, &handle);) ...
 * The streams every device-wide event, wait and take-back must cover. */
int cuh_hp_next_live_stream(const cuh_heap_t *h, uint32_t *i, cuh_stream_t *handle)
{
    while (*i < h->num_streams) {
        const stream_state_t *st = h->streams[(*i)++];
        if (!st->retired && st->handle) {
            *handle = st->handle;
            return 1;
        }
    }
    if (*i == h->num_streams) {
        (*i)++;
        *handle = 0;
        return 1;
    }
    return 0;
}

/* A stream the heap hears of for the first time, after cudaFree'd blocks
 * were taken back with GPU-side waits (cuh_hp_take_back_all_locked): those
 * waits were enqueued on the streams known then, so this one must also start
 * after everything issued so far on them, or it could touch a reused block
 * while older work still uses it. If that cannot be enqueued, the device is
 * synchronized (slow, never wrong). */
static void stream_joins_locked(cuh_heap_t *h, const stream_state_t *joining)
{
    if (!h->took_back || !joining->handle || h->captures)
        return;
    cuh_stream_t other;
    for (uint32_t i = 0; cuh_hp_next_live_stream(h, &i, &other);) {
        if (other == joining->handle)
            continue;
        cuh_event_t ev = cuh_hp_event_get_locked(h);
        int ok = ev && h->dev->ops->event_record(h->dev, ev, other) == CUH_DEV_OK &&
                 h->dev->ops->stream_wait(h->dev, joining->handle, ev) == CUH_DEV_OK;
        if (ev)
            cuh_hp_event_put_locked(h, ev);   /* the wait took the event's state as it is now */
        if (!ok) {
            cuh_hp_cpu_wait_device(h);
            return;
        }
    }
}

stream_state_t *cuh_hp_stream_find_locked(cuh_heap_t *h, cuh_stream_t handle)
{
    stream_state_t *reusable = NULL;
    for (uint32_t i = 0; i < h->num_streams; i++) {
        stream_state_t *st = h->streams[i];
        if (st->retired) {
            if (!reusable && stream_is_drained(h, st))
                reusable = st;
        } else if (st->handle == handle) {
            return h->last_stream = st;
        }
    }
    if (reusable) {
        /* A retired stream whose memory has all turned global: its tag can
         * serve the new stream (its fence counter only ever grows). */
        reusable->handle = handle;
        reusable->retired = 0;
        h->live_other_streams += handle != 0;
        stream_joins_locked(h, reusable);
        return h->last_stream = reusable;
    }
    if (h->num_streams == h->cap_streams) {
        uint32_t cap = h->cap_streams ? 2 * h->cap_streams : 8;
        stream_state_t **grown = realloc(h->streams, cap * sizeof *grown);
        if (!grown)
            return NULL;
        h->streams = grown;
        h->cap_streams = cap;
    }
    stream_state_t *st = calloc(1, sizeof *st);
    if (!st || cuh_arena_reserve_tags(&h->arena, h->num_streams + 2)) {
        free(st);
        return NULL;
    }
    st->handle = handle;
    st->tag = h->num_streams + 1;
    h->streams[h->num_streams++] = st;
    h->live_other_streams += handle != 0;
    stream_joins_locked(h, st);
    return h->last_stream = st;
}

static int stream_has_unfenced(const cuh_heap_t *h, const stream_state_t *st)
{
    uint64_t recorded = h->arena.tags[st->tag].fences_recorded;
    if (h->arena.tags[st->tag].unfenced_bytes || st->small_unfenced ||
        (h->parked && h->parked_st == st && h->parked_epoch >= recorded))
        return 1;
    /* Large blocks threads hold, freed on st since its last fence. */
    int any = 0;
    for (cuh_tcache_t *tc = h->large_tcs; tc && !any; tc = tc->large_next) {
        if (tc->large.stream_state != st)
            continue;
        cuh_spin_lock(&tc->lock);
        any = tc->large.state == CUH_TC_CACHED &&
              (tc->large.epoch == CUH_TC_EPOCH_UNKNOWN || tc->large.epoch >= recorded);
        cuh_spin_unlock(&tc->lock);
    }
    return any;
}

/* ---- fences ------------------------------------------------------------------ */

/* Fences [0, completed) of st are done: its private memory they cover turns
 * global. */
static void stream_globalize_locked(cuh_heap_t *h, stream_state_t *st)
{
    cuh_arena_fence_completed(&h->arena, st->tag, st->completed);
    for (unsigned c = 0; c < h->num_classes; c++) {
        small_ring_t *r = &st->small[c];
        while (r->count && r->entries[r->head].epoch < st->completed) {
            small_entry_t e = cuh_hp_ring_pop_oldest(r);
            st->small_fenced -= h->classes[c].size;
            h->small_fenced_total -= h->classes[c].size;
            cuh_hp_slab_object_home_locked(h, e.addr);
        }
    }
}

/* Everything recorded on st so far has finished (after a synchronize, or
 * when an event could not be used), or every stream waits for it on the GPU
 * (take_back_private_locked): its fences are done with. */
void cuh_hp_stream_all_done_locked(cuh_heap_t *h, stream_state_t *st)
{
    for (size_t i = 0; i < st->num_fences; i++)
        cuh_hp_event_put_locked(h, st->fences[i].event);
    st->num_fences = 0;
    st->completed = h->arena.tags[st->tag].fences_recorded;
    stream_globalize_locked(h, st);
}

/* Records a fence on st covering its private memory. 0 if none was needed or
 * one was recorded; -1 on a device error (then the device was synchronized
 * and the memory made global, which is always safe). */
int cuh_hp_stream_fence_locked(cuh_heap_t *h, stream_state_t *st)
{
    if (st->retired || h->captures || !stream_has_unfenced(h, st))
        return 0;
    if (st->num_fences == st->cap_fences) {
        size_t cap = st->cap_fences ? 2 * st->cap_fences : 4;
        fence_t *grown = realloc(st->fences, cap * sizeof *grown);
        if (!grown)
            goto fallback;
        st->fences = grown;
        st->cap_fences = cap;
    }
    cuh_event_t ev = cuh_hp_event_get_locked(h);
    if (!ev)
        goto fallback;
    if (h->dev->ops->event_record(h->dev, ev, st->handle) != CUH_DEV_OK) {
        cuh_hp_event_put_locked(h, ev);
        goto fallback;
    }
    st->fences[st->num_fences++] = (fence_t){ev, cuh_arena_fence_recorded(&h->arena, st->tag)};
    st->small_fenced += st->small_unfenced;
    h->small_fenced_total += st->small_unfenced;
    st->small_unfenced = 0;
    return 0;
fallback:
    /* No event (a destroyed stream, an exhausted driver): wait for the whole
     * device instead. Slow, rare, and never wrong. */
    cuh_arena_fence_recorded(&h->arena, st->tag);
    st->small_fenced += st->small_unfenced;
    h->small_fenced_total += st->small_unfenced;
    st->small_unfenced = 0;
    cuh_hp_cpu_wait_device(h);
    cuh_hp_stream_all_done_locked(h, st);
    return -1;
}

/* Queries st's outstanding fences in order; returns 1 if any completed. */
int cuh_hp_stream_poll_locked(cuh_heap_t *h, stream_state_t *st, int wait)
{
    size_t done = 0;
    int failed = 0;
    while (done < st->num_fences) {
        cuh_dev_status_t rc = wait ? cuh_hp_cpu_wait_event(h, st->fences[done].event)
                                   : h->dev->ops->event_query(h->dev, st->fences[done].event);
        if (rc == CUH_DEV_NOT_READY)
            break;
        if (rc != CUH_DEV_OK) {
            failed = 1;
            break;
        }
        st->completed = st->fences[done].number + 1;
        cuh_hp_event_put_locked(h, st->fences[done].event);
        done++;
    }
    if (failed) {
        /* The first `done` events went back to the spare pool above: only
         * the rest are the stream's still, or an event would be handed out
         * twice and one fence pass for another's. */
        memmove(st->fences, st->fences + done, (st->num_fences - done) * sizeof *st->fences);
        st->num_fences -= done;
        if (!wait)
            cuh_hp_cpu_wait_device(h);   /* (a failed wait did so already) */
        cuh_hp_stream_all_done_locked(h, st);
        return 1;
    }
    if (!done)
        return 0;
    memmove(st->fences, st->fences + done, (st->num_fences - done) * sizeof *st->fences);
    st->num_fences -= done;
    stream_globalize_locked(h, st);
    return 1;
}

/* Collects completed fences, holds and batches (wait: waits for them). Not
 * while a graph capture is underway: event calls then would invalidate it. */
int cuh_hp_poll_all_locked(cuh_heap_t *h, int wait)
{
    int any = 0;
    if (h->captures)
        return 0;
    if (h->num_holds)
        any |= cuh_hp_holds_poll_locked(h, wait);
    if (h->closed_batches || h->open_batch)
        any |= cuh_hp_batches_poll_locked(h, wait);
    for (uint32_t i = 0; i < h->num_streams; i++)
        if (h->streams[i]->num_fences)
            any |= cuh_hp_stream_poll_locked(h, h->streams[i], wait);
    return any;
}

/* Fences the other streams whose unfenced private memory could serve a
 * request of `size` bytes. A stream with a fence still in flight is left
 * alone: polling will collect it, and recording more events on a busy
 * stream would only add driver calls. Returns 1 if any fence was recorded. */
int cuh_hp_fence_others_locked(cuh_heap_t *h, const stream_state_t *except, size_t size)
{
    int any = 0;
    if (h->captures)
        return 0;
    for (uint32_t i = 0; i < h->num_streams; i++) {
        stream_state_t *st = h->streams[i];
        if (st == except || st->num_fences)
            continue;
        if (h->arena.tags[st->tag].unfenced_bytes + st->small_unfenced >= size) {
            cuh_hp_stream_fence_locked(h, st);
            any = 1;
        }
    }
    return any;
}

/* Makes all freed memory global, what thread caches hold included: fence
 * every stream and wait. */
void cuh_hp_settle_all_locked(cuh_heap_t *h)
{
    cuh_hp_tcache_flush_locked(h);   /* what thread caches hold is freed memory too */
    if (h->captures)
        return;
    cuh_hp_batch_close_locked(h);
    for (uint32_t i = 0; i < h->num_streams; i++)
        cuh_hp_stream_fence_locked(h, h->streams[i]);
    cuh_hp_poll_all_locked(h, 1);
}

/* Waits until the GPU has passed stream st's work so far (the whole device's
 * during a capture, where no event may be recorded): what cannot wait in a
 * cache for a fence is made safe for everyone the slow way. */
void cuh_hp_wait_for_stream_locked(cuh_heap_t *h, stream_state_t *st)
{
    if (!h->captures) {
        cuh_hp_stream_fence_locked(h, st);
        cuh_hp_stream_poll_locked(h, st, 1);
    } else {
        cuh_hp_cpu_wait_device(h);
    }
}

/* ---- fences for memory outside the heap ------------------------------------ *
 * Pinned host memory obeys cudaFree's rule too (the real cudaFreeHost
 * synchronizes): a freed buffer waits until all work issued before the free
 * has finished. A fence is what a device-wide batch waits for - one
 * device-wide event, or an event on the default stream and on every live
 * stream the heap knows - kept apart from the batches, whose take-backs let
 * the GPU, not the host, wait: host memory is written by the host. The
 * fence's type is defined with the batches (cuh_heap_fence_s). */

/* Records the fence's events (one device-wide event when it can); on any
 * failure synchronizes the device instead (slow, never wrong), leaving no
 * event to wait for. */
static void fence_record_locked(cuh_heap_t *h, cuh_heap_fence_t *f, size_t cap)
{
    cuh_stream_t handle;
    cuh_event_t all = NULL;
    const cuh_dev_status_t fenced = cap ? cuh_hp_record_all_locked(h, &all) : CUH_DEV_UNSUPPORTED;
    if (fenced == CUH_DEV_OK) {
        f->recorded = 1;
        f->events[f->num_events++] = all;
        return;
    }
    if (fenced == CUH_DEV_CAPTURING)
        return;   /* recorded later (cuh_heap_fence_passed), as during the heap's own captures */
    f->recorded = 1;
    for (uint32_t i = 0; cuh_hp_next_live_stream(h, &i, &handle);) {
        cuh_event_t ev = f->num_events < cap ? cuh_hp_event_get_locked(h) : NULL;
        if (!ev || h->dev->ops->event_record(h->dev, ev, handle) != CUH_DEV_OK) {
            if (ev)
                cuh_hp_event_put_locked(h, ev);
            while (f->num_events)
                cuh_hp_event_put_locked(h, f->events[--f->num_events]);
            cuh_hp_cpu_wait_device(h);
            return;
        }
        f->events[f->num_events++] = ev;
    }
}

cuh_heap_fence_t *cuh_heap_fence(cuh_heap_t *h)
{
    cuh_hp_lock(h);
    size_t cap = (size_t)cuh_hp_covered_streams_locked(h);
    cuh_heap_fence_t *f = calloc(1, sizeof *f + cap * sizeof f->events[0]);
    if (!f) {
        cuh_hp_cpu_wait_device(h);   /* no room to remember: wait now */
        cuh_unlock(&h->lock);
        return NULL;
    }
    f->cap = cap;
    if (!h->captures)
        fence_record_locked(h, f, cap);
    f->next = h->fences;
    if (h->fences)
        h->fences->prev = f;
    h->fences = f;
    cuh_unlock(&h->lock);
    return f;
}

int cuh_heap_fence_passed(cuh_heap_t *h, cuh_heap_fence_t *f, int wait)
{
    if (!f)
        return 1;
    cuh_hp_lock(h);
    int passed = 0;
    /* Made during a capture: work issued before the free was issued before
     * now too, so events recorded now cover it (with more streams known
     * than there is room for, fence_record_locked synchronizes instead). */
    if (!f->recorded && !h->captures)
        fence_record_locked(h, f, f->cap);
    /* Still capturing: no event may be recorded and no wait made now. */
    if (f->recorded)
        passed = cuh_hp_events_done_locked(h, f->events, &f->num_events, wait);
    cuh_unlock(&h->lock);
    return passed;
}

void cuh_heap_fence_free(cuh_heap_t *h, cuh_heap_fence_t *f)
{
    if (!f)
        return;
    cuh_hp_lock(h);
    while (f->num_events)
        cuh_hp_event_put_locked(h, f->events[--f->num_events]);
    if (f->prev)
        f->prev->next = f->next;
    else
        h->fences = f->next;
    if (f->next)
        f->next->prev = f->prev;
    cuh_unlock(&h->lock);
    free(f);
}

/* Polls a list of events from its end (wait: waits for them), returning
 * each completed one to the spares; 1 when none is left. An event that
 * fails is answered by synchronizing the device, which is never wrong. */
int cuh_hp_events_done_locked(cuh_heap_t *h, cuh_event_t *events, size_t *num_events, int wait)
{
    while (*num_events) {
        cuh_event_t ev = events[*num_events - 1];
        cuh_dev_status_t rc = wait ? cuh_hp_cpu_wait_event(h, ev) : h->dev->ops->event_query(h->dev, ev);
        if (rc == CUH_DEV_NOT_READY)
            return 0;
        if (rc != CUH_DEV_OK && !wait)
            cuh_hp_cpu_wait_device(h);   /* (a failed wait did so already) */
        cuh_hp_event_put_locked(h, ev);
        (*num_events)--;
    }
    return 1;
}

cuheap_status_t cuh_heap_register_stream(cuh_heap_t *h, cuh_stream_t stream)
{
    cuh_hp_lock(h);
    cuheap_status_t status = CUHEAP_OK;
    if (!cuh_hp_stream_get_locked(h, stream)) {
        cuh_set_error("out of host memory for stream records");
        status = CUHEAP_ERR_OUT_OF_MEMORY;
    }
    cuh_unlock(&h->lock);
    return status;
}

void cuh_heap_retire_stream(cuh_heap_t *h, cuh_stream_t stream)
{
    cuh_hp_lock(h);
    cuh_hp_unpark_all_locked(h);
    for (uint32_t i = 0; i < h->num_streams; i++) {
        stream_state_t *st = h->streams[i];
        if (st->retired || st->handle != stream)
            continue;
        /* What thread caches hold for it joins its ring first; what they
         * handed out on it they forget (a new stream may get its handle). */
        for (cuh_tcache_t *tc = h->tcaches; tc; tc = tc->heap_next)
            cuh_hp_tcache_flush_one_locked(h, tc, 0, stream, 1);
        /* The last event ever recorded on it covers all it freed; it stays
         * valid after the stream is destroyed. */
        cuh_hp_stream_fence_locked(h, st);
        cuh_hp_stream_poll_locked(h, st, 0);
        st->retired = 1;
        h->live_other_streams -= st->handle != 0;
        if (h->last_stream == st)
            h->last_stream = NULL;
    }
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
}
