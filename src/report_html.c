/* report_html.c - renders heap snapshots as one self-contained HTML page.
 *
 * No network, no external file, no script: inline CSS and SVG only, so the
 * page opens anywhere, is safe to attach to a bug report, and renders the
 * same in a headless browser. From the same data model as the text and JSON
 * forms (cuh_heap_snapshot_t): an out-of-memory panel with the cause and its
 * proof, a timeline of live / reserved / cached bytes, a map of every
 * segment and its blocks, size-class occupancy, and the streams; after the
 * devices, when the process used it, a card for the pinned host memory cache
 * (one per process, not per device), and under LD_PRELOAD one for the device
 * memory by the library that asked for it.
 */
#include "common.h"
#include "heap.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void html_text(FILE *out, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '&': fputs("&amp;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*s, out);
        }
    }
}

static const char *bytes(char *buf, uint64_t n) { return cuh_format_bytes(buf, 32, n); }

/* One "label, current, peak" row of a statistics table. */
static void stat_row(FILE *out, const char *label, const cuheap_stat_t *stat)
{
    char a[32], b[32];
    fprintf(out, "<tr><td>%s</td><td>%s</td><td>%s</td></tr>\n", label, bytes(a, stat->current), bytes(b, stat->peak));
}

static void stats_table(FILE *out, const cuh_heap_snapshot_t *s)
{
    char a[32], b[32];
    const cuheap_stats_t *st = &s->stats;
    fprintf(out, "<table class=stats><tr><th></th><th>current</th><th>peak</th></tr>\n");
    stat_row(out, "requested (live)", &st->requested);
    stat_row(out, "allocated", &st->allocated);
    stat_row(out, "reserved", &st->reserved);
    stat_row(out, "cached", &st->cached);
    stat_row(out, "pending", &st->pending);
    fprintf(out, "</table>\n<p class=counts>allocations %" PRIu64 " &middot; frees %" PRIu64 " &middot; cache hits %" PRIu64
                 " &middot; device allocations %" PRIu64 ", returned %" PRIu64 " &middot; retries %" PRIu64
                 " &middot; out-of-memory %" PRIu64 " &middot; CPU waits for the GPU %" PRIu64 "</p>\n",
            st->num_allocs, st->num_frees, st->num_cache_hits, st->num_segment_allocs, st->num_segment_frees,
            st->num_retries, st->num_ooms, st->num_cpu_waits);
    double frag = st->cached.current ? 1.0 - (double)st->largest_free_extent / (double)st->cached.current : 0.0;
    fprintf(out, "<p class=counts>free extents %" PRIu64 ", largest %s of %s cached: fragmentation (1 - largest/cached) "
                 "<b>%.3f</b>",
            st->num_free_extents, bytes(a, st->largest_free_extent), bytes(b, st->cached.current), frag);
    if (st->requested.peak)
        fprintf(out, " &middot; peak reserved / peak live <b>%.3f</b>", (double)st->reserved.peak / (double)st->requested.peak);
    char note[96];
    cuh_report_stranded_note(s, note, sizeof note);
    if (note[0])
        fprintf(out, " &middot; <span class=stranded>stranded</span> %s", note);
    fprintf(out, "</p>\n");
}

