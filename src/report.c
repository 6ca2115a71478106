/* report.c - renders heap snapshots as text or JSON.
 *
 * Both forms come from one data model (cuh_heap_snapshot_t), so they never
 * disagree. The text form reads like torch.cuda.memory_summary() with the
 * fragmentation figures added; the JSON form is versioned ("schema":
 * "cuheap-report", "version": 1, schema in include/cuheap_report.schema.json).
 * The pinned host memory cache is one per process, not per device: its
 * statistics follow the devices ("pinned_host" in JSON), and only when the
 * process used it, so that reports of device-only jobs stay as they were;
 * so does the device memory by the library that asked for it ("callers",
 * under LD_PRELOAD only).
 */
#include "common.h"
#include "heap.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *kind_name(cuh_snap_kind_t k)
{
    return k == CUH_SNAP_FREE ? "free" : k == CUH_SNAP_BLOCK ? "block" : "slab";
}

/* 1 - largest free extent / free bytes: 0 when all free memory is one piece. */
static double fragmentation(const cuheap_stats_t *s)
{
    return s->cached.current ? 1.0 - (double)s->largest_free_extent / (double)s->cached.current : 0.0;
}

/* One "label  current  peak" row of a statistics table. */
static void text_stat_row(FILE *out, const char *label, const cuheap_stat_t *stat)
{
    char a[32], b[32];
    fprintf(out, "  %-22s %14s %14s\n", label, cuh_format_bytes(a, sizeof a, stat->current),
            cuh_format_bytes(b, sizeof b, stat->peak));
}

uint64_t cuh_snap_stranded_bytes(const cuh_heap_snapshot_t *s, const cuh_snap_segment_t *g)
{
    if (g->workspace || g->virtual_space)
        return 0;
    uint64_t used = 0;
    for (size_t k = 0; k < g->num_extents; k++)
        if (s->extents[g->first_extent + k].kind != CUH_SNAP_FREE)
            used += s->extents[g->first_extent + k].size;
    return used && used <= g->size / 8 ? g->size - used : 0;
}

uint64_t cuh_snap_stranded_total(const cuh_heap_snapshot_t *s, size_t *segments)
{
    uint64_t total = 0;
    *segments = 0;
    for (size_t i = 0; i < s->num_segments; i++) {
        uint64_t b = cuh_snap_stranded_bytes(s, &s->segments[i]);
        total += b;
        *segments += b != 0;
    }
    return total;
}

void cuh_report_stranded_note(const cuh_heap_snapshot_t *s, char *out, size_t len)
{
    size_t n;
    uint64_t bytes = cuh_snap_stranded_total(s, &n);
    char a[32];
    if (n)
        snprintf(out, len, "%s in %zu mostly empty segment%s", cuh_format_bytes(a, sizeof a, bytes), n, n == 1 ? "" : "s");
    else
        snprintf(out, len, "%s", "");
}

/* The out-of-memory's stranded memory (cuh_oom_info_t), when there was any:
 * the totals, whether the request would have fit without it, and the
 * segment that strands the most with the blocks that hold it there. */
