/* arena.c - segments, extents, best fit and coalescing (see arena.h).
 *
 * Every change to a free extent goes through index_insert / index_remove,
 * which keep the trees, the per-tag lists and the byte counts in step; the
 * rest of the file only cuts and joins extents.
 */
#include "arena.h"

#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_RECORDS 256

struct cuh_extent_chunk_s {
    cuh_extent_chunk_t *next;
    cuh_extent_t records[CHUNK_RECORDS];
};

/* ---- extent records ------------------------------------------------------ */

static cuh_extent_t *record_new(cuh_arena_t *a)
{
    if (!a->spare) {
        cuh_extent_chunk_t *chunk = malloc(sizeof *chunk);
        if (!chunk)
            return NULL;
        chunk->next = a->chunks;
        a->chunks = chunk;
        for (size_t i = 0; i < CHUNK_RECORDS; i++) {
            chunk->records[i].next = a->spare;
            a->spare = &chunk->records[i];
        }
    }
    cuh_extent_t *e = a->spare;
    a->spare = e->next;
    memset(e, 0, sizeof *e);
    return e;
}

static void record_delete(cuh_arena_t *a, cuh_extent_t *e)
{
    e->next = a->spare;
    a->spare = e;
}

/* ---- free index ---------------------------------------------------------- */

/* The bins free extent e is found in. */
static cuh_freebins_t *bins_of(cuh_arena_t *a, const cuh_extent_t *e)
{
    return &a->tags[e->tag].bins[e->segment->region];
}

/* Puts e in its bins, ranked by its segment's creation (freebins.h: ties go
 * to the oldest segment, whatever addresses the device handed out). */
static void bins_insert(cuh_arena_t *a, cuh_extent_t *e)
{
    cuh_freebins_insert(bins_of(a, e), &e->node, e->size, e->addr, e->segment->serial);
}

static void index_insert(cuh_arena_t *a, cuh_extent_t *e)
{
    cuh_tag_books_t *b = &a->tags[e->tag];
    a->index_changes++;
    bins_insert(a, e);
    e->tag_prev = NULL;
    e->tag_next = b->list;
    if (b->list)
        b->list->tag_prev = e;
    else
        b->oldest = e;
    b->list = e;
    if (e->tag != CUH_TAG_GLOBAL) {
        if (e->epoch < b->fences_recorded) {
            b->fenced_bytes += e->size;
            a->fenced_bytes += e->size;
        } else
            b->unfenced_bytes += e->size;
    }
    a->free_extents++;
}

static void index_remove(cuh_arena_t *a, cuh_extent_t *e)
{
    cuh_tag_books_t *b = &a->tags[e->tag];
    a->index_changes++;
    cuh_freebins_remove(bins_of(a, e), &e->node);
    if (e->tag_prev)
        e->tag_prev->tag_next = e->tag_next;
    else
        b->list = e->tag_next;
    if (e->tag_next)
        e->tag_next->tag_prev = e->tag_prev;
    else
        b->oldest = e->tag_prev;
    e->tag_prev = e->tag_next = NULL;
    if (e->tag != CUH_TAG_GLOBAL) {
        if (e->epoch < b->fences_recorded) {
            b->fenced_bytes -= e->size;
            a->fenced_bytes -= e->size;
        } else
            b->unfenced_bytes -= e->size;
    }
    a->free_extents--;
}

/* ---- arena --------------------------------------------------------------- */

void cuh_arena_init(cuh_arena_t *a) { memset(a, 0, sizeof *a); }

