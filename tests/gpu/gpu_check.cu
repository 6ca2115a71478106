/* gpu_check.cu - tests cuheap's public API (include/cuheap.h) on a real GPU.
 *
 * The unit tests run the heap against a simulated device; this program runs
 * the real thing: libcuheap.a opens libcuda itself (dlopen) and hands out
 * device memory that kernels here write and read back. Seven checks, each
 * printing PASS or FAIL:
 *   a. basic     sizes 1 B .. 256 MiB: aligned, writable, disjoint, size 0, free(NULL)
 *   b. errors    not-owned pointer, double free, interior pointer; heap still works
 *   c. stress    8 host threads x 2 non-blocking streams, random sizes, every
 *                block stamped by a kernel and verified before its free
 *   d. cross-stream reuse  a block freed on a stream whose kernel is still
 *                running must not be handed to another stream yet
 *   e. stats     counters agree with what this program did; release_cached
 *                gives everything back but the workspace
 *   f. device-wide free  cudaFree's promise: a block freed device-wide while
 *                a kernel on another non-blocking stream still writes it is
 *                not handed out again before that kernel is done, and the
 *                free does not wait for it
 *   g. same-stream page move  under vmm:1, pages a stream freed while its
 *                kernels still read them move behind its next block at once
 *                (no new pages, no CPU wait); the queued kernels still read
 *                the old data through the old mappings, and the new block's
 *                kernels, queued after them, see the new block's data
 * Exit status 0 only if every check passed. Written in C style (compiled as
 * CUDA C++ by nvcc):
 *   nvcc -O2 -arch=sm_90 -std=c++17 -Iinclude tests/gpu/gpu_check.cu \
 *        build/libcuheap.a -ldl -lpthread -o build/gpu_check
 * Options: --ops N   malloc+free operations of the stress check (default 1000000)
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define STRESS_THREADS 8
#define STRESS_STREAMS 2          /* per thread */
#define STRESS_MAX_LIVE 64        /* live blocks per thread */
#define SAMPLE_EDGE 4096          /* bytes stamped at each end of a block */
#define SAMPLE_MID 4096           /* bytes stamped in between, evenly spread */

/* Slots of the device error counters (one unsigned long long each). */
#define CTR_BASIC 0               /* + size index, up to 16 */
#define CTR_ERRORS 16
#define CTR_STRESS 20             /* + thread */
#define CTR_CROSS 32
#define CTR_WIDE 33
#define CTR_MOVE 34
#define CTR_COUNT 64

/* ---- results ------------------------------------------------------------ */

enum { CK_BASIC, CK_ERRORS, CK_STRESS, CK_CROSS, CK_STATS, CK_WIDE, CK_MOVE, CK_N };

typedef struct result_s {
    const char *name;
    int ran;
    int failed;
    char figures[512];
} result_t;

static result_t g_res[CK_N] = {
    { "a. basic", 0, 0, "" },
    { "b. errors", 0, 0, "" },
    { "c. stress", 0, 0, "" },
    { "d. cross-stream reuse", 0, 0, "" },
    { "e. stats", 0, 0, "" },
    { "f. device-wide free", 0, 0, "" },
    { "g. same-stream page move", 0, 0, "" },
};

static unsigned long long *g_dctr;    /* device: CTR_COUNT error counters */

/* Successful calls this program made: what cuheap's counters must show. A
 * size-0 malloc, a free of NULL and a rejected free change nothing. */
static unsigned long long g_allocs, g_frees;