static void text_stranded(FILE *out, const cuh_oom_info_t *o)
{
    const __typeof__(o->stranded) *x = &o->stranded;
    char a[32], b[32], c[32];
    if (o->partial_pages.pages)
        fprintf(out, "    in partly used pages: %s free in %zu page%s that blocks partly use (only whole free pages "
                     "move)\n",
                cuh_format_bytes(a, sizeof a, o->partial_pages.free), o->partial_pages.pages,
                o->partial_pages.pages == 1 ? "" : "s");
    if (o->partial_units.units)
        fprintf(out, "    in partly used units: %s in whole free pages of %zu unit%s of several pages that blocks "
                     "partly use (a unit moves only whole; vmm_unit:2M makes every unit a page)\n",
                cuh_format_bytes(a, sizeof a, o->partial_units.free), o->partial_units.units,
                o->partial_units.units == 1 ? "" : "s");
    if (!x->segments)
        return;
    fprintf(out, "    stranded: %s free in %zu mostly empty segment%s (at most 1/8 used), held there by %zu block%s "
                 "of %s in all%s\n",
            cuh_format_bytes(a, sizeof a, x->free), x->segments, x->segments == 1 ? "" : "s", x->blocks,
            x->blocks == 1 ? "" : "s", cuh_format_bytes(b, sizeof b, x->block_bytes),
            x->would_fit ? "; had they lain elsewhere, those segments could have gone back to the device and the "
                           "request would have fit"
                         : "");
    fprintf(out, "      the most in 0x%012" PRIx64 " (%s): %zu block%s of %s:", (uint64_t)x->top_base,
            cuh_format_bytes(a, sizeof a, x->top_size), x->top_blocks, x->top_blocks == 1 ? "" : "s",
            cuh_format_bytes(b, sizeof b, x->top_used));
    for (size_t i = 0; i < x->num_top_holders; i++)
        fprintf(out, "%s 0x%012" PRIx64 " (%s)", i ? "," : "", (uint64_t)x->top_holders[i].addr,
                cuh_format_bytes(c, sizeof c, x->top_holders[i].size));
    fprintf(out, "%s\n", x->top_blocks > x->num_top_holders ? ", ..." : "");
}

/* The steps the program marked (cuheap_mark_step): the last of them, and
 * the one that mapped the most pages. */
static void text_steps(FILE *out, const cuh_heap_snapshot_t *s)
{
    if (!s->steps_marked)
        return;
    fprintf(out, "\n  steps marked: %" PRIu64 "%s\n", s->steps_marked,
            s->num_steps < s->steps_marked ? "; the last of them:" : "");
    fprintf(out, "        step    seconds  pages mapped  of them moved  map calls  device allocs  CPU waits\n");
    for (size_t i = 0; i < s->num_steps; i++) {
        const cuh_snap_step_t *x = &s->steps[i];
        fprintf(out, "  %10" PRIu64 " %10.3f %13" PRIu64 " %14" PRIu64 " %10" PRIu64 " %14" PRIu64 " %10" PRIu64 "\n",
                x->index, x->seconds, x->page_maps, x->page_moves, x->map_calls, x->device_allocs, x->cpu_waits);
    }
    const cuh_snap_step_t *m = &s->most_maps;
    if (m->index)
        fprintf(out,
                "  most pages mapped in one step: %" PRIu64 " in step %" PRIu64 " (%" PRIu64 " moved, %" PRIu64
                " map calls, %.3f s)\n",
                m->page_maps, m->index, m->page_moves, m->map_calls, m->seconds);
    if (s->config.step_plan) {
        const cuh_snap_plan_t *p = &s->plan;
        char room[32];
        fprintf(out,
                "  step plans (step_plan:1): %" PRIu64 " made, %" PRIu64 " dropped, %" PRIu64 " steps followed one; %" PRIu64
                " blocks placed by a plan, %" PRIu64 " not (their place was taken)",
                p->made, p->dropped, p->steps_followed, p->placed, p->missed);
        if (p->active)
            fprintf(out, "; the plan in force holds %s", cuh_format_bytes(room, sizeof room, (size_t)p->room_bytes));
        fprintf(out, "\n");
        if (p->steps_found)
            fprintf(out,
                    "  steps found in the allocations (the program marks none): %" PRIu64 " begun%s%" PRIu64
                    " block allocations\n",
                    p->steps_found, p->found_period ? ", each of " : "; none in force now, the last of ",
                    p->found_period ? p->found_period : p->last_period);
    }
}