void cuh_arena_destroy(cuh_arena_t *a)
{
    for (cuh_segment_t *s = a->segments, *next; s; s = next) {
        next = s->next;
        free(s);
    }
    for (cuh_extent_chunk_t *c = a->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(a->tags);
    free(a->by_address);
    memset(a, 0, sizeof *a);
}

int cuh_arena_reserve_tags(cuh_arena_t *a, uint32_t n)
{
    if (n <= a->num_tags)
        return 0;
    uint32_t cap = a->num_tags ? a->num_tags : 4;
    while (cap < n)
        cap *= 2;
    cuh_tag_books_t *grown = realloc(a->tags, cap * sizeof *grown);
    if (!grown)
        return -1;
    memset(grown + a->num_tags, 0, (cap - a->num_tags) * sizeof *grown);
    a->tags = grown;
    a->num_tags = cap;
    return 0;
}

cuh_segment_t *cuh_arena_add_segment(cuh_arena_t *a, uintptr_t base, size_t size, cuh_region_t region)
{
    if (cuh_arena_reserve_tags(a, 1))
        return NULL;
    if (a->num_segments == a->cap_segments) {
        size_t cap = a->cap_segments ? 2 * a->cap_segments : 16;
        cuh_segment_t **grown = realloc(a->by_address, cap * sizeof *grown);
        if (!grown)
            return NULL;
        a->by_address = grown;
        a->cap_segments = cap;
    }
    cuh_segment_t *seg = calloc(1, sizeof *seg);
    cuh_extent_t *e = seg ? record_new(a) : NULL;
    if (!e) {
        free(seg);
        return NULL;
    }
    seg->base = base;
    seg->size = size;
    seg->region = region;
    seg->first = e;
    seg->serial = a->next_serial++;
    seg->next = a->segments;
    if (a->segments)
        a->segments->prev = seg;
    a->segments = seg;
    size_t i = a->num_segments;
    while (i > 0 && a->by_address[i - 1]->base > base) {
        a->by_address[i] = a->by_address[i - 1];
        i--;
    }
    a->by_address[i] = seg;
    a->num_segments++;
    a->reserved += size;

    e->addr = base;
    e->size = size;
    e->segment = seg;
    e->state = CUH_EXTENT_FREE;
    e->tag = CUH_TAG_GLOBAL;
    index_insert(a, e);
    return seg;
}

int cuh_arena_segment_is_free(const cuh_segment_t *seg)
{
    return seg->used_bytes == 0 && seg->first->state == CUH_EXTENT_FREE && !seg->first->next &&
           seg->first->tag == CUH_TAG_GLOBAL;
}

void cuh_arena_remove_segment(cuh_arena_t *a, cuh_segment_t *seg)
{
    index_remove(a, seg->first);
    record_delete(a, seg->first);
    if (seg->prev)
        seg->prev->next = seg->next;
    else
        a->segments = seg->next;
    if (seg->next)
        seg->next->prev = seg->prev;
    size_t i = 0;
    while (a->by_address[i] != seg)
        i++;
    memmove(&a->by_address[i], &a->by_address[i + 1], (a->num_segments - i - 1) * sizeof seg);
    a->num_segments--;
    a->reserved -= seg->size;
    free(seg);
}

cuh_segment_t *cuh_arena_segment_of(const cuh_arena_t *a, uintptr_t addr)
{
    size_t lo = 0, hi = a->num_segments;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->by_address[mid]->base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    cuh_segment_t *s = a->by_address[lo - 1];
    return addr - s->base < s->size ? s : NULL;
}

/* ---- best fit ------------------------------------------------------------ */

cuh_extent_t *cuh_arena_find(cuh_arena_t *a, size_t size, size_t align, uint32_t tag)
{
    if (!a->num_tags)
        return NULL;
    for (int region = 0; region < CUH_NUM_REGIONS; region++) {
        const cuh_freebins_t *global = &a->tags[CUH_TAG_GLOBAL].bins[region];
        cuh_binnode_t *best = global->count ? cuh_freebins_find(global, size, align) : NULL;
        if (tag != CUH_TAG_GLOBAL && tag < a->num_tags && a->tags[tag].bins[region].count) {
            cuh_binnode_t *own = cuh_freebins_find(&a->tags[tag].bins[region], size, align);
            /* Prefer the stream's own memory on a tie: global memory is worth
             * more, since every stream can use it. */
            if (own && (!best || own->size <= best->size))
                best = own;
        }
        if (best)
            return cuh_container_of(best, cuh_extent_t, node);
    }
    return NULL;
}

static void link_after(cuh_extent_t *pos, cuh_extent_t *e)
{
    e->prev = pos;
    e->next = pos->next;
    if (pos->next)
        pos->next->prev = e;
    pos->next = e;
}

static void unlink_extent(cuh_extent_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        e->segment->first = e->next;
    if (e->next)
        e->next->prev = e->prev;
}

void cuh_arena_fresh_take(cuh_extent_t *ext, cuh_extent_state_t state, uint32_t tag)
{
    ext->state = (uint8_t)state;
    ext->tag = tag;
    ext->epoch = 0;
    ext->requested = 0;
    ext->owner = NULL;
    ext->chunked = 0;
    ext->label = 0;
    ext->seq = 0;
    ext->plan = 0;
}

cuh_extent_t *cuh_arena_take(cuh_arena_t *a, cuh_extent_t *ext, size_t size, size_t align,
                             cuh_extent_state_t state, uint32_t tag)
{
    return cuh_arena_take_at(a, ext, cuh_addr_align_up(ext->addr, align), size, state, tag);
}

cuh_extent_t *cuh_arena_take_at(cuh_arena_t *a, cuh_extent_t *ext, uintptr_t start, size_t size,
                                cuh_extent_state_t state, uint32_t tag)
{
    size_t pad = (size_t)(start - ext->addr);
    size_t tail = ext->size - pad - size;
    cuh_extent_t *front = NULL, *back = NULL;
    if (pad && !(front = record_new(a)))
        return NULL;
    if (tail && !(back = record_new(a))) {
        if (front)
            record_delete(a, front);
        return NULL;
    }
    index_remove(a, ext);
    if (front) {
        *front = (cuh_extent_t){.addr = ext->addr, .size = pad, .segment = ext->segment,
                                .state = CUH_EXTENT_FREE, .tag = ext->tag, .epoch = ext->epoch};
        front->prev = ext->prev;
        front->next = ext;
        if (ext->prev)
            ext->prev->next = front;
        else
            ext->segment->first = front;
        ext->prev = front;
        index_insert(a, front);
    }
    if (back) {
        *back = (cuh_extent_t){.addr = start + size, .size = tail, .segment = ext->segment,
                               .state = CUH_EXTENT_FREE, .tag = ext->tag, .epoch = ext->epoch};
        link_after(ext, back);
        index_insert(a, back);
    }
    ext->addr = start;
    ext->size = size;
    cuh_arena_fresh_take(ext, state, tag);
    ext->segment->used_bytes += size;
    a->used += size;
    return ext;
}

cuh_extent_t *cuh_arena_take_spanning(cuh_arena_t *a, cuh_extent_t *ext, uintptr_t start, size_t size,
                                     cuh_extent_state_t state, uint32_t tag)
{
    cuh_extent_t *n = ext->next;
    size_t spill = (size_t)(start + size - (ext->addr + ext->size));
    index_remove(a, ext);
    index_remove(a, n);
    ext->size += spill;
    n->addr += spill;
    n->size -= spill;
    if (n->size) {
        index_insert(a, n);
    } else {
        unlink_extent(n);
        record_delete(a, n);
    }
    index_insert(a, ext);
    return cuh_arena_take_at(a, ext, start, size, state, tag);
}

cuh_extent_t *cuh_arena_split_used(cuh_arena_t *a, cuh_extent_t *ext, uintptr_t at)
{
    cuh_extent_t *x = record_new(a);
    if (!x)
        return NULL;
    *x = (cuh_extent_t){.addr = at, .size = ext->addr + ext->size - at, .segment = ext->segment,
                        .state = ext->state, .tag = ext->tag};
    ext->size = (size_t)(at - ext->addr);
    link_after(ext, x);
    return x;
}

void cuh_arena_join_used(cuh_arena_t *a, cuh_extent_t *ext)
{
    cuh_extent_t *n = ext->next;
    ext->size += n->size;
    unlink_extent(n);
    record_delete(a, n);
}

/* May free extent `tag` absorb its free neighbour n? A private extent takes
 * in global neighbours, except in a virtual-memory reservation: there the
 * global free space is the whole unused address range, and one stream's free
 * must not make it that stream's alone. */
int cuh_arena_absorbs(const cuh_extent_t *n, uint32_t tag)
{
    return n && n->state == CUH_EXTENT_FREE &&
           (n->tag == tag || (n->tag == CUH_TAG_GLOBAL && (tag == CUH_TAG_GLOBAL || !n->segment->virtual_space)));
}

/* Joins free neighbour n into e (n leaves the index and is deleted). */
static void absorb(cuh_arena_t *a, cuh_extent_t *e, cuh_extent_t *n)
{
    index_remove(a, n);
    if (n->addr < e->addr)
        e->addr = n->addr;
    e->size += n->size;
    if (n->tag == e->tag && n->epoch > e->epoch)
        e->epoch = n->epoch;
    unlink_extent(n);
    record_delete(a, n);
}

void cuh_arena_release(cuh_arena_t *a, cuh_extent_t *ext, uint32_t tag)
{
    cuh_arena_release_freed_at(a, ext, tag, tag == CUH_TAG_GLOBAL ? 0 : a->tags[tag].fences_recorded);
}

void cuh_arena_release_freed_at(cuh_arena_t *a, cuh_extent_t *ext, uint32_t tag, uint64_t epoch)
{
    ext->segment->used_bytes -= ext->size;
    a->used -= ext->size;
    ext->state = CUH_EXTENT_FREE;
    ext->tag = tag;
    ext->epoch = tag == CUH_TAG_GLOBAL ? 0 : epoch;
    ext->requested = 0;
    ext->owner = NULL;
    ext->chunked = 0;
    ext->label = 0;
    /* Absorbing a global neighbour can bring the next one of our own tag
     * alongside: keep going until no neighbour may be absorbed. */
    while (cuh_arena_absorbs(ext->prev, tag))
        absorb(a, ext, ext->prev);
    while (cuh_arena_absorbs(ext->next, tag))
        absorb(a, ext, ext->next);
    index_insert(a, ext);
}

void cuh_arena_requeue(cuh_arena_t *a, cuh_extent_t *ext)
{
    if (cuh_arena_queued_first(ext))
        return;
    index_remove(a, ext);
    index_insert(a, ext);
}

uint64_t cuh_arena_fence_recorded(cuh_arena_t *a, uint32_t tag)
{
    cuh_tag_books_t *b = &a->tags[tag];
    b->fenced_bytes += b->unfenced_bytes;
    a->fenced_bytes += b->unfenced_bytes;
    b->unfenced_bytes = 0;
    return b->fences_recorded++;
}

void cuh_arena_hand_over(cuh_arena_t *a, uint32_t from, uint64_t completed, uint32_t to)
{
    cuh_tag_books_t *b = &a->tags[from];
    for (cuh_extent_t *e = b->list, *next; e; e = next) {
        next = e->tag_next;
        if (e->epoch >= completed)
            continue;
        index_remove(a, e);
        e->tag = to;
        e->epoch = to == CUH_TAG_GLOBAL ? 0 : a->tags[to].fences_recorded;
        /* As a free into `to` would merge (cuh_arena_release): neighbours
         * absorbed here are `to`'s or global, so never `next`. */
        while (cuh_arena_absorbs(e->prev, to))
            absorb(a, e, e->prev);
        while (cuh_arena_absorbs(e->next, to))
            absorb(a, e, e->next);
        index_insert(a, e);
    }
}

void cuh_arena_fence_completed(cuh_arena_t *a, uint32_t tag, uint64_t completed)
{
    cuh_arena_hand_over(a, tag, completed, CUH_TAG_GLOBAL);
}

/* ---- figures ------------------------------------------------------------- */

size_t cuh_arena_free_bytes(const cuh_arena_t *a) { return a->reserved - a->used; }

size_t cuh_arena_pending_bytes(const cuh_arena_t *a) { return a->fenced_bytes; }

size_t cuh_arena_largest_free(const cuh_arena_t *a)
{
    size_t largest = 0;
    for (uint32_t t = 0; t < a->num_tags; t++)
        for (int r = 0; r < CUH_NUM_REGIONS; r++) {
            const cuh_binnode_t *n = cuh_freebins_largest(&a->tags[t].bins[r]);
            if (n && n->size > largest)
                largest = n->size;
        }
    return largest;
}

void cuh_arena_visit(const cuh_arena_t *a, cuh_extent_visitor_t visit, void *ctx)
{
    for (size_t i = 0; i < a->num_segments; i++) {
        const cuh_segment_t *s = a->by_address[i];
        for (const cuh_extent_t *e = s->first; e; e = e->next)
            visit(ctx, s, e);
    }
}

int cuh_arena_check(const cuh_arena_t *a, char *msg, size_t len)
{
    size_t reserved = 0, used = 0, nfree = 0;
    size_t *tag_free = calloc(a->num_tags ? a->num_tags : 1, sizeof *tag_free);
    int rc = -1;
    msg[0] = '\0';
    if (!tag_free) {
        snprintf(msg, len, "out of host memory");
        return -1;
    }
    for (size_t i = 0; i < a->num_segments; i++) {
        const cuh_segment_t *s = a->by_address[i];
        if (i && a->by_address[i - 1]->base + a->by_address[i - 1]->size > s->base) {
            snprintf(msg, len, "segments overlap at 0x%llx", (unsigned long long)s->base);
            goto out;
        }
        uintptr_t at = s->base;
        size_t seg_used = 0;
        for (const cuh_extent_t *e = s->first; e; e = e->next) {
            const char *bad = NULL;
            const cuh_extent_t *n = e->next;
            if (e->addr != at)
                bad = "extent does not start where the previous one ends";
            else if (e->segment != s)
                bad = "extent points at the wrong segment";
            else if (e->size == 0 || e->size % CUH_ALIGN || e->addr % CUH_ALIGN)
                bad = "extent is not 512-aligned";
            else if (n && n->prev != e)
                bad = "broken neighbour links";
            else if (e->state == CUH_EXTENT_FREE && n && n->state == CUH_EXTENT_FREE && n->tag == e->tag)
                bad = "two adjacent free extents of one tag were not merged";
            else if (e->state == CUH_EXTENT_FREE && e->tag >= a->num_tags)
                bad = "free extent with a tag out of range";
            if (bad) {
                snprintf(msg, len, "segment 0x%llx, extent 0x%llx: %s", (unsigned long long)s->base,
                         (unsigned long long)e->addr, bad);
                goto out;
            }
            if (e->state == CUH_EXTENT_FREE) {
                nfree++;
                tag_free[e->tag] += e->size;
            } else {
                seg_used += e->size;
            }
            at += e->size;
        }
        if (at != s->base + s->size || seg_used != s->used_bytes) {
            snprintf(msg, len, "segment 0x%llx: extents cover %llu of %zu bytes, used %zu (books say %zu)",
                     (unsigned long long)s->base, (unsigned long long)(at - s->base), s->size, seg_used,
                     s->used_bytes);
            goto out;
        }
        reserved += s->size;
        used += seg_used;
    }
    for (uint32_t t = 0; t < a->num_tags; t++) {
        const cuh_tag_books_t *b = &a->tags[t];
        size_t tree_bytes = 0, list_bytes = 0;
        for (int r = 0; r < CUH_NUM_REGIONS; r++) {
            if (cuh_freebins_check(&b->bins[r])) {
                snprintf(msg, len, "tag %u region %d: free index is unsound", t, r);
                goto out;
            }
            tree_bytes += b->bins[r].bytes;
        }
        for (const cuh_extent_t *e = b->list; e; e = e->tag_next) {
            if (e->state != CUH_EXTENT_FREE || e->tag != t) {
                snprintf(msg, len, "tag %u list holds an extent that is not free with that tag", t);
                goto out;
            }
            list_bytes += e->size;
        }
        if (tree_bytes != tag_free[t] || list_bytes != tag_free[t] ||
            (t && b->fenced_bytes + b->unfenced_bytes != tag_free[t])) {
            snprintf(msg, len, "tag %u: extents hold %zu free bytes, trees %zu, list %zu, counters %zu", t,
                     tag_free[t], tree_bytes, list_bytes, b->fenced_bytes + b->unfenced_bytes);
            goto out;
        }
    }
    if (reserved != a->reserved || used != a->used || nfree != a->free_extents) {
        snprintf(msg, len, "arena totals disagree: reserved %zu/%zu used %zu/%zu free extents %zu/%zu", reserved,
                 a->reserved, used, a->used, nfree, a->free_extents);
        goto out;
    }
    rc = 0;
out:
    free(tag_free);
    return rc;
}
