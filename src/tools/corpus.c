/* corpus.c - cuheap-corpus: every job of the corpus replayed in each way in,
 * one table, and the verdict of the rule every heap policy is judged by.
 *
 * The corpus (bench/traces/corpus) holds PyTorch jobs recorded on a GPU, each
 * twice: as PyTorch's allocator (JOB_plugin.trace.gz: stream-ordered frees)
 * and under LD_PRELOAD (JOB_preload.trace.gz: cudaMalloc and cudaFree), each
 * with the peaks PyTorch's own three modes reached on the same job in its
 * header. Its MANIFEST names every job and its set: "tuning", or "held-out"
 * (the quarter no policy work looks at, reported on its own lines).
 *
 * Each trace is replayed by cuheap-replay (a child process per trace, --json
 * --min-capacity --way WAY) with the way's default settings, and the table
 * sets cuheap's peak reserved over peak live bytes, and the smallest device
 * it fits, beside PyTorch's measured peaks. Summary lines per set and way:
 * the median and worst ratio, and on how many jobs cuheap holds less than
 * the least of PyTorch's three modes; and, beside them, what a steady step
 * laid out in advance would hold (the replay's plan, step_plan.h) on the
 * jobs that repeat their steps: a yardstick, not a policy.
 *
 * With --baseline FILE (the --json output of an earlier run, say before a
 * change) it applies the rule of bench/README.md: a change is kept only if,
 * over the tuning set, the median and the worst ratio both improve in every
 * way and no job gets worse by more than 0.5%. The exit status says it:
 * 0 kept, 3 not kept. No GPU is needed.
 *
 * With --bounds it checks the bounds issue 42 holds every job to: replayed
 * with default settings stream-ordered (the plugin trace) and with cudaFree's
 * at lags 0 and 1000 (the preload trace), peak reserved at most max(1.03x
 * peak live, peak live + 64 MiB) and the smallest device at most 1.02x.
 *
 * Exit status: 0 done (and kept), 1 a trace could not be replayed, 2 usage,
 * 3 the change is not kept.
 */
#include "json_read.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG "cuheap-corpus"
#include "cli.h"

#define GiB ((double)(1ull << 30))
#define MAX_JOBS 256
#define NUM_WAYS 2
#define NUM_MODES 3
/* The H200 the corpus was recorded on: its device memory as CUDA reports it. */
#define DEFAULT_CAPACITY "150109880320"
/* What a map or unmap call costs on an H200: a page moved (an unmap, a
 * map and an access grant, two calls) about 55 us whatever the page's or
 * the unit's size (bench/gpu/vm_costs.cu, docs/benchmarks.md). */
#define CALL_MS 0.0275
/* The rule's bound: no job worse by more than this fraction. */
#define WORSE_BOUND 0.005
/* Issue 42's bounds (--bounds): peak reserved at most the larger of these
 * over peak live, the smallest device at most the last. */
#define BOUND_RATIO 1.03
#define BOUND_SLACK (64ull << 20)
#define BOUND_MIN_RATIO 1.02

static const char *const WAYS[NUM_WAYS] = {"plugin", "preload"};
static const char *const MODES[NUM_MODES] = {"native", "expandable", "async"};
static const char *const SETS[2] = {"tuning", "held-out"};

typedef struct row_s {
    char job[64];
    int held_out;
    int way;
    int ok;                       /* replayed */
    int oom;                      /* out of memory on the device */
    uint64_t peak_live, peak_reserved, min_capacity;
    int min_found;
    uint64_t measured[NUM_MODES]; /* PyTorch's peak reserved on the GPU; 0: not recorded */
    int pytorch_cache;            /* the preload trace was recorded with PyTorch's cache on */
    uint64_t ref_live;            /* the plugin trace's peak live: PyTorch's tensors, what its modes hold */
    int64_t libs;                 /* preload: peak live beyond ref_live, the libraries' own cudaMalloc's */
    double ratio, min_ratio;      /* cuheap's peak reserved and min capacity over peak live */
    double base_ratio;            /* --baseline: the same job's ratio then; NAN if absent */
    double moves;                 /* map and unmap calls a step after the first ((maps + unmaps) / steps); NAN: no steps marked */
    double move_time;             /* those calls' time (CALL_MS each) over PyTorch native's step time; NAN: unknown */
    double worst_moves;           /* the calls of the step after the first that made the most; NAN: unknown */
    double plan_ratio;            /* a steady step laid out in advance (cuheap-replay's plan) over the live
                                   * peak; NAN: the trace marks too few steps */
    int plan_repeats;             /* that step repeats in the next: a layout learned from it would hold */
    /* --bounds, preload rows: the same trace's replay with cudaFree's at lag 0 */
    int lag0_ok;
    uint64_t lag0_live, lag0_reserved, lag0_min;
} row_t;

