/* preload_stress.cu - an ordinary CUDA program that knows nothing of cuheap,
 * run under LD_PRELOAD=libcuheap.so by `make gpu-check`.
 *
 * It is built twice: with nvcc's default static runtime (whose calls reach the
 * driver only through dlopen, dlsym and cuGetProcAddress) and with
 * -cudart shared (whose cudaMalloc symbol a preloaded library defines).
 * Checks, each printing PASS or FAIL:
 *   a. basics   cudaMalloc of 0 bytes, cudaFree(NULL), 512-byte alignment,
 *               a double free is an error and nothing else is harmed
 *   b. stress   8 host threads x 4 non-blocking streams; cudaMalloc and
 *               cudaMallocAsync, cudaFree and cudaFreeAsync mixed; every
 *               block fully written by a kernel and verified by another
 *               before its free (which does not wait for the verification)
 *   c. cudaFree's promise  a slow kernel on a non-blocking stream still
 *               reads a buffer the host has freed while the host allocates
 *               and overwrites memory of that size on another stream: no
 *               byte read may change, and the free must not wait
 *   d. served   under --expect-cuheap, cuheap's statistics (found with
 *               dlsym, as the program does not link cuheap) count at least
 *               every allocation this program made
 *   e. pinned   cudaHostAlloc (flags 0-3) and cudaMallocHost: the flags come
 *               back from cudaHostGetFlags, mapped memory is written by a
 *               kernel through cudaHostGetDevicePointer; cudaFreeHost's
 *               promise: a buffer freed while an asynchronous copy behind a
 *               slow kernel still reads it is not handed out again and
 *               overwritten before the copy ran, and the free does not wait;
 *               under --expect-cuheap, cuheap's pinned statistics count the
 *               allocations
 *   f. ipc      cudaIpcGetMemHandle on blocks of 3 MiB cudaMalloc'd after
 *               the stress: each handle given must name the block's memory
 *               (a child process, this program run again with --ipc-child,
 *               opens every handle, finds the block's bytes and overwrites
 *               them, and the parent sees the new bytes); a refusal must be
 *               cuheap's (cudaErrorInvalidValue: the block does not start
 *               its segment; cudaErrorNotSupported: vmm:1) and leave the
 *               block as it was; with --expect-ipc every handle is given
 *               (CUHEAP_CONF=ipc_safe:1)
 *   g. capture  cudaMalloc and cudaFree while a stream is being captured in
 *               relaxed mode (as PyTorch's allocator calls cudaMalloc inside
 *               captures): cuheap's device-wide fences (cuCtxRecordEvent,
 *               cuCtxWaitEvent) would invalidate the capture, so it must see
 *               the capture begin (through the runtime's cuGetProcAddress)
 *               and make none; the capture ends with its graph, which runs
 *               and writes what was captured
 *   h. steps    a training loop that marks no steps: 12 repeating steps of
 *               cudaMalloc'd blocks, each stamped on one stream and verified
 *               on another behind a slow kernel, cudaFree'd before the
 *               verification ran; no byte verified may change. Under
 *               --expect-plan (CUHEAP_CONF=step_plan:1,vmm_margin:0) cuheap
 *               must have found the steps in the allocations and placed
 *               blocks by a plan (its text report, through dlsym)
 * Prints "preload_stress: all checks passed" or "preload_stress: FAILED"; exit
 * status 0 only if every check passed.
 * Options: --ops N (stress operations, default 200000), --expect-cuheap,
 * --no-double-free, --expect-ipc, --expect-plan, --no-ipc (skips f: compute-sanitizer
 * reports the guard's refusals, error returns as CUDA gives them, as API
 * errors).
 */
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "cuheap.h"   /* types only: the program reaches cuheap through dlsym */
#include "../plan_report.h"
#include <pthread.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define THREADS 8
#define STREAMS 4          /* per thread */
#define MAX_LIVE 32        /* per thread */

