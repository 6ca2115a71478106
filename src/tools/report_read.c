/* report_read.c - reading a JSON report (include/cuheap_report.schema.json,
 * version 1) back into the heap snapshots it was rendered from, field by
 * field, with the optional "pinned_host" and "callers" parts. Each part is
 * checked for what its values promise of each other as it is read: segments
 * in address order, extents that tile their segment, no block with more bytes
 * requested than it holds, a timeline in time order.
 */
#include "report_tool.h"

#include "config.h"

#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void get_stat(reader_t *r, const cuh_json_t *stats, const char *key, cuheap_stat_t *out)
{
    size_t saved;
    const cuh_json_t *o = get_node(r, stats, key, CUH_JSON_OBJECT, &saved);
    if (o) {
        out->current = get_u64(r, o, "current", UINT64_MAX);
        out->peak = get_u64(r, o, "peak", UINT64_MAX);
    }
    path_pop(r, saved);
}

static void read_config(reader_t *r, const cuh_json_t *d, cuh_config_t *c)
{
    size_t saved;
    cuh_config_defaults(c);
    c->report[0] = c->trace[0] = '\0';
    const cuh_json_t *o = get_node(r, d, "config", CUH_JSON_OBJECT, &saved);
    if (o) {
        c->workspace = get_size(r, o, "workspace");
        c->limit_bytes = get_size(r, o, "limit_bytes");
        c->limit_fraction = get_double(r, o, "limit_fraction");
        c->small_max = get_size(r, o, "small_max");
        c->segment_min = get_size(r, o, "segment_min");
        c->grow_fraction = get_double(r, o, "grow_fraction");
        c->vmm = get_size(r, o, "vmm");
        c->vmm_margin = get_double(r, o, "vmm_margin");
        /* Not in version 1's schema, but part of the settings line when set. */
        copy_string(r, o, "report", 0, c->report, sizeof c->report);
        copy_string(r, o, "trace", 0, c->trace, sizeof c->trace);
    }
    path_pop(r, saved);
}

static void read_stats(reader_t *r, const cuh_json_t *d, cuheap_stats_t *st)
{
    size_t saved;
    const cuh_json_t *o = get_node(r, d, "stats", CUH_JSON_OBJECT, &saved);
    if (o) {
        get_stat(r, o, "requested", &st->requested);
        get_stat(r, o, "allocated", &st->allocated);
        get_stat(r, o, "reserved", &st->reserved);
        get_stat(r, o, "cached", &st->cached);
        get_stat(r, o, "pending", &st->pending);
        st->num_allocs = get_u64(r, o, "num_allocs", UINT64_MAX);
        st->num_frees = get_u64(r, o, "num_frees", UINT64_MAX);
        st->num_segment_allocs = get_u64(r, o, "num_segment_allocs", UINT64_MAX);
        st->num_segment_frees = get_u64(r, o, "num_segment_frees", UINT64_MAX);
        st->num_cache_hits = get_u64(r, o, "num_cache_hits", UINT64_MAX);
        st->num_retries = get_u64(r, o, "num_retries", UINT64_MAX);
        st->num_ooms = get_u64(r, o, "num_ooms", UINT64_MAX);
        st->largest_free_extent = get_u64(r, o, "largest_free_extent", UINT64_MAX);
        st->num_free_extents = get_u64(r, o, "num_free_extents", UINT64_MAX);
        (void)get_double(r, o, "fragmentation");   /* derived from the two above; checked, not kept */
        st->limit = get_u64(r, o, "limit", UINT64_MAX);
        st->workspace = get_u64(r, o, "workspace", UINT64_MAX);
        st->num_cpu_waits = opt_u64(r, o, "num_cpu_waits", UINT64_MAX, 0);   /* older reports lack it */
    }
    path_pop(r, saved);
}

static void read_classes(reader_t *r, const cuh_json_t *d, cuh_heap_snapshot_t *s)
{
    size_t saved, item;
    const cuh_json_t *a = get_node(r, d, "size_classes", CUH_JSON_ARRAY, &saved);
    if (a && a->v.array.n > CUH_MAX_CLASSES)
        fail(r, a, "%zu size classes (at most %d)", a->v.array.n, CUH_MAX_CLASSES);
    for (size_t i = 0; a && i < a->v.array.n && !r->failed; i++) {
        const cuh_json_t *o = get_item(r, a, i, &item);
        cuh_snap_class_t *k = &s->classes[i];
        k->size = get_u64(r, o, "size", UINT64_MAX);
        k->slab_bytes = get_u64(r, o, "slab_bytes", UINT64_MAX);
        k->slabs = get_u64(r, o, "slabs", UINT64_MAX);
        k->objs = get_u64(r, o, "objects", UINT64_MAX);
        k->live = get_u64(r, o, "live", UINT64_MAX);
        k->cached = get_u64(r, o, "cached", UINT64_MAX);
        if (!r->failed && (k->live > k->objs || k->cached > k->objs - k->live))
            fail(r, o, "%" PRIu64 " objects live and %" PRIu64 " cached, more than the class's %" PRIu64, k->live,
                 k->cached, k->objs);
        s->num_classes = (unsigned)(i + 1);
        path_pop(r, item);
    }
    path_pop(r, saved);
}

