/* report.c - cuheap-report: renders a JSON report again, compares two, or
 * merges many (one per rank of a distributed job).
 *
 * A JSON report (include/cuheap_report.schema.json, version 1) carries every
 * field of the heap snapshots it was rendered from. cuheap-report reads one
 * back into cuh_heap_snapshot_t, field by field, and renders it with the
 * library's own renderers and the report's own pid and time, so the text or
 * HTML it prints is the one the program would have written at that moment,
 * and --json reproduces the file itself. --compare reads two reports and
 * sets them side by side per device (matched by device number): the byte
 * statistics, the counters, the fragmentation figures and the cause of any
 * out-of-memory, with the difference and the ratio B/A, as text or JSON.
 * --merge reads any number of reports (report:/tmp/r-%p.json under torchrun:
 * one per rank) and sets every (report, device) in one table: peak live,
 * peak reserved and their ratio, reserved now, out-of-memory count and
 * cause, with the sums, the rank that reserved most and every
 * out-of-memory named.
 *
 * The optional "pinned_host" (the pinned host memory cache's statistics,
 * present when the process used it) and "callers" (device memory by the
 * library that asked for it, under LD_PRELOAD) are read back too and
 * rendered after the devices; --compare and --merge look at the devices
 * only.
 *
 * Every field the schema requires must be there with the right type: a
 * missing or wrong one is named by its JSON path
 * ("devices[0].stats.reserved.peak: missing").
 *
 * Exit status: 0 done; 1 unreadable file, malformed JSON (file:line:column),
 * not a cuheap report, missing or wrong field, output not written; 2 usage
 * error.
 */
#include "common.h"
#include "config.h"
#include "heap.h"
#include "json_read.h"

#include <cuheap.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "cuheap-report"
#include "cli.h"
#define REPORT_SCHEMA "cuheap-report"
#define REPORT_VERSION 1

typedef enum { FORMAT_TEXT, FORMAT_HTML, FORMAT_JSON } format_t;

typedef struct options_s {
    format_t format;
    const char *format_option;    /* the option that chose it; NULL for the default */
    int compare;
    int merge;
    const char *output;           /* -o; NULL = standard output */
    const char **files;           /* room for argc names */
    int num_files;
} options_t;

/* One report read back. */
typedef struct report_s {
    const char *file;
    cuh_json_doc_t *doc;
    char version[64];             /* "cuheap": the version that wrote it */
    cuh_report_origin_t origin;
    cuh_heap_snapshot_t **snaps;
    size_t num_snaps;
    const cuh_json_t **device_nodes;   /* devices[i], for messages */
    int has_pinned;                    /* "pinned_host" was there */
    cuheap_host_stats_t pinned;
    cuh_caller_stat_t callers[CUH_CALLERS_MAX];   /* "callers", when there */
    size_t num_callers;
} report_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--text|--html|--json] REPORT.json [-o OUT]\n"
            "       " PROG " --compare [--json] A.json B.json [-o OUT]\n"
            "       " PROG " --merge [--json] R1.json R2.json... [-o OUT]\n"
            "\n"
            "Reads a cuheap JSON report (report:PATH.json, cuheap_dump_report with\n"
            "CUHEAP_REPORT_JSON, cuheap-replay --report PATH.json) and renders it again\n"
            "as text (the default), as one self-contained HTML page or as JSON: the\n"
            "same report cuheap would have written, with the original pid and time.\n"
            "With --compare, sets two reports side by side per device: current and\n"
            "peak bytes, counters, fragmentation, peak reserved / peak live and the\n"
            "out-of-memory cause, with B - A and B / A.\n"
            "\n"
            "options:\n"
            "  --text             text, like the report:PATH.txt form (default)\n"
            "  --html             one HTML page: no network, no other file\n"
            "  --json             JSON (with --compare: the comparison as one object)\n"
            "  --compare          compare two reports, A then B\n"
            "  --merge            one table of many reports (one per rank or\n"
            "                     process): peaks, ratio, out-of-memory, sums\n"
            "  -o, --output OUT   write to OUT instead of standard output\n"
            "  -h, --help         this text\n"
            "\n"
            "REPORT may be - for standard input.\n"
            "\n"
            "exit status: 0 done, 1 unreadable or invalid report (the message names\n"
            "file:line:column or the field's JSON path), 2 usage error\n");
}