static int failures;
static unsigned long long *d_errors;   /* device counters: [0] stress, [1] promise, [2] steps */
static unsigned long long program_allocs;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;

static void report(const char *name, int ok, const char *detail)
{
    printf("%s %-10s %s\n", ok ? "PASS" : "FAIL", name, detail);
    if (!ok)
        failures++;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void counted(int n)
{
    pthread_mutex_lock(&count_lock);
    program_allocs += (unsigned long long)n;
    pthread_mutex_unlock(&count_lock);
}

__global__ void stamp(unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

__global__ void verify(const unsigned char *p, size_t n, unsigned char v, unsigned long long *errors)
{
    unsigned long long bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad += p[i] != v;
    if (bad)
        atomicAdd(errors, bad);
}

/* Spins for `cycles` clock cycles, then checks the buffer. */
__global__ void slow_verify(const unsigned char *p, size_t n, unsigned char v, long long cycles,
                            unsigned long long *errors)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    unsigned long long bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad += p[i] != v;
    if (bad)
        atomicAdd(errors, bad);
}

static unsigned blocks_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b > 1024 ? 1024 : b ? b : 1);
}

/* ---- a. basics ------------------------------------------------------------ */

/* --no-double-free: compute-sanitizer reports the double free's error
 * return (cudaErrorInvalidValue, as CUDA gives) as an API error. */
static int skip_double_free;

static void check_basics(void)
{
    char detail[200] = "";
    int ok = 1;
    void *p = (void *)1;
    if (cudaMalloc(&p, 0) != cudaSuccess || p != NULL)
        ok = 0, strcat(detail, "cudaMalloc(0) ");
    if (cudaFree(NULL) != cudaSuccess)
        ok = 0, strcat(detail, "cudaFree(NULL) ");
    void *blocks[16];
    for (int i = 0; i < 16; i++) {
        if (cudaMalloc(&blocks[i], (size_t)1 << (i + 4)) != cudaSuccess || (uintptr_t)blocks[i] % 512)
            ok = 0, strcat(detail, "alignment ");
        counted(1);
    }
    for (int i = 0; i < 16; i++)
        cudaFree(blocks[i]);
    void *q;
    cudaMalloc(&q, 4096);
    counted(1);
    cudaFree(q);
    cudaError_t again = skip_double_free ? cudaErrorInvalidValue : cudaFree(q);
    cudaGetLastError();
    if (again == cudaSuccess)
        ok = 0, strcat(detail, "double free accepted ");
    void *r;
    if (cudaMalloc(&r, 4096) != cudaSuccess || cudaMemset(r, 1, 4096) != cudaSuccess)
        ok = 0, strcat(detail, "heap harmed by double free ");
    counted(1);
    cudaFree(r);
    if (ok && skip_double_free)
        snprintf(detail, sizeof detail, "size 0, NULL free, alignment (double free not tried)");
    else if (ok)
        snprintf(detail, sizeof detail, "size 0, NULL free, alignment, double free -> %d", (int)again);
    report("basics", ok, detail);
}

/* ---- b. stress ------------------------------------------------------------ */

typedef struct worker_s {
    int id;
    long ops;
    unsigned long long seed;
} worker_t;