static void text_one(FILE *out, const cuh_heap_snapshot_t *s)
{
    char a[32], b[32], c[32];
    const cuheap_stats_t *st = &s->stats;
    char conf[2048];   /* every key, with the report and trace paths (up to 511 bytes each) */
    cuh_config_format(&s->config, conf, sizeof conf);
    fprintf(out, "== device %d (%s) ==\n", s->device, s->device_kind);
    fprintf(out, "settings: %s\n", conf);
    if (s->no_virtual_memory)
        fprintf(out, "virtual memory: vmm:1 asked for, but the device gave none (said on stderr): plain segments\n");
    fprintf(out, "\n");
    fprintf(out, "  %-22s %14s %14s\n", "", "current", "peak");
    text_stat_row(out, "requested (live)", &st->requested);
    text_stat_row(out, "allocated", &st->allocated);
    text_stat_row(out, "reserved", &st->reserved);
    text_stat_row(out, "cached", &st->cached);
    text_stat_row(out, "pending", &st->pending);
    fprintf(out, "\n  allocations %" PRIu64 ", frees %" PRIu64 ", cache hits %" PRIu64 ", segments allocated %" PRIu64
                 ", released %" PRIu64 ", retries %" PRIu64 ", OOMs %" PRIu64 ", CPU waits for the GPU %" PRIu64 "\n",
            st->num_allocs, st->num_frees, st->num_cache_hits, st->num_segment_allocs, st->num_segment_frees,
            st->num_retries, st->num_ooms, st->num_cpu_waits);
    fprintf(out, "  fragmentation: %" PRIu64 " free extents, largest %s of %s cached (1 - largest/cached = %.3f)",
            st->num_free_extents, cuh_format_bytes(a, sizeof a, st->largest_free_extent),
            cuh_format_bytes(b, sizeof b, st->cached.current), fragmentation(st));
    if (st->requested.peak)
        fprintf(out, "; peak reserved / peak requested = %.3f", (double)st->reserved.peak / (double)st->requested.peak);
    char note[96];
    cuh_report_stranded_note(s, note, sizeof note);
    if (note[0])
        fprintf(out, "; stranded %s", note);
    if (s->device_free_unknown) {
        fprintf(out, "\n  device: %s; free not asked (a report at exit makes no device call)",
                cuh_format_bytes(b, sizeof b, s->device_total));
    } else {
        fprintf(out, "\n  device: %s free of %s", cuh_format_bytes(a, sizeof a, s->device_free),
                cuh_format_bytes(b, sizeof b, s->device_total));
        if (s->device_total > s->device_free + st->reserved.current)
            fprintf(out, ", %s used outside cuheap",
                    cuh_format_bytes(c, sizeof c, s->device_total - s->device_free - st->reserved.current));
    }
    if (st->limit)
        fprintf(out, "; limit %s", cuh_format_bytes(c, sizeof c, st->limit));
    fprintf(out, "\n\n  segments: %zu\n", s->num_segments);
    for (size_t i = 0; i < s->num_segments; i++) {
        const cuh_snap_segment_t *g = &s->segments[i];
        size_t blocks = 0, slabs = 0, frees = 0;
        uint64_t used = 0, free_bytes = 0, largest = 0;
        for (size_t k = 0; k < g->num_extents; k++) {
            const cuh_snap_extent_t *x = &s->extents[g->first_extent + k];
            if (x->kind == CUH_SNAP_FREE) {
                frees++;
                free_bytes += x->size;
                if (x->size > largest)
                    largest = x->size;
            } else {
                used += x->size;
                blocks += x->kind == CUH_SNAP_BLOCK;
                slabs += x->kind == CUH_SNAP_SLAB;
            }
        }
        char d[32];
        fprintf(out, "    0x%012" PRIx64 " %11s%s: used %s (blocks %zu, slabs %zu); free %s in %zu extents, largest %s%s\n",
                g->base, cuh_format_bytes(a, sizeof a, g->size), g->workspace ? " workspace" : "",
                cuh_format_bytes(b, sizeof b, used), blocks, slabs, cuh_format_bytes(c, sizeof c, free_bytes), frees,
                cuh_format_bytes(d, sizeof d, largest), cuh_snap_stranded_bytes(s, g) ? "; stranded" : "");
        if (g->virtual_space) {
            char ranges[48] = "";
            if (g->num_runs)
                snprintf(ranges, sizeof ranges, " (%zu range%s)", g->num_runs, g->num_runs == 1 ? "" : "s");
            fprintf(out, "      virtual memory: %s mapped%s in pages of %s; %" PRIu64 " pages mapped since start, %" PRIu64
                         " of them moved from free memory (a map each; the old mapping goes when the range is needed), in %" PRIu64
                         " map and unmap calls\n",
                    cuh_format_bytes(a, sizeof a, g->mapped), ranges, cuh_format_bytes(b, sizeof b, g->page_size),
                    g->page_maps, g->page_moves, g->map_calls);
        }
    }
    int any_class = 0;
    for (unsigned i = 0; i < s->num_classes; i++) {
        const cuh_snap_class_t *k = &s->classes[i];
        if (!k->slabs && !k->cached)
            continue;
        if (!any_class++)
            fprintf(out, "\n  size class   slabs   objects      live    cached\n");
        fprintf(out, "  %10s %7" PRIu64 " %9" PRIu64 " %9" PRIu64 " %9" PRIu64 "\n", cuh_format_bytes(a, sizeof a, k->size),
                k->slabs, k->objs, k->live, k->cached);
    }
    if (s->num_streams) {
        fprintf(out, "\n  stream               private       pending  fences\n");
        for (size_t i = 0; i < s->num_streams; i++)
            fprintf(out, "  0x%-14" PRIx64 " %12s %12s %7" PRIu64 "\n", s->streams[i].handle,
                    cuh_format_bytes(a, sizeof a, s->streams[i].private_bytes),
                    cuh_format_bytes(b, sizeof b, s->streams[i].pending_bytes), s->streams[i].fences_outstanding);
    }
    text_steps(out, s);
    if (s->has_oom) {
        const cuh_oom_info_t *o = &s->oom;
        fprintf(out, "\n  last out-of-memory: %s requested, cause %s\n", cuh_format_bytes(a, sizeof a, o->request),
                cuh_oom_cause_name(o->cause));
        char d[32], e[32], f[32], g[32];
        fprintf(out, "    live %s, reserved %s, cached %s, pending %s, largest free extent %s (%zu free extents)\n",
                cuh_format_bytes(a, sizeof a, o->live), cuh_format_bytes(b, sizeof b, o->reserved),
                cuh_format_bytes(c, sizeof c, o->cached), cuh_format_bytes(d, sizeof d, o->pending),
                cuh_format_bytes(e, sizeof e, o->largest_free), o->num_free_extents);
        fprintf(out, "    device: %s free of %s; used outside cuheap %s; limit %s\n",
                cuh_format_bytes(f, sizeof f, o->device_free), cuh_format_bytes(g, sizeof g, o->device_total),
                cuh_format_bytes(a, sizeof a, o->external), o->limit ? cuh_format_bytes(b, sizeof b, o->limit) : "none");
        text_stranded(out, o);
        fprintf(out, "    what would help: %s\n", o->action);
    }
    fprintf(out, "\n");
}