typedef struct options_s {
    const char *dir, *replay, *capacity, *conf, *baseline;
    int json, tuning_only, bounds;
} options_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options]\n"
            "\n"
            "Replays every job of the corpus in both ways in (as PyTorch's allocator and\n"
            "under LD_PRELOAD) with the way's default settings, and prints cuheap's peak\n"
            "reserved and smallest device over peak live bytes beside PyTorch's three\n"
            "modes as measured on the GPU, with a median and worst per set and way.\n"
            "\n"
            "options:\n"
            "  --dir DIR          the corpus (default bench/traces/corpus): DIR/MANIFEST\n"
            "                     and DIR/JOB_plugin.trace.gz, DIR/JOB_preload.trace.gz\n"
            "  --replay PATH      cuheap-replay to run (default: beside this program)\n"
            "  --capacity BYTES   the device (default " DEFAULT_CAPACITY ", the H200's)\n"
            "  --conf STRING      settings added to every replay (a policy experiment)\n"
            "  --tuning           only the tuning set (what policy work may look at)\n"
            "  --json             one JSON object per job and way, then per summary\n"
            "  --baseline FILE    compare with an earlier --json run and apply the rule:\n"
            "                     kept only if over the tuning set the median and worst\n"
            "                     improve in each way and no job is worse by over 0.5%%\n"
            "  --bounds           also replay each preload trace with cudaFree's at lag 0\n"
            "                     and say which replays meet issue 42's bounds: peak\n"
            "                     reserved <= max(1.03x live, live + 64 MiB), smallest\n"
            "                     device <= 1.02x live\n"
            "  -h, --help         this text\n"
            "\n"
            "exit status: 0 done (and kept), 1 a trace could not be replayed,\n"
            "2 usage error, 3 the change is not kept\n");
}

static void parse_options(int argc, char **argv, options_t *o)
{
    memset(o, 0, sizeof *o);
    o->dir = "bench/traces/corpus";
    o->capacity = DEFAULT_CAPACITY;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = strcmp(a, "--dir") == 0        ? &o->dir
                            : strcmp(a, "--replay") == 0   ? &o->replay
                            : strcmp(a, "--capacity") == 0 ? &o->capacity
                            : strcmp(a, "--conf") == 0     ? &o->conf
                            : strcmp(a, "--baseline") == 0 ? &o->baseline
                                                           : NULL;
        if (slot) {
            if (i + 1 >= argc || !argv[i + 1][0])
                usage_error("option '%s' needs a value", a);
            *slot = argv[++i];
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--tuning") == 0) {
            o->tuning_only = 1;
        } else if (strcmp(a, "--bounds") == 0) {
            o->bounds = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else {
            usage_error("unknown argument '%s'", a);
        }
    }
    if (o->json && o->baseline)
        usage_error("--baseline prints the rule's verdict as text; it does not go with --json");
}

/* ---- the manifest -------------------------------------------------------------- */

/* Reads DIR/MANIFEST: "JOB SET" a line, '#' comments. */
static size_t read_manifest(const char *dir, row_t *jobs, size_t max)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, PROG ": cannot open %s: %s\n", path, strerror(errno));
        exit(1);
    }
    char line[512];
    size_t n = 0, lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char job[128], set[64], extra[8];
        int k = sscanf(line, "%127s %63s %7s", job, set, extra);
        if (k <= 0)
            continue;
        if (k != 2 || strlen(job) >= sizeof jobs[0].job || (strcmp(set, SETS[0]) != 0 && strcmp(set, SETS[1]) != 0)) {
            fprintf(stderr, PROG ": %s:%zu: expected 'JOB SET' with SET tuning or held-out\n", path, lineno);
            exit(1);
        }
        for (size_t j = 0; j < n; j++)
            if (strcmp(jobs[j].job, job) == 0) {
                fprintf(stderr, PROG ": %s:%zu: job %s listed twice\n", path, lineno, job);
                exit(1);
            }
        if (n == max) {
            fprintf(stderr, PROG ": %s: more than %zu jobs\n", path, max);
            exit(1);
        }
        memset(&jobs[n], 0, sizeof jobs[n]);
        memcpy(jobs[n].job, job, strlen(job) + 1);   /* shorter than the field: checked above */
        jobs[n].held_out = strcmp(set, SETS[1]) == 0;
        n++;
    }
    fclose(f);
    if (n == 0) {
        fprintf(stderr, PROG ": %s lists no job\n", path);
        exit(1);
    }
    return n;
}

/* ---- one replay ------------------------------------------------------------------ */

/* Runs argv, returns its standard output (malloc'd) and exit status. */
static char *run_capture(char *const argv[], int *status)
{
    int fd[2];
    if (pipe(fd) != 0)
        return NULL;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return NULL;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execv(argv[0], argv);
        fprintf(stderr, PROG ": cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd[1]);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(fd[0], buf + len, cap - len - 1)) != 0) {
        if (got < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        len += (size_t)got;
        if (cap - len < 4096) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
            }
            buf = bigger;
        }
    }
    close(fd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (buf)
        buf[len] = '\0';
    return buf;
}

static double get_double(const cuh_json_t *obj, const char *key)
{
    const cuh_json_t *v = cuh_json_get(obj, key);
    return v && v->type == CUH_JSON_NUMBER ? v->v.number.d : NAN;
}