static void read_extent(reader_t *r, const cuh_json_t *o, cuh_heap_snapshot_t *s, cuh_snap_extent_t *x)
{
    static const char *const kinds[] = {"free", "block", "slab"};   /* as cuh_snap_kind_t */
    x->addr = get_u64(r, o, "addr", UINT64_MAX);
    x->size = get_u64(r, o, "size", UINT64_MAX);
    int kind = get_enum(r, o, "kind", kinds, 3);
    if (kind == CUH_SNAP_FREE) {
        x->kind = CUH_SNAP_FREE;
        x->stream_tag = (uint32_t)opt_u64(r, o, "stream", UINT32_MAX, 0);
        x->pending = opt_bool(r, o, "pending");
    } else if (kind == CUH_SNAP_BLOCK) {
        x->kind = CUH_SNAP_BLOCK;
        x->requested = opt_u64(r, o, "requested", UINT64_MAX, 0);
        if (!r->failed && x->requested > x->size)
            fail(r, o, "a block of %" PRIu64 " bytes says %" PRIu64 " were requested (at most its size)", x->size,
                 x->requested);
    } else if (kind == CUH_SNAP_SLAB) {
        x->kind = CUH_SNAP_SLAB;
        x->size_class = (uint32_t)opt_u64(r, o, "size_class", UINT32_MAX, 0);
        x->objs = (uint32_t)opt_u64(r, o, "objects", UINT32_MAX, 0);
        x->live = (uint32_t)opt_u64(r, o, "live", UINT32_MAX, 0);
        if (!r->failed && x->live > x->objs)
            fail(r, o, "%" PRIu32 " objects live in a slab of %" PRIu32, x->live, x->objs);
        /* Not in the report: the bytes of its live objects, as the heap counts them. */
        if (x->size_class < s->num_classes)
            x->requested = (uint64_t)x->live * s->classes[x->size_class].size;
    }
}

/* A virtual segment's mapped ranges ("mapped_runs", optional: reports
 * before it had none): [address, bytes] pairs in address order, inside the
 * segment, adding up to its "mapped" bytes. */
static void read_runs(reader_t *r, const cuh_json_t *o, cuh_heap_snapshot_t *s, cuh_snap_segment_t *g)
{
    size_t saved;
    const cuh_json_t *a = opt_node(r, o, "mapped_runs", CUH_JSON_ARRAY, &saved);
    g->first_run = s->num_runs;
    if (!a) {
        path_pop(r, saved);
        return;
    }
    cuh_snap_run_t *runs = realloc(s->runs, (s->num_runs + a->v.array.n + 1) * sizeof *runs);
    if (!runs) {
        fail(r, a, "out of memory");
        path_pop(r, saved);
        return;
    }
    s->runs = runs;
    uint64_t end = g->base, total = 0;
    for (size_t i = 0; i < a->v.array.n && !r->failed; i++) {
        size_t item = path_index(r, i);
        const cuh_json_t *pair = cuh_json_at(a, i);
        uint64_t addr, size;
        if (read_range(r, pair, &addr, &size)) {
            if (!r->failed && (addr < end || size == 0 || size > g->base + g->size - addr))
                fail(r, pair, "the range [%" PRIu64 ", +%" PRIu64 ") is empty, out of order or outside the segment",
                     addr, size);
            end = addr + size;
            total += size;
            s->runs[s->num_runs++] = (cuh_snap_run_t){addr, size};
        }
        path_pop(r, item);
    }
    if (!r->failed && total != g->mapped)
        fail(r, a, "the ranges add up to %" PRIu64 " bytes, the segment says %" PRIu64 " are mapped", total, g->mapped);
    g->num_runs = s->num_runs - g->first_run;
    path_pop(r, saved);
}

