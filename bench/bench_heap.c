/* bench_heap.c - the heap's own speed on the simulated device (no GPU).
 *
 * For several size mixes and 1, 2, 4, 8 and 16 threads, each thread keeps a
 * working set of live blocks on its own stream and replaces one at random per
 * step (a free, then a malloc of a fresh size): the steady state of a caching
 * allocator. "pair" is the warm fast path: malloc and free of one size, back
 * to back. Prints nanoseconds per malloc+free (wall time over the operations
 * of one thread) and the throughput relative to one thread, measured side by
 * side in one run. Then device-wide frees (cudaFree semantics) against
 * stream-ordered ones: their cost and the events they record per free. Last,
 * memory: what a program that frees on many streams holds over what it has
 * live, as the GPU falls behind, with and without reuse_across_streams.
 */
#include "config.h"
#include "device.h"
#include "heap.h"
#include "runtime.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

typedef struct mix_s {
    const char *name;
    size_t min, max;        /* sizes uniform in [min, max] */
    size_t big_min, big_max;
    unsigned big_percent;   /* share of requests drawn from the big range */
    int live;               /* working set per thread; 0 = malloc/free pairs */
} mix_t;

static const mix_t mixes[] = {
    {"pair 4 KiB", 4 * KiB, 4 * KiB, 0, 0, 0, 0},
    {"pair 1 MiB", MiB, MiB, 0, 0, 0, 0},
    {"small 512 B-64 KiB", 512, 64 * KiB, 0, 0, 0, 64},
    {"large 1-64 MiB", MiB, 64 * MiB, 0, 0, 0, 64},
    {"mixed (80% small, 20% 1-8 MiB)", 512, 64 * KiB, MiB, 8 * MiB, 20, 64},
};

/* One thread's job, a cache line of its own: the timed loop works on locals,
 * so that threads share nothing but the heap. */
