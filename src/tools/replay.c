/* replay.c - cuheap-replay: replays allocation traces against the heap.
 *
 * Each trace (cuheap's trace format or an RMM logging-adaptor CSV) is loaded
 * whole first, then replayed on a fresh simulated device: every allocation
 * and free of the recorded program, in order, through cuh_heap_malloc and
 * cuh_heap_free. What comes out is what the heap paid for the workload: the
 * peak of reserved device memory over the peak of live requested bytes (the
 * fragmentation ratio, compared with the one PyTorch paid when the trace was
 * recorded), the time per operation, and, when the device was too small, the
 * heap's own account of the out-of-memory. With --min-capacity it also
 * searches for the smallest device the trace runs on. Beside cuheap's
 * figures it gives PyTorch's: its own allocator, native and with
 * expandable_segments, modelled on the same trace and device
 * (torch_model.h). No GPU is needed.
 *
 * Exit status: 0 when every trace was replayed (an out-of-memory is a result),
 * 1 for a malformed trace or a heap error, 2 for a usage error.
 */
#include "common.h"
#include "config.h"
#include "device.h"
#include "heap.h"
#include "step_plan.h"
#include "torch_model.h"
#include "trace_read.h"

#include <cuheap.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "cuheap-replay"
#include "cli.h"
#define DEFAULT_CAPACITY ((size_t)80 * CUH_GiB)
/* --min-capacity finds the smallest capacity to within this. */
#define SEARCH_GRAIN CUH_SEGMENT_GRAIN
/* --report-at: where the report is taken, when not after a given event. */
#define REPORT_AT_END (-1L)    /* at the first out-of-memory, or at the end */
#define REPORT_AT_PEAK (-2L)   /* after the event that first took reserved memory to its peak */

typedef struct options_s {
    size_t capacity;
    size_t external;          /* --external: bytes used on the device outside cuheap */
    long cudafree_lag;        /* --cudafree LAG: -1 off, else events between GPU catch-ups */
    long lag;                 /* --lag N: stream-ordered replay, events between GPU catch-ups */
    long streams;             /* --streams N: idle streams the program has created */
    long busy_streams;        /* --busy-streams N: streams whose work runs as long as the default stream's */
    cuh_config_t cfg;         /* the way's defaults, then every --conf in order */
    const char *way;          /* --way: "capi" (the default), "plugin" or "preload" */
    int json;
    int min_capacity;
    const char *report;       /* --report PATH ("%t" = trace name), or NULL */
    long report_at;           /* --report-at: REPORT_AT_END, REPORT_AT_PEAK or an event number */
    char **traces;
    int num_traces;
    int marks;                /* --marks 1, --no-marks 0, else -1: the way's (preload: none) */
} options_t;

/* The outcome of one replay. */
typedef struct run_s {
    size_t replayed;          /* events performed, a failed allocation included */
    int oom;                  /* stopped at an out-of-memory */
    size_t oom_event;
    int have_oom_info;
    cuh_oom_info_t oom_info;
    size_t holder_event[CUH_OOM_TOP_HOLDERS];   /* the allocation events of oom_info's stranded top holders
                                                 * (SIZE_MAX: a slab) */
    cuheap_stats_t stats;
    uint64_t elapsed_ns;      /* the replay loop only */
    size_t peak_event;        /* with track_peak: the event after which reserved memory first reached its peak */
    size_t report_event;      /* with a report: the event after which it was taken */
    cuh_sim_counters_t device; /* the simulated device's calls */
    uint64_t page_moves;      /* pages moved from free memory (vmm:1): a move no longer unmaps at once */
    int have_step2;           /* the trace marks step 2's start and the replay got there */
    cuh_sim_counters_t at_step2; /* the device's calls before step 2's first event */
    uint64_t unmaps_at_mark;  /* the device's page unmaps at the last mark */
    uint64_t calls_at_mark;   /* the device's map and unmap calls at the last mark */
    size_t worst_step;        /* of the steps after the first, the one that made the most map calls; 0: none */
    uint64_t worst_step_unmaps, worst_step_calls;
} run_t;

/* The trace's mark number k (from 0) ends step k, which began at mark k - 1
 * (a corpus trace marks each step's start, and its end): follows the step
 * after the first that made the most map and unmap calls (the driver
 * charges per call), the step a user feels. */
static void step_ends(run_t *run, cuh_device_t *dev, size_t k)
{
    cuh_sim_counters_t c;
    cuh_sim_counters(dev, &c);
    const uint64_t calls = c.vm_maps + c.vm_unmaps - run->calls_at_mark;
    if (k >= 2 && (!run->worst_step || calls > run->worst_step_calls)) {
        run->worst_step = k;
        run->worst_step_calls = calls;
        run->worst_step_unmaps = c.vm_unmaps - run->unmaps_at_mark;
    }
    run->unmaps_at_mark = c.vm_unmaps;
    run->calls_at_mark = c.vm_maps + c.vm_unmaps;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options] TRACE...\n"
            "\n"
            "Replays allocation traces (cuheap trace v1, plain or gzip, or RMM's\n"
            "logging-adaptor CSV) against cuheap on a simulated device and reports\n"
            "peak reserved memory over peak live bytes, time per operation and any\n"
            "out-of-memory; beside them the same for PyTorch's own allocator (native\n"
            "and expandable_segments:True), from a model of its rules replayed over\n"
            "the same trace on the same device (a --conf limit applies to it as\n"
            "set_per_process_memory_fraction). An out-of-memory on plain segments\n"
            "by fragmentation or at the limit is replayed again with vmm:1 added,\n"
            "and whether the job then runs on the device is printed (JSON:\n"
            "oom.with_vmm).\n"
            "\n"
            "options:\n"
            "  --capacity BYTES   device memory (default 80G; suffixes K, M, G, T are\n"
            "                     binary units)\n"
            "  --conf STRING      heap settings, CUHEAP_CONF syntax (key:value,...),\n"
            "                     over the defaults of the way in (--way)\n"
            "  --way WAY          replay as the heap runs behind one way in, with its\n"
            "                     defaults: capi (the C API, the default), plugin\n"
            "                     (PyTorch's allocator: stream-ordered frees) or\n"
            "                     preload (LD_PRELOAD: every allocation a cudaMalloc,\n"
            "                     every free a cudaFree; --cudafree 1000 --streams 32\n"
            "                     unless given)\n"
            "  --external BYTES   device memory used by others (other processes), which\n"
            "                     cuheap cannot have\n"
            "  --cudafree LAG     replay as a program run under LD_PRELOAD would: every\n"
            "                     allocation a cudaMalloc and every free a cudaFree\n"
            "                     (device-wide), with the GPU finishing its work only\n"
            "                     every LAG events (0: at once)\n"
            "  --lag N            the GPU finishes its work only every N events (0,\n"
            "                     the default: at once), for a stream-ordered replay:\n"
            "                     memory freed on a stream is pending for other\n"
            "                     streams until the GPU has passed the free (as on a\n"
            "                     busy GPU); under vmm:1 only the freeing stream's\n"
            "                     own blocks may take its pages before that\n"
            "  --streams N        with --cudafree: the program has also created N\n"
            "                     streams that stay idle (PyTorch creates 32 the\n"
            "                     first time it takes a stream from its pool);\n"
            "                     cuheap must cover them at every cudaFree\n"
            "  --busy-streams N   with --cudafree: N more streams that run work, done\n"
            "                     as late as the default stream's (NCCL's streams\n"
            "                     under DDP): device calls grow with busy streams\n"
            "  --report PATH      write the heap's report at the first out-of-memory, or\n"
            "                     at the end: JSON if PATH ends in .json, HTML if in\n"
            "                     .html, else text;\n"
            "                     %%t in PATH becomes the trace's name\n"
            "  --report-at WHEN   with --report: take it after event number WHEN\n"
            "                     (counted from 0, as in the out-of-memory line), or\n"
            "                     'peak': after the event that first took reserved\n"
            "                     memory to its peak (what was held there and why), or\n"
            "                     'end' (the default: the first out-of-memory, or the\n"
            "                     end); a replay cut short by an out-of-memory before\n"
            "                     that event takes it there\n"
            "  --marks, --no-marks  whether the heap is told where the trace's steps end\n"
            "                     (cuheap_mark_step, as cuheap's PyTorch package does at\n"
            "                     every optimizer step); the steps are counted either\n"
            "                     way. Default: told, but not with --way preload (a\n"
            "                     program under LD_PRELOAD marks none: with step_plan\n"
            "                     the heap finds its steps in its allocations)\n"
            "  --settings         print every CUHEAP_CONF key with its default and exit\n"
            "  --min-capacity     also find the smallest capacity (to within 2 MiB)\n"
            "                     that replays the trace without out-of-memory, for\n"
            "                     cuheap and for PyTorch's two modes\n"
            "  --json             one JSON object per trace per line\n"
            "  -h, --help         this text\n"
            "\n"
            "exit status: 0 every trace replayed (out-of-memory is a result),\n"
            "1 malformed trace or heap error, 2 usage error\n");
}

