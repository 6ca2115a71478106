/* report_tool.h - what the parts of cuheap-report share: a report read back
 * (report_t), the reader that checks every value of it (reader_t), and the
 * functions each part offers the others.
 *   report.c         the command line: options, and what runs
 *   report_read.c    reading: a JSON report into the heap snapshots it came from
 *   report_check.c   checking: each value as it is read, named by its JSON path when wrong
 *   report_render.c  rendering: a report again, --compare and --merge
 */
#ifndef CUH_TOOLS_REPORT_TOOL_H
#define CUH_TOOLS_REPORT_TOOL_H

#include "common.h"
#include "heap.h"
#include "json_read.h"

#include <cuheap.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define PROG "cuheap-report"
#define REPORT_SCHEMA "cuheap-report"
#define REPORT_VERSION 1

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

/* Where the reader is: the file and the JSON path of the value at hand.
 * The first error is printed; later ones are not (their causes are the
 * first's). */
typedef struct reader_s {
    const char *file;
    char path[512];
    size_t len;
    int failed;
} reader_t;

/* report_read.c: reading */
void report_free(report_t *rep);
int report_load(const char *file, report_t *rep);

/* report_check.c: checking */
size_t path_key(reader_t *r, const char *key);
size_t path_index(reader_t *r, size_t i);
void path_pop(reader_t *r, size_t old);
__attribute__((format(printf, 3, 4)))
void fail(reader_t *r, const cuh_json_t *at, const char *fmt, ...);
const char *printable(const char *s, size_t len, char *buf, size_t buflen);
const cuh_json_t *member(reader_t *r, const cuh_json_t *obj, const char *key, int required, size_t *saved);
uint64_t as_u64(reader_t *r, const cuh_json_t *v, uint64_t max);
uint64_t get_u64(reader_t *r, const cuh_json_t *obj, const char *key, uint64_t max);
uint64_t opt_u64(reader_t *r, const cuh_json_t *obj, const char *key, uint64_t max, uint64_t def);
int64_t get_i64(reader_t *r, const cuh_json_t *obj, const char *key, int64_t min, int64_t max);
size_t get_size(reader_t *r, const cuh_json_t *obj, const char *key);
double get_double(reader_t *r, const cuh_json_t *obj, const char *key);
int get_bool(reader_t *r, const cuh_json_t *obj, const char *key);
int opt_bool(reader_t *r, const cuh_json_t *obj, const char *key);
void copy_string(reader_t *r, const cuh_json_t *obj, const char *key, int required, char *buf, size_t len);
const cuh_json_t *get_node(reader_t *r, const cuh_json_t *obj, const char *key, cuh_json_type_t type,
                           size_t *saved);
const cuh_json_t *opt_node(reader_t *r, const cuh_json_t *obj, const char *key, cuh_json_type_t type,
                           size_t *saved);
const cuh_json_t *get_item(reader_t *r, const cuh_json_t *array, size_t i, size_t *saved);
int get_enum(reader_t *r, const cuh_json_t *obj, const char *key, const char *const *names, int n);
int read_range(reader_t *r, const cuh_json_t *pair, uint64_t *addr, uint64_t *size);
void check_reserved(reader_t *r, const cuh_json_t *d, const cuh_heap_snapshot_t *s);
int check_unique_devices(const report_t *rep);

/* report_render.c: rendering */
cuh_report_extra_t report_extra(const report_t *rep);
FILE *open_output(const char *path);
int close_output(FILE *f, const char *path);
int *device_union(const report_t *a, const report_t *b, size_t *n);
void compare_text(FILE *out, const report_t *a, const report_t *b, const int *devices, size_t n);
void compare_json(FILE *out, const report_t *a, const report_t *b, const int *devices, size_t n);
void merge_text(FILE *out, const report_t *reps, int n);
void merge_json(FILE *out, const report_t *reps, int n);

#endif /* CUH_TOOLS_REPORT_TOOL_H */