/* Laid out like a device's section: what memory is held (page-locked chunks
 * taken from CUDA once and kept; a request larger than a chunk gets one of
 * its own, hence "or more"), the byte table, then the counters. */
static void text_pinned(FILE *out, const cuheap_host_stats_t *p)
{
    char a[32];
    fprintf(out, "== pinned host memory ==\n");
    fprintf(out, "reserved in %" PRIu64 " chunks of %s or more; %" PRIu64 " taken from CUDA in all\n\n", p->num_chunks,
            cuh_format_bytes(a, sizeof a, p->chunk_size), p->num_chunk_allocs);
    fprintf(out, "  %-22s %14s %14s\n", "", "current", "peak");
    text_stat_row(out, "requested (live)", &p->requested);
    text_stat_row(out, "allocated", &p->allocated);
    text_stat_row(out, "reserved", &p->reserved);
    text_stat_row(out, "pending", &p->pending);
    fprintf(out, "\n  allocations %" PRIu64 ", frees %" PRIu64 ", waits for GPU work %" PRIu64 ", OOMs %" PRIu64 "\n\n",
            p->num_allocs, p->num_frees, p->num_waits, p->num_ooms);
}

/* Device memory by the library that asked for it (LD_PRELOAD): bytes live
 * now, the most live at once, allocations. */