static void read_segments(reader_t *r, const cuh_json_t *d, cuh_heap_snapshot_t *s)
{
    size_t saved, item, sub;
    const cuh_json_t *a = get_node(r, d, "segments", CUH_JSON_ARRAY, &saved);
    size_t total = 0;
    /* First the shape, to size the arrays. */
    for (size_t i = 0; a && i < a->v.array.n && !r->failed; i++) {
        const cuh_json_t *g = get_item(r, a, i, &item);
        const cuh_json_t *e = get_node(r, g, "extents", CUH_JSON_ARRAY, &sub);
        total += cuh_json_count(e);
        path_pop(r, sub);
        path_pop(r, item);
    }
    if (!a || r->failed) {
        path_pop(r, saved);
        return;
    }
    s->segments = calloc(a->v.array.n + 1, sizeof *s->segments);
    s->extents = calloc(total + 1, sizeof *s->extents);
    if (!s->segments || !s->extents) {
        fail(r, a, "out of memory");
        path_pop(r, saved);
        return;
    }
    uint64_t prev_end = 0;   /* where the segment before ends */
    for (size_t i = 0; i < a->v.array.n && !r->failed; i++) {
        const cuh_json_t *o = get_item(r, a, i, &item);
        cuh_snap_segment_t *g = &s->segments[s->num_segments++];
        g->base = get_u64(r, o, "base", UINT64_MAX);
        g->size = get_u64(r, o, "size", UINT64_MAX);
        if (!r->failed && (g->size == 0 || g->size > UINT64_MAX - g->base))
            fail(r, o, "a segment of %" PRIu64 " bytes at %#" PRIx64 " (empty, or past the end of the address space)",
                 g->size, g->base);
        if (!r->failed && i > 0 && g->base < prev_end)
            fail(r, o, "starts at %#" PRIx64 ", before the segment listed before it ends (%#" PRIx64
                 "): segments are listed in address order and do not overlap", g->base, prev_end);
        prev_end = g->base + g->size;
        g->workspace = get_bool(r, o, "workspace");
        g->virtual_space = get_bool(r, o, "virtual");
        g->mapped = get_u64(r, o, "mapped", UINT64_MAX);
        g->page_size = opt_u64(r, o, "page_size", UINT64_MAX, 0);
        g->page_maps = opt_u64(r, o, "page_maps", UINT64_MAX, 0);
        g->page_moves = opt_u64(r, o, "page_moves", UINT64_MAX, 0);
        g->map_calls = opt_u64(r, o, "map_calls", UINT64_MAX, 0);   /* reports before 2026-12-06 lack it */
        if (!r->failed && (g->virtual_space ? g->mapped > g->size : g->mapped != g->size))
            fail(r, o, "%" PRIu64 " bytes mapped in a %s of %" PRIu64 " bytes%s", g->mapped,
                 g->virtual_space ? "reservation" : "segment", g->size,
                 g->virtual_space ? "" : " (a segment that is not virtual memory is mapped whole)");
        if (g->virtual_space)
            read_runs(r, o, s, g);
        g->first_extent = s->num_extents;
        const cuh_json_t *e = get_node(r, o, "extents", CUH_JSON_ARRAY, &sub);
        /* The extents tile the segment: in address order, no gap, no overlap. */
#define TILED " (a segment's extents cover it in address order, with no gap or overlap)"
        uint64_t at = g->base;
        for (size_t k = 0; e && k < e->v.array.n && !r->failed; k++) {
            size_t xi;
            const cuh_json_t *xo = get_item(r, e, k, &xi);
            cuh_snap_extent_t *x = &s->extents[s->num_extents++];
            read_extent(r, xo, s, x);
            if (!r->failed && x->addr != at)
                fail(r, xo, "starts at %#" PRIx64 ", but %s ends at %#" PRIx64 TILED, x->addr,
                     k ? "the extent before it" : "nothing before it: the segment starts", at);
            if (!r->failed && (x->size == 0 || x->size > g->base + g->size - x->addr))
                fail(r, xo, "%" PRIu64 " bytes at %#" PRIx64 " do not fit in the segment, which ends at %#" PRIx64,
                     x->size, x->addr, g->base + g->size);
            at = x->addr + x->size;
            path_pop(r, xi);
        }
        if (e && !r->failed && at != g->base + g->size)
            fail(r, e, "the extents end at %#" PRIx64 ", but the segment ends at %#" PRIx64 TILED, at,
                 g->base + g->size);
#undef TILED
        g->num_extents = s->num_extents - g->first_extent;
        path_pop(r, sub);
        path_pop(r, item);
    }
    path_pop(r, saved);
}

static void read_streams(reader_t *r, const cuh_json_t *d, cuh_heap_snapshot_t *s)
{
    size_t saved, item;
    const cuh_json_t *a = get_node(r, d, "streams", CUH_JSON_ARRAY, &saved);
    if (a) {
        s->streams = calloc(a->v.array.n + 1, sizeof *s->streams);
        if (!s->streams)
            fail(r, a, "out of memory");
    }
    for (size_t i = 0; a && s->streams && i < a->v.array.n && !r->failed; i++) {
        const cuh_json_t *o = get_item(r, a, i, &item);
        /* The renderers number streams by their place: index must agree. */
        size_t isaved;
        const cuh_json_t *index = member(r, o, "index", 1, &isaved);
        uint64_t idx = as_u64(r, index, UINT64_MAX);
        if (index && !r->failed && idx != i + 1)
            fail(r, index, "%" PRIu64 " (expected %zu: streams are listed in order of index, from 1)", idx, i + 1);
        path_pop(r, isaved);
        cuh_snap_stream_t *x = &s->streams[s->num_streams++];
        x->handle = get_u64(r, o, "handle", UINT64_MAX);
        x->private_bytes = get_u64(r, o, "private_bytes", UINT64_MAX);
        x->pending_bytes = get_u64(r, o, "pending_bytes", UINT64_MAX);
        x->fences_outstanding = get_u64(r, o, "fences_outstanding", UINT64_MAX);
        path_pop(r, item);
    }
    path_pop(r, saved);
}

