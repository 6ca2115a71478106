/* heap_holds.c - held blocks: a freed block that streams named by
 * record_stream still use, or that a CUDA graph captured, waits here until
 * those streams' work is done or its graph pool is released; and the captures
 * themselves.
 *
 * Rule kept here (heap.h, cuh_heap_record_stream, cuh_heap_capture_begin): a
 * held block is reused only after every stream that used it has finished the
 * work issued before its free, or after its pool is released; during a capture
 * the heap makes no event call.
 */
#include "heap_internal.h"

#include <stdlib.h>

/* ---- holds ------------------------------------------------------------------------ */

/* Takes a held block off the held books; 1 with its live block in *b. */
int cuh_hp_unhold_locked(cuh_heap_t *h, uintptr_t addr, size_t size, size_t requested, live_block_t *b)
{
    cuh_ptrmap_remove(&h->held, addr);
    h->held_bytes -= size;
    h->held_requested -= requested;
    return cuh_hp_find_live_locked(h, addr, b) == CUHEAP_OK;
}

static int hold_add_locked(cuh_heap_t *h, hold_t *hd)
{
    if (h->num_holds == h->cap_holds) {
        size_t cap = h->cap_holds ? 2 * h->cap_holds : 16;
        hold_t **grown = realloc(h->holds, cap * sizeof *grown);
        if (!grown)
            return -1;
        h->holds = grown;
        h->cap_holds = cap;
    }
    if (cuh_ptrmap_insert(&h->held, hd->addr, hd))
        return -1;
    h->holds[h->num_holds++] = hd;
    h->held_bytes += hd->size;
    h->held_requested += hd->requested;
    return 0;
}

/* Frees held block k for real, on the stream it was freed on. */
static void hold_finish_locked(cuh_heap_t *h, size_t k)
{
    hold_t *hd = h->holds[k];
    h->holds[k] = h->holds[--h->num_holds];
    for (size_t i = 0; i < hd->num_events; i++)
        cuh_hp_event_put_locked(h, hd->events[i]);
    live_block_t b;
    if (cuh_hp_unhold_locked(h, hd->addr, hd->size, hd->requested, &b))
        cuh_hp_release_block_locked(h, &b, hd->addr, h->streams[hd->free_tag - 1]);
    free(hd);
}

/* Finishes every hold whose events have completed (wait: waits for them).
 * Never during a graph capture: event calls would break it. */
int cuh_hp_holds_poll_locked(cuh_heap_t *h, int wait)
{
    int any = 0;
    if (h->captures)
        return 0;
    for (size_t k = 0; k < h->num_holds;) {
        hold_t *hd = h->holds[k];
        if (!hd->pool && cuh_hp_events_done_locked(h, hd->events, &hd->num_events, wait)) {
            hold_finish_locked(h, k);
            any = 1;
        } else {
            k++;
        }
    }
    return any;
}

/* Holds a block freed by the program instead of freeing it: for a graph
 * pool, or until the streams that used it have finished. Returns 1 if held,
 * 0 if the block may be freed now. */
int cuh_hp_maybe_hold_locked(cuh_heap_t *h, uintptr_t addr, size_t size, size_t requested, stream_state_t *st)
{
    uint64_t pool = 0, captured = 0;
    if (cuh_unlikely(h->graph.count))
        pool = (uint64_t)(uintptr_t)cuh_ptrmap_remove(&h->graph, addr);
    if (h->captures && h->capture_pool != pool)
        captured = h->capture_pool;   /* freed during a capture: that graph may use it too */
    if (!pool) {
        pool = captured;
        captured = 0;
    }
    use_list_t *uses = h->uses.count ? cuh_ptrmap_remove(&h->uses, addr) : NULL;
    if (!pool && !uses)
        return 0;
    size_t n = uses ? uses->count : 0;
    hold_t *hd = calloc(1, sizeof *hd + n * sizeof(cuh_event_t));
    int synced = 0;
    if (hd) {
        *hd = (hold_t){.addr = addr, .size = size, .requested = requested, .free_tag = st->tag, .pool = pool,
                       .capture_pool = captured};
        for (size_t i = 0; !pool && i < n; i++) {
            if (uses->streams[i] == st->handle)
                continue;   /* ordered after the free's own stream already */
            cuh_event_t ev = cuh_hp_event_get_locked(h);
            if (!ev || h->dev->ops->event_record(h->dev, ev, uses->streams[i]) != CUH_DEV_OK) {
                if (ev)
                    cuh_hp_event_put_locked(h, ev);
                cuh_hp_cpu_wait_device(h);   /* cannot fence it: wait for everything */
                synced = 1;
                break;
            }
            hd->events[hd->num_events++] = ev;
        }
    }
    free(uses);
    if (!hd || synced || (!pool && !hd->num_events) || hold_add_locked(h, hd)) {
        if (hd) {
            for (size_t i = 0; i < hd->num_events; i++)
                cuh_hp_event_put_locked(h, hd->events[i]);
            if (!synced && hd->num_events)
                cuh_hp_cpu_wait_device(h);
        } else if (!pool) {
            cuh_hp_cpu_wait_device(h);
        }
        free(hd);
        /* A graph pool's block that cannot be tracked stays out of reuse for
         * good rather than be handed out while a replay may write it. */
        return pool != 0;
    }
    return 1;
}