typedef struct job_s {
    _Alignas(64) cuh_heap_t *heap;
    const mix_t *mix;
    long ops;
    uint64_t seed;
    double seconds;
    int failures;
} job_t;

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t draw(const mix_t *m, uint64_t *s)
{
    uint64_t r = next_rand(s);
    if (m->big_percent && r % 100 < m->big_percent)
        return m->big_min + (size_t)(r >> 8) % (m->big_max - m->big_min + 1);
    return m->min + (m->max > m->min ? (size_t)(r >> 8) % (m->max - m->min + 1) : 0);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *run(void *arg)
{
    job_t *j = arg;
    cuh_heap_t *heap = j->heap;
    const mix_t *mix = j->mix;
    uint64_t seed = j->seed;
    int failures = 0;
    cuh_stream_t stream = (cuh_stream_t)(uintptr_t)(0x1000 + (seed << 4));
    uintptr_t live[256] = {0};
    int n = mix->live;
    /* Warm up: fill the working set and cycle it once. */
    for (int i = 0; i < n; i++)
        failures += cuh_heap_malloc(heap, draw(mix, &seed), stream, &live[i]) != CUHEAP_OK;
    double t0 = 0;
    for (long op = -j->ops / 4; op < j->ops; op++) {
        if (op == 0)
            t0 = now();
        if (n) {
            int i = (int)(next_rand(&seed) % (uint64_t)n);
            failures += cuh_heap_free(heap, live[i], stream) != CUHEAP_OK;
            failures += cuh_heap_malloc(heap, draw(mix, &seed), stream, &live[i]) != CUHEAP_OK;
        } else {
            uintptr_t a;
            failures += cuh_heap_malloc(heap, mix->min, stream, &a) != CUHEAP_OK;
            failures += cuh_heap_free(heap, a, stream) != CUHEAP_OK;
        }
    }
    j->seconds = now() - t0;
    for (int i = 0; i < n; i++)
        failures += cuh_heap_free(heap, live[i], stream) != CUHEAP_OK;
    j->failures = failures;
    return NULL;
}

/* A heap with `conf` (CUHEAP_CONF syntax) on a simulated device of
 * `capacity` bytes. */
static cuh_heap_t *heap_on_sim(cuh_device_t **dev, size_t capacity, const char *conf)
{
    *dev = cuh_sim_create(&(cuh_sim_params_t){.capacity = capacity});
    cuh_config_t cfg;
    cuh_config_defaults(&cfg);
    char err[256];
    cuh_heap_t *heap = NULL;
    if (!*dev || cuh_config_parse(conf, &cfg, err, sizeof err) || !(heap = cuh_heap_create(*dev, &cfg, err, sizeof err))) {
        fprintf(stderr, "bench_heap: %s\n", *dev ? err : "cannot create the simulated device");
        exit(1);
    }
    return heap;
}

/* The heap of the speed benchmarks: default settings (vmm:1) on an H200's
 * 140 GiB (16 threads of the large mix keep up to 64 GiB live), with
 * thread_cache:0 when no_thread_cache; BENCH_CONF adds settings (vmm:0). */
static int no_thread_cache;

static cuh_heap_t *speed_heap(cuh_device_t **dev)
{
    const char *extra = getenv("BENCH_CONF");
    char conf[256];
    snprintf(conf, sizeof conf, "%s%s%s", no_thread_cache ? "thread_cache:0" : "",
             no_thread_cache && extra && *extra ? "," : "", extra ? extra : "");
    return heap_on_sim(dev, (size_t)140 << 30, conf);
}

/* The peak reserved and the peak requested bytes of the last measure(). */
static size_t last_peaks[2];
static uint64_t last_lent;   /* and the chunks lent to its threads */

/* ns per malloc+free for `threads` threads on one heap. */
static double measure(const mix_t *mix, int threads, long ops)
{
    cuh_device_t *dev;
    cuh_heap_t *heap = speed_heap(&dev);
    pthread_t th[16];
    job_t jobs[16];
    for (int i = 0; i < threads; i++) {
        jobs[i] = (job_t){.heap = heap, .mix = mix, .ops = ops, .seed = 0x9E3779B97F4A7C15ull + (uint64_t)i * 7919};
        pthread_create(&th[i], NULL, run, &jobs[i]);
    }
    double worst = 0;
    int failures = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].seconds > worst)
            worst = jobs[i].seconds;
        failures += jobs[i].failures;
    }
    if (failures) {
        fprintf(stderr, "bench_heap: %d operations failed in '%s'\n", failures, mix->name);
        exit(1);
    }
    cuh_heap_chunks(heap, NULL, &last_lent);
    cuheap_stats_t st;
    cuh_heap_stats(heap, &st);
    last_peaks[0] = st.reserved.peak;
    last_peaks[1] = st.requested.peak;
    cuh_heap_destroy(heap);
    dev->ops->destroy(dev);
    return worst * 1e9 / (double)ops;
}

/* ns per malloc+free through the public API on a simulated device, with or
 * without trace:PATH recording every operation. */
static double measure_api(const char *conf, long ops)
{
    cuh_runtime_reset();
    cuh_runtime_use_sim((size_t)1 << 40);
    if (conf && cuheap_configure(conf) != CUHEAP_OK) {
        fprintf(stderr, "bench_heap: %s\n", cuheap_last_error());
        exit(1);
    }
    void *live[64] = {0};
    uint64_t seed = 12345;
    double t0 = 0;
    for (long op = -ops / 4; op < ops; op++) {
        if (op == 0)
            t0 = now();
        int i = (int)(next_rand(&seed) % 64);
        if (live[i])
            cuheap_free(live[i], 0, NULL);
        cuheap_malloc(&live[i], draw(&mixes[4], &seed), 0, NULL);
    }
    double ns = (now() - t0) * 1e9 / (double)ops;
    for (int i = 0; i < 64; i++)
        cuheap_free(live[i], 0, NULL);
    cuh_runtime_reset();
    return ns;
}

/* ns per pinned host alloc+free (cuheap_host_alloc/cuheap_host_free, the
 * code behind cudaHostAlloc under LD_PRELOAD) of `size` bytes on a simulated
 * device, 64 buffers live, one thread. */
static double measure_pinned(size_t size, long ops)
{
    cuh_runtime_reset();
    cuh_runtime_use_sim((size_t)1 << 40);
    void *live[64] = {0};
    uint64_t seed = 777;
    double t0 = 0;
    for (long op = -ops / 4; op < ops; op++) {
        if (op == 0)
            t0 = now();
        int i = (int)(next_rand(&seed) % 64);
        if (live[i] && cuheap_host_free(live[i]) != CUHEAP_OK)
            exit(1);
        if (cuheap_host_alloc(&live[i], size, 0) != CUHEAP_OK) {
            fprintf(stderr, "bench_heap: %s\n", cuheap_last_error());
            exit(1);
        }
    }
    double ns = (now() - t0) * 1e9 / (double)ops;
    for (int i = 0; i < 64; i++)
        cuheap_host_free(live[i]);
    cuh_runtime_reset();
    return ns;
}