static unsigned long long next_random(unsigned long long *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static size_t random_size(unsigned long long *s)
{
    unsigned long long r = next_random(s);
    switch (r % 8) {
    case 0: case 1: case 2: return 1 + (size_t)(r >> 8) % 4096;          /* tiny */
    case 3: case 4: return 4096 + (size_t)(r >> 8) % (256 * 1024);       /* small */
    case 5: case 6: return 256 * 1024 + (size_t)(r >> 8) % (4 * MiB);    /* medium */
    default: return 4 * MiB + (size_t)(r >> 8) % (28 * MiB);             /* large */
    }
}

static void *stress_worker(void *arg)
{
    worker_t *w = (worker_t *)arg;
    cudaStream_t streams[STREAMS];
    for (int i = 0; i < STREAMS; i++)
        cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
    struct { unsigned char *p; size_t n; int stream; unsigned char v; } live[MAX_LIVE];
    int nlive = 0;
    unsigned long long s = w->seed;
    long allocs = 0;
    for (long op = 0; op < w->ops; op++) {
        if (nlive == MAX_LIVE || (nlive && next_random(&s) % 2)) {
            int k = (int)(next_random(&s) % (unsigned)nlive);
            cudaStream_t st = streams[live[k].stream];
            verify<<<blocks_for(live[k].n), 256, 0, st>>>(live[k].p, live[k].n, live[k].v, &d_errors[0]);
            /* cudaFree does not wait for the verification; cuheap must not
             * hand the block out before it ran. */
            if (next_random(&s) % 2)
                cudaFree(live[k].p);
            else
                cudaFreeAsync(live[k].p, st);
            live[k] = live[--nlive];
        } else {
            size_t n = random_size(&s);
            int si = (int)(next_random(&s) % STREAMS);
            unsigned char *p = NULL;
            cudaError_t e = next_random(&s) % 2 ? cudaMalloc((void **)&p, n)
                                                : cudaMallocAsync((void **)&p, n, streams[si]);
            if (e != cudaSuccess) {
                fprintf(stderr, "stress: allocation of %zu bytes failed: %s\n", n, cudaGetErrorString(e));
                break;
            }
            allocs++;
            unsigned char v = (unsigned char)(1 + (w->id * 31 + op) % 254);
            stamp<<<blocks_for(n), 256, 0, streams[si]>>>(p, n, v);
            live[nlive].p = p, live[nlive].n = n, live[nlive].stream = si, live[nlive].v = v;
            nlive++;
        }
    }
    for (int k = 0; k < nlive; k++) {
        verify<<<blocks_for(live[k].n), 256, 0, streams[live[k].stream]>>>(live[k].p, live[k].n, live[k].v,
                                                                             &d_errors[0]);
        cudaFree(live[k].p);
    }
    for (int i = 0; i < STREAMS; i++) {
        cudaStreamSynchronize(streams[i]);
        cudaStreamDestroy(streams[i]);
    }
    counted((int)allocs);
    return NULL;
}

static void check_stress(long ops)
{
    pthread_t t[THREADS];
    worker_t w[THREADS];
    double t0 = now_ms();
    for (int i = 0; i < THREADS; i++) {
        w[i].id = i, w[i].ops = ops / THREADS, w[i].seed = 0x9E3779B97F4A7C15ull * (unsigned long long)(i + 1);
        pthread_create(&t[i], NULL, stress_worker, &w[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    cudaError_t e = cudaDeviceSynchronize();
    unsigned long long bad = 0;
    cudaMemcpy(&bad, &d_errors[0], sizeof bad, cudaMemcpyDeviceToHost);
    char detail[200];
    snprintf(detail, sizeof detail, "%ld ops, %d threads x %d streams, %.0f ms, corrupted bytes %llu, %s", ops,
             THREADS, STREAMS, now_ms() - t0, bad, cudaGetErrorString(e));
    report("stress", e == cudaSuccess && bad == 0, detail);
}

/* ---- c. cudaFree's promise ---------------------------------------------- */

static void check_promise(void)
{
    const size_t n = 64 * MiB;
    cudaStream_t slow, other;
    cudaStreamCreateWithFlags(&slow, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    long long cycles = (long long)clock_khz * 300;   /* about 300 ms */
    unsigned char *a;
    cudaMalloc((void **)&a, n);
    counted(1);
    cudaMemset(a, 0x5A, n);
    cudaDeviceSynchronize();
    slow_verify<<<blocks_for(n), 256, 0, slow>>>(a, n, 0x5A, cycles, &d_errors[1]);
    double t0 = now_ms();
    cudaFree(a);
    double free_ms = now_ms() - t0;
    unsigned char *b[16];
    int reused = 0;
    for (int i = 0; i < 16; i++) {
        cudaMalloc((void **)&b[i], n);
        counted(1);
        reused += b[i] == a;
        cudaMemsetAsync(b[i], 0, n, other);
    }
    double loop_ms = now_ms() - t0;
    cudaError_t e = cudaDeviceSynchronize();
    for (int i = 0; i < 16; i++)
        cudaFree(b[i]);
    unsigned long long bad = 0;
    cudaMemcpy(&bad, &d_errors[1], sizeof bad, cudaMemcpyDeviceToHost);
    cudaStreamDestroy(slow);
    cudaStreamDestroy(other);
    char detail[240];
    snprintf(detail, sizeof detail,
             "cudaFree took %.3f ms, 16 x 64 MiB allocated and overwritten in %.1f ms while the kernel ran, "
             "freed block handed out again %d times, corrupted bytes %llu",
             free_ms, loop_ms, reused, bad);
    report("promise", e == cudaSuccess && bad == 0 && free_ms < 5.0, detail);
}

/* ---- h. steps ------------------------------------------------------------ */


static void check_steps(int expect_plan)
{
    enum { STEPS = 12, SMALL = 24, LARGE = 3 };
    cudaStream_t work, check;
    cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&check, cudaStreamNonBlocking);
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    const long long cycles = (long long)clock_khz * 2;   /* about 2 ms before each verification */
    cudaEvent_t stamped;
    cudaEventCreateWithFlags(&stamped, cudaEventDisableTiming);
    unsigned char *small[SMALL], *large[LARGE];
    int allocs = 0;
    cudaError_t e = cudaSuccess;
    for (int step = 0; step < STEPS && e == cudaSuccess; step++) {
        /* Blocks stamped on `work`; `check` verifies each behind a slow
         * kernel, and cudaFree comes before that has run. */
        for (int i = 0; i < SMALL; i++) {
            e = cudaMalloc((void **)&small[i], 2 * MiB);
            allocs++;
            stamp<<<blocks_for(2 * MiB), 256, 0, work>>>(small[i], 2 * MiB, (unsigned char)(1 + i));
        }
        cudaEventRecord(stamped, work);
        cudaStreamWaitEvent(check, stamped, 0);
        for (int i = 0; i < SMALL; i += 2) {
            slow_verify<<<blocks_for(2 * MiB), 256, 0, check>>>(small[i], 2 * MiB, (unsigned char)(1 + i), cycles,
                                                                  &d_errors[2]);
            cudaFree(small[i]);
        }
        for (int i = 0; i < LARGE; i++) {
            e = e == cudaSuccess ? cudaMalloc((void **)&large[i], 8 * MiB) : e;
            allocs++;
            stamp<<<blocks_for(8 * MiB), 256, 0, work>>>(large[i], 8 * MiB, (unsigned char)(100 + i));
        }
        cudaEventRecord(stamped, work);
        cudaStreamWaitEvent(check, stamped, 0);
        for (int i = 1; i < SMALL; i += 2) {
            verify<<<blocks_for(2 * MiB), 256, 0, check>>>(small[i], 2 * MiB, (unsigned char)(1 + i), &d_errors[2]);
            cudaFree(small[i]);
        }
        for (int i = 0; i < LARGE; i++) {
            slow_verify<<<blocks_for(8 * MiB), 256, 0, check>>>(large[i], 8 * MiB, (unsigned char)(100 + i), cycles,
                                                                  &d_errors[2]);
            cudaFree(large[i]);
        }
    }
    counted(allocs);
    e = e == cudaSuccess ? cudaDeviceSynchronize() : e;
    unsigned long long bad = 0;
    cudaMemcpy(&bad, &d_errors[2], sizeof bad, cudaMemcpyDeviceToHost);
    cudaEventDestroy(stamped);
    cudaStreamDestroy(work);
    cudaStreamDestroy(check);
    long made = 0, placed = 0;
    int found = 0;
    const int have = plan_report_figures(&made, &placed, &found);
    char detail[240];
    snprintf(detail, sizeof detail, "%d steps, %d cudaMalloc's, corrupted bytes %llu, %s; plans %ld, blocks placed %ld%s",
             STEPS, allocs, bad, cudaGetErrorString(e), made, placed,
             have != 0 ? " (no step plans)" : found ? ", steps found in the allocations" : "");
    report("steps", e == cudaSuccess && bad == 0 && (!expect_plan || (found && made > 0 && placed > 0)), detail);
}

/* ---- d. served by cuheap ------------------------------------------------ */

static void check_served(int expect)
{
    cuheap_status_t (*get_stats)(int, cuheap_stats_t *);
    void *sym = dlsym(RTLD_DEFAULT, "cuheap_get_stats");
    memcpy(&get_stats, &sym, sizeof get_stats);
    char detail[240];
    if (!get_stats) {
        snprintf(detail, sizeof detail, "libcuheap.so is not loaded (%llu allocations by CUDA itself)",
                 program_allocs);
        report("served", !expect, detail);
        return;
    }
    cuheap_stats_t st;
    memset(&st, 0, sizeof st);
    get_stats(0, &st);
    snprintf(detail, sizeof detail,
             "program allocations %llu, cuheap allocations %llu, frees %llu, device segments %llu, "
             "peak reserved %.1f MiB, peak live %.1f MiB",
             program_allocs, (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees,
             (unsigned long long)st.num_segment_allocs, st.reserved.peak / 1048576.0,
             st.requested.peak / 1048576.0);
    report("served", st.num_allocs >= program_allocs && st.num_segment_allocs < st.num_allocs, detail);
}

/* ---- e. pinned host memory --------------------------------------------- */

__global__ void write_through(unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

__global__ void spin(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

/* ---- g. graph capture -------------------------------------------------- */

static void check_capture(void)
{
    const size_t n = MiB;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    unsigned char *buf = NULL;
    cudaMalloc((void **)&buf, n);
    counted(1);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t begin = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    write_through<<<blocks_for(n), 256, 0, s>>>(buf, n, 0x77);
    int churn = 0;
    for (int i = 0; i < 64; i++) {
        void *x = NULL;
        churn += cudaMalloc(&x, (size_t)(i % 4 + 1) * MiB) == cudaSuccess;
        counted(1);
        churn += cudaFree(x) == cudaSuccess;
    }
    cudaError_t end = cudaStreamEndCapture(s, &graph);
    cudaError_t inst = graph ? cudaGraphInstantiate(&exec, graph, 0) : cudaErrorUnknown;
    cudaMemset(buf, 0, n);
    cudaDeviceSynchronize();
    cudaError_t launch = exec ? cudaGraphLaunch(exec, s) : cudaErrorUnknown;
    cudaError_t done = cudaStreamSynchronize(s);
    unsigned char *host = (unsigned char *)malloc(n);
    unsigned long long bad = n;
    if (host && cudaMemcpy(host, buf, n, cudaMemcpyDeviceToHost) == cudaSuccess) {
        bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += host[i] != 0x77;
    }
    free(host);
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    cudaFree(buf);
    cudaStreamDestroy(s);
    char detail[240];
    snprintf(detail, sizeof detail,
             "begin %s, %d of 128 cudaMalloc/cudaFree calls in the capture succeeded, end %s, instantiate %s, "
             "launch %s, bytes the graph did not write %llu",
             cudaGetErrorName(begin), churn, cudaGetErrorName(end), cudaGetErrorName(inst), cudaGetErrorName(launch),
             bad);
    report("capture", begin == cudaSuccess && churn == 128 && end == cudaSuccess && inst == cudaSuccess &&
                          launch == cudaSuccess && done == cudaSuccess && bad == 0,
           detail);
}

static void check_pinned(int expect)
{
    char detail[320];
    int ok = 1, flag_errors = 0, mapped_errors = 0;
    unsigned long long allocs = 0;
    /* flags, and zero-copy writes through mapped memory */
    for (unsigned flags = 0; flags < 4; flags++)
        for (int i = 0; i < 50; i++) {
            size_t n = 1 + (size_t)(i * 104729 % (4 << 20));
            unsigned char *p = NULL;
            cudaError_t e = flags == 0 && i % 2 ? cudaMallocHost((void **)&p, n) : cudaHostAlloc((void **)&p, n, flags);
            allocs++;
            if (e != cudaSuccess || !p) {
                ok = 0;
                continue;
            }
            unsigned got = 0;
            flag_errors += cudaHostGetFlags(&got, p) != cudaSuccess || (got & flags) != flags;
            if (flags & cudaHostAllocMapped) {
                unsigned char *d = NULL;
                if (cudaHostGetDevicePointer((void **)&d, p, 0) != cudaSuccess) {
                    mapped_errors++;
                } else {
                    write_through<<<blocks_for(n), 256>>>(d, n, (unsigned char)(i + 1));
                    cudaDeviceSynchronize();
                    for (size_t b = 0; b < n; b += 997)
                        mapped_errors += p[b] != (unsigned char)(i + 1);
                }
            }
            ok &= cudaFreeHost(p) == cudaSuccess;
        }
    /* cudaFreeHost's promise */
    const size_t n = 64 * MiB;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    unsigned char *a = NULL, *dev = NULL, *back = (unsigned char *)malloc(n);
    cudaMalloc((void **)&dev, n);
    counted(1);
    ok &= cudaHostAlloc((void **)&a, n, 0) == cudaSuccess;
    allocs++;
    memset(a, 0xAB, n);
    spin<<<1, 1, 0, s>>>((long long)clock_khz * 300);   /* about 300 ms */
    cudaMemcpyAsync(dev, a, n, cudaMemcpyHostToDevice, s);
    double t0 = now_ms();
    ok &= cudaFreeHost(a) == cudaSuccess;
    double free_ms = now_ms() - t0;
    unsigned char *later[8];
    int reused = 0;
    for (int i = 0; i < 8; i++) {
        ok &= cudaHostAlloc((void **)&later[i], n, 0) == cudaSuccess;
        allocs++;
        reused += later[i] == a;
        memset(later[i], 0xCD, n);   /* the program's next batch */
    }
    double loop_ms = now_ms() - t0;
    cudaError_t e = cudaStreamSynchronize(s);
    cudaMemcpy(back, dev, n, cudaMemcpyDeviceToHost);
    unsigned long long bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += back[i] != 0xAB;
    for (int i = 0; i < 8; i++)
        cudaFreeHost(later[i]);
    cudaFree(dev);
    free(back);
    cudaStreamDestroy(s);
    cuheap_status_t (*get_host_stats)(cuheap_host_stats_t *);
    void *sym = dlsym(RTLD_DEFAULT, "cuheap_get_host_stats");
    memcpy(&get_host_stats, &sym, sizeof get_host_stats);
    cuheap_host_stats_t st;
    memset(&st, 0, sizeof st);
    if (get_host_stats)
        get_host_stats(&st);
    snprintf(detail, sizeof detail,
             "flag errors %d, mapped errors %d; cudaFreeHost under a queued copy took %.3f ms, 8 x 64 MiB "
             "allocated and written in %.1f ms, freed buffer handed out again %d times, corrupted bytes %llu; "
             "cuheap served %llu of %llu from %llu chunks",
             flag_errors, mapped_errors, free_ms, loop_ms, reused, bad, (unsigned long long)st.num_allocs, allocs,
             (unsigned long long)st.num_chunk_allocs);
    ok &= e == cudaSuccess && bad == 0 && flag_errors == 0 && mapped_errors == 0;
    if (expect)
        ok &= st.num_allocs >= allocs && free_ms < 5.0;
    report("pinned", ok, detail);
}

/* ---- f. IPC handles --------------------------------------------------- */

#define IPC_BLOCKS 4
#define IPC_SIZE (3 * MiB)

extern char **environ;

static void hex_of(const void *bytes, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", ((const unsigned char *)bytes)[i]);
}

static int bytes_of(const char *hex, void *out, size_t n)
{
    if (strlen(hex) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        ((unsigned char *)out)[i] = (unsigned char)v;
    }
    return 0;
}

/* Bytes of [p, p + n) that differ from v (the stream synchronized). */
static unsigned long long count_other(const unsigned char *p, size_t n, unsigned char v)
{
    cudaMemset(d_errors, 0, sizeof *d_errors);
    verify<<<blocks_for(n), 256>>>(p, n, v, d_errors);
    unsigned long long bad = ~0ull;
    if (cudaMemcpy(&bad, d_errors, sizeof bad, cudaMemcpyDeviceToHost) != cudaSuccess)
        return ~0ull;
    return bad;
}

/* The child: argv holds "HANDLE:VALUE" for each block shared with it. It
 * opens each handle, counts the bytes that are not VALUE, and stamps
 * ~VALUE. Exit status 0 when every handle opened and held VALUE only. */
static int ipc_child(int n, char **args)
{
    cudaSetDevice(0);
    if (cudaMalloc((void **)&d_errors, sizeof *d_errors) != cudaSuccess)
        return 3;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        cudaIpcMemHandle_t handle;
        char hex[2 * sizeof handle + 1];
        unsigned value;
        if (sscanf(args[i], "%128[0-9a-f]:%u", hex, &value) != 2 || bytes_of(hex, &handle, sizeof handle)) {
            fprintf(stderr, "ipc child: bad argument %s\n", args[i]);
            return 2;
        }
        void *p = NULL;
        cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            fprintf(stderr, "ipc child: cudaIpcOpenMemHandle: %s\n", cudaGetErrorString(e));
            rc = 1;
            continue;
        }
        unsigned long long bad = count_other((const unsigned char *)p, IPC_SIZE, (unsigned char)value);
        if (bad) {
            fprintf(stderr, "ipc child: handle %d: %llu of %zu bytes are not the block's\n", i, bad, IPC_SIZE);
            rc = 1;
        }
        stamp<<<blocks_for(IPC_SIZE), 256>>>((unsigned char *)p, IPC_SIZE, (unsigned char)~value);
        if (cudaDeviceSynchronize() != cudaSuccess || cudaIpcCloseMemHandle(p) != cudaSuccess)
            rc = 1;
    }
    cudaFree(d_errors);
    return rc;
}

static void check_ipc(int expect_all)
{
    unsigned char *blocks[IPC_BLOCKS];
    cudaIpcMemHandle_t handles[IPC_BLOCKS];
    cudaError_t got[IPC_BLOCKS];
    int ok = 1, given = 0, guarded = 0, unexpected = 0;
    for (int i = 0; i < IPC_BLOCKS; i++) {
        if (cudaMalloc((void **)&blocks[i], IPC_SIZE) != cudaSuccess) {
            report("ipc", 0, "cudaMalloc of a 3 MiB block failed");
            return;
        }
        counted(1);
        stamp<<<blocks_for(IPC_SIZE), 256>>>(blocks[i], IPC_SIZE, (unsigned char)(0x40 + i));
    }
    cudaDeviceSynchronize();
    /* The child's command line: this program, --ipc-child, and a
     * HANDLE:VALUE per handle given. */
    char *child_argv[IPC_BLOCKS + 3];
    char args[IPC_BLOCKS][2 * sizeof(cudaIpcMemHandle_t) + 8];
    int argc = 0;
    child_argv[argc++] = (char *)"/proc/self/exe";
    child_argv[argc++] = (char *)"--ipc-child";
    for (int i = 0; i < IPC_BLOCKS; i++) {
        got[i] = cudaIpcGetMemHandle(&handles[i], blocks[i]);
        cudaGetLastError();
        if (got[i] == cudaSuccess) {
            given++;
            hex_of(&handles[i], sizeof handles[i], args[i]);
            sprintf(args[i] + 2 * sizeof handles[i], ":%d", 0x40 + i);
            child_argv[argc++] = args[i];
        } else if (got[i] == cudaErrorInvalidValue || got[i] == cudaErrorNotSupported) {
            guarded++;
        } else {
            unexpected++;
        }
    }
    child_argv[argc] = NULL;
    int child_rc = -1;
    if (given) {
        pid_t pid;
        int status = 0;
        if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, child_argv, environ) == 0 &&
            waitpid(pid, &status, 0) == pid && WIFEXITED(status))
            child_rc = WEXITSTATUS(status);
    }
    /* A block shared now holds what the child wrote; one refused, its own. */
    unsigned long long wrong = 0;
    for (int i = 0; i < IPC_BLOCKS; i++) {
        unsigned char v = (unsigned char)(0x40 + i);
        wrong += count_other(blocks[i], IPC_SIZE, got[i] == cudaSuccess ? (unsigned char)~v : v);
        cudaFree(blocks[i]);
    }
    ok = unexpected == 0 && wrong == 0 && (!given || child_rc == 0) && (!expect_all || given == IPC_BLOCKS);
    char detail[240];
    snprintf(detail, sizeof detail,
             "%d of %d handles given and read and written through by a child process (exit %d), %d refused by "
             "cuheap's guard, %d other errors, bytes wrong afterwards %llu%s",
             given, IPC_BLOCKS, child_rc, guarded, unexpected, wrong, expect_all ? " (all expected)" : "");
    report("ipc", ok, detail);
}

int main(int argc, char **argv)
{
    long ops = 200000;
    int expect = 0, expect_ipc = 0, expect_plan = 0, skip_ipc = 0;
    if (argc >= 2 && !strcmp(argv[1], "--ipc-child"))
        return ipc_child(argc - 2, argv + 2);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ops") && i + 1 < argc)
            ops = atol(argv[++i]);
        else if (!strcmp(argv[i], "--expect-cuheap"))
            expect = 1;
        else if (!strcmp(argv[i], "--no-double-free"))
            skip_double_free = 1;
        else if (!strcmp(argv[i], "--expect-ipc"))
            expect_ipc = 1;
        else if (!strcmp(argv[i], "--expect-plan"))
            expect_plan = 1;
        else if (!strcmp(argv[i], "--no-ipc"))
            skip_ipc = 1;
        else {
            fprintf(stderr, "usage: %s [--ops N] [--expect-cuheap] [--no-double-free] [--expect-ipc] [--expect-plan] [--no-ipc]\n",
                    argv[0]);
            return 2;
        }
    }
    cudaSetDevice(0);
    /* The counters come from the runtime like everything else. */
    if (cudaMalloc((void **)&d_errors, 3 * sizeof *d_errors) != cudaSuccess) {
        printf("preload_stress: FAILED (no device memory)\n");
        return 1;
    }
    counted(1);
    cudaMemset(d_errors, 0, 3 * sizeof *d_errors);
    check_basics();
    check_stress(ops);
    check_promise();
    check_served(expect);
    check_pinned(expect);
    check_capture();
    check_steps(expect_plan);
    if (!skip_ipc)
        check_ipc(expect_ipc);
    cudaFree(d_errors);
    printf("preload_stress: %s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