static void oom_panel(FILE *out, const cuh_heap_snapshot_t *s)
{
    char a[32];
    const cuh_oom_info_t *o = &s->oom;
    fprintf(out, "<section class=oom id=oom><h2>Out of memory: <span class=cause>%s</span></h2>\n",
            cuh_oom_cause_name(o->cause));
    fprintf(out, "<p>%s requested (block %s) on stream 0x%" PRIx64 ", %.3f s after the heap was created.</p>\n",
            bytes(a, o->request), bytes((char[32]){0}, o->block), (uint64_t)o->stream, o->t);
    fprintf(out, "<table class=proof>\n");
#define P(label, v) fprintf(out, "<tr><td>%s</td><td>%s</td></tr>\n", label, bytes(a, v))
    P("live (requested)", o->live);
    P("allocated", o->allocated);
    P("reserved", o->reserved);
    P("cached", o->cached);
    P("pending", o->pending);
    P("largest free extent", o->largest_free);
    fprintf(out, "<tr><td>free extents</td><td>%zu</td></tr>\n", o->num_free_extents);
    P("device free", o->device_free);
    P("device total", o->device_total);
    P("used outside cuheap", o->external);
    if (o->limit)
        P("limit", o->limit);
    else
        fprintf(out, "<tr><td>limit</td><td>none</td></tr>\n");
#undef P
    for (size_t i = 0; i < o->num_pending_streams; i++)
        fprintf(out, "<tr><td>pending on stream 0x%" PRIx64 "</td><td>%s</td></tr>\n", o->pending_by_stream[i].stream,
                bytes(a, o->pending_by_stream[i].pending));
    fprintf(out, "</table>\n");
    const __typeof__(o->stranded) *x = &o->stranded;
    if (o->partial_pages.pages)
        fprintf(out, "<p class=stranded><b>In partly used pages:</b> %s free in %zu page%s that blocks partly use "
                     "(only whole free pages move).</p>\n",
                bytes(a, o->partial_pages.free), o->partial_pages.pages, o->partial_pages.pages == 1 ? "" : "s");
    if (o->partial_units.units)
        fprintf(out, "<p class=stranded><b>In partly used units:</b> %s in whole free pages of %zu unit%s of several "
                     "pages that blocks partly use (a unit moves only whole; <code>vmm_unit:2M</code> makes every unit "
                     "a page).</p>\n",
                bytes(a, o->partial_units.free), o->partial_units.units, o->partial_units.units == 1 ? "" : "s");
    if (x->segments) {
        char b[32], c[32];
        fprintf(out, "<p class=stranded><b>Stranded:</b> %s free in %zu mostly empty segment%s (at most 1/8 used), "
                     "held there by %zu block%s of %s in all%s. The most in segment 0x%" PRIx64 " (%s): %zu block%s of "
                     "%s:",
                bytes(a, x->free), x->segments, x->segments == 1 ? "" : "s", x->blocks, x->blocks == 1 ? "" : "s",
                bytes(b, x->block_bytes),
                x->would_fit ? "; had they lain elsewhere, those segments could have gone back to the device and "
                               "the request would have fit"
                             : "",
                (uint64_t)x->top_base, bytes(c, x->top_size), x->top_blocks, x->top_blocks == 1 ? "" : "s",
                bytes((char[32]){0}, x->top_used));
        for (size_t i = 0; i < x->num_top_holders; i++)
            fprintf(out, "%s 0x%" PRIx64 " (%s)", i ? "," : "", (uint64_t)x->top_holders[i].addr,
                    bytes(a, x->top_holders[i].size));
        fprintf(out, "%s.</p>\n", x->top_blocks > x->num_top_holders ? ", ..." : "");
    }
    fprintf(out, "<p class=action><b>What would help:</b> ");
    html_text(out, o->action);
    fprintf(out, "</p></section>\n");
}

