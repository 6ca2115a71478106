/* report_render.c - what cuheap-report writes: a report rendered again by the
 * library's renderers (with the parts after the devices as they were), and
 * the tool's own views: --compare, two reports side by side per device, and
 * --merge, one table of many reports, each as text or JSON.
 */
#include "report_tool.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- output ---------------------------------------------------------------- */

/* What the renderers take after the devices: no pinned statistics for a
 * report without "pinned_host", no callers for one without "callers", so
 * that a report is rendered again as it was. */
cuh_report_extra_t report_extra(const report_t *rep)
{
    return (cuh_report_extra_t){.pinned = rep->has_pinned ? &rep->pinned : NULL,
                                .callers = rep->callers,
                                .num_callers = rep->num_callers};
}

FILE *open_output(const char *path)
{
    if (!path || strcmp(path, "-") == 0)
        return stdout;
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
    return f;
}

/* 0, or -1 after printing why. */
int close_output(FILE *f, const char *path)
{
    const char *name = f == stdout ? "standard output" : path;
    int bad = ferror(f);
    int rc = f == stdout ? fflush(f) : fclose(f);
    if (bad || rc != 0) {
        fprintf(stderr, PROG ": writing %s failed: %s\n", name, errno ? strerror(errno) : "I/O error");
        return -1;
    }
    return 0;
}

/* ---- --compare ---------------------------------------------------------------- */

static double fragmentation(const cuheap_stats_t *s)
{
    /* As report.c computes it. */
    return s->cached.current ? 1.0 - (double)s->largest_free_extent / (double)s->cached.current : 0.0;
}

/* Peak reserved / peak live; 0 when nothing was live. */
static double overhead(const cuheap_stats_t *s)
{
    return s->requested.peak ? (double)s->reserved.peak / (double)s->requested.peak : 0.0;
}

static const char *oom_cause(const cuh_heap_snapshot_t *s)
{
    return s->has_oom ? cuh_oom_cause_name(s->oom.cause) : "none";
}

/* The snapshot of `device` in rep, or NULL. */
static const cuh_heap_snapshot_t *find_device(const report_t *rep, int device)
{
    for (size_t i = 0; i < rep->num_snaps; i++)
        if (rep->snaps[i]->device == device)
            return rep->snaps[i];
    return NULL;
}

static int cmp_int(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return a < b ? -1 : a > b;
}

/* The device numbers of both reports, sorted, each once; NULL when out of memory. */
int *device_union(const report_t *a, const report_t *b, size_t *n)
{
    int *all = malloc((a->num_snaps + b->num_snaps + 1) * sizeof *all);
    if (!all)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < a->num_snaps; i++)
        all[k++] = a->snaps[i]->device;
    for (size_t i = 0; i < b->num_snaps; i++)
        all[k++] = b->snaps[i]->device;
    qsort(all, k, sizeof *all, cmp_int);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || all[u - 1] != all[i])
            all[u++] = all[i];
    *n = u;
    return all;
}

static void format_time(long long t, char *buf, size_t len)
{
    time_t at = (time_t)t;
    struct tm tm;
    if (!gmtime_r(&at, &tm) || !strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm))
        snprintf(buf, len, "%lld", t);
}

/* "+1.30 GiB", "-512 B", "0 B". */
static const char *bytes_diff(char *buf, size_t len, uint64_t a, uint64_t b)
{
    char v[32];
    if (a == b)
        snprintf(buf, len, "0 B");
    else
        snprintf(buf, len, "%c%s", b > a ? '+' : '-', cuh_format_bytes(v, sizeof v, b > a ? b - a : a - b));
    return buf;
}

static const char *count_diff(char *buf, size_t len, uint64_t a, uint64_t b)
{
    if (a == b)
        snprintf(buf, len, "0");
    else
        snprintf(buf, len, "%c%" PRIu64, b > a ? '+' : '-', b > a ? b - a : a - b);
    return buf;
}