/* Device-wide frees (cudaFree) against stream-ordered ones, one thread,
 * mixed sizes, four streams known to the heap. The simulated GPU catches up
 * with all work every `lag` operations (0: at once). Returns ns per
 * malloc+free; *events gets the events recorded per free. */
static double measure_device_wide(int device_wide, long lag, long ops, double *events)
{
    cuh_device_t *dev;
    cuh_heap_t *heap = speed_heap(&dev);
    cuh_sim_hold_events(dev, lag > 0);
    const mix_t *mix = &mixes[4];
    const cuh_stream_t stream = (cuh_stream_t)0x1000;
    for (uintptr_t s = 1; s <= 3; s++)
        cuh_heap_register_stream(heap, (cuh_stream_t)(0x1000 + s * 0x100));
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    uintptr_t live[64];
    int failures = 0;
    for (int i = 0; i < 64; i++)
        failures += cuh_heap_malloc(heap, draw(mix, &seed), stream, &live[i]) != CUHEAP_OK;
    cuh_sim_counters_t c0, c1;
    double t0 = 0;
    for (long op = -ops / 4; op < ops; op++) {
        if (op == 0) {
            cuh_sim_counters(dev, &c0);
            t0 = now();
        }
        int i = (int)(next_rand(&seed) % 64);
        failures += (device_wide ? cuh_heap_free_device_wide(heap, live[i]) : cuh_heap_free(heap, live[i], stream)) !=
                    CUHEAP_OK;
        failures += cuh_heap_malloc(heap, draw(mix, &seed), stream, &live[i]) != CUHEAP_OK;
        if (lag && op % lag == 0)
            cuh_sim_complete_all(dev);
    }
    double seconds = now() - t0;
    cuh_sim_counters(dev, &c1);
    *events = (double)(c1.events_recorded - c0.events_recorded) / (double)ops;
    for (int i = 0; i < 64; i++)
        failures += cuh_heap_free(heap, live[i], stream) != CUHEAP_OK;
    if (failures) {
        fprintf(stderr, "bench_heap: %d operations failed in the device-wide free benchmark\n", failures);
        exit(1);
    }
    cuh_heap_destroy(heap);
    dev->ops->destroy(dev);
    return seconds * 1e9 / (double)ops;
}

/* Memory held by a program that frees on many streams: the GPU check's
 * LD_PRELOAD stress (tests/gpu/preload_stress.cu) on the simulated device.
 * 32 streams, up to 256 blocks live of 1 B to 32 MiB, half the allocations
 * device-wide (cudaMalloc) and half on a random stream (cudaMallocAsync),
 * half the frees device-wide (cudaFree) and half on the block's stream
 * (cudaFreeAsync), a kernel on the block's stream before each free; the GPU
 * finishes its work every `lag` operations. Returns peak reserved over peak
 * live; *cpu_waits gets how often the CPU waited for the GPU. */