static void read_timeline(reader_t *r, const cuh_json_t *d, cuh_heap_snapshot_t *s)
{
    size_t saved, item;
    const cuh_json_t *a = get_node(r, d, "timeline", CUH_JSON_ARRAY, &saved);
    if (a) {
        s->timeline = malloc((a->v.array.n + 1) * sizeof *s->timeline);
        if (!s->timeline)
            fail(r, a, "out of memory");
    }
    for (size_t i = 0; a && s->timeline && i < a->v.array.n && !r->failed; i++) {
        const cuh_json_t *o = get_item(r, a, i, &item);
        cuh_sample_t *p = &s->timeline[s->num_samples++];
        p->t = get_double(r, o, "t");
        if (!r->failed && (p->t < 0 || (i > 0 && p->t < s->timeline[i - 1].t)))
            fail(r, o, "a sample at %g s, %s", p->t,
                 p->t < 0 ? "before the heap began" : "before the sample listed before it: samples are in time order");
        p->live = get_u64(r, o, "live", UINT64_MAX);
        p->reserved = get_u64(r, o, "reserved", UINT64_MAX);
        p->cached = get_u64(r, o, "cached", UINT64_MAX);
        if (!r->failed && (p->live > p->reserved || p->cached > p->reserved))
            fail(r, o, "%" PRIu64 " bytes live and %" PRIu64 " cached of %" PRIu64 " reserved (neither can exceed it)",
                 p->live, p->cached, p->reserved);
        path_pop(r, item);
    }
    path_pop(r, saved);
}

/* One step of "steps" (a step's object): its counts, and that it moved no
 * more pages than it mapped, mapped them in at least one call and ended no
 * earlier than it began. */
static void read_step(reader_t *r, const cuh_json_t *o, cuh_snap_step_t *x)
{
    x->index = get_u64(r, o, "index", UINT64_MAX);
    x->end = get_double(r, o, "end");
    x->seconds = get_double(r, o, "seconds");
    x->page_maps = get_u64(r, o, "page_maps", UINT64_MAX);
    x->page_moves = get_u64(r, o, "page_moves", UINT64_MAX);
    const int have_calls = cuh_json_get(o, "map_calls") != NULL;   /* reports before 2026-12-06 lack it */
    x->map_calls = opt_u64(r, o, "map_calls", UINT64_MAX, 0);
    x->device_allocs = get_u64(r, o, "device_allocs", UINT64_MAX);
    x->cpu_waits = get_u64(r, o, "cpu_waits", UINT64_MAX);
    if (r->failed)
        return;
    if (x->index == 0)
        fail(r, o, "step index 0: steps count from 1");
    else if (x->seconds < 0 || x->end < x->seconds)
        fail(r, o, "step %" PRIu64 " took %g s and ended at %g s: %s", x->index, x->seconds, x->end,
             x->seconds < 0 ? "a negative time" : "it would have begun before the heap");
    else if (x->page_moves > x->page_maps)
        fail(r, o, "step %" PRIu64 " moved %" PRIu64 " pages but mapped %" PRIu64 ": a moved page is a mapped one",
             x->index, x->page_moves, x->page_maps);
    else if (have_calls && x->page_maps && !x->map_calls)
        fail(r, o, "step %" PRIu64 " mapped %" PRIu64 " pages in no map call", x->index, x->page_maps);
}

/* The optional "steps" (reports before cuheap_mark_step lack it): how many
 * were marked, the last of them in order ending at that count, and the one
 * that mapped the most pages, no fewer than any listed. */
static void read_steps(reader_t *r, const cuh_json_t *d, cuh_heap_snapshot_t *s)
{
    size_t saved, saved_last, item;
    const cuh_json_t *o = opt_node(r, d, "steps", CUH_JSON_OBJECT, &saved);
    if (!o || r->failed) {
        path_pop(r, saved);
        return;
    }
    s->steps_marked = get_u64(r, o, "marked", UINT64_MAX);
    const cuh_json_t *a = get_node(r, o, "last", CUH_JSON_ARRAY, &saved_last);
    if (a && !r->failed && (a->v.array.n > CUH_STEP_HISTORY || a->v.array.n > s->steps_marked))
        fail(r, a, "%zu steps listed, but a heap keeps at most %d and %" PRIu64 " were marked", a->v.array.n,
             CUH_STEP_HISTORY, s->steps_marked);
    for (size_t i = 0; a && !r->failed && i < a->v.array.n; i++) {
        const cuh_json_t *x = get_item(r, a, i, &item);
        cuh_snap_step_t *st = &s->steps[s->num_steps++];
        read_step(r, x, st);
        const uint64_t want = s->steps_marked - a->v.array.n + 1 + i;
        if (!r->failed && st->index != want)
            fail(r, x, "step %" PRIu64 " where step %" PRIu64 " belongs: the last steps, in order, end at the %" PRIu64
                 " marked", st->index, want, s->steps_marked);
        path_pop(r, item);
    }
    path_pop(r, saved_last);
    const cuh_json_t *m = member(r, o, "most_maps", 1, &saved_last);
    if (m && !r->failed && m->type != CUH_JSON_NULL && m->type != CUH_JSON_OBJECT)
        fail(r, m, "expected null or an object, found %s", cuh_json_describe(m));
    if (m && !r->failed && m->type == CUH_JSON_OBJECT) {
        read_step(r, m, &s->most_maps);
        if (!r->failed && (s->most_maps.index > s->steps_marked || !s->most_maps.page_maps))
            fail(r, m, "step %" PRIu64 " with %" PRIu64 " pages mapped: %s", s->most_maps.index,
                 s->most_maps.page_maps,
                 s->most_maps.page_maps ? "after the last step marked" : "null stands for no step that mapped any");
        for (size_t i = 0; !r->failed && i < s->num_steps; i++)
            if (s->steps[i].page_maps > s->most_maps.page_maps)
                fail(r, m, "%" PRIu64 " pages mapped, but step %" PRIu64 " mapped %" PRIu64, s->most_maps.page_maps,
                     s->steps[i].index, s->steps[i].page_maps);
    } else if (m && !r->failed) {
        for (size_t i = 0; !r->failed && i < s->num_steps; i++)
            if (s->steps[i].page_maps)
                fail(r, m, "null, but step %" PRIu64 " mapped %" PRIu64 " pages", s->steps[i].index,
                     s->steps[i].page_maps);
    }
    path_pop(r, saved_last);
    path_pop(r, saved);
}

