/* heap_small.c - small objects: size-class slabs cut from the arena, and each
 * stream's rings of the objects it freed (reuse takes the newest, fences
 * release the oldest).
 *
 * Rule kept here (heap.h): the stream rule, byte for byte, for slab objects.
 * An object freed on s waits in s's ring until a fence on s has completed;
 * a slab's free objects are every stream's, so a slab cut from memory a stream
 * freed (its work may still run) puts its objects in that stream's ring, not
 * in the slab.
 */
#include "heap_internal.h"

#include <stdlib.h>

/* ---- small-object rings ------------------------------------------------------ */

static int ring_push(small_ring_t *r, uintptr_t addr, uint64_t epoch)
{
    if (r->count == r->capacity) {
        uint32_t cap = r->capacity ? 2 * r->capacity : 16;
        small_entry_t *grown = malloc(cap * sizeof *grown);
        if (!grown)
            return -1;
        for (uint32_t i = 0; i < r->count; i++)
            grown[i] = r->entries[(r->head + i) & (r->capacity - 1)];
        free(r->entries);
        r->entries = grown;
        r->capacity = cap;
        r->head = 0;
    }
    r->entries[(r->head + r->count) & (r->capacity - 1)] = (small_entry_t){addr, epoch};
    r->count++;
    return 0;
}

static small_entry_t ring_pop_newest(small_ring_t *r)
{
    r->count--;
    return r->entries[(r->head + r->count) & (r->capacity - 1)];
}

small_entry_t cuh_hp_ring_pop_oldest(small_ring_t *r)
{
    small_entry_t e = r->entries[r->head];
    r->head = (r->head + 1) & (r->capacity - 1);
    r->count--;
    return e;
}

/* ---- slabs ------------------------------------------------------------------- */

static void slab_list(size_class_t *c, cuh_slab_t *s)
{
    s->prev = NULL;
    s->next = c->partial;
    if (c->partial)
        c->partial->prev = s;
    c->partial = s;
    s->listed = 1;
}

static void slab_unlist(size_class_t *c, cuh_slab_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        c->partial = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    s->listed = 0;
}

static void slab_forget_locked(cuh_heap_t *h, cuh_slab_t *s)
{
    if (h->last_slab == s)
        h->last_slab = NULL;
    cuh_slab_destroy(s);
}

/* A slab with every object avail goes back to the arena. */
static void slab_release_locked(cuh_heap_t *h, size_class_t *c, cuh_slab_t *s)
{
    if (s->listed)
        slab_unlist(c, s);
    cuh_pagemap_set(&h->pages, s->base, s->extent->size, NULL);
    cuh_arena_release(&h->arena, s->extent, CUH_TAG_GLOBAL);
    slab_forget_locked(h, s);
}

/* Returns a small object to its slab (it is now free for every stream); a
 * slab left with no object in use or cached goes back to the arena, except
 * the first one of the class an allocation waits for (small_taken_back_locked). */
void cuh_hp_slab_object_home_locked(cuh_heap_t *h, uintptr_t addr)
{
    cuh_slab_t *s = cuh_hp_slab_of_locked(h, addr);
    size_class_t *c = &h->classes[s->size_class];
    cuh_slab_give_back(s, (uint32_t)cuh_slab_index(s, addr));
    if (s->num_avail == s->num_objs && !(s->size_class == h->keep_class && !h->kept_slab)) {
        slab_release_locked(h, c, s);
        return;
    }
    if (s->num_avail == s->num_objs)
        h->kept_slab = s;
    if (!s->listed)
        slab_list(c, s);
}

static void small_mark_live_locked(cuh_heap_t *h, cuh_slab_t *s, uintptr_t addr, size_t size)
{
    uint32_t i = (uint32_t)cuh_slab_index(s, addr);
    cuh_slab_set(s->live, i);
    s->requested[i] = (uint32_t)size;
    h->marked_label = &s->labels[i];
    h->marked_addr = addr;
    s->num_live++;
    cuh_hp_stat_set(&h->requested, h->requested.current + size);
    cuh_hp_stat_set(&h->allocated, h->allocated.current + s->obj_size);
}

/* Puts object addr of slab s into stream st's cache, covered by st's next
 * fence (as an object st frees). -1 if the cache cannot grow. */
int cuh_hp_cache_small_locked(cuh_heap_t *h, stream_state_t *st, const cuh_slab_t *s, uintptr_t addr)
{
    if (ring_push(&st->small[s->size_class], addr, h->arena.tags[st->tag].fences_recorded) != 0)
        return -1;
    st->small_unfenced += s->obj_size;
    return 0;
}

/* Moves every avail object of slab s (just cut from stream st's private
 * memory) into st's cache for class c, fenced by st's next fence. If the
 * cache cannot grow, st's work is waited for instead and they stay. */