static uint64_t get_u64(const cuh_json_t *obj, const char *key)
{
    const cuh_json_t *v = cuh_json_get(obj, key);
    return v && v->type == CUH_JSON_NUMBER && (v->v.number.flags & CUH_JSON_UINT64) ? v->v.number.u : 0;
}

/* Replays row's trace (lag0: a preload trace with cudaFree's at lag 0,
 * into the row's lag0 fields); fills the row, or says why not and returns -1. */
static int replay_row(const options_t *o, row_t *row, int lag0)
{
    char trace[4096], way_arg[32];
    snprintf(trace, sizeof trace, "%s/%s_%s.trace.gz", o->dir, row->job, WAYS[row->way]);
    snprintf(way_arg, sizeof way_arg, "--way=%s", WAYS[row->way]);
    if (access(trace, R_OK) != 0) {
        fprintf(stderr, PROG ": %s: %s\n", trace, strerror(errno));
        return -1;
    }
    char *argv[14];
    int a = 0;
    argv[a++] = (char *)o->replay;
    argv[a++] = "--json";
    argv[a++] = "--min-capacity";
    argv[a++] = way_arg;
    argv[a++] = "--capacity";
    argv[a++] = (char *)o->capacity;
    if (lag0) {
        argv[a++] = "--cudafree";
        argv[a++] = "0";
    }
    if (o->conf) {
        argv[a++] = "--conf";
        argv[a++] = (char *)o->conf;
    }
    argv[a++] = trace;
    argv[a] = NULL;
    int status = 0;
    char *out = run_capture(argv, &status);
    if (!out || status != 0) {
        fprintf(stderr, PROG ": %s: cuheap-replay exited with status %d\n", trace, status);
        free(out);
        return -1;
    }
    cuh_json_error_t err;
    cuh_json_doc_t *doc = cuh_json_parse(out, strlen(out), NULL, &err);
    free(out);
    if (!doc) {
        fprintf(stderr, PROG ": %s: cuheap-replay's output is not JSON (%s)\n", trace, err.message);
        return -1;
    }
    const cuh_json_t *r = cuh_json_root(doc);
    if (lag0) {
        row->lag0_live = get_u64(r, "peak_live");
        row->lag0_reserved = get_u64(r, "peak_reserved");
        row->lag0_min = get_u64(r, "min_capacity");
        row->lag0_ok = row->lag0_live != 0;
        cuh_json_free(doc);
        return row->lag0_ok ? 0 : -1;
    }
    row->peak_live = get_u64(r, "peak_live");
    row->peak_reserved = get_u64(r, "peak_reserved");
    const cuh_json_t *oom = cuh_json_get(r, "oom");
    row->oom = oom && oom->type != CUH_JSON_NULL;
    row->min_capacity = get_u64(r, "min_capacity");
    row->min_found = row->min_capacity != 0;
    const cuh_json_t *cache = cuh_json_get(r, "pytorch_cache");
    row->pytorch_cache = cache && cache->type == CUH_JSON_BOOL && cache->v.boolean;
    /* The driver charges per map or unmap call (a page moved is one of
     * each, a new unit a map); after the first step, which lays memory out,
     * the calls are what every step pays. */
    const cuh_json_t *after = cuh_json_get(r, "after_step1");
    uint64_t steps = get_u64(after, "steps");
    row->moves =
        steps ? (double)(get_u64(after, "page_maps") + get_u64(after, "page_unmaps")) / (double)steps : NAN;
    const cuh_json_t *worst = cuh_json_get(r, "worst_step");
    row->worst_moves = worst && worst->type == CUH_JSON_OBJECT ? (double)get_u64(worst, "map_calls") : NAN;
    const cuh_json_t *measured = cuh_json_get(r, "measured");
    /* Native's total_ms is every step after its first; the trace's marks
     * count a warm-up step before them, so those steps are steps - 1 of the
     * after_step1 window (bench/corpus/jobs.py). */
    double native_ms = get_double(cuh_json_get(measured, "native"), "total_ms");
    row->move_time = steps >= 2 && native_ms > 0 ? row->moves * CALL_MS / (native_ms / (double)(steps - 1)) : NAN;
    for (int m = 0; m < NUM_MODES; m++)
        row->measured[m] = get_u64(cuh_json_get(measured, MODES[m]), "peak_reserved");
    const cuh_json_t *plan = cuh_json_get(r, "plan");
    row->plan_ratio = plan && plan->type == CUH_JSON_OBJECT ? get_double(plan, "ratio") : NAN;
    const cuh_json_t *repeats = plan && plan->type == CUH_JSON_OBJECT ? cuh_json_get(plan, "repeats") : NULL;
    row->plan_repeats = repeats && repeats->type == CUH_JSON_BOOL && repeats->v.boolean;
    cuh_json_free(doc);
    if (!row->peak_live) {
        fprintf(stderr, PROG ": %s: no live bytes\n", trace);
        return -1;
    }
    row->ratio = (double)row->peak_reserved / (double)row->peak_live;
    row->min_ratio = row->min_found ? (double)row->min_capacity / (double)row->peak_live : NAN;
    row->ok = 1;
    return 0;
}