cuheap_status_t cuh_heap_record_stream(cuh_heap_t *h, uintptr_t addr, cuh_stream_t stream)
{
    cuh_hp_lock(h);
    live_block_t b;
    cuheap_status_t status = cuh_hp_find_live_locked(h, addr, &b);
    if (status == CUHEAP_OK) {
        use_list_t *u = cuh_ptrmap_get(&h->uses, addr);
        size_t i = 0;
        while (u && i < u->count && u->streams[i] != stream)
            i++;
        if (!u || i == u->count) {
            if (!u || u->count == u->capacity) {
                size_t cap = u ? 2 * u->capacity : 2;
                use_list_t *grown = realloc(u, sizeof *grown + cap * sizeof(cuh_stream_t));
                if (!grown) {
                    cuh_set_error("out of host memory for record_stream");
                    status = CUHEAP_ERR_OUT_OF_MEMORY;
                    goto out;
                }
                if (!u)
                    grown->count = 0;
                grown->capacity = cap;
                if (u != grown) {
                    cuh_ptrmap_remove(&h->uses, addr);
                    if (cuh_ptrmap_insert(&h->uses, addr, grown)) {
                        free(grown);
                        cuh_set_error("out of host memory for record_stream");
                        status = CUHEAP_ERR_OUT_OF_MEMORY;
                        goto out;
                    }
                }
                u = grown;
            }
            u->streams[u->count++] = stream;
        }
    }
out:
    cuh_unlock(&h->lock);
    return status;
}

void cuh_heap_capture_begin(cuh_heap_t *h, uint64_t pool)
{
    cuh_hp_lock(h);
    cuh_hp_unpark_all_locked(h);
    h->captures++;
    h->capture_pool = pool ? pool : 1;
    atomic_store_explicit(&h->tcache_closed, 1, memory_order_release);
    cuh_unlock(&h->lock);
}

static void release_pool_locked(cuh_heap_t *h, uint64_t pool, int *synced);

void cuh_heap_capture_end(cuh_heap_t *h)
{
    cuh_hp_lock(h);
    if (h->captures)
        h->captures--;
    if (!h->captures && h->num_pools_to_release) {
        int synced = 0;
        for (size_t i = 0; i < h->num_pools_to_release; i++)
            release_pool_locked(h, h->pools_to_release[i], &synced);
        h->num_pools_to_release = 0;
        cuh_hp_refresh_stats_locked(h);
    }
    atomic_store_explicit(&h->tcache_closed, h->captures != 0, memory_order_release);
    cuh_unlock(&h->lock);
}

/* Frees the held blocks of graph pool `pool` (those no other pool holds
 * too) and makes its live blocks ordinary ones. Replays of its graphs may
 * still be running: before the first held block, the CPU waits for the
 * device, once (*synced says whether it has). */
static void release_pool_locked(cuh_heap_t *h, uint64_t pool, int *synced)
{
    for (size_t k = 0; k < h->num_holds;) {
        hold_t *hd = h->holds[k];
        if (hd->pool != pool && hd->capture_pool != pool) {
            k++;
            continue;
        }
        if (hd->capture_pool == pool)
            hd->capture_pool = 0;
        if (hd->pool == pool) {
            hd->pool = hd->capture_pool;
            hd->capture_pool = 0;
        }
        if (hd->pool) {
            k++;   /* the other pool still holds it */
            continue;
        }
        if (!*synced) {
            cuh_hp_cpu_wait_device(h);
            *synced = 1;
        }
        for (size_t i = 0; i < hd->num_events; i++)
            cuh_hp_event_put_locked(h, hd->events[i]);
        hd->num_events = 0;
        hold_finish_locked(h, k);
    }
    for (size_t i = 0; i <= h->graph.mask; i++)
        if (h->graph.slots[i].key && (uint64_t)(uintptr_t)h->graph.slots[i].value == pool) {
            cuh_ptrmap_remove(&h->graph, h->graph.slots[i].key);
            i--;   /* backward shift may have moved a later entry here */
        }
}

/* During a capture (of another pool) the device cannot be waited for: the
 * pool is released, its held blocks freed and its live blocks made
 * ordinary, when the last capture ends. */
void cuh_heap_release_pool(cuh_heap_t *h, uint64_t pool)
{
    cuh_hp_lock(h);
    cuh_hp_unpark_all_locked(h);
    if (!pool)
        pool = 1;
    if (h->captures) {
        size_t i = 0;
        while (i < h->num_pools_to_release && h->pools_to_release[i] != pool)
            i++;
        if (i == h->num_pools_to_release) {
            uint64_t *grown = realloc(h->pools_to_release, (i + 1) * sizeof *grown);
            if (grown) {
                h->pools_to_release = grown;
                h->pools_to_release[h->num_pools_to_release++] = pool;
            } else {
                cuh_log("device %d: out of host memory: graph pool %llu stays reserved", h->dev->ordinal,
                        (unsigned long long)pool);
            }
        }
    } else {
        int synced = 0;
        release_pool_locked(h, pool, &synced);
    }
    cuh_hp_refresh_stats_locked(h);
    cuh_unlock(&h->lock);
}