static void fail(int ck, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(int ck, const char *fmt, ...)
{
    va_list ap;
    g_res[ck].failed = 1;
    printf("FAIL [%s] ", g_res[ck].name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static void figures(int ck, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void figures(int ck, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_res[ck].figures, sizeof g_res[ck].figures, fmt, ap);
    va_end(ap);
}

static void report(int ck)
{
    printf("%s [%s] %s\n", g_res[ck].failed ? "FAIL" : "PASS", g_res[ck].name,
           g_res[ck].figures);
    fflush(stdout);
}

/* A CUDA runtime call that must succeed: otherwise the check fails with the
 * error's name and text, and the calling function returns `ret`. */
#define CU_OR(ck, ret, call)                                                     \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess) {                                                 \
            fail((ck), "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,          \
                 cudaGetErrorName(e_), cudaGetErrorString(e_));                  \
            return ret;                                                          \
        }                                                                        \
    } while (0)
#define CU(ck, call) CU_OR(ck, , call)
/* After every kernel launch. */
#define LAUNCHED(ck) CU(ck, cudaGetLastError())

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static const char *st_name(cuheap_status_t s)
{
    const char *n = cuheap_status_string(s);
    return n != NULL ? n : "(null)";
}

static const char *fmt_bytes(char *buf, size_t len, unsigned long long b)
{
    if (b >= (1ull << 30))
        snprintf(buf, len, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(buf, len, "%.2f MiB", (double)b / (double)(1ull << 20));
    else if (b >= (1ull << 10))
        snprintf(buf, len, "%.2f KiB", (double)b / (double)(1ull << 10));
    else
        snprintf(buf, len, "%llu B", b);
    return buf;
}

/* ---- kernels ------------------------------------------------------------ */

/* The byte that block `id` holds at `off`: a hash, so that any other block's
 * bytes (or stale ones) differ almost everywhere. */
__host__ __device__ static inline unsigned char pat8(unsigned long long id, unsigned long long off)
{
    unsigned long long x = id * 0x9E3779B97F4A7C15ull + off;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (unsigned char)(x ^ (x >> 8));
}

/* Every byte of the block. */
__global__ void k_fill(unsigned char *p, size_t n, unsigned long long id)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = pat8(id, i);
}

__global__ void k_check(const unsigned char *p, size_t n, unsigned long long id,
                        unsigned long long *errors)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        bad += p[i] != pat8(id, i);
    if (bad != 0)
        atomicAdd(errors, bad);
}

/* The stress check stamps only part of a large block, to keep each kernel
 * cheap (a million of them run): the first and the last SAMPLE_EDGE bytes and
 * SAMPLE_MID bytes spread evenly in between. Blocks up to 2*SAMPLE_EDGE +
 * SAMPLE_MID bytes are stamped whole. The ends are where a neighbour that
 * overlaps, or a block handed out twice, would show first. */
__host__ __device__ static inline size_t sample_count(size_t n)
{
    if (n <= 2 * SAMPLE_EDGE + SAMPLE_MID)
        return n;
    return 2 * SAMPLE_EDGE + SAMPLE_MID;
}

__host__ __device__ static inline size_t sample_offset(size_t n, size_t t)
{
    size_t mid;
    if (n <= 2 * SAMPLE_EDGE + SAMPLE_MID || t < SAMPLE_EDGE)
        return t;
    t -= SAMPLE_EDGE;
    if (t < SAMPLE_EDGE)
        return n - SAMPLE_EDGE + t;
    t -= SAMPLE_EDGE;
    mid = n - 2 * SAMPLE_EDGE;          /* > SAMPLE_MID here */
    return SAMPLE_EDGE + (size_t)(((unsigned long long)t * mid) / SAMPLE_MID);
}

__global__ void k_fill_sampled(unsigned char *p, size_t n, unsigned long long id)
{
    size_t count = sample_count(n), stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < count; t += stride) {
        size_t off = sample_offset(n, t);
        p[off] = pat8(id, off);
    }
}

__global__ void k_check_sampled(const unsigned char *p, size_t n, unsigned long long id,
                                unsigned long long *errors)
{
    size_t count = sample_count(n), stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < count; t += stride) {
        size_t off = sample_offset(n, t);
        bad += p[off] != pat8(id, off);
    }
    if (bad != 0)
        atomicAdd(errors, bad);
}

__device__ static inline unsigned long long globaltimer_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Spins for `ns` nanoseconds (bounded by clock64 too, so a stopped timer
 * cannot hang the test), then fills the whole block: a late writer. */
__global__ void k_slow_fill(unsigned char *p, size_t n, unsigned long long id,
                            unsigned long long ns)
{
    unsigned long long t0 = globaltimer_ns();
    long long c0 = clock64();
    while (globaltimer_ns() - t0 < ns && clock64() - c0 < 4000000000ll) {
    }
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = pat8(id, i);
}

/* Spins for `ns` nanoseconds (bounded by clock64 too): work that keeps a
 * stream busy. */
__global__ void k_spin(unsigned long long ns)
{
    unsigned long long t0 = globaltimer_ns();
    long long c0 = clock64();
    while (globaltimer_ns() - t0 < ns && clock64() - c0 < 4000000000ll) {
    }
}

static unsigned int grid_for(size_t n)
{
    size_t g = (n + 255) / 256;
    if (g > 4096)
        g = 4096;
    return g == 0 ? 1u : (unsigned int)g;
}

/* Reads and clears the device counters. */
static int read_counters(int ck, unsigned long long *host)
{
    CU_OR(ck, -1, cudaDeviceSynchronize());
    CU_OR(ck, -1, cudaMemcpy(host, g_dctr, CTR_COUNT * sizeof *host, cudaMemcpyDeviceToHost));
    return 0;
}

/* ---- a. basic ------------------------------------------------------------ */

static void check_basic(void)
{
    static const size_t sizes[] = { 1, 511, 512, 4095, 65536, 1 * MiB, 3 * MiB + 7,
                                    64 * MiB, 256 * MiB };
    enum { NS = sizeof sizes / sizeof sizes[0] };
    void *ptrs[NS];
    unsigned long long errs[CTR_COUNT], total_err = 0;
    cuheap_status_t s;
    void *p;
    size_t i;
    int ck = CK_BASIC;

    g_res[ck].ran = 1;
    memset(ptrs, 0, sizeof ptrs);
    /* All blocks live at once, all written, then all read back: a block that
     * overlaps another would have been overwritten. Allocation names the
     * current device (CUHEAP_CURRENT_DEVICE), free names device 0. */
    for (i = 0; i < NS; i++) {
        s = cuheap_malloc(&ptrs[i], sizes[i], CUHEAP_CURRENT_DEVICE, NULL);
        if (s != CUHEAP_OK || ptrs[i] == NULL) {
            fail(ck, "cuheap_malloc(%zu) = %s, ptr %p: %s", sizes[i], st_name(s), ptrs[i],
                 cuheap_last_error());
            ptrs[i] = NULL;
            continue;
        }
        g_allocs++;
        if (((uintptr_t)ptrs[i] & 511u) != 0)
            fail(ck, "cuheap_malloc(%zu) = %p: not 512-byte aligned", sizes[i], ptrs[i]);
    }
    for (i = 0; i < NS; i++) {
        if (ptrs[i] == NULL)
            continue;
        k_fill<<<grid_for(sizes[i]), 256>>>((unsigned char *)ptrs[i], sizes[i], 1000 + i);
        LAUNCHED(ck);
    }
    for (i = 0; i < NS; i++) {
        if (ptrs[i] == NULL)
            continue;
        k_check<<<grid_for(sizes[i]), 256>>>((const unsigned char *)ptrs[i], sizes[i], 1000 + i,
                                             g_dctr + CTR_BASIC + i);
        LAUNCHED(ck);
    }
    if (read_counters(ck, errs) != 0)
        return;
    for (i = 0; i < NS; i++) {
        total_err += errs[CTR_BASIC + i];
        if (errs[CTR_BASIC + i] != 0)
            fail(ck, "block of %zu bytes at %p: %llu bytes did not hold their pattern",
                 sizes[i], ptrs[i], errs[CTR_BASIC + i]);
    }
    for (i = 0; i < NS; i++) {
        if (ptrs[i] == NULL)
            continue;
        s = cuheap_free(ptrs[i], 0, NULL);
        if (s != CUHEAP_OK)
            fail(ck, "cuheap_free(%p, %zu bytes) = %s: %s", ptrs[i], sizes[i], st_name(s),
                 cuheap_last_error());
        else
            g_frees++;
    }

    p = (void *)0x1;
    s = cuheap_malloc(&p, 0, 0, NULL);
    if (s != CUHEAP_OK || p != NULL)
        fail(ck, "cuheap_malloc(size 0) = %s, ptr %p; want CUHEAP_OK and NULL", st_name(s), p);
    s = cuheap_free(NULL, 0, NULL);
    if (s != CUHEAP_OK)
        fail(ck, "cuheap_free(NULL) = %s; want CUHEAP_OK", st_name(s));

    figures(ck, "%d sizes 1 B..256 MiB, every byte written and verified; pattern errors %llu",
            (int)NS, total_err);
}

/* ---- b. errors ----------------------------------------------------------- */

static void check_errors(void)
{
    unsigned long long errs[CTR_COUNT];
    void *foreign = NULL, *p = NULL;
    cuheap_status_t s;
    const char *msg;
    static const size_t dsizes[] = { 1000, 3 * MiB };
    int ck = CK_ERRORS;

    g_res[ck].ran = 1;
    CU(ck, cudaMalloc(&foreign, 1 * MiB));
    s = cuheap_free(foreign, 0, NULL);
    msg = cuheap_last_error();
    if (s != CUHEAP_ERR_NOT_OWNED)
        fail(ck, "cuheap_free(cudaMalloc pointer) = %s; want CUHEAP_ERR_NOT_OWNED", st_name(s));
    else if (msg == NULL || msg[0] == '\0')
        fail(ck, "cuheap_free(cudaMalloc pointer): cuheap_last_error() is empty");
    else
        printf("  not owned: %s: %s\n", st_name(s), msg);
    CU(ck, cudaFree(foreign));

    for (size_t i = 0; i < sizeof dsizes / sizeof dsizes[0]; i++) {
        s = cuheap_malloc(&p, dsizes[i], 0, NULL);
        if (s != CUHEAP_OK) {
            fail(ck, "cuheap_malloc(%zu) = %s: %s", dsizes[i], st_name(s), cuheap_last_error());
            return;
        }
        g_allocs++;
        /* An address inside a live block is not a block: rejected, and the
         * block stays live. heap.h says CUHEAP_ERR_INVALID_ARGUMENT; an entry
         * point that looks pointers up in a map may fairly say NOT_OWNED. */
        s = cuheap_free((char *)p + 512, 0, NULL);
        if (s != CUHEAP_ERR_INVALID_ARGUMENT && s != CUHEAP_ERR_NOT_OWNED)
            fail(ck, "cuheap_free(interior pointer %p of a %zu-byte block) = %s; "
                 "want CUHEAP_ERR_INVALID_ARGUMENT (or NOT_OWNED)",
                 (void *)((char *)p + 512), dsizes[i], st_name(s));
        else
            printf("  interior pointer (%zu B): %s: %s\n", dsizes[i], st_name(s),
                   cuheap_last_error());
        s = cuheap_free(p, 0, NULL);
        if (s != CUHEAP_OK) {
            fail(ck, "cuheap_free(%p) = %s: %s", p, st_name(s), cuheap_last_error());
            return;
        }
        g_frees++;
        s = cuheap_free(p, 0, NULL);
        msg = cuheap_last_error();
        if (s != CUHEAP_ERR_DOUBLE_FREE)
            fail(ck, "second cuheap_free(%p) of a %zu-byte block = %s; want "
                 "CUHEAP_ERR_DOUBLE_FREE", p, dsizes[i], st_name(s));
        else if (msg == NULL || msg[0] == '\0')
            fail(ck, "double free: cuheap_last_error() is empty");
        else
            printf("  double free (%zu B): %s: %s\n", dsizes[i], st_name(s), msg);
    }

    /* The heap still works. */
    s = cuheap_malloc(&p, 1 * MiB + 3, 0, NULL);
    if (s != CUHEAP_OK) {
        fail(ck, "cuheap_malloc after the errors = %s: %s", st_name(s), cuheap_last_error());
        return;
    }
    g_allocs++;
    k_fill<<<grid_for(1 * MiB + 3), 256>>>((unsigned char *)p, 1 * MiB + 3, 77);
    LAUNCHED(ck);
    k_check<<<grid_for(1 * MiB + 3), 256>>>((const unsigned char *)p, 1 * MiB + 3, 77,
                                            g_dctr + CTR_ERRORS);
    LAUNCHED(ck);
    if (read_counters(ck, errs) != 0)
        return;
    if (errs[CTR_ERRORS] != 0)
        fail(ck, "block allocated after the errors: %llu bytes lost their pattern",
             errs[CTR_ERRORS]);
    s = cuheap_free(p, 0, NULL);
    if (s != CUHEAP_OK)
        fail(ck, "cuheap_free after the errors = %s: %s", st_name(s), cuheap_last_error());
    else
        g_frees++;
    figures(ck, "not-owned, interior pointer, double free (small and large) rejected; heap usable");
}

/* ---- c. stress ----------------------------------------------------------- */

typedef struct live_s {
    void *p;
    size_t size;
    unsigned long long id;
    int stream;                 /* index into the worker's streams */
} live_t;

typedef struct worker_s {
    int index;
    long ops;                   /* malloc + free calls to make */
    unsigned long long rng;
    cudaStream_t streams[STRESS_STREAMS];
    unsigned long long *dctr;   /* this worker's device error counter */
    live_t live[STRESS_MAX_LIVE];
    int nlive;
    /* results */
    unsigned long long mallocs, frees, ns_malloc, ns_free, next_id;
    unsigned long long bytes_small, bytes_large;
    size_t largest;
    int failed;
    char msg[512];
} worker_t;

static int g_stop;              /* a worker failed: the others stop too */

static unsigned long long rng_next(unsigned long long *s)
{
    unsigned long long x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Mostly small (512 B..64 KiB), some up to 8 MiB, a few up to 64 MiB. */
static size_t stress_size(unsigned long long *rng)
{
    unsigned long long r = rng_next(rng) % 1000, v = rng_next(rng);
    if (r < 900)
        return 512 + (size_t)(v % (64 * KiB - 512 + 1));
    if (r < 990)
        return 64 * KiB + 1 + (size_t)(v % (8 * MiB - 64 * KiB));
    return 8 * MiB + 1 + (size_t)(v % (56 * MiB));
}

static void worker_fail(worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void worker_fail(worker_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->msg, sizeof w->msg, fmt, ap);
    va_end(ap);
    w->failed = 1;
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
}

/* Launches the verifying kernel on the block's stream, then frees it there. */
static int stress_free(worker_t *w, int slot)
{
    live_t *b = &w->live[slot];
    cudaStream_t st = w->streams[b->stream];
    cudaError_t e;
    cuheap_status_t s;
    unsigned long long t0, t1;

    k_check_sampled<<<8, 256, 0, st>>>((const unsigned char *)b->p, b->size, b->id, w->dctr);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
        worker_fail(w, "k_check_sampled launch: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        return -1;
    }
    t0 = now_ns();
    s = cuheap_free(b->p, 0, st);
    t1 = now_ns();
    if (s != CUHEAP_OK) {
        worker_fail(w, "cuheap_free(%p, %zu bytes, stream %d) = %s: %s", b->p, b->size,
                    b->stream, st_name(s), cuheap_last_error());
        return -1;
    }
    w->ns_free += t1 - t0;
    w->frees++;
    w->live[slot] = w->live[--w->nlive];
    return 0;
}

static void *stress_worker(void *arg)
{
    worker_t *w = (worker_t *)arg;
    cudaError_t e;

    /* The runtime's current device is per thread. */
    e = cudaSetDevice(0);
    if (e != cudaSuccess) {
        worker_fail(w, "cudaSetDevice(0): %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        return NULL;
    }
    for (long op = 0; op < w->ops && !__atomic_load_n(&g_stop, __ATOMIC_RELAXED); op++) {
        int do_malloc;
        if (w->nlive == 0)
            do_malloc = 1;
        else if (w->nlive == STRESS_MAX_LIVE)
            do_malloc = 0;
        else   /* hovers around half full */
            do_malloc = (int)(rng_next(&w->rng) % STRESS_MAX_LIVE) >= w->nlive;

        if (do_malloc) {
            live_t *b = &w->live[w->nlive];
            cuheap_status_t s;
            unsigned long long t0, t1;
            b->size = stress_size(&w->rng);
            b->stream = (int)(rng_next(&w->rng) % STRESS_STREAMS);
            b->id = ((unsigned long long)(w->index + 1) << 40) | w->next_id++;
            b->p = NULL;
            t0 = now_ns();
            s = cuheap_malloc(&b->p, b->size, 0, w->streams[b->stream]);
            t1 = now_ns();
            if (s != CUHEAP_OK || b->p == NULL) {
                worker_fail(w, "cuheap_malloc(%zu, stream %d) = %s: %s", b->size, b->stream,
                            st_name(s), cuheap_last_error());
                break;
            }
            w->ns_malloc += t1 - t0;
            w->mallocs++;
            w->nlive++;
            if (b->size > w->largest)
                w->largest = b->size;
            if (((uintptr_t)b->p & 511u) != 0) {
                worker_fail(w, "cuheap_malloc(%zu) = %p: not 512-byte aligned", b->size, b->p);
                break;
            }
            k_fill_sampled<<<8, 256, 0, w->streams[b->stream]>>>((unsigned char *)b->p, b->size, b->id);
            e = cudaGetLastError();
            if (e != cudaSuccess) {
                worker_fail(w, "k_fill_sampled launch: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
                break;
            }
        } else {
            if (stress_free(w, (int)(rng_next(&w->rng) % (unsigned long long)w->nlive)) != 0)
                break;
        }
    }
    /* The blocks still live stay live: check e reads the statistics with
     * them, then frees them (stress_finish). */
    return NULL;
}

static worker_t g_workers[STRESS_THREADS];

static void check_stress_run(long total_ops)
{
    pthread_t th[STRESS_THREADS];
    double t0, t1;
    int ck = CK_STRESS, started = 0;

    g_res[ck].ran = 1;
    memset(g_workers, 0, sizeof g_workers);
    for (int i = 0; i < STRESS_THREADS; i++) {
        worker_t *w = &g_workers[i];
        w->index = i;
        w->ops = total_ops / STRESS_THREADS + (i < total_ops % STRESS_THREADS ? 1 : 0);
        w->rng = 0x9E3779B97F4A7C15ull * (unsigned long long)(i + 1) + 12345;
        w->dctr = g_dctr + CTR_STRESS + i;
        for (int k = 0; k < STRESS_STREAMS; k++)
            CU(ck, cudaStreamCreateWithFlags(&w->streams[k], cudaStreamNonBlocking));
    }
    t0 = now_s();
    for (int i = 0; i < STRESS_THREADS; i++) {
        if (pthread_create(&th[i], NULL, stress_worker, &g_workers[i]) != 0) {
            fail(ck, "pthread_create failed");
            __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    t1 = now_s();

    unsigned long long mallocs = 0, frees = 0, ns = 0;
    size_t largest = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        worker_t *w = &g_workers[i];
        if (w->failed)
            fail(ck, "thread %d: %s", i, w->msg);
        mallocs += w->mallocs;
        frees += w->frees;
        ns += w->ns_malloc + w->ns_free;
        if (w->largest > largest)
            largest = w->largest;
    }
    g_allocs += mallocs;
    g_frees += frees;
    double ops = (double)(mallocs + frees);
    char lb[32];
    /* Host figures: wall time of the whole phase (kernel launches included)
     * and the time spent inside cuheap_malloc + cuheap_free (two clock reads
     * per call included, some tens of ns). */
    figures(ck, "%.0f ops (%llu mallocs, %llu frees) in %.2f s: %.0f ops/s with launches; "
            "%.0f ns per malloc+free inside cuheap; largest %s",
            ops, mallocs, frees, t1 - t0, ops / (t1 - t0),
            mallocs ? (double)ns / (double)mallocs : 0.0, fmt_bytes(lb, sizeof lb, largest));
    printf("  stress: %s\n", g_res[ck].figures);
}

/* Verifies and frees what the workers left live, then reads the counters. */
static void check_stress_finish(void)
{
    unsigned long long errs[CTR_COUNT], total = 0;
    int ck = CK_STRESS;
    size_t used;

    for (int i = 0; i < STRESS_THREADS; i++) {
        worker_t *w = &g_workers[i];
        unsigned long long before = w->frees;
        while (w->nlive > 0 && !w->failed)
            if (stress_free(w, w->nlive - 1) != 0)
                fail(ck, "thread %d's leftovers: %s", i, w->msg);
        g_frees += w->frees - before;
    }
    if (read_counters(ck, errs) != 0)
        return;
    for (int i = 0; i < STRESS_THREADS; i++) {
        total += errs[CTR_STRESS + i];
        if (errs[CTR_STRESS + i] != 0)
            fail(ck, "thread %d: %llu stamped bytes did not hold their pattern at free",
                 i, errs[CTR_STRESS + i]);
    }
    for (int i = 0; i < STRESS_THREADS; i++)
        for (int k = 0; k < STRESS_STREAMS; k++)
        {
            /* cuheap records events lazily on streams it freed blocks on: it
             * must be told before a stream goes away. */
            cuheap_stream_retire(0, g_workers[i].streams[k]);
            CU(ck, cudaStreamDestroy(g_workers[i].streams[k]));
        }
    used = strlen(g_res[ck].figures);
    snprintf(g_res[ck].figures + used, sizeof g_res[ck].figures - used,
             "; pattern errors %llu", total);
}

/* ---- e. stats ------------------------------------------------------------ */

static void check_stats_live(void)
{
    cuheap_stats_t st;
    cuheap_status_t s;
    unsigned long long live = 0;
    int ck = CK_STATS;

    g_res[ck].ran = 1;
    for (int i = 0; i < STRESS_THREADS; i++)
        for (int k = 0; k < g_workers[i].nlive; k++)
            live += g_workers[i].live[k].size;
    s = cuheap_get_stats(0, &st);
    if (s != CUHEAP_OK) {
        fail(ck, "cuheap_get_stats(0) = %s: %s", st_name(s), cuheap_last_error());
        return;
    }
    printf("  after stress: num_allocs %llu (this program %llu), num_frees %llu (%llu), "
           "requested.current %llu (live %llu)\n",
           (unsigned long long)st.num_allocs, g_allocs, (unsigned long long)st.num_frees,
           g_frees, (unsigned long long)st.requested.current, live);
    if (st.num_allocs != g_allocs)
        fail(ck, "num_allocs %llu, but this program made %llu successful allocations "
             "(size > 0)", (unsigned long long)st.num_allocs, g_allocs);
    if (st.num_frees != g_frees)
        fail(ck, "num_frees %llu, but this program made %llu successful frees (non-NULL)",
             (unsigned long long)st.num_frees, g_frees);
    if (st.requested.current != live)
        fail(ck, "requested.current %llu, but the live blocks add up to %llu bytes",
             (unsigned long long)st.requested.current, live);
    if (st.allocated.current < st.requested.current)
        fail(ck, "allocated.current %llu < requested.current %llu",
             (unsigned long long)st.allocated.current, (unsigned long long)st.requested.current);
    if (st.reserved.current < st.allocated.current)
        fail(ck, "reserved.current %llu < allocated.current %llu",
             (unsigned long long)st.reserved.current, (unsigned long long)st.allocated.current);
}

static void check_stats_release(void)
{
    cuheap_stats_t st;
    cuheap_status_t s;
    char b1[32], b2[32], b3[32], b4[32];
    int ck = CK_STATS;

    s = cuheap_get_stats(0, &st);
    if (s != CUHEAP_OK) {
        fail(ck, "cuheap_get_stats(0) = %s: %s", st_name(s), cuheap_last_error());
        return;
    }
    if (st.num_allocs != g_allocs || st.num_frees != g_frees)
        fail(ck, "after freeing everything: num_allocs %llu (want %llu), num_frees %llu (want %llu)",
             (unsigned long long)st.num_allocs, g_allocs, (unsigned long long)st.num_frees, g_frees);
    if (st.requested.current != 0 || st.allocated.current != 0)
        fail(ck, "everything freed, yet requested.current %llu, allocated.current %llu",
             (unsigned long long)st.requested.current, (unsigned long long)st.allocated.current);
    s = cuheap_release_cached(0);
    if (s != CUHEAP_OK) {
        fail(ck, "cuheap_release_cached(0) = %s: %s", st_name(s), cuheap_last_error());
        return;
    }
    unsigned long long before = st.reserved.current;
    s = cuheap_get_stats(0, &st);
    if (s != CUHEAP_OK) {
        fail(ck, "cuheap_get_stats(0) = %s: %s", st_name(s), cuheap_last_error());
        return;
    }
    if (st.reserved.current != st.workspace)
        fail(ck, "after cuheap_release_cached: reserved.current %llu, want the workspace %llu",
             (unsigned long long)st.reserved.current, (unsigned long long)st.workspace);
    figures(ck, "allocs %llu, frees %llu; reserved %s -> %s after release (workspace %s); "
            "peak reserved in stress %s; segments allocated %llu, freed %llu; cache hits %llu",
            (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees,
            fmt_bytes(b1, sizeof b1, before), fmt_bytes(b2, sizeof b2, st.reserved.current),
            fmt_bytes(b3, sizeof b3, st.workspace),
            fmt_bytes(b4, sizeof b4, st.reserved.peak),
            (unsigned long long)st.num_segment_allocs, (unsigned long long)st.num_segment_frees,
            (unsigned long long)st.num_cache_hits);
}

/* ---- d. cross-stream reuse ----------------------------------------------- */

/* d and f: A's kernel writes a block late; the block is freed at once (on A,
 * or device-wide); B allocates the same size at once (on B, or device-wide)
 * and writes its own pattern. If B got A's memory too early, A's late write
 * shows up in B's block. */
static void check_reuse(int ck, int device_wide)
{
    static const size_t sizes[] = { 4 * MiB, 1 * MiB, 64 * KiB, 4 * MiB + 512, 16 * MiB };
    enum { ROUNDS = 20, NSZ = sizeof sizes / sizeof sizes[0] };
    const int slot = device_wide ? CTR_WIDE : CTR_CROSS;
    cudaStream_t a = NULL, b = NULL;
    unsigned long long errs[CTR_COUNT];
    int same = 0, overlapped = 0;
    double slowest_free = 0;

    g_res[ck].ran = 1;
    CU(ck, cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CU(ck, cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    if (device_wide) {
        /* Streams that never allocate must be named for the frees to cover them. */
        cuheap_stream_register(0, a);
        cuheap_stream_register(0, b);
    }
    for (int r = 0; r < ROUNDS; r++) {
        size_t n = sizes[r % NSZ];
        void *pa = NULL, *pb = NULL;
        cuheap_status_t s;
        unsigned long long x = 500000 + 2 * (unsigned long long)r + (device_wide ? 100000 : 0), y = x + 1;

        s = device_wide ? cuheap_malloc_device_wide(&pa, n, 0) : cuheap_malloc(&pa, n, 0, a);
        if (s != CUHEAP_OK) {
            fail(ck, "round %d: malloc(%zu) for A = %s: %s", r, n, st_name(s), cuheap_last_error());
            break;
        }
        g_allocs++;
        /* A: ~20 ms of spinning, then pattern X over the whole block. */
        k_slow_fill<<<32, 256, 0, a>>>((unsigned char *)pa, n, x, 20000000ull);
        LAUNCHED(ck);
        double t0 = now_s();
        s = device_wide ? cuheap_free_device_wide(pa, 0) : cuheap_free(pa, 0, a);
        double took = now_s() - t0;
        if (took > slowest_free)
            slowest_free = took;
        if (s != CUHEAP_OK) {
            fail(ck, "round %d: free of A's block = %s: %s", r, st_name(s), cuheap_last_error());
            break;
        }
        g_frees++;
        /* B at once: must not get A's memory before A's kernel is done. */
        s = device_wide ? cuheap_malloc_device_wide(&pb, n, 0) : cuheap_malloc(&pb, n, 0, b);
        if (s != CUHEAP_OK) {
            fail(ck, "round %d: malloc(%zu) for B = %s: %s", r, n, st_name(s), cuheap_last_error());
            break;
        }
        g_allocs++;
        if (((uintptr_t)pb & 511u) != 0)
            fail(ck, "round %d: %p not 512-byte aligned", r, pb);
        same += pb == pa;
        k_fill<<<grid_for(n), 256, 0, b>>>((unsigned char *)pb, n, y);
        LAUNCHED(ck);
        CU(ck, cudaStreamSynchronize(b));
        /* Informational: B's write finished while A's kernel still ran, so
         * a wrong reuse would have been caught by A's late write. */
        cudaError_t q = cudaStreamQuery(a);
        if (q == cudaErrorNotReady) {
            overlapped++;
            (void)cudaGetLastError();   /* "not ready" is no error to keep */
        } else {
            CU(ck, q);
        }
        CU(ck, cudaDeviceSynchronize());
        k_check<<<grid_for(n), 256, 0, b>>>((const unsigned char *)pb, n, y, g_dctr + slot);
        LAUNCHED(ck);
        CU(ck, cudaStreamSynchronize(b));
        s = device_wide ? cuheap_free_device_wide(pb, 0) : cuheap_free(pb, 0, b);
        if (s != CUHEAP_OK) {
            fail(ck, "round %d: free of B's block = %s: %s", r, st_name(s), cuheap_last_error());
            break;
        }
        g_frees++;
    }
    if (read_counters(ck, errs) != 0)
        return;
    if (errs[slot] != 0)
        fail(ck, "%llu bytes of B's blocks were overwritten (A's memory handed to B too early)", errs[slot]);
    /* A free that waited for A's 20 ms kernel would take about that long. */
    if (device_wide && slowest_free > 0.005)
        fail(ck, "a device-wide free took %.1f ms: it waited for the GPU", slowest_free * 1e3);
    cuheap_stream_retire(0, a);
    cuheap_stream_retire(0, b);
    CU(ck, cudaStreamDestroy(a));
    CU(ck, cudaStreamDestroy(b));
    figures(ck, "%d rounds, sizes 64 KiB..16 MiB; corrupted bytes %llu; B got A's pointer %d/%d; "
            "B done while A still ran %d/%d; slowest free %.0f us",
            (int)ROUNDS, errs[slot], same, (int)ROUNDS, overlapped, (int)ROUNDS, slowest_free * 1e6);
}

/* ---- g. same-stream page move -------------------------------------------- */

/* 64 blocks of 2 MiB on one stream; behind a 100 ms kernel, kernels that
 * read every other block; those blocks are freed at once, and a 32 MiB
 * block is allocated on the same stream while all that still runs. Under
 * vmm:1 the heap holds more than its margin above the live peak, so the
 * new block gets the freed pages: they move at once (the stream's next work
 * runs after its earlier work) and their old mappings stay until that work
 * has run. A wrong unmap shows as an illegal address in the queued
 * readers; a wrong reuse as bytes that differ; a wait as a slow malloc. */
static void check_same_stream_move(void)
{
    enum { N = 64 };
    const size_t n = 2 * MiB, big = 32 * MiB;
    const int ck = CK_MOVE;
    const char *conf = getenv("CUHEAP_CONF");
    const int vmm = conf && strstr(conf, "vmm:1");
    cudaStream_t s = NULL;
    void *p[N] = { 0 }, *q = NULL;
    unsigned long long errs[CTR_COUNT];
    cuheap_stats_t st0, st1;

    g_res[ck].ran = 1;
    CU(ck, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    /* No cached page anywhere else: the 32 MiB block can only get the pages
     * its own stream freed (or new ones), and the peak starts from here. */
    cuheap_release_cached(0);
    cuheap_reset_peaks(0);
    for (int i = 0; i < N; i++) {
        cuheap_status_t r = cuheap_malloc(&p[i], n, 0, s);
        if (r != CUHEAP_OK) {
            fail(ck, "malloc(2 MiB) #%d = %s: %s", i, st_name(r), cuheap_last_error());
            return;
        }
        g_allocs++;
        k_fill<<<grid_for(n), 256, 0, s>>>((unsigned char *)p[i], n, 700000 + i);
        LAUNCHED(ck);
    }
    CU(ck, cudaStreamSynchronize(s));
    cuheap_get_stats(0, &st0);
    k_spin<<<1, 1, 0, s>>>(100000000ull);
    LAUNCHED(ck);
    for (int i = 0; i < N; i += 2) {
        k_check<<<grid_for(n), 256, 0, s>>>((const unsigned char *)p[i], n, 700000 + i, g_dctr + CTR_MOVE);
        LAUNCHED(ck);
    }
    for (int i = 0; i < N; i += 2) {
        if (cuheap_free(p[i], 0, s) != CUHEAP_OK)
            fail(ck, "free #%d: %s", i, cuheap_last_error());
        g_frees++;
        p[i] = NULL;
    }
    double t0 = now_s();
    cuheap_status_t r = cuheap_malloc(&q, big, 0, s);
    double took = now_s() - t0;
    if (r != CUHEAP_OK) {
        fail(ck, "malloc(32 MiB) = %s: %s", st_name(r), cuheap_last_error());
        return;
    }
    g_allocs++;
    cuheap_get_stats(0, &st1);
    cudaError_t busy = cudaStreamQuery(s);
    int still_running = busy == cudaErrorNotReady;
    if (still_running)
        (void)cudaGetLastError();
    else
        CU(ck, busy);
    k_fill<<<grid_for(big), 256, 0, s>>>((unsigned char *)q, big, 800000);
    LAUNCHED(ck);
    k_check<<<grid_for(big), 256, 0, s>>>((const unsigned char *)q, big, 800000, g_dctr + CTR_MOVE);
    LAUNCHED(ck);
    for (int i = 1; i < N; i += 2) {
        k_check<<<grid_for(n), 256, 0, s>>>((const unsigned char *)p[i], n, 700000 + i, g_dctr + CTR_MOVE);
        LAUNCHED(ck);
    }
    CU(ck, cudaStreamSynchronize(s));
    if (read_counters(ck, errs) != 0)
        return;
    unsigned long long new_pages = st1.num_segment_allocs - st0.num_segment_allocs;
    if (errs[CTR_MOVE] != 0)
        fail(ck, "%llu bytes differ (a page reused or unmapped before its work was done)", errs[CTR_MOVE]);
    if (vmm && new_pages != 0)
        fail(ck, "%llu new pages for the 32 MiB block: the freed pages did not move", new_pages);
    if (vmm && (!still_running || took > 0.05))
        fail(ck, "the 32 MiB malloc took %.1f ms%s: it waited for the GPU", took * 1e3,
             still_running ? "" : " and the stream had finished");
    for (int i = 1; i < N; i += 2) {
        cuheap_free(p[i], 0, s);
        g_frees++;
    }
    cuheap_free(q, 0, s);
    g_frees++;
    CU(ck, cudaStreamSynchronize(s));
    cuheap_stream_retire(0, s);
    CU(ck, cudaStreamDestroy(s));
    figures(ck, "vmm:%d; 32 MiB malloc on the busy stream took %.0f us, new pages %llu%s; corrupted bytes %llu",
            vmm, took * 1e6, new_pages, vmm ? "" : " (vmm:0: a new segment, nothing moves)", errs[CTR_MOVE]);
}

/* ---- main ---------------------------------------------------------------- */

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s [--ops N]\n"
            "  --ops N   malloc+free operations in the stress check (default 1000000)\n", prog);
}

int main(int argc, char **argv)
{
    long ops = 1000000;
    cudaDeviceProp prop;
    int failed = 0, ndev = 0;
    char b[32];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--ops") == 0 && i + 1 < argc) {
            char *end;
            ops = strtol(argv[++i], &end, 10);
            if (*end != '\0' || ops < STRESS_THREADS) {
                fprintf(stderr, "--ops wants a number >= %d\n", STRESS_THREADS);
                return 2;
            }
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("FAIL no CUDA device: %s\ngpu_check: FAILED (no CUDA device)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 1;
    }
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaFree(0)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess ||
        (e = cudaMalloc((void **)&g_dctr, CTR_COUNT * sizeof *g_dctr)) != cudaSuccess ||
        (e = cudaMemset(g_dctr, 0, CTR_COUNT * sizeof *g_dctr)) != cudaSuccess) {
        printf("FAIL setting up device 0: %s (%s)\ngpu_check: FAILED (device setup)\n",
               cudaGetErrorName(e), cudaGetErrorString(e));
        return 1;
    }
    printf("gpu_check: cuheap %s on device 0: %s, sm_%d%d, %d SMs, %s; stress ops %ld\n",
           CUHEAP_VERSION, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
           fmt_bytes(b, sizeof b, prop.totalGlobalMem), ops);

    check_basic();
    report(CK_BASIC);
    check_errors();
    report(CK_ERRORS);

    cuheap_reset_peaks(0);          /* the peaks reported are the stress's */
    check_stress_run(ops);
    check_stats_live();             /* statistics while the stress's blocks are live */
    check_stress_finish();
    report(CK_STRESS);
    check_stats_release();
    report(CK_STATS);
    check_same_stream_move();
    report(CK_MOVE);

    check_reuse(CK_CROSS, 0);
    report(CK_CROSS);
    check_reuse(CK_WIDE, 1);
    report(CK_WIDE);

    cudaFree(g_dctr);

    printf("\n| check | result | figures |\n|---|---|---|\n");
    for (int i = 0; i < CK_N; i++) {
        const char *r = !g_res[i].ran ? "NOT RUN" : g_res[i].failed ? "FAIL" : "PASS";
        if (!g_res[i].ran || g_res[i].failed)
            failed = 1;
        printf("| %s | %s | %s |\n", g_res[i].name, r, g_res[i].figures);
    }
    printf("\ngpu_check: %s\n", failed ? "FAILED" : "all checks passed");
    return failed ? 1 : 0;
}