/* A line chart of the timeline: live, reserved, cached over time. */
static void timeline_chart(FILE *out, const cuh_heap_snapshot_t *s)
{
    const double W = 900, H = 220, L = 70, B = 30, T = 10;
    fprintf(out, "<h2>Timeline</h2>\n");
    if (s->num_samples < 2) {
        fprintf(out, "<p>Too few samples yet.</p>\n");
        return;
    }
    double tmax = s->timeline[s->num_samples - 1].t, t0 = s->timeline[0].t;
    uint64_t ymax = 1;
    for (size_t i = 0; i < s->num_samples; i++)
        if (s->timeline[i].reserved > ymax)
            ymax = s->timeline[i].reserved;
    if (s->has_oom && s->oom.reserved > ymax)
        ymax = s->oom.reserved;
    double span = tmax > t0 ? tmax - t0 : 1;
    fprintf(out, "<svg class=\"chart\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">\n", W, H, W, H);
    fprintf(out, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n", L, T, W - L - 10, H - B - T);
    char a[32];
    for (int k = 0; k <= 4; k++) {
        double y = T + (H - B - T) * (1 - k / 4.0);
        fprintf(out, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/><text x=\"%.0f\" y=\"%.1f\" class=\"axis\">%s</text>\n", L,
                W - 10, y, y, 4.0, y + 4, bytes(a, (uint64_t)((double)ymax * k / 4.0)));
    }
    /* Seconds, or milliseconds for a short life (a replay). */
    double unit = tmax < 2 ? 1e3 : 1;
    const char *uname = tmax < 2 ? "ms" : "s";
    fprintf(out, "<text x=\"%.0f\" y=\"%.0f\" class=\"axis\">%.2f %s</text><text x=\"%.0f\" y=\"%.0f\" class=\"axis\">%.2f %s</text>\n",
            L, H - 8, t0 * unit, uname, W - 70, H - 8, tmax * unit, uname);
    static const struct { const char *name, *color; } lines[] = {
        {"reserved", "#c0392b"}, {"cached", "#e67e22"}, {"live", "#2471a3"}};
    for (int l = 0; l < 3; l++) {
        fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", lines[l].color);
        for (size_t i = 0; i < s->num_samples; i++) {
            const cuh_sample_t *p = &s->timeline[i];
            uint64_t v = l == 0 ? p->reserved : l == 1 ? p->cached : p->live;
            fprintf(out, "%.1f,%.1f ", L + (W - L - 10) * (p->t - t0) / span,
                    T + (H - B - T) * (1 - (double)v / (double)ymax));
        }
        fprintf(out, "\"/>\n<text x=\"%.0f\" y=\"%d\" fill=\"%s\" class=\"legend\">%s</text>\n", L + 10 + 90.0 * l, 24, lines[l].color,
                lines[l].name);
    }
    if (s->has_oom) {
        double x = L + (W - L - 10) * (s->oom.t - t0) / span;
        fprintf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"#8e44ad\" stroke-dasharray=\"4\"/>"
                     "<text x=\"%.1f\" y=\"%.0f\" fill=\"#8e44ad\" class=\"legend\">OOM</text>\n",
                x, x, T, H - B, x + 3, T + 28);
    }
    fprintf(out, "</svg>\n");
}

static const char *extent_class(const cuh_snap_extent_t *x)
{
    if (x->kind == CUH_SNAP_BLOCK)
        return "blk";
    if (x->kind == CUH_SNAP_SLAB)
        return "slab";
    if (x->pending)
        return "pend";
    return x->stream_tag ? "priv" : "free";
}

/* Each segment a bar, its extents coloured by state. A virtual-memory
 * reservation is drawn up to its last used extent (the rest is unused
 * address space). Every bar is the full width: the label says how large
 * the segment is, the bar how it is cut. */
/* The part of a segment worth drawing: all of it, except for a virtual
 * reservation, whose unused address space past its last block is not shown. */
static uint64_t shown_span(const cuh_heap_snapshot_t *s, const cuh_snap_segment_t *g)
{
    if (!g->virtual_space || !g->num_extents)
        return g->size;
    const cuh_snap_extent_t *last = &s->extents[g->first_extent + g->num_extents - 1];
    return last->kind == CUH_SNAP_FREE ? last->addr - g->base : g->size;
}

/* One piece [addr, addr + size) of a segment's bar, `width` pixels standing
 * for the `shown` bytes from `base`, with its address, size and `what` as
 * its tooltip. */
static void bar_rect(FILE *out, const char *cls, uint64_t base, uint64_t shown, double width, uint64_t addr,
                     uint64_t size, const char *what)
{
    char a[32];
    double x0 = width * (double)(addr - base) / (double)shown;
    double w = width * (double)size / (double)shown;
    /* What holds a stranded segment stays visible however small it is. */
    const double min_w = strcmp(cls, "hold") ? 0.5 : 3.0;
    fprintf(out, "<rect class=\"%s\" x=\"%.2f\" y=\"0\" width=\"%.2f\" height=\"16\"><title>0x%" PRIx64 " %s %s</title></rect>",
            cls, x0, w < min_w ? min_w : w, addr, bytes(a, size), what);
}

/* Over a virtual reservation's bar, the address space with no memory behind
 * it (between its mapped ranges): free extents there cost nothing, and a
 * block that lands there needs pages mapped or moved. */
static void unmapped_overlay(FILE *out, const cuh_heap_snapshot_t *s, const cuh_snap_segment_t *g, uint64_t shown,
                             double width)
{
    uint64_t at = g->base, end = g->base + shown;
    for (size_t k = 0; k <= g->num_runs && at < end; k++) {
        uint64_t next = k < g->num_runs ? s->runs[g->first_run + k].addr : end;
        if (next > end)
            next = end;
        if (next > at)
            bar_rect(out, "unmapped", g->base, shown, width, at, next - at, "without memory behind it");
        if (k < g->num_runs)
            at = s->runs[g->first_run + k].addr + s->runs[g->first_run + k].size;
    }
}

static void segment_map(FILE *out, const cuh_heap_snapshot_t *s)
{
    const double W = 900;
    char a[32], b[32];
    fprintf(out, "<h2>Segments</h2>\n<p class=legend-row><span class=\"key blk\"></span>block <span class=\"key slab\">"
                 "</span>slab of small objects <span class=\"key free\"></span>free <span class=\"key priv\"></span>free, "
                 "one stream's <span class=\"key pend\"></span>free, pending GPU work <span class=\"key unmapped\"></span>"
                 "no memory behind it (vmm:1) <span class=\"key hold\"></span>block or slab alone in a mostly empty "
                 "segment (at most 1/8 used: stranded)</p>\n");
    fprintf(out, "<div class=segments>\n");
    for (size_t i = 0; i < s->num_segments; i++) {
        const cuh_snap_segment_t *g = &s->segments[i];
        uint64_t shown = shown_span(s, g);
        double width = W;
        const int stranded = cuh_snap_stranded_bytes(s, g) != 0;
        fprintf(out, "<div class=seg><span class=seglabel>0x%012" PRIx64 " %s%s%s%s</span>\n", g->base, bytes(a, g->size),
                g->workspace ? " workspace" : "", g->virtual_space ? " virtual" : "",
                stranded ? " <span class=stranded>stranded</span>" : "");
        if (g->virtual_space)
            fprintf(out,
                    "<span class=seglabel>(%s mapped; %" PRIu64 " pages mapped, %" PRIu64 " moved, in %" PRIu64
                    " map calls)</span>",
                    bytes(b, g->mapped), g->page_maps, g->page_moves, g->map_calls);
        fprintf(out, "<svg width=\"%.0f\" height=\"16\">", width);
        for (size_t k = 0; k < g->num_extents; k++) {
            const cuh_snap_extent_t *x = &s->extents[g->first_extent + k];
            if (x->addr - g->base >= shown)
                break;
            const char *cls = stranded && x->kind != CUH_SNAP_FREE ? "hold" : extent_class(x);
            bar_rect(out, cls, g->base, shown, width, x->addr, x->size,
                     stranded && x->kind != CUH_SNAP_FREE ? "holds this mostly empty segment" : extent_class(x));
        }
        if (g->num_runs)
            unmapped_overlay(out, s, g, shown, width);
        fprintf(out, "</svg></div>\n");
    }
    fprintf(out, "</div>\n");
}

static void classes_table(FILE *out, const cuh_heap_snapshot_t *s)
{
    char a[32];
    int any = 0;
    for (unsigned i = 0; i < s->num_classes; i++) {
        const cuh_snap_class_t *k = &s->classes[i];
        if (!k->slabs && !k->cached)
            continue;
        if (!any++)
            fprintf(out, "<h2>Size classes</h2>\n<table class=classes><tr><th>class</th><th>slabs</th><th>objects</th>"
                         "<th>live</th><th>cached</th><th>occupancy</th></tr>\n");
        double occ = k->objs ? (double)k->live / (double)k->objs : 0;
        fprintf(out, "<tr><td>%s</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%" PRIu64
                     "</td><td><svg width=\"120\" height=\"10\"><rect width=\"120\" height=\"10\" fill=\"#eee\"/>"
                     "<rect width=\"%.1f\" height=\"10\" fill=\"#16a085\"/></svg> %.0f%%</td></tr>\n",
                bytes(a, k->size), k->slabs, k->objs, k->live, k->cached, 120 * occ, 100 * occ);
    }
    if (any)
        fprintf(out, "</table>\n");
}

static void streams_table(FILE *out, const cuh_heap_snapshot_t *s)
{
    char a[32], b[32];
    if (!s->num_streams)
        return;
    fprintf(out, "<h2>Streams</h2>\n<table class=classes><tr><th>stream</th><th>private free</th><th>pending</th>"
                 "<th>fences in flight</th></tr>\n");
    for (size_t i = 0; i < s->num_streams; i++)
        fprintf(out, "<tr><td>0x%" PRIx64 "</td><td>%s</td><td>%s</td><td>%" PRIu64 "</td></tr>\n", s->streams[i].handle,
                bytes(a, s->streams[i].private_bytes), bytes(b, s->streams[i].pending_bytes),
                s->streams[i].fences_outstanding);
    fprintf(out, "</table>\n");
}

/* The steps the program marked (cuheap_mark_step), the last of them. */
static void steps_table(FILE *out, const cuh_heap_snapshot_t *s)
{
    if (!s->steps_marked)
        return;
    fprintf(out, "<h2>Steps</h2>\n<p class=counts>%" PRIu64 " marked", s->steps_marked);
    if (s->num_steps < s->steps_marked)
        fprintf(out, ", the last %zu below", s->num_steps);
    if (s->most_maps.index)
        fprintf(out,
                " &middot; most pages mapped in one step: %" PRIu64 " in step %" PRIu64 " (%" PRIu64 " moved, %" PRIu64
                " map calls)",
                s->most_maps.page_maps, s->most_maps.index, s->most_maps.page_moves, s->most_maps.map_calls);
    fprintf(out, "</p>\n<table class=classes><tr><th>step</th><th>seconds</th><th>pages mapped</th>"
                 "<th>of them moved</th><th>map calls</th><th>device allocations</th><th>CPU waits</th></tr>\n");
    for (size_t i = 0; i < s->num_steps; i++) {
        const cuh_snap_step_t *x = &s->steps[i];
        fprintf(out,
                "<tr><td>%" PRIu64 "</td><td>%.3f</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td><td>%" PRIu64
                "</td><td>%" PRIu64 "</td><td>%" PRIu64 "</td></tr>\n",
                x->index, x->seconds, x->page_maps, x->page_moves, x->map_calls, x->device_allocs, x->cpu_waits);
    }
    fprintf(out, "</table>\n");
}

/* The pinned host memory cache as a card: the chunks it holds, the byte
 * table and the counters, like a device's. */
static void pinned_card(FILE *out, const cuheap_host_stats_t *p)
{
    char a[32];
    fprintf(out, "<section class=card id=pinned><h2>Pinned host memory</h2>\n<p class=counts>reserved in %" PRIu64
                 " chunks of %s or more; %" PRIu64 " taken from CUDA in all</p>\n",
            p->num_chunks, bytes(a, p->chunk_size), p->num_chunk_allocs);
    fprintf(out, "<table class=stats><tr><th></th><th>current</th><th>peak</th></tr>\n");
    stat_row(out, "requested (live)", &p->requested);
    stat_row(out, "allocated", &p->allocated);
    stat_row(out, "reserved", &p->reserved);
    stat_row(out, "pending", &p->pending);
    fprintf(out, "</table>\n<p class=counts>allocations %" PRIu64 " &middot; frees %" PRIu64
                 " &middot; waits for GPU work %" PRIu64 " &middot; out-of-memory %" PRIu64 "</p></section>\n",
            p->num_allocs, p->num_frees, p->num_waits, p->num_ooms);
}

/* Device memory by the library that asked for it (LD_PRELOAD) as a card. */
static void callers_card(FILE *out, const cuh_caller_stat_t *c, size_t n)
{
    char a[32], b[32];
    fprintf(out, "<section class=card id=callers><h2>Device memory by caller (LD_PRELOAD)</h2>\n"
                 "<table class=stats><tr><th>library</th><th>live</th><th>peak</th><th>allocations</th></tr>\n");
    for (size_t i = 0; i < n; i++) {
        fputs("<tr><td>", out);
        html_text(out, c[i].library);
        fprintf(out, "</td><td>%s</td><td>%s</td><td>%" PRIu64 "</td></tr>\n", bytes(a, c[i].live), bytes(b, c[i].peak),
                c[i].allocs);
    }
    fprintf(out, "</table></section>\n");
}

void cuh_report_html(FILE *out, cuh_report_origin_t origin, cuh_heap_snapshot_t *const *snaps, size_t n,
                     const cuh_report_extra_t *extra)
{
    char when[64];
    time_t at = (time_t)origin.time;
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime_r(&at, &tm));
    fprintf(out,
            "<!DOCTYPE html>\n<html><head><meta charset=utf-8><title>cuheap report</title>\n<style>\n"
            "body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}\n"
            "h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse}\n"
            "td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}td:first-child,th:first-child{text-align:left}\n"
            ".oom{border:2px solid #c0392b;background:#fdf2f0;padding:8px 16px;margin:16px 0}\n"
            ".card{border:1px solid #ddd;background:#fafafa;padding:0 16px 4px;margin:28px 0 16px}.card h2{margin-top:14px}\n"
            ".cause{color:#c0392b}.action{font-size:15px}.counts{color:#555;overflow-wrap:anywhere}\n"
            ".axis{font-size:10px;fill:#666}.legend{font-size:12px}\n"
            ".seg{margin:3px 0}.seglabel{font:11px monospace;color:#555;margin-right:8px}\n"
            "rect.blk,rect.slab{stroke:#fff;stroke-width:0.6}\n"
            ".blk{fill:#2471a3}.slab{fill:#16a085}.free{fill:#dcdcdc}.priv{fill:#f4d03f}.pend{fill:#e67e22}\n"
            ".key{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}\n"
            "span.blk{background:#2471a3}span.slab{background:#16a085}span.free{background:#dcdcdc}"
            "span.priv{background:#f4d03f}span.pend{background:#e67e22}\n"
            "rect.unmapped{fill:#fff;fill-opacity:0.7}span.unmapped{background:#fff;border:1px solid #bbb}\n"
            "rect.hold{fill:#c0392b;stroke:#fff;stroke-width:0.6}span.hold{background:#c0392b}"
            "span.stranded{color:#c0392b;font-weight:bold}\n"
            "</style></head><body>\n<h1>cuheap %s report &middot; pid %d &middot; %s</h1>\n",
            origin.version, origin.pid, when);
    if (!n)
        fprintf(out, "<p>No device has been used.</p>\n");
    for (size_t i = 0; i < n; i++) {
        const cuh_heap_snapshot_t *s = snaps[i];
        char conf[2048], a[32], b[32];
        cuh_config_format(&s->config, conf, sizeof conf);
        fprintf(out, "<h2>Device %d (%s)</h2>\n<p class=counts>settings: %s &middot; device %s", s->device,
                s->device_kind, conf, bytes(a, s->device_total));
        if (s->device_free_unknown)
            fprintf(out, ", free not asked (a report at exit makes no device call)");
        else
            fprintf(out, ", %s free", bytes(b, s->device_free));
        if (s->no_virtual_memory)
            fprintf(out, " &middot; vmm:1 asked for, but the device gave no virtual memory: plain segments");
        fprintf(out, "</p>\n");
        if (s->has_oom)
            oom_panel(out, s);
        stats_table(out, s);
        timeline_chart(out, s);
        segment_map(out, s);
        classes_table(out, s);
        streams_table(out, s);
        steps_table(out, s);
    }
    if (extra && extra->pinned)
        pinned_card(out, extra->pinned);
    if (extra && extra->num_callers)
        callers_card(out, extra->callers, extra->num_callers);
    fprintf(out, "</body></html>\n");
}