static void text_callers(FILE *out, const cuh_caller_stat_t *c, size_t n)
{
    char a[32], b[32];
    fprintf(out, "== device memory by caller (LD_PRELOAD) ==\n");
    fprintf(out, "  %-40s %14s %14s %12s\n", "library", "live", "peak", "allocations");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "  %-40s %14s %14s %12" PRIu64 "\n", c[i].library, cuh_format_bytes(a, sizeof a, c[i].live),
                cuh_format_bytes(b, sizeof b, c[i].peak), c[i].allocs);
    fprintf(out, "\n");
}

cuh_report_origin_t cuh_report_origin_now(void)
{
    return (cuh_report_origin_t){.pid = (int)getpid(), .time = (long long)time(NULL), .version = CUHEAP_VERSION};
}

void cuh_report_text(FILE *out, cuh_report_origin_t origin, cuh_heap_snapshot_t *const *snaps, size_t n,
                     const cuh_report_extra_t *extra)
{
    char when[64];
    time_t at = (time_t)origin.time;
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime_r(&at, &tm));
    fprintf(out, "cuheap %s report, pid %d, %s\n\n", origin.version, origin.pid, when);
    if (!n)
        fprintf(out, "no device has been used.\n");
    for (size_t i = 0; i < n; i++)
        text_one(out, snaps[i]);
    if (extra && extra->pinned)
        text_pinned(out, extra->pinned);
    if (extra && extra->num_callers)
        text_callers(out, extra->callers, extra->num_callers);
}

static void json_stat(FILE *out, const char *name, const cuheap_stat_t *s, int comma)
{
    fprintf(out, "\"%s\":{\"current\":%" PRIu64 ",\"peak\":%" PRIu64 "}%s", name, s->current, s->peak, comma ? "," : "");
}

void cuh_json_write_stranded(FILE *out, const cuh_oom_info_t *o)
{
    const __typeof__(o->stranded) *x = &o->stranded;
    fprintf(out, "{\"segments\":%zu,\"bytes\":%zu,\"free\":%zu,\"blocks\":%zu,\"block_bytes\":%zu,\"would_fit\":%s,\"top\":",
            x->segments, x->bytes, x->free, x->blocks, x->block_bytes, x->would_fit ? "true" : "false");
    if (!x->segments) {
        fprintf(out, "null}");
        return;
    }
    fprintf(out, "{\"base\":%" PRIu64 ",\"size\":%zu,\"used\":%zu,\"blocks\":%zu,\"holders\":[", (uint64_t)x->top_base,
            x->top_size, x->top_used, x->top_blocks);
    for (size_t i = 0; i < x->num_top_holders; i++)
        fprintf(out, "%s[%" PRIu64 ",%zu]", i ? "," : "", (uint64_t)x->top_holders[i].addr, x->top_holders[i].size);
    fprintf(out, "]}}");
}

void cuh_json_write_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(out, "\\u%04x", ch);
        else
            fputc(ch, out);
    }
    fputc('"', out);
}

static void json_step(FILE *out, const char *sep, const cuh_snap_step_t *x)
{
    fprintf(out,
            "%s{\"index\":%" PRIu64 ",\"end\":%.6f,\"seconds\":%.6f,\"page_maps\":%" PRIu64 ",\"page_moves\":%" PRIu64
            ",\"map_calls\":%" PRIu64 ",\"device_allocs\":%" PRIu64 ",\"cpu_waits\":%" PRIu64 "}",
            sep, x->index, x->end, x->seconds, x->page_maps, x->page_moves, x->map_calls, x->device_allocs,
            x->cpu_waits);
}