static double measure_streams_memory(const char *conf, long lag, long ops, uint64_t *cpu_waits)
{
    /* An H200's memory: vmm:1 reserves four times as much address space. */
    cuh_device_t *dev;
    cuh_heap_t *heap = heap_on_sim(&dev, (size_t)140 << 30, conf);
    cuh_sim_hold_events(dev, 1);
    enum { STREAMS = 32, LIVE = 256 };
    cuh_stream_t streams[STREAMS];
    for (int i = 0; i < STREAMS; i++) {
        streams[i] = (cuh_stream_t)(0x10000 + (uintptr_t)i * 0x100);
        cuh_heap_register_stream(heap, streams[i]);
    }
    struct { uintptr_t addr; size_t size; int stream; } live[LIVE];
    int num = 0, failures = 0;
    size_t live_bytes = 0, peak_live = 0;
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (long op = 0; op < ops; op++) {
        if (num == LIVE || (num && next_rand(&seed) % 2)) {
            int k = (int)(next_rand(&seed) % (uint64_t)num);
            cuh_sim_enqueue_work(dev, streams[live[k].stream]);
            failures += (next_rand(&seed) % 2 ? cuh_heap_free_device_wide(heap, live[k].addr)
                                              : cuh_heap_free(heap, live[k].addr, streams[live[k].stream])) != CUHEAP_OK;
            live_bytes -= live[k].size;
            live[k] = live[--num];
        } else {
            uint64_t r = next_rand(&seed);
            size_t size = r % 8 < 3 ? 1 + (r >> 8) % 4096
                        : r % 8 < 5 ? 4096 + (r >> 8) % (256 * KiB)
                        : r % 8 < 7 ? 256 * KiB + (r >> 8) % (4 * MiB)
                                    : 4 * MiB + (r >> 8) % (28 * MiB);
            int si = (int)(next_rand(&seed) % STREAMS);
            uintptr_t addr = 0;
            failures += (next_rand(&seed) % 2 ? cuh_heap_malloc_device_wide(heap, size, &addr)
                                              : cuh_heap_malloc(heap, size, streams[si], &addr)) != CUHEAP_OK;
            cuh_sim_enqueue_work(dev, streams[si]);
            live[num].addr = addr, live[num].size = size, live[num].stream = si;
            num++;
            live_bytes += size;
            if (live_bytes > peak_live)
                peak_live = live_bytes;
        }
        if (op % lag == 0)
            cuh_sim_complete_all(dev);
    }
    cuheap_stats_t st;
    cuh_heap_stats(heap, &st);
    if (failures) {
        fprintf(stderr, "bench_heap: %d operations failed in the many-streams benchmark\n", failures);
        exit(1);
    }
    *cpu_waits = st.num_cpu_waits;
    cuh_heap_destroy(heap);
    dev->ops->destroy(dev);
    return (double)st.reserved.peak / (double)peak_live;
}

/* --only MIX THREADS [thread_cache:0]: one measurement, for profiling. */
static int only(const char *prog, const char *name, const char *threads_arg, const char *flag, long ops)
{
    const mix_t *mix = NULL;
    for (size_t m = 0; m < sizeof mixes / sizeof mixes[0] && !mix; m++)
        if (strstr(mixes[m].name, name))
            mix = &mixes[m];
    char *end;
    long threads = strtol(threads_arg, &end, 10);
    if (!mix || *end || threads < 1 || threads > 16 || (flag && strcmp(flag, "thread_cache:0"))) {
        fprintf(stderr, "%s: --only takes a mix (part of a name:", prog);
        for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++)
            fprintf(stderr, "%s '%s'", m ? "," : "", mixes[m].name);
        fprintf(stderr, "), 1-16 threads and optionally thread_cache:0\n");
        return 2;
    }
    no_thread_cache = flag != NULL;
    double ns = measure(mix, (int)threads, ops);
    printf("%s%s, %ld thread%s: %.0f ns per malloc+free; peak reserved %.2f GiB for a peak of %.2f GiB requested; "
           "%llu chunks lent\n",
           mix->name, flag ? ", thread_cache:0" : "", threads, threads > 1 ? "s" : "", ns,
           (double)last_peaks[0] / (double)(1 << 30), (double)last_peaks[1] / (double)(1 << 30),
           (unsigned long long)last_lent);
    return 0;
}

