/* bench_per_tensor.c - what one tensor costs the CPU on each way into cuheap,
 * and which driver calls it makes, without a GPU (issue 45).
 *
 * A tensor through PyTorch is one allocation and one free. This program
 * makes them as PyTorch would, in a loop, for the sizes of
 * bench/torch/per_tensor.py (512 B, 64 KiB, 1 MiB, 64 MiB, and its mixed
 * live set: a window of live blocks of mixed sizes, the oldest freed as each
 * new one comes), and prints for each the nanoseconds per allocation+free and
 * the calls per allocation+free that reached the driver (or, on the
 * simulated device, cuheap's device interface), with the functions called
 * most. The ways in:
 *
 *   bench_per_tensor plugin LIB   PyTorch's plugin entry points of LIB
 *                                 (cuheap_torch_alloc/free, or the floor's
 *                                 floor_alloc/free), loaded with dlopen as
 *                                 PyTorch loads them, on the fake driver, the
 *                                 primary context current as in PyTorch's
 *                                 threads, on the legacy default stream (the
 *                                 stream of a plain loop of torch.empty)
 *   bench_per_tensor runtime      cudaMalloc/cudaFree through the fake runtime:
 *                                 served by whatever is preloaded (cuheap, the
 *                                 floor), or by the fake runtime alone
 *   bench_per_tensor_sim plugin   cuheap_torch_alloc/free of libcuheap.a on the
 *                                 simulated device (the same source, built with
 *                                 PER_TENSOR_SIM): no driver at all
 *
 * CUHEAP_CONF applies as always (vmm:0, vmm:1). The fake driver's own work
 * (a lock per call) is in the figures: they bound cuheap's CPU cost from
 * above, and the calls are what a GPU's driver would be asked.
 *
 * A tight loop keeps the allocator's code and data in the CPU's caches; a
 * Python loop does not (between two tensors the interpreter runs through its
 * own), and there a pair's cost follows the cache lines it touches more than
 * its instructions (docs/benchmarks.md: 45 ns saved in C did not show in
 * Python). --cold KIB models that: before each allocation and each free the
 * loop writes a line in every 64 bytes of a KIB KiB buffer (Python's
 * footprint between two calls), and only the calls are timed, each between
 * two clock reads (the clock's own cost, measured with nothing between,
 * taken off twice: a pair is two calls). Under valgrind --tool=cachegrind
 * (scripts/cold_misses.sh) the cache lines a pair misses are counted.
 *
 * usage: bench_per_tensor [--pairs N] [--size BYTES] [--cold KIB] plugin LIB | runtime
 *   --pairs N      pairs per round (3 rounds, the median; default 200000)
 *   --size BYTES   that size alone, 0 the mixed live set alone (to profile one:
 *                  valgrind --tool=callgrind, perf record)
 *   --cold KIB     sweep KIB KiB between pairs (default 0: none)
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#ifdef PER_TENSOR_SIM
#include "hook_torch.h"
#include "runtime.h"
#else
#include "fake_cuda.h"
#include "fake_cudart.h"
#endif

#define MiB ((size_t)1 << 20)
#define ROUNDS 3
#define MAX_COUNTED 96
#define SHOWN 6

/* The mixed live set, as bench/torch/per_tensor.py makes it (MIXED_SIZES,
 * MIXED_WINDOW there): the sizes in turn, MIXED_WINDOW live at a time. */
static const size_t mixed_sizes[] = {512, 4096, 65536, 512, 262144, 1 << 20, 512, 16384,
                                     4 << 20, 512, 65536, 1 << 20, 2048, 16 << 20, 512, 64 << 20};
#define MIXED_WINDOW 32
#define NUM_MIXED (sizeof mixed_sizes / sizeof mixed_sizes[0])

/* PyTorch's pair: cudaStream_t is struct CUstream_st *, as cuheap_stream_t. */
struct CUstream_st;
typedef void *(*alloc_fn)(ssize_t, int, struct CUstream_st *);
typedef void (*free_fn)(void *, ssize_t, int, struct CUstream_st *);

static alloc_fn plugin_alloc;
static free_fn plugin_free;

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void *take(size_t size)
{
    void *p = NULL;
#ifndef PER_TENSOR_SIM
    if (!plugin_alloc) {
        if (cudaMalloc(&p, size) != cudaSuccess)
            p = NULL;
    } else
#endif
        p = plugin_alloc((ssize_t)size, 0, NULL);
    if (!p) {
        fprintf(stderr, "bench_per_tensor: allocating %zu bytes failed\n", size);
        exit(1);
    }
    return p;
}

static void give(void *p, size_t size)
{
#ifndef PER_TENSOR_SIM
    if (!plugin_free) {
        if (cudaFree(p) != cudaSuccess) {
            fprintf(stderr, "bench_per_tensor: cudaFree(%p) failed\n", p);
            exit(1);
        }
        return;
    }
#endif
    plugin_free(p, (ssize_t)size, 0, NULL);
}