/* ---- the table and the summaries ---------------------------------------------------- */

/* The least of PyTorch's measured peaks (0 if none, or not comparable) and
 * its mode. PyTorch's figures hold its tensors only: a preload trace also
 * holds what libraries (cuBLAS, cuDNN) took with cudaMalloc themselves,
 * which vs_best takes off cuheap's side, and one recorded with PyTorch's
 * cache on holds PyTorch's own segments, which compare with nothing. */
static uint64_t best_mode(const row_t *r, int *mode)
{
    uint64_t best = 0;
    *mode = -1;
    if (r->pytorch_cache || !r->ref_live)
        return 0;
    for (int m = 0; m < NUM_MODES; m++)
        if (r->measured[m] && (!best || r->measured[m] < best)) {
            best = r->measured[m];
            *mode = m;
        }
    return best;
}

/* cuheap's peak reserved, less the libraries' bytes, over PyTorch's best. */
static double vs_best(const row_t *r, uint64_t best)
{
    return ((double)r->peak_reserved - (double)r->libs) / (double)best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *xs, size_t n)
{
    qsort(xs, n, sizeof *xs, cmp_double);
    return n % 2 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

typedef struct summary_s {
    size_t jobs;
    double median, worst, median_min, worst_min;
    const char *worst_job;
    double median_moves, most_moves; /* map calls a step after the first; NAN: none marked */
    double most_in_a_step;        /* the most pages any job moved in one step after its first; NAN: none */
    const char *most_in_a_step_job;
    double median_move_time, most_move_time; /* their estimated time over native's step time */
    const char *most_moves_job;
    size_t below_best;            /* jobs where cuheap reserves less than PyTorch's least */
    size_t with_measured;         /* jobs with PyTorch's peaks recorded */
    size_t planned, repeating;    /* jobs with a step planned, and those whose step repeats */
    double plan_median, plan_worst;   /* on the repeating ones: the plan over the live peak */
    double heap_median, heap_worst;   /* and cuheap's replay on the same jobs */
} summary_t;

static summary_t summarize(const row_t *rows, size_t n, int held_out, int way)
{
    summary_t s = {0};
    double *ratios = calloc(n + 1, sizeof *ratios), *mins = calloc(n + 1, sizeof *mins);
    double *moves = calloc(n + 1, sizeof *moves), *times = calloc(n + 1, sizeof *times);
    double *plans = calloc(n + 1, sizeof *plans), *heaps = calloc(n + 1, sizeof *heaps);
    size_t nm = 0, nv = 0, nt = 0;
    s.most_moves = NAN;
    s.most_move_time = NAN;
    s.most_in_a_step = NAN;
    if (!ratios || !mins || !moves || !times || !plans || !heaps) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        if (!r->ok || r->held_out != held_out || r->way != way)
            continue;
        ratios[s.jobs++] = r->ratio;
        if (r->ratio > s.worst) {
            s.worst = r->ratio;
            s.worst_job = r->job;
        }
        if (!isnan(r->move_time)) {
            times[nt++] = r->move_time;
            if (isnan(s.most_move_time) || r->move_time > s.most_move_time)
                s.most_move_time = r->move_time;
        }
        if (!isnan(r->worst_moves) && (isnan(s.most_in_a_step) || r->worst_moves > s.most_in_a_step)) {
            s.most_in_a_step = r->worst_moves;
            s.most_in_a_step_job = r->job;
        }
        if (!isnan(r->moves)) {
            moves[nv++] = r->moves;
            if (isnan(s.most_moves) || r->moves > s.most_moves) {
                s.most_moves = r->moves;
                s.most_moves_job = r->job;
            }
        }
        if (r->min_found) {
            mins[nm++] = r->min_ratio;
            if (r->min_ratio > s.worst_min)
                s.worst_min = r->min_ratio;
        }
        int mode;
        uint64_t best = best_mode(r, &mode);
        if (best) {
            s.with_measured++;
            s.below_best += vs_best(r, best) < 1;
        }
        if (!isnan(r->plan_ratio)) {
            s.planned++;
            if (r->plan_repeats) {
                plans[s.repeating] = r->plan_ratio;
                heaps[s.repeating++] = r->ratio;
                s.plan_worst = r->plan_ratio > s.plan_worst ? r->plan_ratio : s.plan_worst;
                s.heap_worst = r->ratio > s.heap_worst ? r->ratio : s.heap_worst;
            }
        }
    }
    s.plan_median = s.repeating ? median_of(plans, s.repeating) : NAN;
    s.heap_median = s.repeating ? median_of(heaps, s.repeating) : NAN;
    free(plans);
    free(heaps);
    s.median = s.jobs ? median_of(ratios, s.jobs) : NAN;
    s.median_min = nm ? median_of(mins, nm) : NAN;
    s.median_moves = nv ? median_of(moves, nv) : NAN;
    s.median_move_time = nt ? median_of(times, nt) : NAN;
    free(ratios);
    free(mins);
    free(moves);
    free(times);
    return s;
}