/* B / A with three decimals, "-" when A is 0. */
static const char *ratio_text(char *buf, size_t len, double a, double b)
{
    if (a == 0.0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.3f", b / a);
    return buf;
}

#define ROW_FMT "  %-28s %16s %16s %16s %9s\n"

static void text_bytes_row(FILE *out, const char *label, uint64_t a, uint64_t b)
{
    char x[32], y[32], d[40], q[32];
    fprintf(out, ROW_FMT, label, cuh_format_bytes(x, sizeof x, a), cuh_format_bytes(y, sizeof y, b),
            bytes_diff(d, sizeof d, a, b), ratio_text(q, sizeof q, (double)a, (double)b));
}

static void text_count_row(FILE *out, const char *label, uint64_t a, uint64_t b)
{
    char x[32], y[32], d[32], q[32];
    snprintf(x, sizeof x, "%" PRIu64, a);
    snprintf(y, sizeof y, "%" PRIu64, b);
    fprintf(out, ROW_FMT, label, x, y, count_diff(d, sizeof d, a, b), ratio_text(q, sizeof q, (double)a, (double)b));
}

static void text_figure_row(FILE *out, const char *label, double a, double b, int a_known, int b_known)
{
    char x[32], y[32], d[32], q[32];
    snprintf(x, sizeof x, a_known ? "%.3f" : "-", a);
    snprintf(y, sizeof y, b_known ? "%.3f" : "-", b);
    if (a_known && b_known)
        snprintf(d, sizeof d, "%+.3f", b - a);
    else
        snprintf(d, sizeof d, "-");
    fprintf(out, ROW_FMT, label, x, y, d, a_known && b_known ? ratio_text(q, sizeof q, a, b) : "-");
}

static void compare_text_device(FILE *out, const cuh_heap_snapshot_t *a, const cuh_heap_snapshot_t *b)
{
    const cuheap_stats_t *x = &a->stats, *y = &b->stats;
    if (strcmp(a->device_kind, b->device_kind) == 0)
        fprintf(out, "== device %d (%s) ==\n", a->device, a->device_kind);
    else
        fprintf(out, "== device %d (A: %s, B: %s) ==\n", a->device, a->device_kind, b->device_kind);
    fprintf(out, ROW_FMT, "", "A", "B", "B - A", "B / A");
#define STAT(label, f)                                                       \
    text_bytes_row(out, label " current", x->f.current, y->f.current);      \
    text_bytes_row(out, label " peak", x->f.peak, y->f.peak)
    STAT("requested", requested);
    STAT("allocated", allocated);
    STAT("reserved", reserved);
    STAT("cached", cached);
    STAT("pending", pending);
#undef STAT
    text_count_row(out, "allocations", x->num_allocs, y->num_allocs);
    text_count_row(out, "frees", x->num_frees, y->num_frees);
    text_count_row(out, "cache hits", x->num_cache_hits, y->num_cache_hits);
    text_count_row(out, "segments allocated", x->num_segment_allocs, y->num_segment_allocs);
    text_count_row(out, "segments released", x->num_segment_frees, y->num_segment_frees);
    text_count_row(out, "retries", x->num_retries, y->num_retries);
    text_count_row(out, "OOMs", x->num_ooms, y->num_ooms);
    text_count_row(out, "CPU waits for the GPU", x->num_cpu_waits, y->num_cpu_waits);
    text_bytes_row(out, "largest free extent", x->largest_free_extent, y->largest_free_extent);
    text_count_row(out, "free extents", x->num_free_extents, y->num_free_extents);
    text_figure_row(out, "fragmentation", fragmentation(x), fragmentation(y), 1, 1);
    size_t na, nb;
    text_bytes_row(out, "stranded", cuh_snap_stranded_total(a, &na), cuh_snap_stranded_total(b, &nb));
    text_count_row(out, "stranded segments", na, nb);
    text_figure_row(out, "peak reserved / peak live", overhead(x), overhead(y), x->requested.peak != 0,
                    y->requested.peak != 0);
    char ra[32] = "-", rb[32] = "-";
    if (a->has_oom)
        cuh_format_bytes(ra, sizeof ra, a->oom.request);
    if (b->has_oom)
        cuh_format_bytes(rb, sizeof rb, b->oom.request);
    fprintf(out, "  %-28s %16s %16s\n", "out-of-memory cause", oom_cause(a), oom_cause(b));
    fprintf(out, "  %-28s %16s %16s\n", "out-of-memory request", ra, rb);
    fputc('\n', out);
}

void compare_text(FILE *out, const report_t *a, const report_t *b, const int *devices, size_t n)
{
    char when[64];
    fprintf(out, "cuheap report comparison\n");
    format_time(a->origin.time, when, sizeof when);
    fprintf(out, "  A: %s (cuheap %s, pid %d, %s)\n", a->file, a->version, a->origin.pid, when);
    format_time(b->origin.time, when, sizeof when);
    fprintf(out, "  B: %s (cuheap %s, pid %d, %s)\n\n", b->file, b->version, b->origin.pid, when);
    if (!n)
        fprintf(out, "no device in either report.\n");
    for (size_t i = 0; i < n; i++) {
        const cuh_heap_snapshot_t *x = find_device(a, devices[i]), *y = find_device(b, devices[i]);
        if (x && y)
            compare_text_device(out, x, y);
        else
            fprintf(out, "== device %d (%s): only in %s (%s) ==\n\n", devices[i], (x ? x : y)->device_kind,
                    x ? "A" : "B", x ? a->file : b->file);
    }
}

/* {"a":A,"b":B,"diff":B-A,"ratio":B/A or null}, exact integers. */
static void json_count(FILE *out, const char *name, uint64_t a, uint64_t b, int comma)
{
    fprintf(out, "\"%s\":{\"a\":%" PRIu64 ",\"b\":%" PRIu64 ",\"diff\":%s%" PRIu64 ",\"ratio\":", name, a, b,
            b < a ? "-" : "", b < a ? a - b : b - a);
    if (a)
        fprintf(out, "%.6f}", (double)b / (double)a);
    else
        fputs("null}", out);
    if (comma)
        fputc(',', out);
}

static void json_figure(FILE *out, const char *name, double a, double b, int a_known, int b_known, int comma)
{
    fprintf(out, "\"%s\":{\"a\":", name);
    if (a_known)
        fprintf(out, "%.6f", a);
    else
        fputs("null", out);
    fputs(",\"b\":", out);
    if (b_known)
        fprintf(out, "%.6f", b);
    else
        fputs("null", out);
    if (a_known && b_known) {
        fprintf(out, ",\"diff\":%.6f,\"ratio\":", b - a);
        if (a != 0.0)
            fprintf(out, "%.6f}", b / a);
        else
            fputs("null}", out);
    } else {
        fputs(",\"diff\":null,\"ratio\":null}", out);
    }
    if (comma)
        fputc(',', out);
}

static void json_oom(FILE *out, const cuh_heap_snapshot_t *s)
{
    if (!s->has_oom) {
        fputs("null", out);
        return;
    }
    fputs("{\"cause\":", out);
    cuh_json_write_string(out, cuh_oom_cause_name(s->oom.cause));
    fprintf(out, ",\"request\":%zu}", s->oom.request);
}

static void compare_json_device(FILE *out, const cuh_heap_snapshot_t *a, const cuh_heap_snapshot_t *b)
{
    const cuheap_stats_t *x = &a->stats, *y = &b->stats;
    fprintf(out, "{\"device\":%d,\"in\":\"both\",\"kind\":{\"a\":", a->device);
    cuh_json_write_string(out, a->device_kind);
    fputs(",\"b\":", out);
    cuh_json_write_string(out, b->device_kind);
    fputs("},", out);
#define STAT(f)                                                                 \
    fputs("\"" #f "\":{", out);                                                 \
    json_count(out, "current", x->f.current, y->f.current, 1);                  \
    json_count(out, "peak", x->f.peak, y->f.peak, 0);                           \
    fputs("},", out)
    STAT(requested);
    STAT(allocated);
    STAT(reserved);
    STAT(cached);
    STAT(pending);
#undef STAT
    json_count(out, "num_allocs", x->num_allocs, y->num_allocs, 1);
    json_count(out, "num_frees", x->num_frees, y->num_frees, 1);
    json_count(out, "num_cache_hits", x->num_cache_hits, y->num_cache_hits, 1);
    json_count(out, "num_segment_allocs", x->num_segment_allocs, y->num_segment_allocs, 1);
    json_count(out, "num_segment_frees", x->num_segment_frees, y->num_segment_frees, 1);
    json_count(out, "num_retries", x->num_retries, y->num_retries, 1);
    json_count(out, "num_ooms", x->num_ooms, y->num_ooms, 1);
    json_count(out, "num_cpu_waits", x->num_cpu_waits, y->num_cpu_waits, 1);
    json_count(out, "largest_free_extent", x->largest_free_extent, y->largest_free_extent, 1);
    json_count(out, "num_free_extents", x->num_free_extents, y->num_free_extents, 1);
    json_figure(out, "fragmentation", fragmentation(x), fragmentation(y), 1, 1, 1);
    size_t na, nb;
    json_count(out, "stranded_bytes", cuh_snap_stranded_total(a, &na), cuh_snap_stranded_total(b, &nb), 1);
    json_count(out, "stranded_segments", na, nb, 1);
    json_figure(out, "peak_reserved_over_peak_live", overhead(x), overhead(y), x->requested.peak != 0,
                y->requested.peak != 0, 1);
    fputs("\"oom\":{\"a\":", out);
    json_oom(out, a);
    fputs(",\"b\":", out);
    json_oom(out, b);
    fputs("}}", out);
}

static void json_origin(FILE *out, const report_t *r)
{
    fputs("{\"file\":", out);
    cuh_json_write_string(out, r->file);
    fputs(",\"cuheap\":", out);
    cuh_json_write_string(out, r->version);
    fprintf(out, ",\"pid\":%d,\"time\":%lld}", r->origin.pid, r->origin.time);
}

void compare_json(FILE *out, const report_t *a, const report_t *b, const int *devices, size_t n)
{
    fputs("{\"schema\":\"cuheap-report-compare\",\"version\":1,\"a\":", out);
    json_origin(out, a);
    fputs(",\"b\":", out);
    json_origin(out, b);
    fputs(",\"devices\":[", out);
    for (size_t i = 0; i < n; i++) {
        const cuh_heap_snapshot_t *x = find_device(a, devices[i]), *y = find_device(b, devices[i]);
        if (i)
            fputc(',', out);
        if (x && y) {
            compare_json_device(out, x, y);
        } else {
            fprintf(out, "{\"device\":%d,\"in\":\"%s\",\"kind\":", devices[i], x ? "a" : "b");
            cuh_json_write_string(out, (x ? x : y)->device_kind);
            fputs(",\"oom\":", out);
            json_oom(out, x ? x : y);
            fputc('}', out);
        }
    }
    fputs("]}\n", out);
}

/* ---- --merge ------------------------------------------------------------------ */

/* Sums over every (report, device). The sum of peaks bounds what the
 * processes held at once from above (their peaks need not coincide). */
typedef struct merge_total_s {
    uint64_t peak_live, peak_reserved, reserved, ooms;
    size_t rows;
    const report_t *largest_rep;        /* the largest peak reserved */
    const cuh_heap_snapshot_t *largest;
    const cuh_heap_snapshot_t *smallest;
} merge_total_t;

static merge_total_t merge_totals(const report_t *reps, int n)
{
    merge_total_t t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < reps[i].num_snaps; k++) {
            const cuh_heap_snapshot_t *s = reps[i].snaps[k];
            t.peak_live += s->stats.requested.peak;
            t.peak_reserved += s->stats.reserved.peak;
            t.reserved += s->stats.reserved.current;
            t.ooms += s->stats.num_ooms;
            t.rows++;
            if (!t.largest || s->stats.reserved.peak > t.largest->stats.reserved.peak)
                t.largest = s, t.largest_rep = &reps[i];
            if (!t.smallest || s->stats.reserved.peak < t.smallest->stats.reserved.peak)
                t.smallest = s;
        }
    return t;
}

void merge_text(FILE *out, const report_t *reps, int n)
{
    char a[32], b[32], c[32], r[32];
    merge_total_t t = merge_totals(reps, n);
    fprintf(out, "cuheap merged view: %d reports, %zu devices in all\n\n", n, t.rows);
    fprintf(out, "  %-28s %8s %6s %12s %14s %9s %13s %5s  %s\n", "report", "pid", "device", "peak live",
            "peak reserved", "rsvd/live", "reserved now", "OOMs", "out-of-memory");
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < reps[i].num_snaps; k++) {
            const cuh_heap_snapshot_t *s = reps[i].snaps[k];
            snprintf(r, sizeof r, "%.3f", overhead(&s->stats));
            char why[96] = "-";
            if (s->has_oom) {
                char req[32];
                cuh_format_bytes(req, sizeof req, s->oom.request);
                snprintf(why, sizeof why, "%s (%s request)", oom_cause(s), req);
            }
            fprintf(out, "  %-28s %8d %6d %12s %14s %9s %13s %5" PRIu64 "  %s\n", reps[i].file, reps[i].origin.pid,
                    s->device, cuh_format_bytes(a, sizeof a, s->stats.requested.peak),
                    cuh_format_bytes(b, sizeof b, s->stats.reserved.peak), s->stats.requested.peak ? r : "-",
                    cuh_format_bytes(c, sizeof c, s->stats.reserved.current), s->stats.num_ooms, why);
        }
    snprintf(r, sizeof r, "%.3f", t.peak_live ? (double)t.peak_reserved / (double)t.peak_live : 0.0);
    fprintf(out, "  %-28s %8s %6s %12s %14s %9s %13s %5" PRIu64 "\n", "all (sums)", "", "",
            cuh_format_bytes(a, sizeof a, t.peak_live), cuh_format_bytes(b, sizeof b, t.peak_reserved),
            t.peak_live ? r : "-", cuh_format_bytes(c, sizeof c, t.reserved), t.ooms);
    fputc('\n', out);
    if (t.largest) {
        fprintf(out, "largest peak reserved: %s, device %d: %s", t.largest_rep->file, t.largest->device,
                cuh_format_bytes(a, sizeof a, t.largest->stats.reserved.peak));
        if (t.smallest->stats.reserved.peak)
            fprintf(out, " (%.3fx the smallest, %s)", (double)t.largest->stats.reserved.peak /
                    (double)t.smallest->stats.reserved.peak,
                    cuh_format_bytes(b, sizeof b, t.smallest->stats.reserved.peak));
        fputc('\n', out);
    }
    fprintf(out, "sums of peaks are upper bounds: the processes need not have peaked at once.\n");
    if (!t.ooms)
        fprintf(out, "no out-of-memory in any report.\n");
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < reps[i].num_snaps; k++)
            if (reps[i].snaps[k]->has_oom)
                fprintf(out, "out of memory: %s, device %d: %s; render that report for the proof "
                        "(" PROG " %s)\n", reps[i].file, reps[i].snaps[k]->device, oom_cause(reps[i].snaps[k]),
                        reps[i].file);
}