/* "80G", "512MiB", "1.5g", "1073741824": bytes, binary units. 0 or -1. */
static int parse_bytes(const char *s, size_t *out)
{
    const char *p = s;
    uint64_t whole = 0;
    double frac = 0.0, scale = 0.1;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return -1;
        whole = whole * 10 + d;
    }
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return -1;
        for (; *p >= '0' && *p <= '9'; p++) {
            frac += scale * (double)(*p - '0');
            scale /= 10.0;
        }
    }
    unsigned shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    case 't': case 'T': shift = 40; p++; break;
    default: break;
    }
    if (shift && (*p == 'i' || *p == 'I'))
        p++;
    if (*p == 'b' || *p == 'B')
        p++;
    if (*p != '\0')
        return -1;
    if (shift && whole > (UINT64_MAX >> shift))
        return -1;
    uint64_t bytes = whole << shift;
    uint64_t extra = (uint64_t)(frac * (double)((uint64_t)1 << shift));
    if (bytes > UINT64_MAX - extra || bytes + extra == 0 || bytes + extra > (uint64_t)SIZE_MAX)
        return -1;
    *out = (size_t)(bytes + extra);
    return 0;
}

/* A count option's value: a whole number from 0 to max, else a usage error
 * naming the option and what it counts. */
static long count_value(const char *option, const char *value, long max, const char *expected)
{
    char *end;
    long n = strtol(value, &end, 10);
    if (!*value || *end || n < 0 || n > max)
        usage_error("bad %s value '%s' (expected %s)", option, value, expected);
    return n;
}

static void parse_options(int argc, char **argv, options_t *o)
{
    memset(o, 0, sizeof *o);
    o->capacity = DEFAULT_CAPACITY;
    o->cudafree_lag = -1;
    o->report_at = REPORT_AT_END;
    o->way = "capi";
    o->marks = -1;
    o->traces = calloc((size_t)argc, sizeof *o->traces);
    const char **confs = calloc((size_t)argc, sizeof *confs);
    int num_confs = 0, streams_given = 0;
    if (!o->traces || !confs) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    int only_files = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_files || a[0] != '-' || a[1] == '\0') {
            o->traces[o->num_traces++] = argv[i];
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_files = 1;
            continue;
        }
        /* Options with a value take it as "--opt VALUE" or "--opt=VALUE". */
        const char *eq = strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        const char *value = eq ? eq + 1 : NULL;
        int takes_value = (name_len == 10 && strncmp(a, "--capacity", 10) == 0) ||
                          (name_len == 10 && strncmp(a, "--external", 10) == 0) ||
                          (name_len == 10 && strncmp(a, "--cudafree", 10) == 0) ||
                          (name_len == 9 && strncmp(a, "--streams", 9) == 0) ||
                          (name_len == 14 && strncmp(a, "--busy-streams", 14) == 0) ||
                          (name_len == 5 && strncmp(a, "--lag", 5) == 0) ||
                          (name_len == 6 && strncmp(a, "--conf", 6) == 0) ||
                          (name_len == 5 && strncmp(a, "--way", 5) == 0) ||
                          (name_len == 8 && strncmp(a, "--report", 8) == 0) ||
                          (name_len == 11 && strncmp(a, "--report-at", 11) == 0);
        if (takes_value && !value) {
            if (i + 1 >= argc)
                usage_error("option '%.*s' needs a value", (int)name_len, a);
            value = argv[++i];
        } else if (!takes_value && value) {
            int known = (name_len == 14 && strncmp(a, "--min-capacity", 14) == 0) ||
                        (name_len == 7 && strncmp(a, "--marks", 7) == 0) ||
                        (name_len == 10 && strncmp(a, "--no-marks", 10) == 0) ||
                        (name_len == 6 && strncmp(a, "--json", 6) == 0) ||
                        (name_len == 10 && strncmp(a, "--settings", 10) == 0) ||
                        (name_len == 6 && strncmp(a, "--help", 6) == 0) ||
                        (name_len == 2 && strncmp(a, "-h", 2) == 0);
            if (known)
                usage_error("option '%.*s' takes no value", (int)name_len, a);
            usage_error("unknown option '%s'", a);
        }
        if (name_len == 10 && strncmp(a, "--capacity", 10) == 0) {
            if (parse_bytes(value, &o->capacity) != 0)
                usage_error("bad --capacity value '%s' (expected a number of bytes > 0, "
                            "e.g. 80G, 512M, 1.5G, 1073741824)", value);
        } else if (name_len == 6 && strncmp(a, "--conf", 6) == 0) {
            confs[num_confs++] = value;
        } else if (name_len == 5 && strncmp(a, "--way", 5) == 0) {
            if (strcmp(value, "capi") != 0 && strcmp(value, "plugin") != 0 && strcmp(value, "preload") != 0)
                usage_error("bad --way value '%s' (expected capi, plugin or preload)", value);
            o->way = value;
        } else if (name_len == 10 && strncmp(a, "--external", 10) == 0) {
            if (parse_bytes(value, &o->external) != 0)
                usage_error("bad --external value '%s' (expected a number of bytes, e.g. 4G)", value);
        } else if (name_len == 10 && strncmp(a, "--cudafree", 10) == 0) {
            o->cudafree_lag = count_value("--cudafree", value, LONG_MAX, "a number of events, 0 or more");
        } else if (name_len == 5 && strncmp(a, "--lag", 5) == 0) {
            o->lag = count_value("--lag", value, LONG_MAX, "a number of events, 0 or more");
        } else if (name_len == 9 && strncmp(a, "--streams", 9) == 0) {
            o->streams = count_value("--streams", value, 4096, "a number of streams, 0 to 4096");
            streams_given = 1;
        } else if (name_len == 14 && strncmp(a, "--busy-streams", 14) == 0) {
            o->busy_streams = count_value("--busy-streams", value, 4096, "a number of streams, 0 to 4096");
        } else if (name_len == 8 && strncmp(a, "--report", 8) == 0) {
            if (!*value)
                usage_error("--report needs a file name");
            o->report = value;
        } else if (name_len == 11 && strncmp(a, "--report-at", 11) == 0) {
            if (strcmp(value, "peak") == 0)
                o->report_at = REPORT_AT_PEAK;
            else if (strcmp(value, "end") == 0)
                o->report_at = REPORT_AT_END;
            else
                o->report_at = count_value("--report-at", value, LONG_MAX,
                                           "an event number (0 or more), 'peak' or 'end'");
        } else if (strcmp(a, "--marks") == 0) {
            o->marks = 1;
        } else if (strcmp(a, "--no-marks") == 0) {
            o->marks = 0;
        } else if (strcmp(a, "--min-capacity") == 0) {
            o->min_capacity = 1;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--settings") == 0) {
            cuh_config_print_table(stdout);
            exit(0);
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else {
            usage_error("unknown option '%s'", a);
        }
    }
    unsigned ways = 0;
    if (strcmp(o->way, "plugin") == 0) {
        if (o->cudafree_lag >= 0)
            usage_error("--way plugin replays stream-ordered frees; --cudafree is the preload way's");
        ways = CUH_WAY_PLUGIN;
    } else if (strcmp(o->way, "preload") == 0) {
        if (o->lag)
            usage_error("--way preload replays cudaFree's; give its lag with --cudafree LAG, not --lag");
        ways = CUH_WAY_INTERPOSER;
        if (o->cudafree_lag < 0)
            o->cudafree_lag = 1000;
        if (!streams_given)
            o->streams = 32;
    }
    if (o->marks < 0)
        o->marks = !(ways & CUH_WAY_INTERPOSER);   /* under LD_PRELOAD the program marks no steps */
    cuh_config_defaults_for(&o->cfg, ways);
    for (int k = 0; k < num_confs; k++) {
        char err[1024] = "";
        if (cuh_config_parse(confs[k], &o->cfg, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": %s\n", err[0] ? err : "bad --conf value");
            exit(2);
        }
    }
    free(confs);
    if (o->num_traces == 0)
        usage_error("no trace given");
    if (o->lag && o->cudafree_lag >= 0)
        usage_error("--lag is for stream-ordered replays; --cudafree takes its own lag");
    if (o->streams && o->cudafree_lag < 0)
        usage_error("--streams needs --cudafree (idle streams matter only to device-wide frees)");
    if (o->busy_streams && o->cudafree_lag < 0)
        usage_error("--busy-streams needs --cudafree (other streams' work matters only to device-wide frees)");
    if (o->report_at != REPORT_AT_END && !o->report)
        usage_error("--report-at needs --report PATH (where to write the report)");
    if (o->report && o->num_traces > 1 && !strstr(o->report, "%t"))
        usage_error("--report with several traces needs %%t in the file name (replaced by each trace's name)");
}