static void print_row(const row_t *r)
{
    printf("%-20s %-8s %-7s", r->job, SETS[r->held_out], WAYS[r->way]);
    if (!r->ok) {
        printf("  could not be replayed\n");
        return;
    }
    printf(" %8.3f %7.4f", (double)r->peak_live / GiB, r->ratio);
    if (r->min_found)
        printf(" %7.4f", r->min_ratio);
    else
        printf(" %7s", "none");
    for (int m = 0; m < NUM_MODES; m++) {
        if (r->measured[m] && r->ref_live)
            printf(" %7.4f", (double)r->measured[m] / (double)r->ref_live);
        else
            printf(" %7s", "-");
    }
    int mode;
    uint64_t best = best_mode(r, &mode);
    if (best)
        printf("  %-10s %+6.1f%%", MODES[mode], 100.0 * (vs_best(r, best) - 1));
    else
        printf("  %-10s %7s", r->pytorch_cache ? "(cache on)" : "-", "-");
    if (r->way == 1 && !r->pytorch_cache)
        printf(" %6.0f", (double)r->libs / (1 << 20));
    else
        printf(" %6s", "");
    if (!isnan(r->moves))
        printf(" %8.0f", r->moves);
    else
        printf(" %8s", "-");
    if (!isnan(r->worst_moves))
        printf(" %7.0f", r->worst_moves);
    else
        printf(" %7s", "-");
    if (!isnan(r->move_time))
        printf(" %+6.1f%%", 100.0 * r->move_time);
    else
        printf(" %7s", "-");
    if (isnan(r->plan_ratio))
        printf(" %7s", "-");
    else if (r->plan_repeats)
        printf(" %7.4f", r->plan_ratio);
    else
        printf(" %7s", "varies");
    if (!isnan(r->base_ratio))
        printf("  %+6.2f%%", 100.0 * (r->ratio / r->base_ratio - 1));
    printf("%s\n", r->oom ? "  OUT OF MEMORY" : "");
}

static void print_summary(const summary_t *s, int held_out, int way)
{
    if (!s->jobs)
        return;
    printf("%-8s %-7s %2zu jobs: ratio median %.4f, worst %.4f (%s); smallest device median %.4f, worst %.4f; "
           "below PyTorch's best mode on %zu of %zu",
           SETS[held_out], WAYS[way], s->jobs, s->median, s->worst, s->worst_job, s->median_min, s->worst_min,
           s->below_best, s->with_measured);
    if (!isnan(s->median_moves))
        printf("; map calls a step after the first: median %.0f, most %.0f (%s)", s->median_moves, s->most_moves,
               s->most_moves_job);
    if (!isnan(s->most_in_a_step))
        printf(", in one step %.0f (%s)", s->most_in_a_step, s->most_in_a_step_job);
    if (!isnan(s->median_move_time))
        printf(", their time over native's step: median %+.1f%%, most %+.1f%%", 100.0 * s->median_move_time,
               100.0 * s->most_move_time);
    printf("\n");
    if (s->repeating)
        printf("%-8s %-7s %2zu of %zu jobs repeat their steps: a steady step laid out in advance holds median %.4f, "
               "worst %.4f of the live peak, where cuheap's replay holds median %.4f, worst %.4f\n",
               SETS[held_out], WAYS[way], s->repeating, s->planned, s->plan_median, s->plan_worst, s->heap_median,
               s->heap_worst);
}

static void json_row(const row_t *r)
{
    printf("{\"job\":\"%s\",\"set\":\"%s\",\"way\":\"%s\",\"ok\":%s", r->job, SETS[r->held_out], WAYS[r->way],
           r->ok ? "true" : "false");
    if (r->ok) {
        printf(",\"peak_live\":%" PRIu64 ",\"peak_reserved\":%" PRIu64 ",\"ratio\":%.6f,\"oom\":%s", r->peak_live,
               r->peak_reserved, r->ratio, r->oom ? "true" : "false");
        printf(",\"pytorch_live\":%" PRIu64 ",\"libs\":%" PRId64 ",\"pytorch_cache\":%s", r->ref_live, r->libs,
               r->pytorch_cache ? "true" : "false");
        if (r->min_found)
            printf(",\"min_capacity\":%" PRIu64 ",\"min_ratio\":%.6f", r->min_capacity, r->min_ratio);
        else
            printf(",\"min_capacity\":null,\"min_ratio\":null");
        if (!isnan(r->moves))
            printf(",\"calls_per_step\":%.1f", r->moves);
        else
            printf(",\"calls_per_step\":null");
        if (!isnan(r->worst_moves))
            printf(",\"worst_step_calls\":%.0f", r->worst_moves);
        else
            printf(",\"worst_step_calls\":null");
        if (!isnan(r->move_time))
            printf(",\"move_time\":%.4f", r->move_time);
        else
            printf(",\"move_time\":null");
        if (!isnan(r->plan_ratio))
            printf(",\"plan_ratio\":%.6f,\"plan_repeats\":%s", r->plan_ratio, r->plan_repeats ? "true" : "false");
        else
            printf(",\"plan_ratio\":null,\"plan_repeats\":null");
        printf(",\"pytorch\":{");
        for (int m = 0; m < NUM_MODES; m++) {
            if (r->measured[m])
                printf("%s\"%s\":%" PRIu64, m ? "," : "", MODES[m], r->measured[m]);
            else
                printf("%s\"%s\":null", m ? "," : "", MODES[m]);
        }
        printf("}");
    }
    printf("}\n");
}