void merge_json(FILE *out, const report_t *reps, int n)
{
    merge_total_t t = merge_totals(reps, n);
    fputs("{\"schema\":\"cuheap-report-merge\",\"version\":1,\"reports\":[", out);
    for (int i = 0; i < n; i++) {
        fputs(i ? ",{\"origin\":" : "{\"origin\":", out);
        json_origin(out, &reps[i]);
        fputs(",\"devices\":[", out);
        for (size_t k = 0; k < reps[i].num_snaps; k++) {
            const cuh_heap_snapshot_t *s = reps[i].snaps[k];
            fprintf(out, "%s{\"device\":%d,\"kind\":", k ? "," : "", s->device);
            cuh_json_write_string(out, s->device_kind);
            fprintf(out,
                    ",\"peak_live\":%" PRIu64 ",\"peak_reserved\":%" PRIu64 ",\"reserved\":%" PRIu64
                    ",\"num_ooms\":%" PRIu64 ",\"oom\":",
                    s->stats.requested.peak, s->stats.reserved.peak, s->stats.reserved.current, s->stats.num_ooms);
            json_oom(out, s);
            fputc('}', out);
        }
        fputs("]}", out);
    }
    fprintf(out,
            "],\"total\":{\"devices\":%zu,\"peak_live_sum\":%" PRIu64 ",\"peak_reserved_sum\":%" PRIu64
            ",\"reserved_sum\":%" PRIu64 ",\"num_ooms\":%" PRIu64 "}}\n",
            t.rows, t.peak_live, t.peak_reserved, t.reserved, t.ooms);
}