static void slab_to_own_cache_locked(cuh_heap_t *h, stream_state_t *st, size_class_t *c, cuh_slab_t *s)
{
    while (s->num_avail) {
        int64_t i = cuh_slab_take(s);
        if (cuh_hp_cache_small_locked(h, st, s, s->base + (uintptr_t)i * s->obj_size) != 0) {
            cuh_slab_give_back(s, (uint32_t)i);
            cuh_hp_wait_for_stream_locked(h, st);
            return;
        }
    }
    if (s->listed)
        slab_unlist(c, s);
}

/* An object from a slab of class c with avail objects, or 0. */
static uintptr_t small_from_slabs_locked(size_class_t *c)
{
    cuh_slab_t *s = c->partial;
    if (!s)
        return 0;
    int64_t i = cuh_slab_take(s);
    if (!s->num_avail)
        slab_unlist(c, s);
    return s->base + (uintptr_t)i * s->obj_size;
}

/* An object of class ci from what cudaFree'd memory gives back: the batches
 * the GPU has passed and, device-wide fenced, a take-back of all that is held
 * (what the ladder would do first, cuh_hp_extent_alloc_locked); 0 if none.
 * A slab whose objects all come home stays for this allocation rather than
 * go back to the arena and be cut again at once: with PyTorch's cache off a
 * loop of 64 KiB tensors emptied and made a slab every sixteen tensors. */
static uintptr_t small_taken_back_locked(cuh_heap_t *h, unsigned ci)
{
    size_class_t *c = &h->classes[ci];
    h->keep_class = ci;
    int any = cuh_hp_poll_all_locked(h, 0);
    if (!c->partial && h->held_bytes && !cuh_hp_fences_per_stream_locked(h))
        any |= cuh_hp_take_back_all_locked(h);
    h->keep_class = CUH_MAX_CLASSES;
    uintptr_t a = any ? small_from_slabs_locked(c) : 0;
    cuh_slab_t *kept = h->kept_slab;
    h->kept_slab = NULL;
    if (kept && kept->num_avail == kept->num_objs)
        slab_release_locked(h, c, kept);   /* another slab served: no slab stays empty */
    return a;
}

cuheap_status_t cuh_hp_small_alloc_locked(cuh_heap_t *h, stream_state_t *st, size_t size, uintptr_t *addr)
{
    unsigned ci = cuh_sizeclass_index(size);
    size_class_t *c = &h->classes[ci];
    small_ring_t *r = &st->small[ci];
    uintptr_t a = 0;
    if (r->count) {
        small_entry_t e = ring_pop_newest(r);
        if (e.epoch < h->arena.tags[st->tag].fences_recorded) {
            st->small_fenced -= c->size;
            h->small_fenced_total -= c->size;
        } else {
            st->small_unfenced -= c->size;
        }
        a = e.addr;
        h->num_cache_hits++;
    } else if ((a = small_from_slabs_locked(c)) || (a = small_taken_back_locked(h, ci))) {
        h->num_cache_hits++;
    } else {
        cuheap_status_t status = CUHEAP_OK;
        grow_result_t why = GROW_OK;
        cuh_extent_t *e =
            cuh_hp_extent_alloc_locked(h, st, c->slab_bytes, CUH_SLAB_PAGE, CUH_EXTENT_SLAB, &status, &why);
        if (!e) {
            /* The ladder may have returned objects of this class to slabs. */
            if (status == CUHEAP_ERR_OUT_OF_MEMORY && (a = small_from_slabs_locked(c)))
                goto found;
            if (status == CUHEAP_ERR_OUT_OF_MEMORY && why != GROW_OK)
                cuh_hp_record_oom_locked(h, st, size, c->slab_bytes, CUH_SLAB_PAGE, why);
            return status;
        }
        /* Cut from this stream's private memory, whose old work may still
         * run, the slab's objects are this stream's until a fence shows the
         * GPU passed that work: they go to its cache (as if it had freed
         * them now), not to the slab, whose objects are every stream's. */
        uint32_t from = h->last_take_tag;
        cuh_slab_t *s = cuh_slab_create(e, ci, c->size);
        if (!s || cuh_pagemap_set(&h->pages, e->addr, e->size, s)) {
            if (s)
                cuh_pagemap_set(&h->pages, e->addr, e->size, NULL);
            slab_forget_locked(h, s);
            cuh_arena_release(&h->arena, e, from);
            cuh_set_error("out of host memory for slab records");
            return CUHEAP_ERR_OUT_OF_MEMORY;
        }
        e->owner = s;
        e->requested = e->size;
        slab_list(c, s);
        a = small_from_slabs_locked(c);
        if (from != CUH_TAG_GLOBAL)
            slab_to_own_cache_locked(h, st, c, s);
    }
found:
    small_mark_live_locked(h, cuh_hp_slab_of_locked(h, a), a, size);
    *addr = a;
    return CUHEAP_OK;
}