int main(int argc, char **argv)
{
    long ops = 400000;
    int first = 1;
    if (argc >= 2 && strcmp(argv[1], "--only") != 0 && strcmp(argv[1], "-h") != 0 && strcmp(argv[1], "--help") != 0) {
        char *end;
        ops = strtol(argv[1], &end, 10);
        if (*argv[1] == '\0' || *end != '\0' || ops < 1000) {
            fprintf(stderr, "%s: OPS must be a whole number of at least 1000, not '%s'\n", argv[0], argv[1]);
            return 2;
        }
        first = 2;
    }
    if (argc > first && !strcmp(argv[first], "--only") && (argc == first + 3 || argc == first + 4))
        return only(argv[0], argv[first + 1], argv[first + 2], argc == first + 4 ? argv[first + 3] : NULL, ops);
    if (argc > first) {
        int help = !strcmp(argv[first], "-h") || !strcmp(argv[first], "--help");
        fprintf(help ? stdout : stderr,
                "usage: %s [OPS] [--only MIX THREADS [thread_cache:0]]\n"
                "  OPS: operations per thread and measurement (default 400000); --only: one measurement\n"
                "  of the mix whose name contains MIX with THREADS threads (for profiling)\n",
                argv[0]);
        return help ? 0 : 2;
    }
    static const int thread_counts[] = {1, 2, 4, 8, 16};
    printf("ns per malloc+free (one thread's wall time / its operations); throughput vs 1 thread in ()\n\n");
    printf("| mix | 1 thread | 2 | 4 | 8 | 16 |\n|---|---|---|---|---|---|\n");
    /* Each mix with thread caches (the default) and without, side by side. */
    for (size_t row = 0; row < 2 * sizeof mixes / sizeof mixes[0]; row++) {
        size_t m = row / 2;
        no_thread_cache = (int)(row % 2);
        printf("| %s%s |", mixes[m].name, no_thread_cache ? ", thread_cache:0" : "");
        double one = 0;
        for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
            double ns = measure(&mixes[m], thread_counts[t], ops);
            if (t == 0) {
                one = ns;
                printf(" %.0f ns |", ns);
            } else {
                printf(" %.0f ns (%.2fx) |", ns, one / ns * thread_counts[t]);
            }
            fflush(stdout);
        }
        printf("\n");
    }
    no_thread_cache = 0;
    double plain = measure_api(NULL, ops), traced = measure_api("trace:/tmp/cuheap-bench-%p.trace", ops);
    char path[64];
    snprintf(path, sizeof path, "/tmp/cuheap-bench-%d.trace", (int)getpid());
    unlink(path);
    printf("\npublic API, mixed sizes, 1 thread: %.0f ns per malloc+free; with trace:PATH recording %.0f ns "
           "(%.2fx)\n", plain, traced, traced / plain);

    printf("\npinned host memory (cuheap_host_alloc + cuheap_host_free), 64 live, 1 thread: "
           "4 KiB %.0f ns, 64 KiB %.0f ns, 1 MiB %.0f ns per pair\n",
           measure_pinned(4096, ops), measure_pinned(65536, ops), measure_pinned(1 << 20, ops / 4));

    printf("\ncudaFree-style device-wide frees vs stream-ordered frees, mixed sizes, 1 thread, 4 streams "
           "(the GPU catches up every N operations)\n\n");
    printf("| GPU catches up | stream free | device-wide free | ratio | events per device-wide free |\n"
           "|---|---|---|---|---|\n");
    static const long lags[] = {0, 8, 64};
    for (size_t l = 0; l < sizeof lags / sizeof lags[0]; l++) {
        double ev_stream, ev_wide;
        double ns_stream = measure_device_wide(0, lags[l], ops, &ev_stream);
        double ns_wide = measure_device_wide(1, lags[l], ops, &ev_wide);
        char when[32];
        snprintf(when, sizeof when, lags[l] ? "every %ld ops" : "at once", lags[l]);
        printf("| %s | %.0f ns | %.0f ns | %.2fx | %.3f |\n", when, ns_stream, ns_wide, ns_wide / ns_stream, ev_wide);
        fflush(stdout);
    }

    printf("\npeak reserved / peak live of a program that frees on 32 streams (the GPU check's LD_PRELOAD "
           "stress), 200,000 operations, the GPU done every N operations; CPU waits in ()\n\n");
    printf("| GPU done every | plain | plain, reuse_across_streams:1 | vmm:1 | vmm:1, reuse_across_streams:1 |\n"
           "|---|---|---|---|---|\n");
    static const char *const confs[] = {"vmm:0", "vmm:0,reuse_across_streams:1", "vmm:1", "vmm:1,reuse_across_streams:1"};
    static const long stress_lags[] = {1, 1000, 10000};
    for (size_t l = 0; l < sizeof stress_lags / sizeof stress_lags[0]; l++) {
        printf("| %ld ops |", stress_lags[l]);
        for (size_t c = 0; c < sizeof confs / sizeof confs[0]; c++) {
            uint64_t waits;
            double ratio = measure_streams_memory(confs[c], stress_lags[l], 200000, &waits);
            printf(" %.2fx (%llu) |", ratio, (unsigned long long)waits);
            fflush(stdout);
        }
        printf("\n");
    }
    return 0;
}