static void json_summary(const summary_t *s, int held_out, int way)
{
    if (!s->jobs)
        return;
    printf("{\"summary\":{\"set\":\"%s\",\"way\":\"%s\",\"jobs\":%zu,\"median\":%.6f,\"worst\":%.6f,"
           "\"worst_job\":\"%s\",\"median_min\":%.6f,\"worst_min\":%.6f,\"below_best\":%zu,\"with_measured\":%zu",
           SETS[held_out], WAYS[way], s->jobs, s->median, s->worst, s->worst_job, s->median_min, s->worst_min,
           s->below_best, s->with_measured);
    if (!isnan(s->median_moves))
        printf(",\"median_calls\":%.1f,\"most_calls\":%.1f,\"most_calls_job\":\"%s\"", s->median_moves,
               s->most_moves, s->most_moves_job);
    else
        printf(",\"median_calls\":null,\"most_calls\":null,\"most_calls_job\":null");
    if (!isnan(s->most_in_a_step))
        printf(",\"most_in_a_step\":%.0f,\"most_in_a_step_job\":\"%s\"", s->most_in_a_step, s->most_in_a_step_job);
    else
        printf(",\"most_in_a_step\":null,\"most_in_a_step_job\":null");
    if (!isnan(s->median_move_time))
        printf(",\"median_move_time\":%.4f,\"most_move_time\":%.4f", s->median_move_time, s->most_move_time);
    else
        printf(",\"median_move_time\":null,\"most_move_time\":null");
    if (s->repeating)
        printf(",\"repeating\":%zu,\"plan_median\":%.6f,\"plan_worst\":%.6f,\"heap_median_repeating\":%.6f,"
               "\"heap_worst_repeating\":%.6f}}\n",
               s->repeating, s->plan_median, s->plan_worst, s->heap_median, s->heap_worst);
    else
        printf(",\"repeating\":0,\"plan_median\":null,\"plan_worst\":null,\"heap_median_repeating\":null,"
               "\"heap_worst_repeating\":null}}\n");
}

/* ---- issue 42's bounds (--bounds) -------------------------------------------------- */

static const char *const REPLAYS[3] = {"stream-ordered", "cudaFree lag 0", "cudaFree lag 1000"};

/* One replay of a job against the bounds: which of them it meets. */
typedef struct bound_s {
    int ran;
    double ratio, min_ratio;      /* min_ratio NAN: no smallest device found */
    int reserved_ok, min_ok;
} bound_t;

static bound_t bound_of(uint64_t live, uint64_t reserved, uint64_t min)
{
    bound_t b = {0};
    if (!live)
        return b;
    b.ran = 1;
    b.ratio = (double)reserved / (double)live;
    b.min_ratio = min ? (double)min / (double)live : NAN;
    double allowed = (double)live * BOUND_RATIO;
    if (allowed < (double)(live + BOUND_SLACK))
        allowed = (double)(live + BOUND_SLACK);
    b.reserved_ok = (double)reserved <= allowed;
    b.min_ok = min && (double)min <= (double)live * BOUND_MIN_RATIO;
    return b;
}

/* The job's three replays: stream-ordered (its plugin row), cudaFree's at
 * lag 0 and at lag 1000 (its preload row). */
static void bounds_of_job(const row_t *rows, size_t n, const char *job, bound_t out[3])
{
    memset(out, 0, 3 * sizeof *out);
    for (size_t i = 0; i < n; i++) {
        const row_t *r = &rows[i];
        if (strcmp(r->job, job) != 0 || !r->ok)
            continue;
        if (r->way == 0) {
            out[0] = bound_of(r->peak_live, r->peak_reserved, r->min_capacity);
        } else {
            out[2] = bound_of(r->peak_live, r->peak_reserved, r->min_capacity);
            if (r->lag0_ok)
                out[1] = bound_of(r->lag0_live, r->lag0_reserved, r->lag0_min);
        }
    }
}