/* An out-of-memory's "stranded" object (optional: reports before it had
 * none): totals, and the segment that strands the most with its largest
 * blocks as [address, bytes] pairs, largest first, inside that segment. */
static void read_stranded(reader_t *r, const cuh_json_t *o, cuh_oom_info_t *x)
{
    size_t saved;
    const cuh_json_t *st = opt_node(r, o, "stranded", CUH_JSON_OBJECT, &saved);
    if (!st || r->failed) {
        path_pop(r, saved);
        return;
    }
    __typeof__(x->stranded) *y = &x->stranded;
    y->known = 1;
    y->segments = get_size(r, st, "segments");
    y->bytes = get_size(r, st, "bytes");
    y->free = get_size(r, st, "free");
    y->blocks = get_size(r, st, "blocks");
    y->block_bytes = get_size(r, st, "block_bytes");
    y->would_fit = get_bool(r, st, "would_fit");
    if (!r->failed && y->free + y->block_bytes != y->bytes)
        fail(r, st, "free (%zu) and block_bytes (%zu) do not add up to bytes (%zu)", y->free, y->block_bytes, y->bytes);
    size_t sub;
    const cuh_json_t *top = member(r, st, "top", 1, &sub);
    if (top && top->type != CUH_JSON_NULL && top->type != CUH_JSON_OBJECT)
        fail(r, top, "expected null or an object, found %s", cuh_json_describe(top));
    if (!r->failed && top && (top->type == CUH_JSON_NULL) != (y->segments == 0))
        fail(r, top, "null exactly when no segment strands memory");
    if (!r->failed && top && top->type == CUH_JSON_OBJECT) {
        y->top_base = (uintptr_t)get_u64(r, top, "base", UINTPTR_MAX);
        y->top_size = get_size(r, top, "size");
        y->top_used = get_size(r, top, "used");
        y->top_blocks = get_size(r, top, "blocks");
        if (!r->failed && (y->top_size > y->bytes || y->top_used > y->top_size || y->top_blocks > y->blocks))
            fail(r, top, "the segment does not fit the totals");
        size_t hs;
        const cuh_json_t *a = get_node(r, top, "holders", CUH_JSON_ARRAY, &hs);
        const size_t max_holders = CUH_OOM_TOP_HOLDERS;
        if (a && (a->v.array.n > max_holders || a->v.array.n > y->top_blocks))
            fail(r, a, "%zu holders (at most %zu, and no more than the segment's blocks)", a->v.array.n, max_holders);
        for (size_t i = 0; a && i < a->v.array.n && !r->failed; i++) {
            size_t item = path_index(r, i);
            const cuh_json_t *pair = cuh_json_at(a, i);
            uint64_t addr, size;
            if (read_range(r, pair, &addr, &size)) {
                if (!r->failed && (addr < y->top_base || size == 0 || size > y->top_size ||
                                   addr - y->top_base > y->top_size - size))
                    fail(r, pair, "the block [%" PRIu64 ", +%" PRIu64 ") is empty or outside the segment", addr, size);
                else if (!r->failed && i && size > y->top_holders[i - 1].size)
                    fail(r, pair, "holders are not largest first");
                y->top_holders[i].addr = (uintptr_t)addr;
                y->top_holders[i].size = (size_t)size;
                y->num_top_holders = i + 1;
            }
            path_pop(r, item);
        }
        path_pop(r, hs);
    }
    path_pop(r, sub);
    path_pop(r, saved);
}

/* An out-of-memory's "partial_pages" object (optional: only under vmm:1,
 * and reports before it had none). */