static void set_format(options_t *o, format_t format, const char *option)
{
    if (o->format_option && o->format != format)
        usage_error("%s and %s cannot be used together", o->format_option, option);
    o->format = format;
    o->format_option = option;
}

static void parse_options(int argc, char **argv, options_t *o)
{
    memset(o, 0, sizeof *o);
    o->format = FORMAT_TEXT;
    o->files = calloc((size_t)argc, sizeof *o->files);
    if (!o->files) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    int only_files = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_files || a[0] != '-' || a[1] == '\0') {
            o->files[o->num_files++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_files = 1;
        } else if (strcmp(a, "--text") == 0) {
            set_format(o, FORMAT_TEXT, "--text");
        } else if (strcmp(a, "--html") == 0) {
            set_format(o, FORMAT_HTML, "--html");
        } else if (strcmp(a, "--json") == 0) {
            set_format(o, FORMAT_JSON, "--json");
        } else if (strcmp(a, "--compare") == 0) {
            o->compare = 1;
        } else if (strcmp(a, "--merge") == 0) {
            o->merge = 1;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            if (i + 1 >= argc)
                usage_error("option '%s' needs a value (a file name)", a);
            o->output = argv[++i];
        } else if (strncmp(a, "--output=", 9) == 0) {
            o->output = a + 9;
        } else if (strncmp(a, "-o", 2) == 0) {
            o->output = a + 2;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else {
            const char *eq = strchr(a, '=');
            if (eq && a[1] == '-') {
                size_t n = (size_t)(eq - a);
                static const char *const flags[] = {"--text", "--html", "--json", "--compare", "--merge", "--help"};
                for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
                    if (strlen(flags[k]) == n && strncmp(a, flags[k], n) == 0)
                        usage_error("option '%s' takes no value", flags[k]);
            }
            usage_error("unknown option '%s'", a);
        }
    }
    if (o->output && !o->output[0])
        usage_error("-o needs a file name");
    if (o->compare && o->merge)
        usage_error("--compare and --merge: one or the other");
    if (o->merge) {
        if (o->format == FORMAT_HTML)
            usage_error("--merge writes text, or JSON with --json: not --html");
        if (o->num_files < 2)
            usage_error("--merge needs two reports or more (%d given)", o->num_files);
        int stdin_files = 0;
        for (int i = 0; i < o->num_files; i++)
            stdin_files += strcmp(o->files[i], "-") == 0;
        if (stdin_files > 1)
            usage_error("only one of the reports can be standard input");
    } else if (o->compare) {
        if (o->format == FORMAT_HTML)
            usage_error("--compare writes text, or JSON with --json: not --html");
        if (o->num_files != 2)
            usage_error("--compare needs two reports, A.json and B.json (%d given)", o->num_files);
    } else {
        if (o->num_files == 0)
            usage_error("no report given");
        if (o->num_files > 1)
            usage_error("one report at a time ('%s' and '%s'); --compare compares two, --merge many", o->files[0],
                        o->files[1]);
    }
}

/* ---- reading a report: the tree to snapshots -------------------------------- */

/* Where the reader is: the file and the JSON path of the value at hand.
 * The first error is printed; later ones are not (their causes are the
 * first's). */
typedef struct reader_s {
    const char *file;
    char path[512];
    size_t len;
    int failed;
} reader_t;