static void print_bounds(const row_t *rows, size_t n, int json)
{
    if (!json)
        printf("\nbounds (issue 42): peak reserved <= max(%.2fx live, live + %llu MiB), smallest device <= %.2fx "
               "live;\neach replay: ratio, smallest device, and which bounds it misses\n%-20s %-8s %-26s %-26s %-26s\n",
               BOUND_RATIO, BOUND_SLACK >> 20, BOUND_MIN_RATIO, "job", "set", REPLAYS[0], REPLAYS[1], REPLAYS[2]);
    for (int held = 0; held < 2; held++) {
        size_t ran = 0, met = 0, reserved_ok = 0, min_ok = 0;
        for (size_t i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            if (r->way != 0 || r->held_out != held)
                continue;
            bound_t b[3];
            bounds_of_job(rows, n, r->job, b);
            if (!json)
                printf("%-20s %-8s", r->job, SETS[held]);
            for (int k = 0; k < 3; k++) {
                if (!b[k].ran) {
                    if (!json)
                        printf(" %-26s", "not replayed");
                    continue;
                }
                ran++;
                met += (size_t)(b[k].reserved_ok && b[k].min_ok);
                reserved_ok += (size_t)b[k].reserved_ok;
                min_ok += (size_t)b[k].min_ok;
                if (json) {
                    printf("{\"bound\":{\"job\":\"%s\",\"set\":\"%s\",\"replay\":\"%s\",\"ratio\":%.6f,", r->job,
                           SETS[held], REPLAYS[k], b[k].ratio);
                    if (isnan(b[k].min_ratio))
                        printf("\"min_ratio\":null,");
                    else
                        printf("\"min_ratio\":%.6f,", b[k].min_ratio);
                    printf("\"reserved_ok\":%s,\"min_ok\":%s}}\n", b[k].reserved_ok ? "true" : "false",
                           b[k].min_ok ? "true" : "false");
                    continue;
                }
                char cell[64], min[16];
                if (isnan(b[k].min_ratio))
                    snprintf(min, sizeof min, "none");
                else
                    snprintf(min, sizeof min, "%.4f", b[k].min_ratio);
                snprintf(cell, sizeof cell, "%.4f %s %s", b[k].ratio, min,
                         b[k].reserved_ok && b[k].min_ok ? "ok"
                         : !b[k].reserved_ok && !b[k].min_ok ? "MISSES BOTH"
                         : !b[k].reserved_ok ? "MISSES 1.03x" : "MISSES 1.02x");
                printf(" %-26s", cell);
            }
            if (!json)
                printf("\n");
        }
        if (!ran)
            continue;
        if (json)
            printf("{\"bounds_summary\":{\"set\":\"%s\",\"replays\":%zu,\"met\":%zu,\"reserved_ok\":%zu,"
                   "\"min_ok\":%zu}}\n", SETS[held], ran, met, reserved_ok, min_ok);
        else
            printf("%-8s bounds: %zu of %zu replays meet both (peak reserved: %zu, smallest device: %zu)\n",
                   SETS[held], met, ran, reserved_ok, min_ok);
    }
}

/* ---- the rule -------------------------------------------------------------------- */

/* Fills base_ratio from an earlier --json run. */
static void read_baseline(const char *path, row_t *rows, size_t n)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, PROG ": cannot open baseline %s: %s\n", path, strerror(errno));
        exit(1);
    }
    char line[4096];
    size_t lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        cuh_json_error_t err;
        cuh_json_doc_t *doc = cuh_json_parse(line, strlen(line), NULL, &err);
        if (!doc) {
            fprintf(stderr, PROG ": %s:%zu: not a line of '" PROG " --json': %s\n", path, lineno, err.message);
            exit(1);
        }
        const cuh_json_t *r = cuh_json_root(doc), *job = cuh_json_get(r, "job"), *way = cuh_json_get(r, "way"),
                         *ratio = cuh_json_get(r, "ratio");
        if (job && way && ratio && job->type == CUH_JSON_STRING && way->type == CUH_JSON_STRING &&
            ratio->type == CUH_JSON_NUMBER)
            for (size_t i = 0; i < n; i++)
                if (strcmp(rows[i].job, job->v.string.s) == 0 && strcmp(WAYS[rows[i].way], way->v.string.s) == 0)
                    rows[i].base_ratio = ratio->v.number.d;
        cuh_json_free(doc);
    }
    fclose(f);
}

/* The baseline's summary of one way, from the rows' base ratios. */
static summary_t base_summary(const row_t *rows, size_t n, int way)
{
    row_t *copy = malloc(n * sizeof *copy);
    if (!copy) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (rows[i].way == way && !rows[i].held_out && !isnan(rows[i].base_ratio)) {
            copy[k] = rows[i];
            copy[k].ok = 1;
            copy[k].ratio = rows[i].base_ratio;
            k++;
        }
    summary_t s = summarize(copy, k, 0, way);
    free(copy);
    return s;
}