/* ---- one replay ------------------------------------------------------------ */

static uint64_t elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    int64_t ns = (int64_t)(b->tv_sec - a->tv_sec) * 1000000000 + (int64_t)(b->tv_nsec - a->tv_nsec);
    return ns > 0 ? (uint64_t)ns : 0;
}

/* Replays `t` on a fresh simulated device of `capacity` bytes and a fresh
 * heap. 0 when the trace ran to its end or to an out-of-memory; -1 on any
 * other failure (already reported on stderr). With `report`, the heap's
 * report is written after event `report_at` (an event number), or where the
 * replay stops (report_at < 0 or beyond that). With track_peak, the device's
 * memory in use is read after every event (slower: never for timing) to find
 * run->peak_event. */
static int write_report(cuh_heap_t *heap, const char *pattern, const char *trace_path);
static void short_name(const char *path, char *out, size_t len);

static size_t g_external;   /* --external, for every replay */
static long g_cudafree_lag = -1;   /* --cudafree, for every replay */
static int g_marks = 1;            /* the heap is told where the trace's steps end (--marks) */
static long g_lag;                 /* --lag, for every replay */
static long g_streams;             /* --streams, for every replay */
static long g_busy_streams;        /* --busy-streams */

/* The handle of the k-th busy stream (--busy-streams). */
static cuh_stream_t busy_stream(long k) { return (cuh_stream_t)(0x20000000 + (uintptr_t)k * 0x100); }

/* A busy stream always has work running, done at the GPU's next catch-up
 * (what a device-wide event waits for; an event per stream is work of its
 * own): a piece of work on each. */
static void busy_streams_work(cuh_device_t *dev)
{
    for (long k = 0; k < g_busy_streams; k++)
        cuh_sim_enqueue_work(dev, busy_stream(k));
}

/* For each block holding the most stranded memory at an out-of-memory at
 * event `at`: the allocation event still live then whose block starts at
 * its address (SIZE_MAX for a slab of small blocks, which no event names). */
static void find_holder_events(const cuh_trace_t *t, const uintptr_t *addrs, size_t at, const cuh_oom_info_t *o,
                               size_t *events)
{
    for (size_t k = 0; k < o->stranded.num_top_holders; k++) {
        events[k] = SIZE_MAX;
        for (size_t i = at; i-- > 0;) {
            const cuh_trace_event_t *e = &t->events[i];
            if (e->kind == CUH_TRACE_ALLOC && addrs[i] == o->stranded.top_holders[k].addr &&
                (e->match == CUH_TRACE_NO_MATCH || e->match > at)) {
                events[k] = i;
                break;
            }
        }
    }
}

