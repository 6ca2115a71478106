/* report_check.c - checking a report as cuheap-report reads it. Every value
 * goes through a typed accessor that says what is wrong and where: the file,
 * the line and column, and the value's JSON path
 * ("devices[0].stats.reserved.peak: missing"); the first error is printed, the
 * ones it causes are not. Also here, the checks across parts: the reserved
 * bytes against what the segments hold, and one entry per device for
 * --compare. A check of values while they are read (extents that tile their
 * segment, samples in time order) stays with their reading in report_read.c.
 */
#include "report_tool.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

size_t path_key(reader_t *r, const char *key)
{
    return r->len ? path_push(r, ".%s", key) : path_push(r, "%s", key);
}

size_t path_index(reader_t *r, size_t i) { return path_push(r, "[%zu]", i); }

void path_pop(reader_t *r, size_t old)
{
    r->len = old;
    r->path[old] = '\0';
}

/* "PROG: FILE:LINE:COLUMN: PATH: message" (no LINE:COLUMN when at is NULL). */
__attribute__((format(printf, 3, 4)))
void fail(reader_t *r, const cuh_json_t *at, const char *fmt, ...)
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
const char *printable(const char *s, size_t len, char *buf, size_t buflen)
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
const cuh_json_t *member(reader_t *r, const cuh_json_t *obj, const char *key, int required, size_t *saved)
{
    *saved = path_key(r, key);
    if (!obj)
        return NULL;
    const cuh_json_t *v = cuh_json_get(obj, key);
    if (!v && required)
        fail(r, NULL, "missing (from the object at line %u, column %u)", (unsigned)obj->line, (unsigned)obj->column);
    return v;
}

uint64_t as_u64(reader_t *r, const cuh_json_t *v, uint64_t max)
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

uint64_t get_u64(reader_t *r, const cuh_json_t *obj, const char *key, uint64_t max)
{
    size_t saved;
    uint64_t x = as_u64(r, member(r, obj, key, 1, &saved), max);
    path_pop(r, saved);
    return x;
}

/* An optional unsigned integer: `def` when absent. */
uint64_t opt_u64(reader_t *r, const cuh_json_t *obj, const char *key, uint64_t max, uint64_t def)
{
    size_t saved;
    const cuh_json_t *v = member(r, obj, key, 0, &saved);
    uint64_t x = v ? as_u64(r, v, max) : def;
    path_pop(r, saved);
    return x;
}

int64_t get_i64(reader_t *r, const cuh_json_t *obj, const char *key, int64_t min, int64_t max)
{
    size_t saved;
    int64_t x = as_i64(r, member(r, obj, key, 1, &saved), min, max);
    path_pop(r, saved);
    return x;
}

size_t get_size(reader_t *r, const cuh_json_t *obj, const char *key)
{
    return (size_t)get_u64(r, obj, key, SIZE_MAX);
}

double get_double(reader_t *r, const cuh_json_t *obj, const char *key)
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

int get_bool(reader_t *r, const cuh_json_t *obj, const char *key)
{
    size_t saved;
    int x = as_bool(r, member(r, obj, key, 1, &saved));
    path_pop(r, saved);
    return x;
}

int opt_bool(reader_t *r, const cuh_json_t *obj, const char *key)
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
void copy_string(reader_t *r, const cuh_json_t *obj, const char *key, int required, char *buf, size_t len)
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

const cuh_json_t *get_node(reader_t *r, const cuh_json_t *obj, const char *key, cuh_json_type_t type,
                           size_t *saved)
{
    return typed_member(r, obj, key, type, 1, saved);
}

/* An optional member: NULL when absent, and (after an error) when of
 * another type than `type`. */
const cuh_json_t *opt_node(reader_t *r, const cuh_json_t *obj, const char *key, cuh_json_type_t type,
                           size_t *saved)
{
    return typed_member(r, obj, key, type, 0, saved);
}

/* Element i of an array, which must be an object; the path extended by
 * "[i]": the caller pops it. */
const cuh_json_t *get_item(reader_t *r, const cuh_json_t *array, size_t i, size_t *saved)
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
int get_enum(reader_t *r, const cuh_json_t *obj, const char *key, const char *const *names, int n)
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

/* An [address, bytes] pair (a mapped range, a block): 1 when it is one. */
int read_range(reader_t *r, const cuh_json_t *pair, uint64_t *addr, uint64_t *size)
{
    if (pair->type != CUH_JSON_ARRAY || pair->v.array.n != 2) {
        fail(r, pair, "expected [address, bytes], found %s", cuh_json_describe(pair));
        return 0;
    }
    *addr = as_u64(r, cuh_json_at(pair, 0), UINT64_MAX);
    *size = as_u64(r, cuh_json_at(pair, 1), UINT64_MAX);
    return 1;
}

/* stats.reserved.current against the segments: what plain segments and the
 * workspace hold, plus the pages a virtual reservation has mapped (the heap
 * may hold a few more physical pages than it has mapped, never fewer). */
void check_reserved(reader_t *r, const cuh_json_t *d, const cuh_heap_snapshot_t *s)
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

/* Devices are matched by number: each may appear once in a report. */
int check_unique_devices(const report_t *rep)
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