static void read_partial_pages(reader_t *r, const cuh_json_t *o, cuh_oom_info_t *x)
{
    size_t saved;
    const cuh_json_t *p = opt_node(r, o, "partial_pages", CUH_JSON_OBJECT, &saved);
    if (p && !r->failed) {
        x->partial_pages.known = 1;
        x->partial_pages.pages = get_size(r, p, "pages");
        x->partial_pages.free = get_size(r, p, "free");
        if (!r->failed && (x->partial_pages.free > x->cached || (x->partial_pages.free != 0) != (x->partial_pages.pages != 0)))
            fail(r, p, "%zu free bytes in %zu pages do not fit the record (%zu cached)", x->partial_pages.free,
                 x->partial_pages.pages, x->cached);
    }
    path_pop(r, saved);
}

/* An out-of-memory's "partial_units" object (optional: only under vmm:1,
 * and reports before it had none). Its whole free pages and the free bytes
 * of partly used pages are different bytes, all of them cached. */
static void read_partial_units(reader_t *r, const cuh_json_t *o, cuh_oom_info_t *x)
{
    size_t saved;
    const cuh_json_t *p = opt_node(r, o, "partial_units", CUH_JSON_OBJECT, &saved);
    if (p && !r->failed) {
        x->partial_units.known = 1;
        x->partial_units.units = get_size(r, p, "units");
        x->partial_units.free = get_size(r, p, "free");
        const size_t in_pages = x->partial_pages.known ? x->partial_pages.free : 0;
        if (!r->failed && (x->partial_units.free > x->cached - cuh_min_size(in_pages, x->cached) ||
                           (x->partial_units.free != 0) != (x->partial_units.units != 0)))
            fail(r, p, "%zu free bytes in %zu units do not fit the record (%zu cached, %zu of them in partly used pages)",
                 x->partial_units.free, x->partial_units.units, x->cached, in_pages);
    }
    path_pop(r, saved);
}

static void read_oom(reader_t *r, const cuh_json_t *d, cuh_heap_snapshot_t *s)
{
    /* Every cause the library can name, "none" included, by its own names. */
    const char *causes[CUH_OOM_DEVICE_REFUSED + 1];
    for (int c = CUH_OOM_NONE; c <= CUH_OOM_DEVICE_REFUSED; c++)
        causes[c] = cuh_oom_cause_name((cuh_oom_cause_t)c);
    size_t saved, item;
    const cuh_json_t *o = member(r, d, "oom", 1, &saved);
    if (o && o->type != CUH_JSON_NULL && o->type != CUH_JSON_OBJECT)
        fail(r, o, "expected null or an object, found %s", cuh_json_describe(o));
    if (o && o->type == CUH_JSON_OBJECT && !r->failed) {
        cuh_oom_info_t *x = &s->oom;
        s->has_oom = 1;
        int cause = get_enum(r, o, "cause", causes, CUH_OOM_DEVICE_REFUSED + 1);
        x->cause = cause < 0 ? CUH_OOM_NONE : (cuh_oom_cause_t)cause;
        x->request = get_size(r, o, "request");
        x->block = get_size(r, o, "block");
        x->stream = (cuh_stream_t)get_u64(r, o, "stream", UINTPTR_MAX);
        x->live = get_size(r, o, "live");
        x->allocated = get_size(r, o, "allocated");
        x->reserved = get_size(r, o, "reserved");
        x->cached = get_size(r, o, "cached");
        x->pending = get_size(r, o, "pending");
        x->largest_free = get_size(r, o, "largest_free");
        x->num_free_extents = get_size(r, o, "num_free_extents");
        x->device_free = get_size(r, o, "device_free");
        x->device_total = get_size(r, o, "device_total");
        x->external = get_size(r, o, "external");
        x->limit = get_size(r, o, "limit");
        copy_string(r, o, "action", 1, x->action, sizeof x->action);
        x->t = get_double(r, o, "t");
        size_t sub;
        const size_t max_streams = sizeof x->pending_by_stream / sizeof x->pending_by_stream[0];
        const cuh_json_t *a = get_node(r, o, "pending_by_stream", CUH_JSON_ARRAY, &sub);
        if (a && a->v.array.n > max_streams)
            fail(r, a, "%zu streams (at most %zu)", a->v.array.n, max_streams);
        for (size_t i = 0; a && i < a->v.array.n && !r->failed; i++) {
            const cuh_json_t *p = get_item(r, a, i, &item);
            x->pending_by_stream[i].stream = get_u64(r, p, "stream", UINT64_MAX);
            x->pending_by_stream[i].pending = get_u64(r, p, "pending", UINT64_MAX);
            x->num_pending_streams = i + 1;
            path_pop(r, item);
        }
        path_pop(r, sub);
        read_stranded(r, o, x);
        read_partial_pages(r, o, x);
        read_partial_units(r, o, x);
    }
    path_pop(r, saved);
}