static int replay_once(const cuh_trace_t *t, size_t capacity, const cuh_config_t *cfg,
                       uintptr_t *addrs, run_t *run, const char *report, long report_at, int track_peak)
{
    size_t most_used = 0;
    int reported = 0;
    memset(run, 0, sizeof *run);
    cuh_device_t *dev = cuh_sim_create(&(cuh_sim_params_t){.capacity = capacity, .ordinal = 0});
    if (!dev) {
        fprintf(stderr, PROG ": %s: cannot create a simulated device of %zu bytes\n", t->path, capacity);
        return -1;
    }
    cuh_sim_set_external(dev, g_external);
    char err[1024] = "";
    cuh_heap_t *heap = cuh_heap_create(dev, cfg, err, sizeof err);
    if (!heap) {
        fprintf(stderr, PROG ": %s: cannot create the heap: %s\n", t->path, err[0] ? err : "unknown error");
        dev->ops->destroy(dev);
        return -1;
    }

    const cuh_trace_event_t *ev = t->events;
    const size_t n = t->num_events;
    size_t i;
    cuheap_status_t st = CUHEAP_OK;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const long lag = g_cudafree_lag >= 0 ? g_cudafree_lag : g_lag;
    if (lag > 0)
        cuh_sim_hold_events(dev, 1);
    for (long k = 0; k < g_streams && st == CUHEAP_OK; k++) {
        cuh_stream_t idle = (cuh_stream_t)(0x10000 + (uintptr_t)k * 0x100);
        cuh_sim_stream_idle(dev, idle);
        st = cuh_heap_register_stream(heap, idle);
    }
    for (long k = 0; k < g_busy_streams && st == CUHEAP_OK; k++)
        st = cuh_heap_register_stream(heap, busy_stream(k));
    if (st != CUHEAP_OK) {
        fprintf(stderr, PROG ": %s: cannot register %ld streams: %s\n", t->path, g_streams + g_busy_streams,
                cuheap_last_error());
        cuh_heap_destroy(heap);
        dev->ops->destroy(dev);
        return -1;
    }
    if (lag > 0)
        busy_streams_work(dev);
    size_t next_mark = 0;   /* the trace's marks are its steps: the heap's reports show them */
    for (i = 0; i < n; i++) {
        for (; cuh_unlikely(next_mark < t->num_marks && t->mark_events[next_mark] == i); next_mark++) {
            if (next_mark == 1) {   /* step 2 starts here: what every later step pays is counted from it */
                cuh_sim_counters(dev, &run->at_step2);
                run->have_step2 = 1;
            }
            if (g_marks)
                cuh_heap_mark_step(heap);
            step_ends(run, dev, next_mark);
        }
        if (g_cudafree_lag >= 0) {
            /* cudaMalloc and cudaFree: any stream may use the block. */
            if (ev[i].kind == CUH_TRACE_ALLOC)
                st = cuh_heap_malloc_device_wide(heap, (size_t)ev[i].size, &addrs[i]);
            else
                st = cuh_heap_free_device_wide(heap, addrs[ev[i].match]);
        } else if (ev[i].kind == CUH_TRACE_ALLOC) {
            st = cuh_heap_malloc(heap, (size_t)ev[i].size, (cuh_stream_t)ev[i].stream, &addrs[i]);
        } else {
            st = cuh_heap_free(heap, addrs[ev[i].match], (cuh_stream_t)ev[i].stream);
        }
        if (lag > 0 && i % (size_t)lag == 0) {
            cuh_sim_complete_all(dev);
            busy_streams_work(dev);
        }
        if (cuh_unlikely(st != CUHEAP_OK))
            break;
        if (cuh_unlikely(track_peak)) {
            cuh_sim_counters_t c;
            cuh_sim_counters(dev, &c);
            if (c.used > most_used) {
                most_used = c.used;
                run->peak_event = i;
            }
        }
        if (cuh_unlikely(report && report_at >= 0 && i == (size_t)report_at)) {
            run->report_event = i;
            reported = 1;
            if (write_report(heap, report, t->path) != 0) {
                cuh_heap_destroy(heap);
                dev->ops->destroy(dev);
                return -1;
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (i == n) {
        const int ends_with_mark = t->num_marks && t->mark_events[t->num_marks - 1] == n;
        for (; next_mark < t->num_marks; next_mark++) {   /* marks after the last event ("end") */
            if (g_marks)
                cuh_heap_mark_step(heap);
            step_ends(run, dev, next_mark);
        }
        if (t->num_marks && !ends_with_mark)
            step_ends(run, dev, t->num_marks);   /* the last step ran to the trace's end */
    }
    run->elapsed_ns = elapsed_ns(&t0, &t1);
    run->replayed = i < n ? i + 1 : n;

    int rc = 0;
    if (st == CUHEAP_ERR_OUT_OF_MEMORY && ev[i].kind == CUH_TRACE_ALLOC) {
        run->oom = 1;
        run->oom_event = i;
        run->have_oom_info = cuh_heap_last_oom(heap, &run->oom_info);
        if (!run->have_oom_info) {
            memset(&run->oom_info, 0, sizeof run->oom_info);
            run->oom_info.request = (size_t)ev[i].size;
            run->oom_info.stream = (cuh_stream_t)ev[i].stream;
        }
        find_holder_events(t, addrs, i, &run->oom_info, run->holder_event);
    } else if (st != CUHEAP_OK) {
        const cuh_trace_event_t *e = &ev[i];
        const char *why = cuheap_last_error();
        if (e->kind == CUH_TRACE_ALLOC)
            fprintf(stderr,
                    PROG ": %s:%" PRIu32 ": event %zu: cuh_heap_malloc(%" PRIu64 " bytes, stream %" PRIu64
                    ") for id %" PRIu64 " failed: %s%s%s\n",
                    t->path, e->line, i, e->size, e->stream, e->id, cuheap_status_string(st),
                    why && why[0] ? ": " : "", why ? why : "");
        else
            fprintf(stderr,
                    PROG ": %s:%" PRIu32 ": event %zu: cuh_heap_free(0x%" PRIxPTR ", stream %" PRIu64
                    ") of id %" PRIu64 " (allocated on line %" PRIu32 ") failed: %s%s%s\n",
                    t->path, e->line, i, addrs[e->match], e->stream, e->id, ev[e->match].line,
                    cuheap_status_string(st), why && why[0] ? ": " : "", why ? why : "");
        rc = -1;
    }
    if (rc == 0)
        cuh_heap_stats(heap, &run->stats);
    cuh_sim_counters(dev, &run->device);
    cuh_heap_snapshot_t *moves = cuh_heap_snapshot(heap, 0);
    for (size_t k = 0; moves && k < moves->num_segments; k++)
        run->page_moves += moves->segments[k].page_moves;
    cuh_heap_snapshot_free(moves);
    if (rc == 0 && report && !reported) {
        run->report_event = run->replayed ? run->replayed - 1 : 0;
        if (write_report(heap, report, t->path) != 0)
            rc = -1;
    }
    cuh_heap_destroy(heap);
    dev->ops->destroy(dev);
    return rc;
}

/* Writes the heap's report to `pattern` with %t replaced by the trace name. */
static int write_report(cuh_heap_t *heap, const char *pattern, const char *trace_path)
{
    char name[256], path[4096];
    short_name(trace_path, name, sizeof name);
    size_t o = 0;
    for (const char *p = pattern; *p && o + 1 < sizeof path; p++) {
        if (p[0] == '%' && p[1] == 't') {
            o += (size_t)snprintf(path + o, sizeof path - o, "%s", name);
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o < sizeof path ? o : sizeof path - 1] = '\0';
    cuh_heap_snapshot_t *snap = cuh_heap_snapshot(heap, 1);
    FILE *f = snap ? fopen(path, "w") : NULL;
    if (!f) {
        fprintf(stderr, PROG ": cannot write the report %s: %s\n", path, snap ? strerror(errno) : "out of memory");
        cuh_heap_snapshot_free(snap);
        return -1;
    }
    size_t n = strlen(path);
    if (n > 5 && strcmp(path + n - 5, ".json") == 0)
        cuh_report_json(f, cuh_report_origin_now(), &snap, 1, NULL);
    else if (n > 5 && strcmp(path + n - 5, ".html") == 0)
        cuh_report_html(f, cuh_report_origin_now(), &snap, 1, NULL);
    else
        cuh_report_text(f, cuh_report_origin_now(), &snap, 1, NULL);
    cuh_heap_snapshot_free(snap);
    if (fclose(f) != 0) {
        fprintf(stderr, PROG ": writing the report %s failed: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Bisection over capacity for the smallest one that runs `t` without
 * out-of-memory. `top` is the replay at o->capacity. *found = 0 when even
 * that ran out of memory. Each probe is a full replay on a fresh device. */
static int find_min_capacity(const cuh_trace_t *t, const options_t *o, uintptr_t *addrs,
                             const run_t *top, size_t *result, int *found)
{
    *found = 0;
    if (top->oom)
        return 0;
    size_t hi = o->capacity;   /* known to run */
    size_t lo = (size_t)t->peak_live & ~(SEARCH_GRAIN - 1);   /* assumed not to */
    if (lo == t->peak_live && lo >= SEARCH_GRAIN)
        lo -= SEARCH_GRAIN;    /* exactly on the grain: lo itself might run */
    while (lo < hi && hi - lo > SEARCH_GRAIN) {
        size_t step = ((hi - lo) / 2) & ~(SEARCH_GRAIN - 1);
        if (step == 0)
            step = SEARCH_GRAIN;
        size_t mid = lo + step;
        if (mid >= hi)
            break;
        run_t probe;
        if (replay_once(t, mid, &o->cfg, addrs, &probe, NULL, REPORT_AT_END, 0) != 0)
            return -1;
        if (probe.oom)
            lo = mid;
        else
            hi = mid;
    }
    *result = hi;
    *found = 1;
    return 0;
}

/* ---- output ---------------------------------------------------------------- */

static double ratio_of(uint64_t num, uint64_t den)
{
    return den ? (double)num / (double)den : 0.0;
}

typedef struct result_s {
    const char *arg;          /* the path as given */
    const cuh_trace_t *trace;
    const run_t *run;
    uint64_t peak_live;
    size_t capacity;
    int want_min;
    int min_found;
    size_t min_capacity;
    int have_report_event;    /* --report-at other than end */
    size_t report_event;
    /* What PyTorch's own allocator would do (torch_model.h), per mode. */
    cuh_torch_result_t torch[CUH_TORCH_NUM_MODES];
    int torch_min_found[CUH_TORCH_NUM_MODES];
    uint64_t torch_min[CUH_TORCH_NUM_MODES];
    /* An out-of-memory on plain segments that virtual memory might avoid:
     * the same replay with vmm:1 added. */
    int tried_vmm;
    run_t vmm_run;
    /* The planned layout of a steady step (step_plan.h), where the trace
     * marks PLAN_STEP and the step after it. */
    int have_plan;
    cuh_step_plan_t plan;
} result_t;

/* The step planned: the third, after the first step's set-up and the second
 * step's warm-up (a corpus trace marks ten). */
#define PLAN_STEP 3
/* A block's bytes as the heap rounds them, and the page the window is
 * mapped in (vmm:1's default). */
#define PLAN_ALIGN 512
#define PLAN_PAGE ((uint64_t)2 << 20)

static double plan_ratio(const result_t *r)
{
    return ratio_of(r->plan.persistent + r->plan.window, r->peak_live);
}

/* Would vmm:1 change this out-of-memory? Not when the live bytes themselves
 * do not fit (capacity), when others hold the memory (external), or when it
 * waits on streams' pending frees: only free memory in the wrong places or
 * a limit reached with memory cached can be helped by moving pages. */
static int vmm_might_help(const cuh_config_t *cfg, const run_t *run)
{
    if (cfg->vmm || !run->oom || !run->have_oom_info)
        return 0;
    return run->oom_info.cause == CUH_OOM_FRAGMENTATION || run->oom_info.cause == CUH_OOM_LIMIT;
}

static void print_json(const result_t *r)
{
    const cuh_trace_t *t = r->trace;
    const run_t *run = r->run;
    FILE *f = stdout;
    uint64_t reserved = run->stats.reserved.peak;
    fputs("{\"trace\":", f);
    cuh_json_write_string(f, r->arg);
    fprintf(f, ",\"events\":%zu,\"allocs\":%zu,\"frees\":%zu,\"capacity\":%zu", t->num_events,
            t->num_allocs, t->num_frees, r->capacity);
    fprintf(f, ",\"peak_live\":%" PRIu64 ",\"peak_reserved\":%" PRIu64, r->peak_live, reserved);
    if (r->peak_live)
        fprintf(f, ",\"ratio\":%.4f", ratio_of(reserved, r->peak_live));
    else
        fputs(",\"ratio\":null", f);
    fprintf(f, ",\"ns_per_op\":%.1f", run->replayed ? (double)run->elapsed_ns / (double)run->replayed : 0.0);
    fprintf(f, ",\"segments\":%" PRIu64 ",\"segment_frees\":%" PRIu64 ",\"cache_hits\":%" PRIu64,
            run->stats.num_segment_allocs, run->stats.num_segment_frees, run->stats.num_cache_hits);
    fprintf(f,
            ",\"device_calls\":{\"event_records\":%" PRIu64 ",\"event_queries\":%" PRIu64
            ",\"stream_waits\":%" PRIu64 ",\"device_events\":%" PRIu64 ",\"device_waits\":%" PRIu64
            ",\"cpu_waits\":%" PRIu64 ",\"synchronizes\":%" PRIu64
            ",\"page_maps\":%" PRIu64 ",\"page_unmaps\":%" PRIu64 "}",
            run->device.events_recorded, run->device.event_queries, run->device.stream_waits,
            run->device.events_recorded_all, run->device.waits_all,
            run->device.event_waits, run->device.synchronizes, run->device.vm_maps, run->device.vm_unmaps);
    fprintf(f, ",\"page_moves\":%" PRIu64, run->page_moves);
    /* Page maps after the first step: the first step lays memory out; what
     * moves after it, each step, is what a job pays on every step. */
    if (run->have_step2 && t->num_marks >= 2)
        fprintf(f, ",\"after_step1\":{\"steps\":%zu,\"page_maps\":%" PRIu64 ",\"page_unmaps\":%" PRIu64
                   ",\"cpu_waits\":%" PRIu64 "}",
                t->num_marks - 1, run->device.vm_maps - run->at_step2.vm_maps,
                run->device.vm_unmaps - run->at_step2.vm_unmaps,
                run->device.event_waits + run->device.synchronizes - run->at_step2.event_waits -
                    run->at_step2.synchronizes);
    else
        fputs(",\"after_step1\":null", f);
    if (run->worst_step)
        fprintf(f, ",\"worst_step\":{\"step\":%zu,\"page_unmaps\":%" PRIu64 ",\"map_calls\":%" PRIu64 "}",
                run->worst_step, run->worst_step_unmaps, run->worst_step_calls);
    else
        fputs(",\"worst_step\":null", f);
    if (r->have_plan)
        fprintf(f,
                ",\"plan\":{\"step\":%zu,\"repeats\":%s,\"blocks\":%zu,\"persistent\":%" PRIu64
                ",\"window\":%" PRIu64 ",\"step_peak\":%" PRIu64 ",\"ratio\":%.4f}",
                r->plan.step, r->plan.repeats ? "true" : "false", r->plan.blocks, r->plan.persistent, r->plan.window,
                r->plan.step_peak, plan_ratio(r));
    else
        fputs(",\"plan\":null", f);
    if (t->pytorch_peak_reserved) {
        fprintf(f, ",\"pytorch_peak_reserved\":%" PRIu64, t->pytorch_peak_reserved);
        if (t->peak_live)
            fprintf(f, ",\"pytorch_ratio\":%.4f", ratio_of(t->pytorch_peak_reserved, t->peak_live));
        else
            fputs(",\"pytorch_ratio\":null", f);
    } else {
        fputs(",\"pytorch_peak_reserved\":null,\"pytorch_ratio\":null", f);
    }
    fputs(",\"torch_model\":{", f);
    for (int m = 0; m < CUH_TORCH_NUM_MODES; m++) {
        const cuh_torch_result_t *tr = &r->torch[m];
        fprintf(f, "%s\"%s\":{\"peak_reserved\":%" PRIu64, m ? "," : "", cuh_torch_mode_name((cuh_torch_mode_t)m),
                tr->peak_reserved);
        if (!tr->oom && t->peak_live)
            fprintf(f, ",\"ratio\":%.4f", ratio_of(tr->peak_reserved, t->peak_live));
        else
            fputs(",\"ratio\":null", f);
        fprintf(f, ",\"device_allocs\":%" PRIu64 ",\"retries\":%" PRIu64, tr->device_allocs, tr->releases);
        if (tr->oom)
            fprintf(f,
                    ",\"oom\":{\"event\":%zu,\"request\":%" PRIu64 ",\"reserved\":%" PRIu64 ",\"live\":%" PRIu64 "}",
                    tr->oom_event, tr->oom_request, tr->oom_reserved, tr->oom_live);
        else
            fputs(",\"oom\":null", f);
        if (r->want_min) {
            if (r->torch_min_found[m])
                fprintf(f, ",\"min_capacity\":%" PRIu64, r->torch_min[m]);
            else
                fputs(",\"min_capacity\":null", f);
        }
        fputc('}', f);
    }
    fputc('}', f);
    if (run->oom) {
        const cuh_oom_info_t *o = &run->oom_info;
        fprintf(f, ",\"oom\":{\"event\":%zu,\"request\":%zu,\"cause\":", run->oom_event, o->request);
        cuh_json_write_string(f, run->have_oom_info ? cuh_oom_cause_name(o->cause) : "unknown");
        fprintf(f,
                ",\"live\":%zu,\"allocated\":%zu,\"reserved\":%zu,\"cached\":%zu,\"pending\":%zu"
                ",\"largest_free\":%zu,\"num_free_extents\":%zu,\"device_free\":%zu,\"device_total\":%zu"
                ",\"external\":%zu,\"limit\":%zu,\"action\":",
                o->live, o->allocated, o->reserved, o->cached, o->pending, o->largest_free,
                o->num_free_extents, o->device_free, o->device_total, o->external, o->limit);
        char action[sizeof o->action + 1];
        memcpy(action, o->action, sizeof o->action);
        action[sizeof o->action] = '\0';
        cuh_json_write_string(f, action);
        fputs(",\"stranded\":", f);
        if (run->have_oom_info)
            cuh_json_write_stranded(f, o);
        else
            fputs("null", f);
        fputs(",\"holder_events\":[", f);
        for (size_t k = 0; k < o->stranded.num_top_holders; k++) {
            if (run->holder_event[k] == SIZE_MAX)
                fprintf(f, "%snull", k ? "," : "");
            else
                fprintf(f, "%s%zu", k ? "," : "", run->holder_event[k]);
        }
        fputs("],\"with_vmm\":", f);
        if (!r->tried_vmm) {
            fputs("null", f);
        } else {
            const run_t *v = &r->vmm_run;
            fprintf(f, "{\"peak_reserved\":%" PRIu64 ",\"oom\":", v->stats.reserved.peak);
            if (v->oom) {
                fprintf(f, "{\"event\":%zu,\"request\":%zu,\"cause\":", v->oom_event, v->oom_info.request);
                cuh_json_write_string(f, v->have_oom_info ? cuh_oom_cause_name(v->oom_info.cause) : "unknown");
                fputc('}', f);
            } else {
                fputs("null", f);
            }
            fputc('}', f);
        }
        fputc('}', f);
    } else {
        fputs(",\"oom\":null", f);
    }
    if (r->want_min) {
        if (r->min_found)
            fprintf(f, ",\"min_capacity\":%zu", r->min_capacity);
        else
            fputs(",\"min_capacity\":null", f);
    }
    if (r->have_report_event)
        fprintf(f, ",\"report_event\":%zu", r->report_event);
    fputs(",\"job\":", f);
    if (t->job[0])
        cuh_json_write_string(f, t->job);
    else
        fputs("null", f);
    fprintf(f, ",\"pytorch_cache\":%s,\"marks\":%zu,\"measured\":",
            t->pytorch_cache < 0 ? "null" : t->pytorch_cache ? "true" : "false", t->num_marks);
    int any = 0;
    for (int m = 0; m < CUH_TRACE_NUM_MODES; m++)
        any |= t->measured[m].present;
    if (!any)
        fputs("null", f);
    for (int m = 0, first = 1; any && m < CUH_TRACE_NUM_MODES; m++) {
        const cuh_trace_measured_t *me = &t->measured[m];
        if (!me->present)
            continue;
        fprintf(f, "%s\"%s\":{\"peak_reserved\":%" PRIu64 ",\"peak_allocated\":%" PRIu64 ",\"total_ms\":%.2f",
                first ? "{" : ",", cuh_trace_mode_name((cuh_trace_mode_t)m), me->peak_reserved, me->peak_allocated,
                me->total_ms);
        if (t->peak_live)
            fprintf(f, ",\"ratio\":%.4f}", ratio_of(me->peak_reserved, t->peak_live));
        else
            fputs(",\"ratio\":null}", f);
        first = 0;
    }
    if (any)
        fputc('}', f);
    fprintf(f, ",\"unfinished\":%s", t->unfinished ? "true" : "false");
    if (t->cut_line)
        fprintf(f, ",\"cut_line\":%" PRIu32, t->cut_line);
    else
        fputs(",\"cut_line\":null", f);
    fputs("}\n", f);
    fflush(f);
}

/* The trace's name for the table: its basename without .trace.gz & co. */
static void short_name(const char *path, char *out, size_t len)
{
    static const char *const suffixes[] = {".trace.gz", ".trace", ".csv.gz", ".csv", ".gz"};
    const char *base = strrchr(path, '/');
    base = base && base[1] ? base + 1 : path;
    size_t n = strlen(base);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t sl = strlen(suffixes[i]);
        if (n > sl && strcmp(base + n - sl, suffixes[i]) == 0) {
            n -= sl;
            break;
        }
    }
    snprintf(out, len, "%.*s", (int)n, base);
}

static double gib(uint64_t bytes) { return (double)bytes / (double)CUH_GiB; }

static void print_header(int name_width, int want_min)
{
    printf("%-*s %8s %10s %10s %7s %7s %7s", name_width, "trace", "events", "live GiB", "rsvd GiB", "ratio",
           "native", "expand");
    if (want_min)
        printf(" %11s %10s %10s", "min cap GiB", "native min", "expand min");
    printf(" %9s  %s\n", "ns/op", "oom");
    fflush(stdout);
}

/* Under an out-of-memory row: the memory stranded in mostly empty segments
 * (cuh_oom_info_t) and the trace events that allocated the blocks holding
 * the most of it, so that the job's own record says which tensors they are. */
static void print_stranded(int name_width, const cuh_trace_t *t, const run_t *run)
{
    const cuh_oom_info_t *o = &run->oom_info;
    if (!run->have_oom_info || !o->stranded.segments)
        return;
    char a[32], b[32], c[32];
    printf("%-*s   stranded: %s free in %zu mostly empty segment%s, held there by %zu block%s of %s%s\n", name_width, "",
           cuh_format_bytes(a, sizeof a, o->stranded.free), o->stranded.segments, o->stranded.segments == 1 ? "" : "s",
           o->stranded.blocks, o->stranded.blocks == 1 ? "" : "s", cuh_format_bytes(b, sizeof b, o->stranded.block_bytes),
           o->stranded.would_fit ? " (without them the request would have fit)" : "");
    printf("%-*s   the most (%s of a %s segment) behind:", name_width, "",
           cuh_format_bytes(a, sizeof a, o->stranded.top_size - o->stranded.top_used),
           cuh_format_bytes(b, sizeof b, o->stranded.top_size));
    for (size_t k = 0; k < o->stranded.num_top_holders; k++) {
        cuh_format_bytes(c, sizeof c, o->stranded.top_holders[k].size);
        if (run->holder_event[k] == SIZE_MAX)
            printf("%s a slab of small blocks (%s)", k ? "," : "", c);
        else
            printf("%s %s allocated at event %zu (line %u, id %" PRIu64 ")", k ? "," : "", c, run->holder_event[k],
                   t->events[run->holder_event[k]].line, t->events[run->holder_event[k]].id);
    }
    printf("%s\n", o->stranded.top_blocks > o->stranded.num_top_holders ? ", ..." : "");
}

static void print_row(const result_t *r, int name_width)
{
    const cuh_trace_t *t = r->trace;
    const run_t *run = r->run;
    char name[256], cell[32];
    short_name(r->arg, name, sizeof name);
    uint64_t reserved = run->stats.reserved.peak;
    printf("%-*s %8zu %10.3f %10.3f", name_width, name, t->num_events, gib(r->peak_live), gib(reserved));
    if (r->peak_live)
        snprintf(cell, sizeof cell, "%.4f", ratio_of(reserved, r->peak_live));
    else
        snprintf(cell, sizeof cell, "-");
    printf(" %7s", cell);
    for (int m = 0; m < CUH_TORCH_NUM_MODES; m++) {
        if (r->torch[m].oom)
            snprintf(cell, sizeof cell, "OOM");
        else if (t->peak_live)
            snprintf(cell, sizeof cell, "%.4f", ratio_of(r->torch[m].peak_reserved, t->peak_live));
        else
            snprintf(cell, sizeof cell, "-");
        printf(" %7s", cell);
    }
    if (r->want_min) {
        if (r->min_found)
            snprintf(cell, sizeof cell, "%.3f", gib(r->min_capacity));
        else
            snprintf(cell, sizeof cell, "> %.3f", gib(r->capacity));
        printf(" %11s", cell);
        for (int m = 0; m < CUH_TORCH_NUM_MODES; m++) {
            if (r->torch_min_found[m])
                snprintf(cell, sizeof cell, "%.3f", gib(r->torch_min[m]));
            else
                snprintf(cell, sizeof cell, "> %.3f", gib(r->capacity));
            printf(" %10s", cell);
        }
    }
    printf(" %9.1f  ", run->replayed ? (double)run->elapsed_ns / (double)run->replayed : 0.0);
    if (run->oom) {
        char req[32];
        cuh_format_bytes(req, sizeof req, run->oom_info.request);
        printf("%s: %s request at event %zu of %zu\n",
               run->have_oom_info ? cuh_oom_cause_name(run->oom_info.cause) : "out of memory", req,
               run->oom_event, t->num_events);
        print_stranded(name_width, t, run);
        if (r->tried_vmm) {
            const run_t *v = &r->vmm_run;
            char peak[32];
            cuh_format_bytes(peak, sizeof peak, v->stats.reserved.peak);
            if (!v->oom)
                printf("%-*s   with vmm:1 (the default: drop vmm:0 from --conf or CUHEAP_CONF) the job runs on this device: peak reserved %s\n",
                       name_width, "", peak);
            else
                printf("%-*s   with vmm:1 (the default: drop vmm:0 from --conf or CUHEAP_CONF) it runs out of memory too: %s at event %zu\n",
                       name_width, "", v->have_oom_info ? cuh_oom_cause_name(v->oom_info.cause) : "out of memory",
                       v->oom_event);
        }
    } else {
        printf("none\n");
    }
    if (g_cudafree_lag >= 0) {
        /* What device-wide frees cost the GPU's command queues. */
        double per = run->replayed ? 1000.0 / (double)run->replayed : 0.0;
        printf("%-*s   per 1000 events: %.1f event records (%.1f device-wide), %.1f event queries, %.1f stream "
               "waits, %.1f device-wide waits, %.1f CPU waits, %.1f synchronizes\n",
               name_width, "", (double)run->device.events_recorded * per,
               (double)run->device.events_recorded_all * per, (double)run->device.event_queries * per,
               (double)run->device.stream_waits * per, (double)run->device.waits_all * per,
               (double)run->device.event_waits * per, (double)run->device.synchronizes * per);
    }
    if (r->have_report_event)
        printf("%-*s   report taken after event %zu of %zu\n", name_width, "", r->report_event, t->num_events);
    for (int m = 0, first = 1; m < CUH_TRACE_NUM_MODES; m++) {
        const cuh_trace_measured_t *me = &t->measured[m];
        if (!me->present)
            continue;
        if (first)
            printf("%-*s   PyTorch measured when the trace was recorded, peak reserved over this trace's live peak:",
                   name_width, "");
        printf("%s %s %.4f", first ? "" : ",", cuh_trace_mode_name((cuh_trace_mode_t)m),
               ratio_of(me->peak_reserved, t->peak_live));
        first = 0;
        if (m == CUH_TRACE_NUM_MODES - 1 || !t->measured[m + 1].present)
            putchar('\n');
    }
    if (r->have_plan) {
        char persistent[32], window[32];
        cuh_format_bytes(persistent, sizeof persistent, (size_t)r->plan.persistent);
        cuh_format_bytes(window, sizeof window, (size_t)r->plan.window);
        printf("%-*s   step %zu laid out in advance (%s): %s live through it + %s for its %zu blocks = "
               "%.4f of the live peak\n",
               name_width, "", r->plan.step,
               r->plan.repeats ? "the next step repeats it" : "the next step differs: no later step foretold",
               persistent, window, r->plan.blocks, plan_ratio(r));
    }
    if (t->unfinished)
        printf("%-*s   the trace lacks the line trace:PATH writes at exit: the program stopped before it exited "
               "(killed or crashed?), and this is what it recorded until then\n",
               name_width, "");
    if (t->cut_line)
        printf("%-*s   its last line (%" PRIu32 ") was cut short as it was written (a full disk?) and is left out\n",
               name_width, "", t->cut_line);
    for (int m = 0; m < CUH_TORCH_NUM_MODES; m++) {
        const cuh_torch_result_t *tr = &r->torch[m];
        if (tr->oom) {
            char req[32], rsv[32];
            cuh_format_bytes(req, sizeof req, (size_t)tr->oom_request);
            cuh_format_bytes(rsv, sizeof rsv, (size_t)tr->oom_reserved);
            printf("%-*s   PyTorch (%s) runs out of memory at event %zu: a %s request with %s reserved\n", name_width,
                   "", cuh_torch_mode_name((cuh_torch_mode_t)m), tr->oom_event, req, rsv);
        }
    }
    /* Only where the device never refused the model: a full device or a
     * limit changes PyTorch's peak. */
    if (t->pytorch_peak_reserved && !r->torch[CUH_TORCH_NATIVE].oom && !r->torch[CUH_TORCH_NATIVE].releases &&
        t->pytorch_peak_reserved != r->torch[CUH_TORCH_NATIVE].peak_reserved)
        printf("%-*s   the trace records PyTorch's peak reserved as %" PRIu64 " bytes; the model of its native "
               "allocator gives %" PRIu64 " (other PyTorch settings or version?)\n",
               name_width, "", t->pytorch_peak_reserved, r->torch[CUH_TORCH_NATIVE].peak_reserved);
    fflush(stdout);
}

/* ---- main ------------------------------------------------------------------ */

/* Loads, replays and reports one trace. 0, or the exit status to stop with. */
static int replay_trace(const char *arg, const options_t *o, int name_width)
{
    cuh_trace_t trace;
    char err[1024];
    if (cuh_trace_load(arg, &trace, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    uintptr_t *addrs = calloc(trace.num_events ? trace.num_events : 1, sizeof *addrs);
    if (!addrs) {
        fprintf(stderr, PROG ": %s: out of memory for %zu events\n", arg, trace.num_events);
        cuh_trace_free(&trace);
        return 1;
    }
    run_t run;
    result_t r = {.arg = arg, .trace = &trace, .run = &run, .capacity = o->capacity,
                  .want_min = o->min_capacity};
    int status = 0;
    if (o->report_at >= 0 && (size_t)o->report_at >= trace.num_events) {
        fprintf(stderr, PROG ": --report-at %ld: %s has %zu events, numbered 0 to %zu\n", o->report_at, arg,
                trace.num_events, trace.num_events ? trace.num_events - 1 : 0);
        status = 2;
        goto out;
    }
    const char *report_now = o->report_at == REPORT_AT_END ? o->report : NULL;
    if (replay_once(&trace, o->capacity, &o->cfg, addrs, &run, report_now, REPORT_AT_END, 0) != 0) {
        status = 1;
        goto out;
    }
    /* Timing on a shared machine is noisy: replay twice more and report the
     * median time per event (the heap's results are identical each time). */
    uint64_t times[3] = {run.elapsed_ns, 0, 0};
    for (int k = 1; k < 3; k++) {
        run_t again;
        if (replay_once(&trace, o->capacity, &o->cfg, addrs, &again, NULL, REPORT_AT_END, 0) != 0) {
            status = 1;
            goto out;
        }
        times[k] = again.elapsed_ns;
    }
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            if (times[b] < times[a]) {
                uint64_t tmp = times[a];
                times[a] = times[b];
                times[b] = tmp;
            }
    run.elapsed_ns = times[1];
    if (o->report && o->report_at != REPORT_AT_END) {
        /* The report after a chosen event: a replay of its own (the heap's
         * results are the same each time), after one that finds the peak. */
        long at = o->report_at;
        run_t extra;
        if (at == REPORT_AT_PEAK) {
            if (replay_once(&trace, o->capacity, &o->cfg, addrs, &extra, NULL, REPORT_AT_END, 1) != 0) {
                status = 1;
                goto out;
            }
            at = (long)extra.peak_event;
        }
        if (replay_once(&trace, o->capacity, &o->cfg, addrs, &extra, o->report, at, 0) != 0) {
            status = 1;
            goto out;
        }
        r.report_event = extra.report_event;
        r.have_report_event = 1;
    }
    /* A full run's peak is the trace's; a run cut short has the heap's. */
    r.peak_live = run.oom ? run.stats.requested.peak : trace.peak_live;
    if (vmm_might_help(&o->cfg, &run)) {
        cuh_config_t with_vmm = o->cfg;
        with_vmm.vmm = 1;
        if (replay_once(&trace, o->capacity, &with_vmm, addrs, &r.vmm_run, NULL, REPORT_AT_END, 0) != 0) {
            status = 1;
            goto out;
        }
        r.tried_vmm = 1;
    }
    if (o->min_capacity &&
        find_min_capacity(&trace, o, addrs, &run, &r.min_capacity, &r.min_found) != 0) {
        status = 1;
        goto out;
    }
    /* PyTorch's own allocator on the same trace and device (the model runs
     * in milliseconds: always). */
    /* cuheap's limit, if any, is PyTorch's set_per_process_memory_fraction. */
    const cuh_torch_device_t torch_dev = {.capacity = o->capacity, .external = o->external,
                                          .limit = cuh_config_limit(&o->cfg, o->capacity)};
    for (int m = 0; m < CUH_TORCH_NUM_MODES; m++) {
        if (cuh_torch_model_run(&trace, (cuh_torch_mode_t)m, &torch_dev, &r.torch[m], err, sizeof err) != 0 ||
            (o->min_capacity &&
             cuh_torch_model_min_capacity(&trace, (cuh_torch_mode_t)m, &torch_dev, &r.torch[m], SEARCH_GRAIN,
                                          &r.torch_min[m], &r.torch_min_found[m], err, sizeof err) != 0)) {
            fprintf(stderr, PROG ": %s: %s\n", arg, err);
            status = 1;
            goto out;
        }
    }
    /* The planned layout, a yardstick beside the replay: only where the
     * trace marks the step and the one after it. */
    if (trace.num_marks > PLAN_STEP + 1) {
        if (cuh_step_plan_trace(&trace, PLAN_STEP, PLAN_ALIGN, PLAN_PAGE, &r.plan, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": %s: %s\n", arg, err);
            status = 1;
            goto out;
        }
        r.have_plan = 1;
    }
    if (o->json) {
        print_json(&r);
    } else {
        static int header_done;
        if (!header_done) {
            print_header(name_width, o->min_capacity);
            header_done = 1;
        }
        print_row(&r, name_width);
    }
out:
    free(addrs);
    cuh_trace_free(&trace);
    return status;
}

int main(int argc, char **argv)
{
    options_t o;
    parse_options(argc, argv, &o);
    g_external = o.external;
    g_cudafree_lag = o.cudafree_lag;
    g_marks = o.marks;
    g_lag = o.lag;
    g_streams = o.streams;
    g_busy_streams = o.busy_streams;

    int name_width = 5;
    for (int i = 0; i < o.num_traces; i++) {
        char name[256];
        short_name(o.traces[i], name, sizeof name);
        if ((int)strlen(name) > name_width)
            name_width = (int)strlen(name);
    }
    int status = 0;
    for (int i = 0; i < o.num_traces && status == 0; i++)
        status = replay_trace(o.traces[i], &o, name_width);
    free(o.traces);
    return status;
}