static size_t path_push(reader_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_push(reader_t *r, const char *fmt, ...)
{
    size_t old = r->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->path + r->len, sizeof r->path - r->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        r->len = cuh_min_size(r->len + (size_t)n, sizeof r->path - 1);
    return old;
}

static size_t path_key(reader_t *r, const char *key)
{
    return r->len ? path_push(r, ".%s", key) : path_push(r, "%s", key);
}

static size_t path_index(reader_t *r, size_t i) { return path_push(r, "[%zu]", i); }

static void path_pop(reader_t *r, size_t old)
{
    r->len = old;
    r->path[old] = '\0';
}

/* "PROG: FILE:LINE:COLUMN: PATH: message" (no LINE:COLUMN when at is NULL). */
__attribute__((format(printf, 3, 4)))
static void fail(reader_t *r, const cuh_json_t *at, const char *fmt, ...)
{
    if (r->failed)
        return;
    r->failed = 1;
    fprintf(stderr, PROG ": %s", r->file);
    if (at)
        fprintf(stderr, ":%u:%u", (unsigned)at->line, (unsigned)at->column);
    fprintf(stderr, ": %s: ", r->len ? r->path : "the document");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* Writes s for a message: at most 60 bytes, control characters as '?'. */
static const char *printable(const char *s, size_t len, char *buf, size_t buflen)
{
    size_t n = 0;
    for (size_t i = 0; i < len && n + 4 < buflen; i++) {
        if (n >= 60) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        unsigned char c = (unsigned char)s[i];
        buf[n++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    buf[n] = '\0';
    return buf;
}

/* The member `key` of obj with the path extended by it (path_pop(r, *saved)
 * restores it). NULL when obj is NULL, or with an error when key is missing
 * and required. */
static const cuh_json_t *member(reader_t *r, const cuh_json_t *obj, const char *key, int required, size_t *saved)
{
    *saved = path_key(r, key);
    if (!obj)
        return NULL;
    const cuh_json_t *v = cuh_json_get(obj, key);
    if (!v && required)
        fail(r, NULL, "missing (from the object at line %u, column %u)", (unsigned)obj->line, (unsigned)obj->column);
    return v;
}

static uint64_t as_u64(reader_t *r, const cuh_json_t *v, uint64_t max)
{
    if (!v)
        return 0;
    if (v->type != CUH_JSON_NUMBER || !(v->v.number.flags & CUH_JSON_UINT64)) {
        if (v->type == CUH_JSON_NUMBER && v->v.number.d >= 18446744073709551615.0)
            fail(r, v, "%g is out of range (at most %" PRIu64 ")", v->v.number.d, max);
        else
            fail(r, v, "expected an unsigned integer, found %s", cuh_json_describe(v));
        return 0;
    }
    if (v->v.number.u > max) {
        fail(r, v, "%" PRIu64 " is out of range (at most %" PRIu64 ")", v->v.number.u, max);
        return 0;
    }
    return v->v.number.u;
}

static int64_t as_i64(reader_t *r, const cuh_json_t *v, int64_t min, int64_t max)
{
    if (!v)
        return 0;
    if (v->type != CUH_JSON_NUMBER || !(v->v.number.flags & CUH_JSON_INT64)) {
        fail(r, v, "expected an integer, found %s", cuh_json_describe(v));
        return 0;
    }
    if (v->v.number.i < min || v->v.number.i > max) {
        fail(r, v, "%" PRId64 " is out of range (%" PRId64 " to %" PRId64 ")", v->v.number.i, min, max);
        return 0;
    }
    return v->v.number.i;
}

static uint64_t get_u64(reader_t *r, const cuh_json_t *obj, const char *key, uint64_t max)
{
    size_t saved;
    uint64_t x = as_u64(r, member(r, obj, key, 1, &saved), max);
    path_pop(r, saved);
    return x;
}

/* An optional unsigned integer: `def` when absent. */
static uint64_t opt_u64(reader_t *r, const cuh_json_t *obj, const char *key, uint64_t max, uint64_t def)
{
    size_t saved;
    const cuh_json_t *v = member(r, obj, key, 0, &saved);
    uint64_t x = v ? as_u64(r, v, max) : def;
    path_pop(r, saved);
    return x;
}

static int64_t get_i64(reader_t *r, const cuh_json_t *obj, const char *key, int64_t min, int64_t max)
{
    size_t saved;
    int64_t x = as_i64(r, member(r, obj, key, 1, &saved), min, max);
    path_pop(r, saved);
    return x;
}

static size_t get_size(reader_t *r, const cuh_json_t *obj, const char *key)
{
    return (size_t)get_u64(r, obj, key, SIZE_MAX);
}

static double get_double(reader_t *r, const cuh_json_t *obj, const char *key)
{
    size_t saved;
    const cuh_json_t *v = member(r, obj, key, 1, &saved);
    double x = 0;
    if (v && v->type != CUH_JSON_NUMBER)
        fail(r, v, "expected a number, found %s", cuh_json_describe(v));
    else if (v)
        x = v->v.number.d;
    path_pop(r, saved);
    return x;
}

static int as_bool(reader_t *r, const cuh_json_t *v)
{
    if (!v)
        return 0;
    if (v->type != CUH_JSON_BOOL) {
        fail(r, v, "expected true or false, found %s", cuh_json_describe(v));
        return 0;
    }
    return v->v.boolean;
}

static int get_bool(reader_t *r, const cuh_json_t *obj, const char *key)
{
    size_t saved;
    int x = as_bool(r, member(r, obj, key, 1, &saved));
    path_pop(r, saved);
    return x;
}

static int opt_bool(reader_t *r, const cuh_json_t *obj, const char *key)
{
    size_t saved;
    const cuh_json_t *v = member(r, obj, key, 0, &saved);
    int x = v ? as_bool(r, v) : 0;
    path_pop(r, saved);
    return x;
}

/* A string without NUL bytes; NULL (with an error) otherwise. */
static const char *as_string(reader_t *r, const cuh_json_t *v)
{
    if (!v)
        return NULL;
    if (v->type != CUH_JSON_STRING) {
        fail(r, v, "expected a string, found %s", cuh_json_describe(v));
        return NULL;
    }
    if (strlen(v->v.string.s) != v->v.string.len) {
        fail(r, v, "the string holds a NUL character (\\u0000)");
        return NULL;
    }
    return v->v.string.s;
}

/* Copies a required (or, with required 0, optional) string into buf; an
 * error if it does not fit. */
static void copy_string(reader_t *r, const cuh_json_t *obj, const char *key, int required, char *buf, size_t len)
{
    size_t saved;
    const cuh_json_t *v = member(r, obj, key, required, &saved);
    const char *s = as_string(r, v);
    if (s) {
        if (v->v.string.len >= len)
            fail(r, v, "too long (%zu bytes; at most %zu)", v->v.string.len, len - 1);
        else
            memcpy(buf, s, v->v.string.len + 1);
    }
    path_pop(r, saved);
}

/* A required array or object (as `type`), the path extended by its key: the
 * caller pops it. */
static const cuh_json_t *typed_member(reader_t *r, const cuh_json_t *obj, const char *key, cuh_json_type_t type,
                                      int required, size_t *saved)
{
    const cuh_json_t *v = member(r, obj, key, required, saved);
    if (v && v->type != type) {
        fail(r, v, "expected %s, found %s", cuh_json_type_name(type), cuh_json_describe(v));
        return NULL;
    }
    return v;
}

static const cuh_json_t *get_node(reader_t *r, const cuh_json_t *obj, const char *key, cuh_json_type_t type,
                                  size_t *saved)
{
    return typed_member(r, obj, key, type, 1, saved);
}

/* An optional member: NULL when absent, and (after an error) when of
 * another type than `type`. */
static const cuh_json_t *opt_node(reader_t *r, const cuh_json_t *obj, const char *key, cuh_json_type_t type,
                                  size_t *saved)
{
    return typed_member(r, obj, key, type, 0, saved);
}

/* Element i of an array, which must be an object; the path extended by
 * "[i]": the caller pops it. */
static const cuh_json_t *get_item(reader_t *r, const cuh_json_t *array, size_t i, size_t *saved)
{
    *saved = path_index(r, i);
    const cuh_json_t *v = cuh_json_at(array, i);
    if (v && v->type != CUH_JSON_OBJECT) {
        fail(r, v, "expected an object, found %s", cuh_json_describe(v));
        return NULL;
    }
    return v;
}

/* Matches a string value against names[0..n): its index, or -1 with an error. */
static int get_enum(reader_t *r, const cuh_json_t *obj, const char *key, const char *const *names, int n)
{
    size_t saved;
    const cuh_json_t *v = member(r, obj, key, 1, &saved);
    const char *s = as_string(r, v);
    int found = -1;
    if (s) {
        for (int i = 0; i < n && found < 0; i++)
            if (strcmp(s, names[i]) == 0)
                found = i;
        if (found < 0) {
            char list[256] = "", shown[80];
            size_t len = 0;
            for (int i = 0; i < n && len < sizeof list - 1; i++) {
                int w = snprintf(list + len, sizeof list - len, "%s\"%s\"", i == 0 ? "" : i == n - 1 ? " or " : ", ",
                                 names[i]);
                len = w > 0 ? cuh_min_size(len + (size_t)w, sizeof list - 1) : len;
            }
            fail(r, v, "\"%s\" is not a valid value (expected %s)", printable(s, v->v.string.len, shown, sizeof shown),
                 list);
        }
    }
    path_pop(r, saved);
    return found;
}

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

/* An [address, bytes] pair (a mapped range, a block): 1 when it is one. */
static int read_range(reader_t *r, const cuh_json_t *pair, uint64_t *addr, uint64_t *size)
{
    if (pair->type != CUH_JSON_ARRAY || pair->v.array.n != 2) {
        fail(r, pair, "expected [address, bytes], found %s", cuh_json_describe(pair));
        return 0;
    }
    *addr = as_u64(r, cuh_json_at(pair, 0), UINT64_MAX);
    *size = as_u64(r, cuh_json_at(pair, 1), UINT64_MAX);
    return 1;
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

static void read_oom(reader_t *r, const cuh_json_t *d, cuh_heap_snapshot_t *s)
{
    /* Every cause the library can name, "none" included, by its own names. */
    const char *causes[CUH_OOM_EXTERNAL + 1];
    for (int c = CUH_OOM_NONE; c <= CUH_OOM_EXTERNAL; c++)
        causes[c] = cuh_oom_cause_name((cuh_oom_cause_t)c);
    size_t saved, item;
    const cuh_json_t *o = member(r, d, "oom", 1, &saved);
    if (o && o->type != CUH_JSON_NULL && o->type != CUH_JSON_OBJECT)
        fail(r, o, "expected null or an object, found %s", cuh_json_describe(o));
    if (o && o->type == CUH_JSON_OBJECT && !r->failed) {
        cuh_oom_info_t *x = &s->oom;
        s->has_oom = 1;
        int cause = get_enum(r, o, "cause", causes, CUH_OOM_EXTERNAL + 1);
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
    }
    path_pop(r, saved);
}

/* stats.reserved.current against the segments: what plain segments and the
 * workspace hold, plus the pages a virtual reservation has mapped (the heap
 * may hold a few more physical pages than it has mapped, never fewer). */
static void check_reserved(reader_t *r, const cuh_json_t *d, const cuh_heap_snapshot_t *s)
{
    if (r->failed)
        return;
    uint64_t held = 0;
    int any_virtual = 0;
    for (size_t i = 0; i < s->num_segments; i++) {
        held += s->segments[i].mapped;
        any_virtual |= s->segments[i].virtual_space;
    }
    uint64_t reserved = s->stats.reserved.current;
    if (any_virtual ? held > reserved : held != reserved) {
        size_t saved = path_key(r, "stats");
        path_key(r, "reserved");
        path_key(r, "current");
        const cuh_json_t *at = cuh_json_get(cuh_json_get(cuh_json_get(d, "stats"), "reserved"), "current");
        fail(r, at, "%" PRIu64 " bytes, but the segments hold %" PRIu64, reserved, held);
        path_pop(r, saved);
    }
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

static void report_free(report_t *rep)
{
    for (size_t i = 0; i < rep->num_snaps; i++)
        cuh_heap_snapshot_free(rep->snaps[i]);
    free(rep->snaps);
    free(rep->device_nodes);
    cuh_json_free(rep->doc);
    memset(rep, 0, sizeof *rep);
}

/* Reads `file` into rep: 0, or -1 after printing why. */
static int report_load(const char *file, report_t *rep)
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

/* ---- output ---------------------------------------------------------------- */

/* What the renderers take after the devices: no pinned statistics for a
 * report without "pinned_host", no callers for one without "callers", so
 * that a report is rendered again as it was. */
static cuh_report_extra_t report_extra(const report_t *rep)
{
    return (cuh_report_extra_t){.pinned = rep->has_pinned ? &rep->pinned : NULL,
                                .callers = rep->callers,
                                .num_callers = rep->num_callers};
}

static FILE *open_output(const char *path)
{
    if (!path || strcmp(path, "-") == 0)
        return stdout;
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, PROG ": cannot write %s: %s\n", path, strerror(errno));
    return f;
}

/* 0, or -1 after printing why. */
static int close_output(FILE *f, const char *path)
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

/* Devices are matched by number: each may appear once in a report. */
static int check_unique_devices(const report_t *rep)
{
    for (size_t i = 1; i < rep->num_snaps; i++)
        for (size_t j = 0; j < i; j++)
            if (rep->snaps[i]->device == rep->snaps[j]->device) {
                const cuh_json_t *d = rep->device_nodes[i];
                fprintf(stderr, PROG ": %s:%u:%u: devices[%zu].device: device %d appears twice (also devices[%zu]); "
                                "--compare matches devices by number\n",
                        rep->file, (unsigned)d->line, (unsigned)d->column, i, rep->snaps[i]->device, j);
                return -1;
            }
    return 0;
}

static int cmp_int(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return a < b ? -1 : a > b;
}

/* The device numbers of both reports, sorted, each once; NULL when out of memory. */
static int *device_union(const report_t *a, const report_t *b, size_t *n)
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

static void compare_text(FILE *out, const report_t *a, const report_t *b, const int *devices, size_t n)
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

static void compare_json(FILE *out, const report_t *a, const report_t *b, const int *devices, size_t n)
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

static void merge_text(FILE *out, const report_t *reps, int n)
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

static void merge_json(FILE *out, const report_t *reps, int n)
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

int main(int argc, char **argv)
{
    options_t o;
    parse_options(argc, argv, &o);
    if (o.compare && strcmp(o.files[0], "-") == 0 && strcmp(o.files[1], "-") == 0)
        usage_error("only one of the two reports can be standard input");

    report_t *reps = calloc((size_t)(o.num_files ? o.num_files : 1), sizeof *reps);
    if (!reps) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    int loaded = 0, rc = 0;
    for (int i = 0; i < o.num_files && rc == 0; i++) {
        if (report_load(o.files[i], &reps[i]) != 0)
            rc = 1;
        loaded = i + 1;
    }
    if (rc == 0 && o.compare && (check_unique_devices(&reps[0]) != 0 || check_unique_devices(&reps[1]) != 0))
        rc = 1;
    size_t num_devices = 0;
    int *devices = NULL;
    if (rc == 0 && o.compare && !(devices = device_union(&reps[0], &reps[1], &num_devices))) {
        fprintf(stderr, PROG ": out of memory\n");
        rc = 1;
    }
    FILE *out = rc == 0 ? open_output(o.output) : NULL;
    if (rc == 0 && !out)
        rc = 1;
    if (out) {
        const cuh_report_extra_t extra = report_extra(&reps[0]);
        if (o.merge && o.format == FORMAT_JSON)
            merge_json(out, reps, o.num_files);
        else if (o.merge)
            merge_text(out, reps, o.num_files);
        else if (o.compare && o.format == FORMAT_JSON)
            compare_json(out, &reps[0], &reps[1], devices, num_devices);
        else if (o.compare)
            compare_text(out, &reps[0], &reps[1], devices, num_devices);
        else if (o.format == FORMAT_JSON)
            cuh_report_json(out, reps[0].origin, reps[0].snaps, reps[0].num_snaps, &extra);
        else if (o.format == FORMAT_HTML)
            cuh_report_html(out, reps[0].origin, reps[0].snaps, reps[0].num_snaps, &extra);
        else
            cuh_report_text(out, reps[0].origin, reps[0].snaps, reps[0].num_snaps, &extra);
        if (close_output(out, o.output) != 0)
            rc = 1;
    }
    free(devices);
    for (int i = 0; i < loaded; i++)
        report_free(&reps[i]);
    free(reps);
    free(o.files);
    return rc;
}