static void json_one(FILE *out, const cuh_heap_snapshot_t *s)
{
    const cuheap_stats_t *st = &s->stats;
    fprintf(out, "{\"device\":%d,\"kind\":", s->device);
    cuh_json_write_string(out, s->device_kind);
    fprintf(out, ",\"config\":{\"workspace\":%zu,\"limit_bytes\":%zu,\"limit_fraction\":%g,\"small_max\":%zu,"
                 "\"segment_min\":%zu,\"grow_fraction\":%g,\"vmm\":%zu,\"vmm_margin\":%g,\"report\":",
            s->config.workspace, s->config.limit_bytes, s->config.limit_fraction, s->config.small_max,
            s->config.segment_min, s->config.grow_fraction, s->config.vmm, s->config.vmm_margin);
    cuh_json_write_string(out, s->config.report);
    fprintf(out, ",\"trace\":");
    cuh_json_write_string(out, s->config.trace);
    fprintf(out, "},");
    fprintf(out, "\"stats\":{");
    json_stat(out, "requested", &st->requested, 1);
    json_stat(out, "allocated", &st->allocated, 1);
    json_stat(out, "reserved", &st->reserved, 1);
    json_stat(out, "cached", &st->cached, 1);
    json_stat(out, "pending", &st->pending, 1);
    fprintf(out,
            "\"num_allocs\":%" PRIu64 ",\"num_frees\":%" PRIu64 ",\"num_segment_allocs\":%" PRIu64
            ",\"num_segment_frees\":%" PRIu64 ",\"num_cache_hits\":%" PRIu64 ",\"num_retries\":%" PRIu64
            ",\"num_ooms\":%" PRIu64 ",\"largest_free_extent\":%" PRIu64 ",\"num_free_extents\":%" PRIu64
            ",\"fragmentation\":%.6f,\"limit\":%" PRIu64 ",\"workspace\":%" PRIu64 ",\"num_cpu_waits\":%" PRIu64 "},",
            st->num_allocs, st->num_frees, st->num_segment_allocs, st->num_segment_frees, st->num_cache_hits,
            st->num_retries, st->num_ooms, st->largest_free_extent, st->num_free_extents, fragmentation(st), st->limit,
            st->workspace, st->num_cpu_waits);
    fprintf(out, "\"device_memory\":{\"free\":%zu,\"total\":%zu%s%s},\"segments\":[", s->device_free, s->device_total,
            s->device_free_unknown ? ",\"free_unknown\":true" : "", s->no_virtual_memory ? ",\"no_virtual_memory\":true" : "");
    for (size_t i = 0; i < s->num_segments; i++) {
        const cuh_snap_segment_t *g = &s->segments[i];
        fprintf(out, "%s{\"base\":%" PRIu64 ",\"size\":%" PRIu64 ",\"workspace\":%s,\"virtual\":%s,\"mapped\":%" PRIu64,
                i ? "," : "", g->base, g->size, g->workspace ? "true" : "false", g->virtual_space ? "true" : "false",
                g->mapped);
        if (g->virtual_space) {
            fprintf(out,
                    ",\"page_size\":%" PRIu64 ",\"page_maps\":%" PRIu64 ",\"page_moves\":%" PRIu64
                    ",\"map_calls\":%" PRIu64,
                    g->page_size, g->page_maps, g->page_moves, g->map_calls);
            /* Known unless host memory ran short for them, or the report
             * read back was written before they were: then left out. */
            if (g->num_runs || !g->mapped) {
                fputs(",\"mapped_runs\":[", out);
                for (size_t k = 0; k < g->num_runs; k++) {
                    const cuh_snap_run_t *run = &s->runs[g->first_run + k];
                    fprintf(out, "%s[%" PRIu64 ",%" PRIu64 "]", k ? "," : "", run->addr, run->size);
                }
                fputc(']', out);
            }
        }
        fputs(",\"extents\":[", out);
        for (size_t k = 0; k < g->num_extents; k++) {
            const cuh_snap_extent_t *x = &s->extents[g->first_extent + k];
            fprintf(out, "%s{\"addr\":%" PRIu64 ",\"size\":%" PRIu64 ",\"kind\":\"%s\"", k ? "," : "", x->addr, x->size,
                    kind_name(x->kind));
            if (x->kind == CUH_SNAP_FREE)
                fprintf(out, ",\"stream\":%u,\"pending\":%s}", x->stream_tag, x->pending ? "true" : "false");
            else if (x->kind == CUH_SNAP_BLOCK)
                fprintf(out, ",\"requested\":%" PRIu64 "}", x->requested);
            else
                fprintf(out, ",\"size_class\":%u,\"objects\":%u,\"live\":%u}", x->size_class, x->objs, x->live);
        }
        fprintf(out, "]}");
    }
    fprintf(out, "],\"size_classes\":[");
    for (unsigned i = 0; i < s->num_classes; i++) {
        const cuh_snap_class_t *k = &s->classes[i];
        fprintf(out,
                "%s{\"size\":%" PRIu64 ",\"slab_bytes\":%" PRIu64 ",\"slabs\":%" PRIu64 ",\"objects\":%" PRIu64
                ",\"live\":%" PRIu64 ",\"cached\":%" PRIu64 "}",
                i ? "," : "", k->size, k->slab_bytes, k->slabs, k->objs, k->live, k->cached);
    }
    fprintf(out, "],\"streams\":[");
    for (size_t i = 0; i < s->num_streams; i++)
        fprintf(out,
                "%s{\"index\":%zu,\"handle\":%" PRIu64 ",\"private_bytes\":%" PRIu64 ",\"pending_bytes\":%" PRIu64
                ",\"fences_outstanding\":%" PRIu64 "}",
                i ? "," : "", i + 1, s->streams[i].handle, s->streams[i].private_bytes, s->streams[i].pending_bytes,
                s->streams[i].fences_outstanding);
    fprintf(out, "],\"steps\":{\"marked\":%" PRIu64 ",\"last\":[", s->steps_marked);
    for (size_t i = 0; i < s->num_steps; i++)
        json_step(out, i ? "," : "", &s->steps[i]);
    fprintf(out, "],\"most_maps\":");
    if (s->most_maps.index)
        json_step(out, "", &s->most_maps);
    else
        fprintf(out, "null");
    fprintf(out,
            "},\"plan\":{\"active\":%s,\"made\":%" PRIu64 ",\"steps_followed\":%" PRIu64 ",\"placed\":%" PRIu64
            ",\"missed\":%" PRIu64 ",\"dropped\":%" PRIu64 ",\"room_bytes\":%" PRIu64 ",\"steps_found\":%" PRIu64
            ",\"found_period\":%" PRIu64 "}",
            s->plan.active ? "true" : "false", s->plan.made, s->plan.steps_followed, s->plan.placed, s->plan.missed,
            s->plan.dropped, s->plan.room_bytes, s->plan.steps_found, s->plan.found_period);
    fprintf(out, ",\"uptime\":%.6f,\"timeline\":[", s->uptime);
    for (size_t i = 0; i < s->num_samples; i++)
        fprintf(out, "%s{\"t\":%.6f,\"live\":%" PRIu64 ",\"reserved\":%" PRIu64 ",\"cached\":%" PRIu64 "}", i ? "," : "",
                s->timeline[i].t, s->timeline[i].live, s->timeline[i].reserved, s->timeline[i].cached);
    fprintf(out, "],\"oom\":");
    if (!s->has_oom) {
        fprintf(out, "null}");
        return;
    }
    const cuh_oom_info_t *o = &s->oom;
    fprintf(out, "{\"cause\":\"%s\",\"request\":%zu,\"block\":%zu,\"stream\":%" PRIu64 ",\"live\":%zu,\"allocated\":%zu,"
                 "\"reserved\":%zu,\"cached\":%zu,\"pending\":%zu,\"largest_free\":%zu,\"num_free_extents\":%zu,"
                 "\"device_free\":%zu,\"device_total\":%zu,\"external\":%zu,\"limit\":%zu,\"action\":",
            cuh_oom_cause_name(o->cause), o->request, o->block, (uint64_t)o->stream, o->live, o->allocated, o->reserved,
            o->cached, o->pending, o->largest_free, o->num_free_extents, o->device_free, o->device_total, o->external,
            o->limit);
    cuh_json_write_string(out, o->action);
    fprintf(out, ",\"t\":%.6f,\"pending_by_stream\":[", o->t);
    for (size_t i = 0; i < o->num_pending_streams; i++)
        fprintf(out, "%s{\"stream\":%" PRIu64 ",\"pending\":%" PRIu64 "}", i ? "," : "", o->pending_by_stream[i].stream,
                o->pending_by_stream[i].pending);
    fprintf(out, "]");
    if (o->stranded.known) {
        fprintf(out, ",\"stranded\":");
        cuh_json_write_stranded(out, o);
    }
    if (o->partial_pages.known)
        fprintf(out, ",\"partial_pages\":{\"pages\":%zu,\"free\":%zu}", o->partial_pages.pages, o->partial_pages.free);
    if (o->partial_units.known)
        fprintf(out, ",\"partial_units\":{\"units\":%zu,\"free\":%zu}", o->partial_units.units, o->partial_units.free);
    fprintf(out, "}}");
}