/* Applies the rule over the tuning set; 1 when the change is kept. */
static int verdict(const row_t *rows, size_t n)
{
    int kept = 1;
    for (int w = 0; w < NUM_WAYS; w++) {
        summary_t now = summarize(rows, n, 0, w), then = base_summary(rows, n, w);
        if (then.jobs != now.jobs) {
            printf("rule: %s: the baseline has %zu of the %zu tuning jobs; compare like with like\n", WAYS[w],
                   then.jobs, now.jobs);
            kept = 0;
            continue;
        }
        int better = now.median < then.median && now.worst < then.worst;
        printf("rule: %s: median %.4f -> %.4f, worst %.4f -> %.4f: %s\n", WAYS[w], then.median, now.median,
               then.worst, now.worst, better ? "both improve" : "not both improved");
        kept &= better;
        for (size_t i = 0; i < n; i++) {
            const row_t *r = &rows[i];
            if (r->way == w && !r->held_out && r->ok && !isnan(r->base_ratio) &&
                r->ratio > r->base_ratio * (1 + WORSE_BOUND)) {
                printf("rule: %s: %s is worse by %.2f%% (over the 0.5%% bound)\n", WAYS[w], r->job,
                       100.0 * (r->ratio / r->base_ratio - 1));
                kept = 0;
            }
        }
    }
    printf("rule: the change is %s\n", kept ? "KEPT" : "NOT KEPT");
    return kept;
}

/* ---- main ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    options_t o;
    parse_options(argc, argv, &o);
    char replay[4096];
    if (!o.replay) {
        const char *slash = strrchr(argv[0], '/');
        snprintf(replay, sizeof replay, "%.*scuheap-replay", slash ? (int)(slash - argv[0] + 1) : 0, argv[0]);
        o.replay = replay;
    }
    if (access(o.replay, X_OK) != 0)
        usage_error("cannot run %s (%s); give --replay PATH", o.replay, strerror(errno));
    static row_t jobs[MAX_JOBS];
    size_t njobs = read_manifest(o.dir, jobs, MAX_JOBS);
    row_t *rows = calloc(njobs * NUM_WAYS, sizeof *rows);
    if (!rows) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    size_t n = 0;
    int failed = 0;
    for (int held = 0; held < 2; held++)
        for (size_t j = 0; j < njobs; j++)
            for (int w = 0; w < NUM_WAYS; w++) {
                if (jobs[j].held_out != held || (held && o.tuning_only))
                    continue;
                row_t *r = &rows[n++];
                *r = jobs[j];
                r->way = w;
                r->base_ratio = NAN;
                failed |= replay_row(&o, r, 0) != 0;
                if (o.bounds && w == 1)
                    failed |= replay_row(&o, r, 1) != 0;
            }
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < n; k++)
            if (rows[k].ok && rows[k].way == 0 && strcmp(rows[k].job, rows[i].job) == 0) {
                rows[i].ref_live = rows[k].peak_live;
                rows[i].libs = rows[i].way == 1 ? (int64_t)rows[i].peak_live - (int64_t)rows[k].peak_live : 0;
            }
    if (o.baseline)
        read_baseline(o.baseline, rows, n);
    if (o.json) {
        for (size_t i = 0; i < n; i++)
            json_row(&rows[i]);
    } else {
        printf("ratio, min cap: cuheap's peak reserved and smallest device over the trace's peak live bytes,\n"
               "  replayed with the way's defaults (plugin: stream-ordered frees; preload: cudaMalloc/cudaFree)\n"
               "native, expand, async: PyTorch's peak reserved measured on the GPU, over its tensors' live peak\n"
               "  (the plugin trace's); best: the least of the three, and cuheap's bytes against it\n"
               "libs: MiB the libraries took with cudaMalloc themselves under LD_PRELOAD (the preload trace's\n"
               "  live peak beyond the plugin trace's), which PyTorch's figures do not hold: vs best leaves them out\n"
               "calls: map and unmap calls a step after the first step, in the replay (a page moved is one\n"
               "  of each; a unit of vmm_unit bytes takes one); worst: in the step after the first that made\n"
               "  the most (the step a user feels); +time: the calls a step at about 27.5 us each on an H200\n"
               "  (55 us a page moved), over PyTorch native's step\n"
               "plan: a steady step (the third) laid out before it runs, greedy by size (cuheap-replay's plan):\n"
               "  the bytes live through it plus the layout's, over the live peak; varies: the next step asks for\n"
               "  other sizes, so no layout learned from one step would serve the next\n"
               "%s\n", o.baseline ? "last column: cuheap's ratio against the baseline's\n" : "");
        printf("%-20s %-8s %-7s %8s %7s %7s %7s %7s %7s  %-10s %7s %6s %8s %7s %7s %7s\n", "job", "set", "way",
               "live GiB", "ratio", "min cap", "native", "expand", "async", "best", "vs best", "libs", "calls", "worst",
               "+time", "plan");
        for (size_t i = 0; i < n; i++)
            print_row(&rows[i]);
        printf("\n");
    }
    for (int held = 0; held < 2; held++)
        for (int w = 0; w < NUM_WAYS; w++) {
            summary_t s = summarize(rows, n, held, w);
            if (o.json)
                json_summary(&s, held, w);
            else
                print_summary(&s, held, w);
        }
    if (o.bounds)
        print_bounds(rows, n, o.json);
    int kept = 1;
    if (o.baseline && !o.json)
        kept = verdict(rows, n);
    free(rows);
    return failed ? 1 : kept ? 0 : 3;
}