/* The buffer swept between pairs (--cold), and its size in bytes. */
static volatile unsigned char *sweep_buf;
static size_t sweep_bytes;

static void sweep(void)
{
    for (size_t i = 0; i < sweep_bytes; i += 64)
        sweep_buf[i]++;
}

/* With --cold: nanoseconds spent in the calls alone, clock reads included. */
static double cold_ns;

/* take and give, with --cold each after a sweep and timed alone. */
static void *take_cold(size_t size)
{
    if (!sweep_bytes)
        return take(size);
    sweep();
    double t0 = now_ns();
    void *p = take(size);
    cold_ns += now_ns() - t0;
    return p;
}

static void give_cold(void *p, size_t size)
{
    if (!sweep_bytes) {
        give(p, size);
        return;
    }
    sweep();
    double t0 = now_ns();
    give(p, size);
    cold_ns += now_ns() - t0;
}

/* n allocation+free pairs of `size`, or of the mixed live set (size 0). */
static void pairs(long n, size_t size)
{
    if (size && !sweep_bytes) {
        for (long i = 0; i < n; i++)
            give(take(size), size);
        return;
    }
    if (size) {
        for (long i = 0; i < n; i++)
            give_cold(take_cold(size), size);
        return;
    }
    void *live[MIXED_WINDOW] = {0};
    size_t live_size[MIXED_WINDOW] = {0};
    for (long i = 0; i < n; i++) {
        /* The new one first, then the oldest goes, as per_tensor.py's deque. */
        size_t k = (size_t)i % MIXED_WINDOW, size_now = mixed_sizes[(size_t)i % NUM_MIXED];
        void *p = take_cold(size_now);
        if (live[k])
            give_cold(live[k], live_size[k]);
        live[k] = p;
        live_size[k] = size_now;
    }
    for (size_t k = 0; k < MIXED_WINDOW; k++)
        if (live[k])
            give(live[k], live_size[k]);
}

/* ---- counting what reaches the device --------------------------------------- */

typedef struct counts_s {
    int n;
    const char *names[MAX_COUNTED];
    unsigned long counts[MAX_COUNTED];
} counts_t;

#ifdef PER_TENSOR_SIM
/* The simulated device's counters, as named counts of device-interface calls. */
static void count_now(counts_t *c)
{
    cuh_sim_counters_t s;
    cuh_device_t *dev = cuh_runtime_device(0);
    memset(&s, 0, sizeof s);
    if (dev)
        cuh_sim_counters(dev, &s);
    const struct {
        const char *name;
        uint64_t n;
    } all[] = {{"mem_alloc", s.mem_allocs},        {"mem_free", s.mem_frees},
               {"event_record", s.events_recorded}, {"event_query", s.event_queries},
               {"event_wait", s.event_waits},       {"stream_wait", s.stream_waits},
               {"synchronize", s.synchronizes},     {"vm_create", s.vm_creates},
               {"vm_release", s.vm_releases},       {"vm_map", s.vm_maps},
               {"vm_unmap", s.vm_unmaps}};
    c->n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        c->names[c->n] = all[i].name;
        c->counts[c->n++] = all[i].n;
    }
}
static const char *const counted_what = "device calls";
#else
static fake_cuda_count_list_fn count_list;

static void count_now(counts_t *c)
{
    c->n = count_list(c->names, c->counts, MAX_COUNTED);
}
static const char *const counted_what = "driver calls";
#endif

static unsigned long count_of(const counts_t *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->names[i], name))
            return c->counts[i];
    return 0;
}