/* ,"pinned_host":{...}: the byte statistics as the devices' are written. */
static void json_pinned(FILE *out, const cuheap_host_stats_t *p)
{
    fputs(",\"pinned_host\":{", out);
    json_stat(out, "requested", &p->requested, 1);
    json_stat(out, "allocated", &p->allocated, 1);
    json_stat(out, "reserved", &p->reserved, 1);
    json_stat(out, "pending", &p->pending, 1);
    fprintf(out,
            "\"num_allocs\":%" PRIu64 ",\"num_frees\":%" PRIu64 ",\"num_chunks\":%" PRIu64 ",\"num_chunk_allocs\":%" PRIu64
            ",\"num_waits\":%" PRIu64 ",\"num_ooms\":%" PRIu64 ",\"chunk_size\":%" PRIu64 "}",
            p->num_allocs, p->num_frees, p->num_chunks, p->num_chunk_allocs, p->num_waits, p->num_ooms, p->chunk_size);
}

/* ,"callers":[{"library":...,"live":...,"peak":...,"allocs":...},...] */
static void json_callers(FILE *out, const cuh_caller_stat_t *c, size_t n)
{
    fputs(",\"callers\":[", out);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ",{\"library\":" : "{\"library\":", out);
        cuh_json_write_string(out, c[i].library);
        fprintf(out, ",\"live\":%" PRIu64 ",\"peak\":%" PRIu64 ",\"allocs\":%" PRIu64 "}", c[i].live, c[i].peak,
                c[i].allocs);
    }
    fputc(']', out);
}

void cuh_report_json(FILE *out, cuh_report_origin_t origin, cuh_heap_snapshot_t *const *snaps, size_t n,
                     const cuh_report_extra_t *extra)
{
    fprintf(out, "{\"schema\":\"cuheap-report\",\"version\":1,\"cuheap\":\"%s\",\"pid\":%d,\"time\":%lld,\"devices\":[",
            origin.version, origin.pid, origin.time);
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputc(',', out);
        json_one(out, snaps[i]);
    }
    fputc(']', out);
    if (extra && extra->pinned)
        json_pinned(out, extra->pinned);
    if (extra && extra->num_callers)
        json_callers(out, extra->callers, extra->num_callers);
    fputs("}\n", out);
}