/* devices[i] as a snapshot; NULL after an error. */
static cuh_heap_snapshot_t *read_device(reader_t *r, const cuh_json_t *d)
{
    static const char *const kinds[] = {"cuda", "sim"};   /* static: device_kind points here */
    cuh_heap_snapshot_t *s = calloc(1, sizeof *s);
    if (!s) {
        fail(r, d, "out of memory");
        return NULL;
    }
    s->device = (int)get_i64(r, d, "device", INT_MIN, INT_MAX);
    int kind = get_enum(r, d, "kind", kinds, 2);
    s->device_kind = kinds[kind < 0 ? 1 : kind];
    read_config(r, d, &s->config);
    read_stats(r, d, &s->stats);
    size_t saved;
    const cuh_json_t *mem = get_node(r, d, "device_memory", CUH_JSON_OBJECT, &saved);
    if (mem) {
        s->device_free = get_size(r, mem, "free");
        s->device_total = get_size(r, mem, "total");
        s->device_free_unknown = opt_bool(r, mem, "free_unknown");   /* older reports lack it */
        s->no_virtual_memory = opt_bool(r, mem, "no_virtual_memory");   /* so do reports of heaps that got it */
        if (s->no_virtual_memory && !s->config.vmm && !r->failed) {
            size_t saved_nv = path_key(r, "no_virtual_memory");
            fail(r, cuh_json_get(mem, "no_virtual_memory"), "true with vmm 0 in config: only a heap that asked for "
                 "virtual memory can have been refused it");
            path_pop(r, saved_nv);
        }
        if (s->device_free_unknown && s->device_free && !r->failed) {
            size_t saved_free = path_key(r, "free");
            fail(r, cuh_json_get(mem, "free"), "%zu with free_unknown true: a report that did not ask the device "
                 "has 0 there", s->device_free);
            path_pop(r, saved_free);
        }
    }
    path_pop(r, saved);
    /* Not in the report: the heap's own idea of the device, the same number. */
    s->stats.device_total = s->device_total;
    read_classes(r, d, s);
    read_segments(r, d, s);
    check_reserved(r, d, s);
    read_streams(r, d, s);
    s->uptime = get_double(r, d, "uptime");
    read_timeline(r, d, s);
    if (!r->failed && (s->uptime < 0 || (s->num_samples && s->uptime < s->timeline[s->num_samples - 1].t))) {
        size_t saved_up = path_key(r, "uptime");
        fail(r, cuh_json_get(d, "uptime"), "%g s, %s", s->uptime,
             s->uptime < 0 ? "negative" : "less than the time of the timeline's last sample");
        path_pop(r, saved_up);
    }
    read_steps(r, d, s);
    read_oom(r, d, s);
    if (r->failed) {
        cuh_heap_snapshot_free(s);
        return NULL;
    }
    return s;
}

/* The optional top-level "pinned_host": when present, an object with every
 * field of cuheap_host_stats_t. */
static void read_pinned(reader_t *r, const cuh_json_t *root, report_t *rep)
{
    size_t saved;
    const cuh_json_t *o = opt_node(r, root, "pinned_host", CUH_JSON_OBJECT, &saved);
    if (o) {
        cuheap_host_stats_t *p = &rep->pinned;
        get_stat(r, o, "requested", &p->requested);
        get_stat(r, o, "allocated", &p->allocated);
        get_stat(r, o, "reserved", &p->reserved);
        get_stat(r, o, "pending", &p->pending);
        p->num_allocs = get_u64(r, o, "num_allocs", UINT64_MAX);
        p->num_frees = get_u64(r, o, "num_frees", UINT64_MAX);
        p->num_chunks = get_u64(r, o, "num_chunks", UINT64_MAX);
        p->num_chunk_allocs = get_u64(r, o, "num_chunk_allocs", UINT64_MAX);
        p->num_waits = get_u64(r, o, "num_waits", UINT64_MAX);
        p->num_ooms = get_u64(r, o, "num_ooms", UINT64_MAX);
        p->chunk_size = get_u64(r, o, "chunk_size", UINT64_MAX);
        rep->has_pinned = 1;
    }
    path_pop(r, saved);
}

/* The optional top-level "callers" (device memory by the library that
 * asked for it, under LD_PRELOAD): an array of at most CUH_CALLERS_MAX
 * objects with "library", "live", "peak" and "allocs", no library's live
 * bytes above its peak. */
static void read_callers(reader_t *r, const cuh_json_t *root, report_t *rep)
{
    size_t saved, item;
    const cuh_json_t *a = opt_node(r, root, "callers", CUH_JSON_ARRAY, &saved);
    if (a && a->v.array.n > CUH_CALLERS_MAX)
        fail(r, a, "%zu libraries (at most %d)", a->v.array.n, CUH_CALLERS_MAX);
    for (size_t i = 0; a && !r->failed && i < a->v.array.n; i++) {
        const cuh_json_t *o = get_item(r, a, i, &item);
        if (o) {
            cuh_caller_stat_t *c = &rep->callers[rep->num_callers];
            copy_string(r, o, "library", 1, c->library, sizeof c->library);
            c->live = get_u64(r, o, "live", UINT64_MAX);
            c->peak = get_u64(r, o, "peak", UINT64_MAX);
            c->allocs = get_u64(r, o, "allocs", UINT64_MAX);
            if (!r->failed && c->live > c->peak)
                fail(r, o, "%" PRIu64 " bytes live, above the peak of %" PRIu64, c->live, c->peak);
            rep->num_callers++;
        }
        path_pop(r, item);
    }
    path_pop(r, saved);
}