/* Prints the calls per pair between `before` and `after`, most first. */
static void print_calls(const counts_t *before, const counts_t *after, long n)
{
    unsigned long total = 0, diff[MAX_COUNTED];
    for (int i = 0; i < after->n; i++)
        total += diff[i] = after->counts[i] - count_of(before, after->names[i]);
    printf("%7.2f %s", (double)total / (double)n, counted_what);
    for (int shown = 0; shown < SHOWN; shown++) {
        int best = -1;
        for (int i = 0; i < after->n; i++)
            if (diff[i] && (best < 0 || diff[i] > diff[best]))
                best = i;
        if (best < 0)
            break;
        printf("%s %s %.2f", shown ? "," : ":", after->names[best], (double)diff[best] / (double)n);
        diff[best] = 0;
    }
    printf("\n");
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* What a clock read around nothing costs, after a sweep (--cold). */
static double clock_ns(long n)
{
    double ns[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double sum = 0;
        for (long i = 0; i < n; i++) {
            sweep();
            double t0 = now_ns();
            sum += now_ns() - t0;
        }
        ns[r] = sum / (double)n;
    }
    qsort(ns, ROUNDS, sizeof ns[0], by_value);
    return ns[ROUNDS / 2];
}

/* Times one size: a warm-up, then ROUNDS rounds of n pairs (the median);
 * with --cold, the pairs alone, less a clock read's cost. */
static void measure(const char *label, size_t size, long n)
{
    counts_t before, after;
    double ns[ROUNDS];
    pairs(n / 4 + MIXED_WINDOW, size);
    count_now(&before);
    for (int r = 0; r < ROUNDS; r++) {
        cold_ns = 0;
        double t0 = now_ns();
        pairs(n, size);
        ns[r] = ((sweep_bytes ? cold_ns : now_ns() - t0)) / (double)n;
    }
    count_now(&after);
    qsort(ns, ROUNDS, sizeof ns[0], by_value);
    printf("  %-10s %8.1f ns/pair ", label, ns[ROUNDS / 2] - (sweep_bytes ? 2 * clock_ns(n) : 0));
    print_calls(&before, &after, n * ROUNDS);
}

int main(int argc, char **argv)
{
    long n = 200000, only = -1;
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-'; i += 2)
        if (!strcmp(argv[i], "--pairs"))
            n = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--size"))
            only = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--cold"))
            sweep_bytes = (size_t)atol(argv[i + 1]) << 10;
        else
            n = 0;   /* a usage error below */
    const char *way = i < argc ? argv[i] : "";
    const char *lib = i + 1 < argc ? argv[i + 1] : NULL;
    const char *conf = getenv("CUHEAP_CONF");
    if (sweep_bytes && !(sweep_buf = calloc(1, sweep_bytes))) {
        fprintf(stderr, "bench_per_tensor: no memory for --cold\n");
        return 1;
    }
#ifdef PER_TENSOR_SIM
    if (n < 1 || strcmp(way, "plugin") != 0 || lib) {
        fprintf(stderr, "usage: bench_per_tensor_sim [--pairs N] [--size BYTES] [--cold KIB] plugin\n");
        return 2;
    }
    if (cuh_runtime_use_sim((size_t)80 << 30) != 0)
        return 1;
    cuheap_torch_init(1);   /* as PyTorch does when the allocator is made */
    plugin_alloc = cuheap_torch_alloc;
    plugin_free = cuheap_torch_free;
    printf("cuheap plugin on the simulated device (CUHEAP_CONF=%s)\n", conf ? conf : "");
#else
    if (n < 1 || !((!strcmp(way, "plugin") && lib) || (!strcmp(way, "runtime") && !lib))) {
        fprintf(stderr, "usage: bench_per_tensor [--pairs N] [--size BYTES] [--cold KIB] plugin LIB | runtime\n");
        return 2;
    }
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    void *sym = driver ? dlsym(driver, "fake_cuda_count_list") : NULL;
    if (!sym) {
        fprintf(stderr, "bench_per_tensor: the fake driver (libcuda.so.1 with fake_cuda_count_list) is not found\n");
        return 1;
    }
    memcpy(&count_list, &sym, sizeof sym);
    if (cudaFree(NULL) != cudaSuccess) {   /* the runtime's start: the primary context current */
        fprintf(stderr, "bench_per_tensor: cudaFree(NULL) failed\n");
        return 1;
    }
    if (lib) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "bench_per_tensor: %s\n", dlerror());
            return 1;
        }
        int floor = dlsym(h, "cuheap_torch_alloc") == NULL;
        void *a = dlsym(h, floor ? "floor_alloc" : "cuheap_torch_alloc");
        void *f = dlsym(h, floor ? "floor_free" : "cuheap_torch_free");
        void *init = floor ? NULL : dlsym(h, "cuheap_torch_init");
        if (!a || !f) {
            fprintf(stderr, "bench_per_tensor: %s has neither cuheap's nor the floor's plugin entry points\n", lib);
            return 1;
        }
        memcpy(&plugin_alloc, &a, sizeof a);
        memcpy(&plugin_free, &f, sizeof f);
        if (init) {
            void (*init_fn)(int);
            memcpy(&init_fn, &init, sizeof init);
            init_fn(1);   /* as PyTorch does when the allocator is made */
        }
        printf("%s plugin %s on the fake driver (CUHEAP_CONF=%s)\n", floor ? "floor" : "cuheap", lib,
               conf ? conf : "");
    } else {
        const char *pre = getenv("LD_PRELOAD");
        printf("cudaMalloc/cudaFree on the fake runtime, LD_PRELOAD=%s (CUHEAP_CONF=%s)\n", pre ? pre : "",
               conf ? conf : "");
    }
#endif
    if (only >= 0) {
        char label[32];
        snprintf(label, sizeof label, only ? "%ld B" : "mixed", only);
        measure(label, (size_t)only, n);
        return 0;
    }
    measure("512 B", 512, n);
    measure("64 KiB", 64 << 10, n);
    measure("1 MiB", MiB, n);
    measure("64 MiB", 64 * MiB, n);
    measure("mixed", 0, n);
    return 0;
}