void report_free(report_t *rep)
{
    for (size_t i = 0; i < rep->num_snaps; i++)
        cuh_heap_snapshot_free(rep->snaps[i]);
    free(rep->snaps);
    free(rep->device_nodes);
    cuh_json_free(rep->doc);
    memset(rep, 0, sizeof *rep);
}

/* Reads `file` into rep: 0, or -1 after printing why. */
int report_load(const char *file, report_t *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->file = file;
    cuh_json_error_t err;
    rep->doc = cuh_json_parse_file(file, NULL, &err);
    if (!rep->doc) {
        if (err.line)
            fprintf(stderr, PROG ": %s:%u:%u: %s\n", file, (unsigned)err.line, (unsigned)err.column, err.message);
        else
            fprintf(stderr, PROG ": %s: %s\n", file, err.message);
        return -1;
    }
    reader_t r = {.file = file};
    char shown[80];
    const cuh_json_t *root = cuh_json_root(rep->doc);
    if (root->type != CUH_JSON_OBJECT) {
        fprintf(stderr, PROG ": %s: not a cuheap report: the document is %s, not an object with \"schema\": \"%s\"\n",
                file, cuh_json_describe(root), REPORT_SCHEMA);
        return -1;
    }
    const cuh_json_t *schema = cuh_json_get(root, "schema");
    if (!schema) {
        fprintf(stderr, PROG ": %s: not a cuheap report: no \"schema\" field (expected \"schema\": \"%s\")\n", file,
                REPORT_SCHEMA);
        return -1;
    }
    if (schema->type != CUH_JSON_STRING || strcmp(schema->v.string.s, REPORT_SCHEMA) != 0 ||
        schema->v.string.len != strlen(REPORT_SCHEMA)) {
        if (schema->type == CUH_JSON_STRING)
            fprintf(stderr, PROG ": %s:%u:%u: not a cuheap report: its schema is \"%s\" (expected \"%s\")\n", file,
                    (unsigned)schema->line, (unsigned)schema->column,
                    printable(schema->v.string.s, schema->v.string.len, shown, sizeof shown), REPORT_SCHEMA);
        else
            fprintf(stderr, PROG ": %s:%u:%u: not a cuheap report: \"schema\" is %s (expected \"%s\")\n", file,
                    (unsigned)schema->line, (unsigned)schema->column, cuh_json_describe(schema), REPORT_SCHEMA);
        return -1;
    }
    const cuh_json_t *version = cuh_json_get(root, "version");
    if (!version) {
        fprintf(stderr, PROG ": %s: no \"version\" field (expected \"version\": %d)\n", file, REPORT_VERSION);
        return -1;
    }
    if (version->type != CUH_JSON_NUMBER || !(version->v.number.flags & CUH_JSON_INT64)) {
        fprintf(stderr, PROG ": %s:%u:%u: \"version\" is %s (expected %d)\n", file, (unsigned)version->line,
                (unsigned)version->column, cuh_json_describe(version), REPORT_VERSION);
        return -1;
    }
    if (version->v.number.i != REPORT_VERSION) {
        fprintf(stderr, PROG ": %s:%u:%u: report version %" PRId64 " is not supported (this " PROG " reads version %d)\n",
                file, (unsigned)version->line, (unsigned)version->column, version->v.number.i, REPORT_VERSION);
        return -1;
    }
    copy_string(&r, root, "cuheap", 1, rep->version, sizeof rep->version);
    rep->origin.pid = (int)get_i64(&r, root, "pid", INT_MIN, INT_MAX);
    rep->origin.time = (long long)get_i64(&r, root, "time", INT64_MIN, INT64_MAX);
    size_t saved, item;
    const cuh_json_t *devices = get_node(&r, root, "devices", CUH_JSON_ARRAY, &saved);
    if (devices && !r.failed) {
        size_t n = devices->v.array.n;
        rep->snaps = calloc(n + 1, sizeof *rep->snaps);
        rep->device_nodes = calloc(n + 1, sizeof *rep->device_nodes);
        if (!rep->snaps || !rep->device_nodes)
            fail(&r, devices, "out of memory");
        for (size_t i = 0; i < n && !r.failed; i++) {
            const cuh_json_t *d = get_item(&r, devices, i, &item);
            cuh_heap_snapshot_t *s = d ? read_device(&r, d) : NULL;
            if (s) {
                rep->device_nodes[rep->num_snaps] = d;
                rep->snaps[rep->num_snaps++] = s;
            }
            path_pop(&r, item);
        }
    }
    path_pop(&r, saved);
    if (!r.failed)
        read_pinned(&r, root, rep);
    if (!r.failed)
        read_callers(&r, root, rep);
    if (r.failed)
        return -1;
    rep->origin.version = rep->version;
    return 0;
}
