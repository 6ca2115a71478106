/* runtime_checks.c - a CUDA runtime program run under
 * LD_PRELOAD=libcuheap.so; its argument names the check.
 *
 * It is built twice: linked with the fake shared runtime (libcudart.so.13,
 * where cuheap's preloaded cudaMalloc is found first) and with the fake
 * runtime compiled in (a static runtime, whose calls only reach cuheap
 * through dlsym and cuGetProcAddress on the driver). Every check must hold
 * for both. cuheap's service shows in its statistics and in the fake
 * driver's count of real allocations; the fake driver's pretend kernels show
 * a block handed out again while GPU work still reads it.
 */
#define _GNU_SOURCE
#include "fake_cudart.h"
#include "support.h"
#include "../plan_report.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define THREADS 4
#define ALLOCS_PER_THREAD 500
#define LIVE_PER_THREAD 32
#define ALIGNMENT 512
#define REUSE_TRIES 20
#define CHECKED_BYTES (4 * MiB)

/* A static runtime's cudaFree synchronizes the device before it reaches the
 * driver's cuMemFree (and so cuheap); a preloaded cudaFree returns at once. */
#ifdef FAKE_CUDART_STATIC
#define RUNTIME_SYNCHRONIZES_IN_CUDA_FREE 1
#else
#define RUNTIME_SYNCHRONIZES_IN_CUDA_FREE 0
#endif

static fake_helpers_t fake;

static void start_runtime(void)
{
    expect(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL) (runtime start) failed");
    fake_helpers_load(&fake, fakeCudartDriverFunction);
}

/* ---- a, b: served by cuheap from many threads, data intact ------------------- */

static void *allocate_and_verify(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *live[LIVE_PER_THREAD] = {0};
    size_t sizes[LIVE_PER_THREAD] = {0};
    long bad = 0;
    for (int i = 0; i < ALLOCS_PER_THREAD; i++) {
        int slot = i % LIVE_PER_THREAD;
        if (live[slot]) {
            bad += !pattern_intact(live[slot], sizes[slot], seed + (unsigned)slot);
            bad += cudaFree(live[slot]) != cudaSuccess;
        }
        sizes[slot] = 1 + (size_t)((i * 7919 + (int)seed * 104729) % (256 * 1024));
        if (cudaMalloc(&live[slot], sizes[slot]) != cudaSuccess || !live[slot]) {
            bad++;
            live[slot] = NULL;
            continue;
        }
        pattern_fill(live[slot], sizes[slot], seed + (unsigned)slot);
    }
    for (int slot = 0; slot < LIVE_PER_THREAD; slot++)
        if (live[slot]) {
            bad += !pattern_intact(live[slot], sizes[slot], seed + (unsigned)slot);
            bad += cudaFree(live[slot]) != cudaSuccess;
        }
    return (void *)(intptr_t)bad;
}

static void check_threads(void)
{
    start_runtime();
    cuheap_stats_t before, after;
    heap_stats(&before);
    fake_cuda_calls_t fake_before = fake_calls(&fake);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, allocate_and_verify, (void *)(uintptr_t)(i + 1));
    long bad = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (long)(intptr_t)r;
    }
    heap_stats(&after);
    fake_cuda_calls_t fake_after = fake_calls(&fake);
    unsigned long total = THREADS * ALLOCS_PER_THREAD;
    expect(bad == 0, "%ld failed calls or damaged blocks", bad);
    expect(after.num_allocs - before.num_allocs == total, "cuheap served %llu of %lu allocations",
           (unsigned long long)(after.num_allocs - before.num_allocs), total);
    expect(after.num_frees - before.num_frees == total, "cuheap freed %llu of %lu blocks",
           (unsigned long long)(after.num_frees - before.num_frees), total);
    expect(fake_after.mem_allocs - fake_before.mem_allocs < total / 10,
           "the driver made %lu real allocations for %lu requests (cuheap should pool them)",
           fake_after.mem_allocs - fake_before.mem_allocs, total);
    expect(after.allocated.current == 0, "%llu bytes still allocated after every free",
           (unsigned long long)after.allocated.current);
}

/* ---- e: the driver reached through cudaGetDriverEntryPoint ------------------- */

static void check_entry_point(void)
{
    start_runtime();
    void *sym = NULL;
    int status = -1;
    expect(cudaGetDriverEntryPoint("cuMemAlloc", &sym, 0, &status) == cudaSuccess && sym && status == 0,
           "cudaGetDriverEntryPoint(cuMemAlloc) failed");
    void *free_sym = NULL;
    expect(cudaGetDriverEntryPoint("cuMemFree", &free_sym, 0, &status) == cudaSuccess && free_sym,
           "cudaGetDriverEntryPoint(cuMemFree) failed");
    if (!sym || !free_sym)
        return;
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*mem_free)(unsigned long long);
    memcpy(&mem_alloc, &sym, sizeof sym);
    memcpy(&mem_free, &free_sym, sizeof sym);
    cuheap_stats_t before, after;
    heap_stats(&before);
    fake_cuda_calls_t fb = fake_calls(&fake);
    unsigned long long d = 0;
    expect(mem_alloc(&d, 3000) == 0 && d, "cuMemAlloc through the entry point failed");
    pattern_fill((void *)(uintptr_t)d, 3000, 5);
    expect(pattern_intact((void *)(uintptr_t)d, 3000, 5), "data lost");
    expect(mem_free(d) == 0, "cuMemFree through the entry point failed");
    heap_stats(&after);
    fake_cuda_calls_t fa = fake_calls(&fake);
    expect(after.num_allocs == before.num_allocs + 1 && after.num_frees == before.num_frees + 1,
           "cuMemAlloc/cuMemFree from cudaGetDriverEntryPoint were not served by cuheap");
    expect(fa.mem_frees == fb.mem_frees, "the driver's own cuMemFree ran");
}

/* ---- f: what cuheap did not hand out goes to CUDA ---------------------------- */

static void check_pass_through(void)
{
    start_runtime();
    cuheap_stats_t before, after;
    heap_stats(&before);
    fake_cuda_calls_t fb = fake_calls(&fake);
    void *managed = NULL;
    expect(cudaMallocManaged(&managed, 1 * MiB, 0) == cudaSuccess && managed, "cudaMallocManaged failed");
    memset(managed, 0x5a, 1 * MiB);
    expect(cudaFree(managed) == cudaSuccess, "cudaFree(managed memory) failed");
    unsigned long long foreign = 0;
    expect(fake.alloc_foreign(&foreign, 2 * MiB) == 0 && foreign, "the driver's own allocation failed");
    expect(cudaFree((void *)(uintptr_t)foreign) == cudaSuccess, "cudaFree(a driver allocation) failed");
    heap_stats(&after);
    fake_cuda_calls_t fa = fake_calls(&fake);
    expect(fa.managed_allocs == fb.managed_allocs + 1, "cudaMallocManaged did not reach the driver");
    expect(fa.mem_frees == fb.mem_frees + 2, "the driver freed %lu of the 2 foreign blocks",
           fa.mem_frees - fb.mem_frees);
    expect(fa.refused_frees == fb.refused_frees, "the driver was asked to free something it never gave");
    expect(after.num_frees == before.num_frees, "cuheap counted frees of memory it did not hand out");
}

/* During a CUDA graph capture: cudaMallocAsync and cudaFreeAsync on the
 * captured stream go to CUDA (they become the graph's memory nodes); a
 * cuheap block freed there is kept, since a replay may use it later. */
static void check_capture(void)
{
    start_runtime();
    cudaStream_t s = NULL;
    expect(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    void *before_capture = NULL, *in_capture = NULL;
    expect(cudaMallocAsync(&before_capture, 1 * MiB, s) == cudaSuccess, "cudaMallocAsync failed");
    cuheap_stats_t st0, st1;
    heap_stats(&st0);
    fake_cuda_calls_t f0 = fake_calls(&fake);
    fake.set_capturing(s, 1);
    expect(cudaMallocAsync(&in_capture, 3 * MiB, s) == cudaSuccess && in_capture, "cudaMallocAsync in a capture failed");
    expect(cudaFreeAsync(in_capture, s) == cudaSuccess, "cudaFreeAsync in a capture failed");
    expect(cudaFreeAsync(before_capture, s) == cudaSuccess, "cudaFreeAsync of a cuheap block in a capture failed");
    fake.set_capturing(s, 0);
    heap_stats(&st1);
    fake_cuda_calls_t f1 = fake_calls(&fake);
    expect(f1.mem_allocs == f0.mem_allocs + 1 && f1.mem_frees == f0.mem_frees + 1,
           "the captured allocation did not go to CUDA (%lu allocations, %lu frees)", f1.mem_allocs - f0.mem_allocs,
           f1.mem_frees - f0.mem_frees);
    expect(st1.num_allocs == st0.num_allocs, "cuheap served an allocation on a captured stream");
    expect(st1.num_frees == st0.num_frees, "cuheap freed a block during a capture");
    expect(st1.allocated.current == st0.allocated.current, "the block freed in the capture was not kept");
    expect(cudaStreamDestroy(s) == cudaSuccess, "cudaStreamDestroy failed");
}

/* A graph capture underway: cuheap's device-wide fences would break it
 * (cuCtxRecordEvent and cuCtxWaitEvent invalidate every capture in the
 * context), so while one is underway cudaFree'd blocks wait and the capture
 * ends whole, with its graph; before and after, a take-back is one
 * device-wide event. The capture begins through the runtime, which reaches
 * the driver through cuGetProcAddress: cuheap sees it there. */
static void check_capture_fences(void)
{
    start_runtime();
    fake.hold(1);
    cudaStream_t s = NULL;
    expect(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    void *a = NULL, *b = NULL, *x[8] = {0};
    fake_cuda_calls_t c0 = fake_calls(&fake);
    expect(cudaMalloc(&a, 4 * MiB) == cudaSuccess && a, "cudaMalloc failed");
    expect(cudaFree(a) == cudaSuccess, "cudaFree failed");
    expect(cudaMalloc(&b, 4 * MiB) == cudaSuccess && b == a, "the freed block did not come back (%p, not %p)", b, a);
    fake_cuda_calls_t c1 = fake_calls(&fake);
    expect(c1.ctx_records > c0.ctx_records, "no device-wide event before the capture");
    expect(cudaFree(b) == cudaSuccess, "cudaFree failed");
    expect(cudaStreamBeginCapture(s, 2 /* relaxed */) == cudaSuccess, "cudaStreamBeginCapture failed");
    c1 = fake_calls(&fake);
    for (int i = 0; i < 8; i++) {
        expect(cudaMalloc(&x[i], 4 * MiB) == cudaSuccess && x[i], "cudaMalloc in the capture failed");
        expect(cudaFree(x[i]) == cudaSuccess, "cudaFree in the capture failed");
    }
    void *graph = NULL;
    int rc = cudaStreamEndCapture(s, &graph);
    fake_cuda_calls_t c2 = fake_calls(&fake);
    expect(rc == cudaSuccess && graph, "the capture was broken: cudaStreamEndCapture returned %d", rc);
    expect(c2.captures_broken == c0.captures_broken, "a device-wide call broke the capture");
    expect(c2.ctx_records == c1.ctx_records && c2.ctx_waits == c1.ctx_waits,
           "%lu device-wide events and %lu waits during the capture", c2.ctx_records - c1.ctx_records,
           c2.ctx_waits - c1.ctx_waits);
    expect(cudaMalloc(&a, 4 * MiB) == cudaSuccess && a, "cudaMalloc after the capture failed");
    expect(cudaFree(a) == cudaSuccess, "cudaFree failed");
    expect(cudaMalloc(&b, 4 * MiB) == cudaSuccess && b == a, "after the capture the freed block did not come back");
    expect(fake_calls(&fake).ctx_records > c2.ctx_records, "no device-wide event after the capture");
    expect(cudaFree(b) == cudaSuccess, "cudaFree failed");
    fake.complete_all();
    fake.hold(0);
    expect(cudaStreamDestroy(s) == cudaSuccess, "cudaStreamDestroy failed");
}

/* A capture that begins while a device-wide fence's call is underway: the
 * call would break it, so the begin waits until that call has returned,
 * however the fence reached it (no lock is held on its way: issue 45). The
 * fake driver holds the fence's call at its start. */
static atomic_int capture_begun;

static void *free_on_a_thread(void *block)
{
    return (void *)(intptr_t)cudaFree(block);
}

static void *begin_capture_on_a_thread(void *stream)
{
    intptr_t rc = cudaStreamBeginCapture(stream, 2 /* relaxed */);
    atomic_store(&capture_begun, 1);
    return (void *)rc;
}

static void check_capture_waits_for_fence(void)
{
    start_runtime();
    cudaStream_t s = NULL;
    expect(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    void *a = NULL;
    expect(cudaMalloc(&a, 4 * MiB) == cudaSuccess && a, "cudaMalloc failed");
    fake_cuda_calls_t c0 = fake_calls(&fake);
    fake.pause_ctx_events(1);
    pthread_t freeing, beginning;
    expect(pthread_create(&freeing, NULL, free_on_a_thread, a) == 0, "pthread_create failed");
    for (int i = 0; i < 10000 && fake.pause_ctx_events(-1) == 0; i++)
        usleep(1000);
    expect(fake.pause_ctx_events(-1) == 1, "cudaFree made no device-wide call");
    expect(pthread_create(&beginning, NULL, begin_capture_on_a_thread, s) == 0, "pthread_create failed");
    usleep(200000);
    expect(!atomic_load(&capture_begun), "a capture began while a device-wide fence's call was underway");
    fake.pause_ctx_events(0);
    void *free_rc = NULL, *begin_rc = NULL;
    pthread_join(freeing, &free_rc);
    pthread_join(beginning, &begin_rc);
    expect((intptr_t)free_rc == cudaSuccess, "cudaFree returned %ld", (long)(intptr_t)free_rc);
    expect((intptr_t)begin_rc == cudaSuccess, "cudaStreamBeginCapture returned %ld", (long)(intptr_t)begin_rc);
    void *graph = NULL;
    int rc = cudaStreamEndCapture(s, &graph);
    fake_cuda_calls_t c1 = fake_calls(&fake);
    expect(rc == cudaSuccess && graph, "the capture was broken: cudaStreamEndCapture returned %d", rc);
    expect(c1.captures_broken == c0.captures_broken, "the fence broke the capture");
    expect(c1.ctx_records > c0.ctx_records, "no device-wide event for the cudaFree");
    expect(cudaStreamDestroy(s) == cudaSuccess, "cudaStreamDestroy failed");
}

/* A capture cuheap did not see (begun behind its hooks): the first
 * device-wide fence breaks it, as the driver would. cuheap says so on
 * stderr, turns device-wide fences off and fences stream by stream from then
 * on, and the program's memory stays as it should. */
static void check_unseen_capture(void)
{
    start_runtime();
    cudaStream_t s = NULL;
    expect(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    fake.set_capturing(s, 1);   /* behind the hooks */
    fake_cuda_calls_t c0 = fake_calls(&fake);
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    expect(cudaMalloc(&a, 4 * MiB) == cudaSuccess && a, "cudaMalloc failed");
    expect(cudaFree(a) == cudaSuccess, "cudaFree failed");
    expect(cudaMalloc(&b, 4 * MiB) == cudaSuccess && b, "cudaMalloc failed");
    fake_cuda_calls_t c1 = fake_calls(&fake);
    expect(c1.captures_broken == c0.captures_broken + 1, "%lu captures broken, not 1",
           c1.captures_broken - c0.captures_broken);
    fake.set_capturing(s, 0);
    expect(cudaFree(b) == cudaSuccess, "cudaFree failed");
    expect(cudaMalloc(&c, 4 * MiB) == cudaSuccess && c, "cudaMalloc failed");
    pattern_fill(c, 4 * MiB, 5);
    expect(cudaFree(c) == cudaSuccess, "cudaFree failed");
    expect(cudaMalloc(&d, 4 * MiB) == cudaSuccess && d, "cudaMalloc failed");
    fake_cuda_calls_t c2 = fake_calls(&fake);
    expect(c2.ctx_records == c1.ctx_records && c2.ctx_waits == c1.ctx_waits,
           "device-wide fences still used after one broke a capture");
    expect(c2.captures_broken == c1.captures_broken, "another capture broken");
    expect(cudaFree(d) == cudaSuccess, "cudaFree failed");
    expect(cudaStreamDestroy(s) == cudaSuccess, "cudaStreamDestroy failed");
}

/* ---- g: program errors are refused, the heap carries on ---------------------- */

static void check_double_free(void)
{
    start_runtime();
    void *small = NULL, *large = NULL, *other = NULL;
    expect(cudaMalloc(&small, 1000) == cudaSuccess && small, "cudaMalloc(1000) failed");
    expect(cudaMalloc(&large, 8 * MiB) == cudaSuccess && large, "cudaMalloc(8 MiB) failed");
    expect(cudaFree(small) == cudaSuccess, "first cudaFree failed");
    int rc = cudaFree(small);
    expect(rc == cudaErrorInvalidValue, "a double free returned %d, not 1 (invalid value)", rc);
    rc = cudaFree((char *)large + 4096);
    expect(rc == cudaErrorInvalidValue, "a pointer inside a block returned %d, not 1 (invalid value)", rc);
    expect(cudaFree(large) == cudaSuccess, "the block freed from inside is still freeable at its start");
    expect(cudaMalloc(&other, 8 * MiB) == cudaSuccess && other, "cudaMalloc after the errors failed");
    pattern_fill(other, 8 * MiB, 3);
    expect(pattern_intact(other, 8 * MiB, 3), "data lost after the errors");
    expect(cudaFree(other) == cudaSuccess, "cudaFree after the errors failed");
    cuheap_stats_t st;
    heap_stats(&st);
    expect(st.num_allocs == 3 && st.num_frees == 3, "stats count %llu allocations and %llu frees, not 3 and 3",
           (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees);
    expect(st.allocated.current == 0 && st.requested.current == 0, "bytes still counted as live");
}

/* ---- h: sizes, arguments and alignment as the runtime has them ---------------- */

static void check_zero_and_alignment(void)
{
    start_runtime();
    void *p = (void *)1;
    expect(cudaMalloc(&p, 0) == cudaSuccess && p == NULL, "cudaMalloc(&p, 0) did not give success and NULL");
    expect(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL) failed");
    int rc = cudaMalloc(NULL, 16);
    expect(rc == cudaErrorInvalidValue, "cudaMalloc(NULL, 16) returned %d, not 1", rc);
    static const size_t sizes[] = {1, 3, 511, 513, 1000, 4097, 65537, 1 * MiB + 1, 3 * MiB + 17, 9 * MiB + 5};
    void *blocks[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        blocks[i] = NULL;
        expect(cudaMalloc(&blocks[i], sizes[i]) == cudaSuccess && blocks[i], "cudaMalloc(%zu) failed", sizes[i]);
        expect((uintptr_t)blocks[i] % ALIGNMENT == 0, "cudaMalloc(%zu) gave %p, not 512-byte aligned", sizes[i],
               blocks[i]);
    }
    size_t pitch = 0;
    void *pitched = NULL;
    expect(cudaMallocPitch(&pitched, &pitch, 1000, 10) == cudaSuccess && pitched, "cudaMallocPitch failed");
    expect(pitch >= 1000 && pitch % ALIGNMENT == 0 && (uintptr_t)pitched % ALIGNMENT == 0,
           "cudaMallocPitch gave pitch %zu at %p", pitch, pitched);
    memset(pitched, 1, pitch * 10);
    expect(cudaFree(pitched) == cudaSuccess, "cudaFree(pitched) failed");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        cudaFree(blocks[i]);
    cuheap_stats_t st;
    heap_stats(&st);
    expect(st.num_allocs == sizeof sizes / sizeof sizes[0] + 1, "cuheap served %llu allocations, not %zu",
           (unsigned long long)st.num_allocs, sizeof sizes / sizeof sizes[0] + 1);
}

/* ---- i: out of memory -------------------------------------------------------- */

static void check_out_of_memory(void)
{
    start_runtime();
    fake_cuda_calls_t fc = fake_calls(&fake);
    void *held = NULL;   /* the error names the program as holding it */
    expect(cudaMalloc(&held, 3 * MiB) == cudaSuccess && held, "cudaMalloc(3 MiB) failed");
    void *p = (void *)1;
    int rc = cudaMalloc(&p, fc.capacity + 64 * MiB);
    expect(rc == cudaErrorMemoryAllocation, "cudaMalloc beyond the device returned %d, not 2", rc);
    expect(p == NULL, "a failed cudaMalloc left %p", p);
    void *small = NULL;
    expect(cudaMalloc(&small, 1 * MiB) == cudaSuccess && small, "cudaMalloc after an OOM failed");
    cudaFree(small);
    cudaFree(held);
    cuheap_stats_t st;
    heap_stats(&st);
    expect(st.num_ooms >= 1, "cuheap counted no out-of-memory");
}

/* ---- j: a forked child that uses no CUDA writes no report --------------------- */

static void check_fork(void)
{
    start_runtime();
    void *p = NULL;
    expect(cudaMalloc(&p, 1 * MiB) == cudaSuccess, "cudaMalloc failed");
    cudaFree(p);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0)
        exit(0);   /* atexit handlers run, as in any child that exits */
    int status = 0;
    expect(child > 0 && waitpid(child, &status, 0) == child, "fork or wait failed");
    expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child did not exit cleanly (status %d)", status);
    printf("parent %d child %d\n", (int)getpid(), (int)child);
}

/* ---- k: IPC handles only for blocks that start their segment ------------------ */

static void check_ipc(void)
{
    start_runtime();
    void *large = NULL, *first = NULL, *second = NULL;
    expect(cudaMalloc(&large, 64 * MiB) == cudaSuccess && large, "cudaMalloc(64 MiB) failed");
    expect(cudaMalloc(&first, 1000) == cudaSuccess && first, "cudaMalloc(1000) failed");
    expect(cudaMalloc(&second, 1000) == cudaSuccess && second, "cudaMalloc(1000) failed");
    cudaIpcMemHandle_t handle;
    memset(&handle, 0, sizeof handle);
    int rc = cudaIpcGetMemHandle(&handle, large);
    expect(rc == cudaSuccess, "cudaIpcGetMemHandle of a block that starts its segment returned %d", rc);
    void *named = NULL;
    memcpy(&named, handle.reserved, sizeof named);
    expect(rc != cudaSuccess || named == large, "the handle names %p, not %p", named, large);
    rc = cudaIpcGetMemHandle(&handle, second);
    expect(rc != cudaSuccess, "cudaIpcGetMemHandle of a block inside a segment succeeded");
    cudaFree(large), cudaFree(first), cudaFree(second);
}

/* With CUHEAP_CONF=ipc_safe:1 every block starts its own segment: the small
 * blocks that are refused above get handles that name them. */
static void check_ipc_safe(void)
{
    start_runtime();
    void *blocks[3] = {NULL, NULL, NULL};
    const size_t sizes[3] = {1000, 1000, 5 * MiB};
    for (int i = 0; i < 3; i++) {
        expect(cudaMalloc(&blocks[i], sizes[i]) == cudaSuccess && blocks[i], "cudaMalloc(%zu) failed", sizes[i]);
        cudaIpcMemHandle_t handle;
        memset(&handle, 0, sizeof handle);
        int rc = cudaIpcGetMemHandle(&handle, blocks[i]);
        void *named = NULL;
        memcpy(&named, handle.reserved, sizeof named);
        expect(rc == cudaSuccess && named == blocks[i], "block %d: cudaIpcGetMemHandle returned %d naming %p, not %p",
               i, rc, named, blocks[i]);
    }
    for (int i = 0; i < 3; i++)
        cudaFree(blocks[i]);
}

/* A library that shares its cudaMalloc'd buffers through IPC handles (NCCL
 * with NCCL_CUMEM_ENABLE=0): with cuheap's default ipc_callers, its blocks
 * start segments of their own, even where a hole inside a segment would fit;
 * the program's own blocks do not. The library is tests' libnccl_fake.so
 * (path in NCCL_FAKE_LIB); with CUHEAP_CONF=ipc_callers:none its block is
 * refused like the program's (the test script checks that run fails). */
static void check_ipc_callers(void)
{
    start_runtime();
    const char *path = getenv("NCCL_FAKE_LIB");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    expect(lib != NULL, "cannot load NCCL_FAKE_LIB=%s: %s", path ? path : "(unset)", dlerror());
    void *(*lib_alloc)(size_t) = NULL;
    int (*lib_free)(void *) = NULL;
    *(void **)&lib_alloc = dlsym(lib, "nccl_fake_alloc");
    *(void **)&lib_free = dlsym(lib, "nccl_fake_free");
    expect(lib_alloc && lib_free, "libnccl_fake.so lacks its functions");
    void *a = NULL, *b = NULL;
    expect(cudaMalloc(&a, MiB) == cudaSuccess && a, "cudaMalloc(1 MiB) failed");
    expect(cudaMalloc(&b, MiB) == cudaSuccess && b, "cudaMalloc(1 MiB) failed");
    cudaIpcMemHandle_t handle;
    memset(&handle, 0, sizeof handle);
    expect(cudaIpcGetMemHandle(&handle, b) != cudaSuccess, "the program's block inside a segment got a handle");
    cudaFree(b);   /* a 1 MiB hole inside a's segment */
    void *blocks[2] = {lib_alloc(MiB), lib_alloc(1000)};
    for (int i = 0; i < 2; i++) {
        expect(blocks[i] != NULL, "the library's cudaMalloc %d failed", i);
        memset(&handle, 0, sizeof handle);
        int rc = cudaIpcGetMemHandle(&handle, blocks[i]);
        void *named = NULL;
        memcpy(&named, handle.reserved, sizeof named);
        expect(rc == cudaSuccess && named == blocks[i], "the library's block %d: cudaIpcGetMemHandle returned %d naming "
               "%p, not %p", i, rc, named, blocks[i]);
    }
    expect(lib_free(blocks[0]) == cudaSuccess && lib_free(blocks[1]) == cudaSuccess, "the library's cudaFree failed");
    cudaFree(a);
}

/* ---- l, n: cudaFree's promise ------------------------------------------------- */

/* Frees block A while a kernel on `stream` still reads it, then hands out
 * REUSE_TRIES blocks of its size and overwrites them. */
static void free_while_read(cudaStream_t stream, int stream_ordered_free, void **reused, void **a_out)
{
    void *a = NULL;
    expect(cudaMalloc(&a, CHECKED_BYTES) == cudaSuccess && a, "cudaMalloc(A) failed");
    memset(a, 0xAB, CHECKED_BYTES);
    expect(fake.enqueue_check(stream, a, CHECKED_BYTES, 0xAB) == 0, "enqueueing the kernel failed");
    int rc = stream_ordered_free ? cudaFreeAsync(a, stream) : cudaFree(a);
    expect(rc == cudaSuccess, "freeing A returned %d", rc);
    if (RUNTIME_SYNCHRONIZES_IN_CUDA_FREE && !stream_ordered_free)
        expect(fake_calls(&fake).kernels_run == 1, "the runtime's cudaFree did not synchronize");
    else
        expect(fake_calls(&fake).kernels_run == 0, "the free waited for the kernel (it must return at once)");
    for (int i = 0; i < REUSE_TRIES; i++) {
        reused[i] = NULL;
        expect(cudaMalloc(&reused[i], CHECKED_BYTES) == cudaSuccess && reused[i], "cudaMalloc %d failed", i);
        /* Written by GPU work on the default stream, as a program would:
         * cuheap may hand A out at once if it makes the streams wait. */
        if (reused[i])
            expect(fake.enqueue_fill(NULL, reused[i], CHECKED_BYTES, 0xCD) == 0, "enqueueing a fill failed");
    }
    *a_out = a;
}

/* Returns every cached segment to the device (waiting for pending frees)
 * and expects nothing left: no block was lost on the way. */
static void expect_nothing_leaked(void)
{
    void *sym = dlsym(RTLD_DEFAULT, "cuheap_release_cached");
    cuheap_status_t (*release_cached)(int);
    memcpy(&release_cached, &sym, sizeof sym);
    if (!expect(release_cached != NULL, "cuheap_release_cached is not in the process"))
        return;
    expect(release_cached(0) == CUHEAP_OK, "cuheap_release_cached failed");
    cuheap_stats_t st;
    heap_stats(&st);
    expect(st.pending.current == 0 && st.allocated.current == 0 && st.reserved.current == 0,
           "after freeing everything and releasing the cache: %llu pending, %llu allocated, %llu reserved",
           (unsigned long long)st.pending.current, (unsigned long long)st.allocated.current,
           (unsigned long long)st.reserved.current);
    expect(fake_calls(&fake).used == 0, "%zu bytes still allocated from the device", fake_calls(&fake).used);
}

/* After the kernel ran: no corrupt byte, A handed out again, nothing lost. */
static void expect_a_safe_then_reusable(void *a, void **reused)
{
    expect(fake_calls(&fake).kernels_run == 1, "the kernel did not run");
    unsigned long corrupt = fake.corrupt_bytes();
    expect(corrupt == 0, "the kernel saw %lu corrupt bytes: A was handed out again before it ran", corrupt);
    void *again[REUSE_TRIES + 1] = {0};
    int got_a = 0;
    for (int i = 0; i < REUSE_TRIES; i++)
        got_a |= reused[i] == a;   /* where the work was waited for before the free */
    for (int i = 0; i <= REUSE_TRIES && !got_a; i++) {
        expect(cudaMalloc(&again[i], CHECKED_BYTES) == cudaSuccess, "cudaMalloc after completion failed");
        got_a = again[i] == a;
    }
    expect(got_a, "A was never handed out again after its kernel completed");
    for (int i = 0; i < REUSE_TRIES; i++)
        cudaFree(reused[i]);
    for (int i = 0; i <= REUSE_TRIES; i++)
        cudaFree(again[i]);
    expect_nothing_leaked();
}

static void check_free_ordering(int stream_seen)
{
    start_runtime();
    fake.hold(1);
    cudaStream_t s = NULL;
    if (stream_seen)
        expect(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    else
        expect(fake.stream_create_unseen(&s, cudaStreamNonBlocking) == 0, "stream creation failed");
    void *reused[REUSE_TRIES], *a;
    fake_cuda_calls_t before = fake_calls(&fake);
    free_while_read(s, 0, reused, &a);
    if (stream_seen && !RUNTIME_SYNCHRONIZES_IN_CUDA_FREE) {
        /* cuheap handed A out again at once, making the streams wait for
         * the kernel on the GPU rather than reserving more memory. */
        int early = 0;
        for (int i = 0; i < REUSE_TRIES; i++)
            early |= reused[i] == a;
        expect(early, "A was not reused before its kernel ran (the heap grew instead)");
        fake_cuda_calls_t after = fake_calls(&fake);
        expect(after.stream_waits + after.ctx_waits > before.stream_waits + before.ctx_waits,
               "no stream was made to wait for the freed block");
        expect(fake_calls(&fake).kernels_run == 0, "the CPU waited for the kernel");
    }
    fake.complete_all();
    expect_a_safe_then_reusable(a, reused);
    fake.hold(0);
    expect(cudaStreamDestroy(s) == cudaSuccess, "cudaStreamDestroy failed");
}

/* A block cudaFree'd while a kernel on the default stream still reads it
 * comes back at once (one stream known: no wait needed then); a stream
 * created afterwards must still not overwrite it before that kernel ran. */
static void check_new_stream_after_reuse(void)
{
    start_runtime();
    fake.hold(1);
    void *a = NULL, *b = NULL;
    expect(cudaMalloc(&a, CHECKED_BYTES) == cudaSuccess && a, "cudaMalloc(A) failed");
    memset(a, 0xAB, CHECKED_BYTES);
    expect(fake.enqueue_check(NULL, a, CHECKED_BYTES, 0xAB) == 0, "enqueueing the kernel failed");
    expect(cudaFree(a) == cudaSuccess, "cudaFree(A) failed");
    expect(cudaMalloc(&b, CHECKED_BYTES) == cudaSuccess && b, "cudaMalloc(B) failed");
    expect(b == a, "A did not come back at once (%p, not %p)", b, a);
    cudaStream_t late = NULL;
    expect(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    expect(fake.enqueue_fill(late, b, CHECKED_BYTES, 0xCD) == 0, "enqueueing a fill failed");
    fake.complete(late);   /* the new stream runs first, as a GPU may */
    fake.complete_all();
    unsigned long corrupt = fake.corrupt_bytes();
    expect(corrupt == 0, "the kernel saw %lu corrupt bytes: a stream created after the reuse overwrote A first",
           corrupt);
    fake.hold(0);
    expect(cudaStreamDestroy(late) == cudaSuccess, "cudaStreamDestroy failed");
    cudaFree(b);
}

static void check_stream_destroy(void)
{
    start_runtime();
    fake.hold(1);
    cudaStream_t s = NULL;
    expect(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    void *reused[REUSE_TRIES], *a;
    free_while_read(s, 1, reused, &a);
    expect(cudaStreamDestroy(s) == cudaSuccess, "cudaStreamDestroy with a pending free failed");
    void *after_destroy = NULL;
    expect(cudaMalloc(&after_destroy, CHECKED_BYTES) == cudaSuccess, "cudaMalloc after the destroy failed");
    expect(after_destroy != a, "A was handed out again after its stream was destroyed, before its work ran");
    if (after_destroy)
        expect(fake.enqueue_fill(NULL, after_destroy, CHECKED_BYTES, 0xCD) == 0, "enqueueing a fill failed");
    fake.complete_all();
    cudaFree(after_destroy);
    expect_a_safe_then_reusable(a, reused);
    expect(fake_calls(&fake).unknown_streams == 0, "a destroyed stream was used afterwards");
    fake.hold(0);
}

/* ---- step plans for a program that marks no steps ------------------------------ */


/* A training loop that marks no steps, run with step_plan:1 (and
 * vmm_margin:0, so that pages move every step until a plan is in force):
 * cuheap must find its steps and place blocks by a plan. Every block is
 * filled and, just before its cudaFree, checked on one of two streams, the
 * next block on the other; blocks freed on one stream are followed by as
 * many of their size on the other, which the plan puts in their places
 * before their checks ran; the work is held until the step's end and then
 * the second blocks' stream runs first. No check may see a later block's
 * bytes. */
static void check_steps_planned(void)
{
    start_runtime();
    fake.hold(1);
    cudaStream_t s[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        expect(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    enum { STEPS = 12, SMALL = 24, LARGE = 3, PAIRS = 8, BLOCKS = SMALL + LARGE + 2 * PAIRS };
    int same_place = 0;
    for (int step = 0; step < STEPS; step++) {
        void *small[SMALL], *large[LARGE];
        unsigned char v[SMALL + LARGE];
        int on[SMALL + LARGE];
        for (int k = 0; k < SMALL + LARGE; k++) {
            v[k] = (unsigned char)(1 + (step * (SMALL + LARGE) + k) % 250);
            on[k] = (step + k) % 2;
        }
        for (int i = 0; i < SMALL; i++) {
            expect(cudaMalloc(&small[i], 2 * MiB) == cudaSuccess, "cudaMalloc failed");
            expect(fake.enqueue_fill(s[on[i]], small[i], 2 * MiB, v[i]) == 0, "enqueueing a fill failed");
        }
        for (int i = 0; i < SMALL; i += 2) {
            expect(fake.enqueue_check(s[on[i]], small[i], 2 * MiB, v[i]) == 0, "enqueueing a check failed");
            expect(cudaFree(small[i]) == cudaSuccess, "cudaFree failed");
        }
        for (int i = 0; i < LARGE; i++) {
            expect(cudaMalloc(&large[i], 8 * MiB) == cudaSuccess, "cudaMalloc failed");
            expect(fake.enqueue_fill(s[on[SMALL + i]], large[i], 8 * MiB, v[SMALL + i]) == 0, "enqueueing a fill failed");
        }
        /* Blocks of 2 MiB used on one stream and freed, then as many on the
         * other: laid out by size, the second ones go where the first ones
         * were, before the first ones' checks have run (their fills have). */
        void *first[PAIRS], *second[PAIRS];
        for (int i = 0; i < PAIRS; i++) {
            expect(cudaMalloc(&first[i], 2 * MiB) == cudaSuccess, "cudaMalloc failed");
            expect(fake.enqueue_fill(s[step % 2], first[i], 2 * MiB, (unsigned char)(200 + i)) == 0,
                   "enqueueing a fill failed");
        }
        fake.complete(s[step % 2]);   /* their fills ran; their checks will wait */
        for (int i = 0; i < PAIRS; i++) {
            expect(fake.enqueue_check(s[step % 2], first[i], 2 * MiB, (unsigned char)(200 + i)) == 0,
                   "enqueueing a check failed");
            expect(cudaFree(first[i]) == cudaSuccess, "cudaFree failed");
        }
        for (int i = 0; i < PAIRS; i++) {
            expect(cudaMalloc(&second[i], 2 * MiB) == cudaSuccess, "cudaMalloc failed");
            same_place += second[i] == first[i];
            expect(fake.enqueue_fill(s[(step + 1) % 2], second[i], 2 * MiB, (unsigned char)(220 + i)) == 0,
                   "enqueueing a fill failed");
        }
        for (int i = 0; i < PAIRS; i++) {
            expect(fake.enqueue_check(s[(step + 1) % 2], second[i], 2 * MiB, (unsigned char)(220 + i)) == 0,
                   "enqueueing a check failed");
            expect(cudaFree(second[i]) == cudaSuccess, "cudaFree failed");
        }
        for (int i = 1; i < SMALL; i += 2) {
            expect(fake.enqueue_check(s[on[i]], small[i], 2 * MiB, v[i]) == 0, "enqueueing a check failed");
            expect(cudaFree(small[i]) == cudaSuccess, "cudaFree failed");
        }
        for (int i = 0; i < LARGE; i++) {
            expect(fake.enqueue_check(s[on[SMALL + i]], large[i], 8 * MiB, v[SMALL + i]) == 0,
                   "enqueueing a check failed");
            expect(cudaFree(large[i]) == cudaSuccess, "cudaFree failed");
        }
        fake.complete(s[(step + 1) % 2]);   /* the second blocks' stream first */
        fake.complete_all();
    }
    unsigned long corrupt = fake.corrupt_bytes();
    expect(corrupt == 0, "checks saw %lu bytes of later blocks", corrupt);
    long made = 0, placed = 0;
    int found = 0;
    expect(plan_report_figures(&made, &placed, &found) == 0, "cuheap's report has no step plans line (step_plan:1 not set?)");
    expect(found, "cuheap found no steps in the allocations");
    expect(made >= 1 && placed >= 4 * BLOCKS, "plans made %ld, blocks placed by them %ld", made, placed);
    expect(same_place >= 4 * PAIRS, "the second blocks took the first ones' places %d times", same_place);
    fake.hold(0);
    for (int i = 0; i < 2; i++)
        expect(cudaStreamDestroy(s[i]) == cudaSuccess, "cudaStreamDestroy failed");
}

/* Memory freed in order on stream A while A's kernel still reads it, asked
 * for in order on stream B when nothing else fits: under LD_PRELOAD cuheap
 * orders streams as CUDA's pools do (reuse_across_streams:1 unless
 * CUHEAP_CONF says otherwise), so B gets it at once and waits for A's kernel
 * on the GPU; with reuse_across_streams:0 the heap grows instead. Either
 * way B's writes never reach the block before the kernel has read it. */
static void check_async_reuse(int expect_reuse)
{
    enum { BYTES = 64 << 20 };   /* a segment of its own: nothing else fits beside it */
    start_runtime();
    fake.hold(1);
    cudaStream_t a_stream = NULL, b_stream = NULL;
    expect(cudaStreamCreateWithFlags(&a_stream, cudaStreamNonBlocking) == cudaSuccess &&
               cudaStreamCreateWithFlags(&b_stream, cudaStreamNonBlocking) == cudaSuccess,
           "stream creation failed");
    void *a = NULL, *b = NULL;
    expect(cudaMallocAsync(&a, BYTES, a_stream) == cudaSuccess && a, "cudaMallocAsync(A) failed");
    memset(a, 0xAB, BYTES);
    expect(fake.enqueue_check(a_stream, a, BYTES, 0xAB) == 0, "enqueueing the kernel failed");
    expect(cudaFreeAsync(a, a_stream) == cudaSuccess, "cudaFreeAsync(A) failed");
    unsigned long waits_before = fake_calls(&fake).stream_waits, allocs_before = fake_calls(&fake).mem_allocs;
    expect(cudaMallocAsync(&b, BYTES, b_stream) == cudaSuccess && b, "cudaMallocAsync(B) failed");
    if (expect_reuse) {
        expect(b == a, "B did not get A's memory (%p, not %p): the heap grew instead", b, a);
        expect(fake_calls(&fake).stream_waits > waits_before, "stream B was not made to wait for A's kernel");
        expect(fake_calls(&fake).mem_allocs == allocs_before, "the heap asked the device for memory");
    } else {
        expect(b != a, "with reuse_across_streams:0, B got A's memory before A's kernel ran");
    }
    expect(fake_calls(&fake).kernels_run == 0, "the CPU waited for the kernel");
    if (b)
        expect(fake.enqueue_fill(b_stream, b, BYTES, 0xCD) == 0, "enqueueing a fill failed");
    fake.complete(b_stream);   /* B's stream runs first, as a GPU may */
    fake.complete_all();
    unsigned long corrupt = fake.corrupt_bytes();
    expect(corrupt == 0, "the kernel saw %lu corrupt bytes: B wrote A's memory before the kernel read it", corrupt);
    fake.hold(0);
    expect(cudaFreeAsync(b, b_stream) == cudaSuccess, "cudaFreeAsync(B) failed");
    expect(cudaStreamDestroy(a_stream) == cudaSuccess && cudaStreamDestroy(b_stream) == cudaSuccess,
           "cudaStreamDestroy failed");
    expect_nothing_leaked();
}

/* ---- m: cudaMemGetInfo counts cuheap's ready cache as free -------------------- */

/* Frees one of two 64 MiB blocks; `settle` then allocates and frees a small
 * block, on which cuheap looks at its pending frees again. Both
 * cudaMemGetInfo and cuMemGetInfo_v2 must report the device's free bytes
 * plus the 64 MiB (with counts_cache), or the device's alone. */
static void check_meminfo(int counts_cache, int settle)
{
    start_runtime();
    void *a = NULL, *b = NULL, *small = NULL;
    expect(cudaMalloc(&a, 64 * MiB) == cudaSuccess && a, "cudaMalloc(64 MiB) failed");
    expect(cudaMalloc(&b, 64 * MiB) == cudaSuccess && b, "cudaMalloc(64 MiB) failed");
    expect(cudaFree(a) == cudaSuccess, "cudaFree failed");
    if (settle) {
        expect(cudaMalloc(&small, 1000) == cudaSuccess, "cudaMalloc(1000) failed");
        expect(cudaFree(small) == cudaSuccess, "cudaFree(small) failed");
    }
    void *sym = fakeCudartDriverFunction("cuMemGetInfo");
    int (*driver_meminfo)(size_t *, size_t *);
    memcpy(&driver_meminfo, &sym, sizeof sym);
    size_t free_rt = 0, total_rt = 0, free_drv = 0, total_drv = 0;
    /* A query polls the heap: memory whose free the GPU has passed becomes
     * ready (the small object may wait in the open batch until then), so
     * what it counts lies between the ready cache before and after it. */
    cuheap_stats_t before, st;
    heap_stats(&before);
    expect(cudaMemGetInfo(&free_rt, &total_rt) == cudaSuccess, "cudaMemGetInfo failed");
    expect(driver_meminfo && driver_meminfo(&free_drv, &total_drv) == 0, "cuMemGetInfo_v2 failed");
    heap_stats(&st);
    fake_cuda_calls_t fc = fake_calls(&fake);
    size_t device_free = fc.capacity - fc.used;
    size_t ready_before = counts_cache ? (size_t)(before.cached.current - before.pending.current) : 0;
    size_t ready = counts_cache ? (size_t)(st.cached.current - st.pending.current) : 0;
    expect(!counts_cache || ready + MiB >= 64 * MiB, "cuheap counts %zu MiB of the freed 64 MiB as ready for reuse",
           ready / MiB);
    expect(free_rt >= device_free + ready_before && free_rt <= device_free + ready,
           "cudaMemGetInfo: %zu KiB free, expected %zu KiB + %zu to %zu KiB", free_rt >> 10, device_free >> 10,
           ready_before >> 10, ready >> 10);
    expect(free_drv >= free_rt && free_drv <= device_free + ready,
           "cuMemGetInfo_v2: %zu KiB free, expected %zu KiB + at most %zu KiB, and no less than cudaMemGetInfo's",
           free_drv >> 10, device_free >> 10, ready >> 10);
    expect(total_rt == fc.capacity && total_drv == fc.capacity, "total is not the device's");
    cudaFree(b);
}

/* ---- o: cudaDeviceReset drops the heap ---------------------------------------- */

static void check_device_reset(void)
{
    start_runtime();
    void *p = NULL, *q = NULL;
    expect(cudaMalloc(&p, 1 * MiB) == cudaSuccess, "cudaMalloc failed");
    expect(cudaMalloc(&q, 10 * MiB) == cudaSuccess, "cudaMalloc failed");
    cudaFree(q);
    expect(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset failed");
    cuheap_stats_t st, zero;
    heap_stats(&st);
    memset(&zero, 0, sizeof zero);
    expect(memcmp(&st, &zero, sizeof st) == 0, "device 0's stats are not zero after the reset "
           "(reserved %llu, allocs %llu)", (unsigned long long)st.reserved.current,
           (unsigned long long)st.num_allocs);
    expect(fake_calls(&fake).primary_resets == 1, "the driver's primary context was not reset");
    void *r = NULL;
    expect(cudaMalloc(&r, 2 * MiB) == cudaSuccess && r, "cudaMalloc after the reset failed");
    if (r) {
        pattern_fill(r, 2 * MiB, 9);
        expect(pattern_intact(r, 2 * MiB, 9), "data lost after the reset");
    }
    heap_stats(&st);
    expect(st.num_allocs == 1, "the new heap counts %llu allocations, not 1", (unsigned long long)st.num_allocs);
    cudaFree(r);
}

/* ---- two devices (FAKE_CUDA_DEVICES=2) ---------------------------------------
 * Each cudaMalloc goes to the current device's heap; a cudaFree to the heap
 * that owns the block, whichever device is current; cudaMemGetInfo answers
 * for the current device; cudaDeviceReset drops only the current device's
 * heap. */

/* What cudaMemGetInfo must say on `device` under the preload: the device's
 * free bytes plus cuheap's ready cache, i.e. its total less what the program
 * holds there. */
static void expect_meminfo(int device)
{
    size_t free_bytes = 0, total = 0;
    cuheap_stats_t st;
    expect(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess, "cudaMemGetInfo on device %d failed", device);
    heap_stats_of(device, &st);
    expect(free_bytes == total - st.allocated.current,
           "cudaMemGetInfo on device %d: %zu free of %zu, expected the total less the %llu bytes allocated there",
           device, free_bytes, total, (unsigned long long)st.allocated.current);
}

static void check_two_devices(void)
{
    start_runtime();
    int device = -1;
    void *a = NULL, *b = NULL, *c = NULL;
    expect(cudaSetDevice(1) == cudaSuccess && cudaGetDevice(&device) == cudaSuccess && device == 1,
           "cudaSetDevice(1) did not make device 1 current (device %d)", device);
    expect(cudaMalloc(&a, 3 * MiB) == cudaSuccess && a, "cudaMalloc on device 1 failed");
    if (a)
        pattern_fill(a, 3 * MiB, 21);
    expect_meminfo(1);
    expect(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0) failed");
    expect(cudaMalloc(&b, 5 * MiB) == cudaSuccess && b, "cudaMalloc on device 0 failed");
    expect_meminfo(0);
    cuheap_stats_t s0, s1;
    heap_stats_of(0, &s0);
    heap_stats_of(1, &s1);
    expect(s0.num_allocs == 1 && s0.requested.current == 5 * MiB,
           "device 0's heap: %llu allocations, %llu bytes requested; expected b alone",
           (unsigned long long)s0.num_allocs, (unsigned long long)s0.requested.current);
    expect(s1.num_allocs == 1 && s1.requested.current == 3 * MiB,
           "device 1's heap: %llu allocations, %llu bytes requested; expected a alone",
           (unsigned long long)s1.num_allocs, (unsigned long long)s1.requested.current);
    /* a belongs to device 1: freed while device 0 is current, it goes back to
     * device 1's heap, and device 0 never hands it out. */
    if (a)
        expect(pattern_intact(a, 3 * MiB, 21), "a's data changed");
    expect(cudaFree(a) == cudaSuccess, "cudaFree of device 1's block while device 0 is current failed");
    heap_stats_of(1, &s1);
    expect(s1.num_frees == 1 && s1.requested.current == 0, "device 1's heap did not take a back (frees %llu)",
           (unsigned long long)s1.num_frees);
    expect(cudaFree(a) == cudaErrorInvalidValue, "a second cudaFree of a was not refused");
    expect(cudaMalloc(&c, 3 * MiB) == cudaSuccess && c && c != a, "device 0 handed out device 1's memory");
    heap_stats_of(0, &s0);
    expect(s0.num_allocs == 2, "device 0's heap counts %llu allocations, not 2", (unsigned long long)s0.num_allocs);
    /* A reset of device 1 leaves device 0's heap alone. */
    expect(cudaSetDevice(1) == cudaSuccess && cudaDeviceReset() == cudaSuccess, "cudaDeviceReset on device 1 failed");
    heap_stats_of(0, &s0);
    heap_stats_of(1, &s1);
    expect(s1.num_allocs == 0 && s1.reserved.current == 0, "device 1's heap survived its reset");
    expect(s0.num_allocs == 2 && s0.requested.current == 8 * MiB, "device 1's reset touched device 0's heap");
    expect(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0) failed");
    if (b)
        pattern_fill(b, 5 * MiB, 22), expect(pattern_intact(b, 5 * MiB, 22), "b unusable after device 1's reset");
    expect(cudaFree(b) == cudaSuccess && cudaFree(c) == cudaSuccess, "cudaFree on device 0 failed");
}

/* ---- peer access to virtual memory (FAKE_CUDA_DEVICES=2, vmm:1) -----------------
 * cuheap maps its own pages under vmm:1, and a mapping is accessible only to
 * the devices cuMemSetAccess names: once device 0 may access device 1
 * (cudaDeviceEnablePeerAccess(1) on device 0), device 1's mapped pages, and
 * every page mapped there later, must name device 0 too; device 0's own pages
 * are not granted to device 1 (peer access is one-way). */
static void check_peer_access(void)
{
    start_runtime();
    void *a = NULL, *b = NULL, *c = NULL;
    expect(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1) failed");
    expect(cudaMalloc(&a, 8 * MiB) == cudaSuccess && a, "cudaMalloc on device 1 failed");
    fake_cuda_calls_t c0 = fake_calls(&fake);
    expect(c0.access_grants[1] > 0, "device 1's pages were never made accessible to device 1 (is vmm:1 on?)");
    expect(c0.access_grants[0] == 0, "device 1's pages were granted to device 0 before peer access");
    expect(cudaSetDevice(0) == cudaSuccess && cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess,
           "cudaDeviceEnablePeerAccess(1) on device 0 failed");
    fake_cuda_calls_t c1 = fake_calls(&fake);
    expect(c1.peer_enables == 1, "the driver saw %lu peer enables, not 1", c1.peer_enables);
    expect(c1.access_grants[0] > 0, "enabling peer access did not grant device 0 device 1's mapped pages");
    expect(cudaSetDevice(1) == cudaSuccess && cudaMalloc(&b, 64 * MiB) == cudaSuccess && b,
           "cudaMalloc of 64 MiB on device 1 failed");
    fake_cuda_calls_t c2 = fake_calls(&fake);
    expect(c2.access_grants[0] > c1.access_grants[0], "pages mapped on device 1 later were not granted to device 0");
    expect(cudaSetDevice(0) == cudaSuccess && cudaMalloc(&c, 8 * MiB) == cudaSuccess && c,
           "cudaMalloc on device 0 failed");
    fake_cuda_calls_t c3 = fake_calls(&fake);
    expect(c3.access_grants[0] > c2.access_grants[0], "device 0's own pages were not made accessible to it");
    expect(c3.access_grants[1] == c2.access_grants[1], "device 0's pages were granted to device 1, which never asked");
    expect(cudaFree(a) == cudaSuccess && cudaFree(b) == cudaSuccess && cudaFree(c) == cudaSuccess, "cudaFree failed");
}

/* ---- pinned host memory: cudaHostAlloc, cudaMallocHost, cudaFreeHost ---------- */

/* Served by cuheap's cache (few real page-locked allocations for many
 * requests), with the flags asked for reaching CUDA: cudaHostGetFlags and
 * cudaHostGetDevicePointer answer for the cache's buffers as for CUDA's.
 * Write-combined memory and foreign pointers go to CUDA. */
static void check_pinned(void)
{
    start_runtime();
    fake_cuda_calls_t c0 = fake_calls(&fake);
    void *ptrs[4][50];
    for (unsigned flags = 0; flags < 4; flags++)
        for (int i = 0; i < 50; i++) {
            size_t size = 1 + (size_t)((i * 7919 + (int)flags * 104729) % (512 * 1024));
            void *p = NULL;
            cudaError_t rc = flags == 0 && i % 2 ? cudaMallocHost(&p, size) : cudaHostAlloc(&p, size, flags);
            ptrs[flags][i] = p;
            if (!expect(rc == cudaSuccess && p, "pinned allocation of %zu bytes, flags %u: %d", size, flags, rc))
                continue;
            pattern_fill(p, size, flags * 100 + (unsigned)i);
            unsigned got = 99;
            expect(cudaHostGetFlags(&got, p) == cudaSuccess && got == flags,
                   "cudaHostGetFlags on a buffer asked with flags %u says %u", flags, got);
            void *d = NULL;
            cudaError_t drc = cudaHostGetDevicePointer(&d, p, 0);
            if (flags & cudaHostAllocMapped)
                expect(drc == cudaSuccess && d == p, "no device pointer for mapped pinned memory (%d)", drc);
            else
                expect(drc != cudaSuccess, "a device pointer for pinned memory that was not asked to be mapped");
        }
    fake_cuda_calls_t c1 = fake_calls(&fake);
    expect(c1.host_allocs - c0.host_allocs <= 8, "the driver made %lu page-locked allocations for 200 requests",
           c1.host_allocs - c0.host_allocs);
    cuheap_host_stats_t st;
    host_stats(&st);
    expect(st.num_allocs == 200, "cuheap's pinned cache served %llu of 200 allocations",
           (unsigned long long)st.num_allocs);
    for (unsigned flags = 0; flags < 4; flags++)
        for (int i = 0; i < 50; i++) {
            size_t size = 1 + (size_t)((i * 7919 + (int)flags * 104729) % (512 * 1024));
            if (!ptrs[flags][i])
                continue;
            expect(pattern_intact(ptrs[flags][i], size, flags * 100 + (unsigned)i), "pinned data damaged");
            expect(cudaFreeHost(ptrs[flags][i]) == cudaSuccess, "cudaFreeHost failed");
        }
    expect(fake_calls(&fake).host_frees == c1.host_frees, "cudaFreeHost of the cache's buffers reached CUDA");

    /* write-combined: CUDA's own */
    void *wc = NULL;
    expect(cudaHostAlloc(&wc, 4096, cudaHostAllocWriteCombined) == cudaSuccess && wc, "write-combined alloc failed");
    fake_cuda_calls_t c2 = fake_calls(&fake);
    expect(c2.host_allocs == c1.host_allocs + 1, "write-combined memory did not come from CUDA");
    unsigned got = 0;
    expect(cudaHostGetFlags(&got, wc) == cudaSuccess && got == cudaHostAllocWriteCombined, "write-combined flags lost");
    expect(cudaFreeHost(wc) == cudaSuccess, "cudaFreeHost of CUDA's write-combined buffer failed");
    expect(fake_calls(&fake).host_frees == c2.host_frees + 1, "CUDA's buffer was not freed by CUDA");

    /* a pointer nobody allocated: CUDA's answer */
    char *plain = malloc(64);
    expect(cudaFreeHost(plain) == cudaErrorInvalidValue, "cudaFreeHost of a malloc'd pointer did not fail as CUDA's");
    free(plain);
    host_stats(&st);
    expect(st.num_frees == 200 && st.requested.current == 0, "pinned books: %llu frees, %llu bytes live",
           (unsigned long long)st.num_frees, (unsigned long long)st.requested.current);
}

/* A double free and a pointer inside a buffer: invalid value, named on
 * stderr, and nothing else changes. */
static void check_pinned_double_free(void)
{
    start_runtime();
    void *va = NULL, *vb = NULL;
    expect(cudaHostAlloc(&va, 10000, 0) == cudaSuccess && cudaHostAlloc(&vb, 10000, 0) == cudaSuccess,
           "cudaHostAlloc failed");
    char *a = va, *b = vb;
    pattern_fill(b, 10000, 9);
    int rc = cudaFreeHost(a + 100);
    expect(rc == cudaErrorInvalidValue, "a pointer inside a pinned buffer returned %d, not 1", rc);
    expect(cudaFreeHost(a) == cudaSuccess, "cudaFreeHost failed");
    rc = cudaFreeHost(a);
    expect(rc == cudaErrorInvalidValue, "a double cudaFreeHost returned %d, not 1", rc);
    expect(pattern_intact(b, 10000, 9), "the other buffer was damaged");
    expect(cudaFreeHost(b) == cudaSuccess, "cudaFreeHost failed");
}

/* cudaFreeHost's promise without its wait: a buffer freed while a copy
 * (a pretend kernel reading it) is queued is not handed out before the copy
 * ran, and the free does not wait for it. */
static void check_pinned_ordering(void)
{
    start_runtime();
    cudaStream_t s = NULL;
    expect(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream creation failed");
    fake.hold(1);
    void *a = NULL;
    expect(cudaHostAlloc(&a, MiB, 0) == cudaSuccess && a, "cudaHostAlloc failed");
    memset(a, 0xab, MiB);
    expect(fake.enqueue_check(s, a, MiB, 0xab) == 0, "enqueue failed");
    unsigned long ran = fake_calls(&fake).kernels_run;
    expect(cudaFreeHost(a) == cudaSuccess, "cudaFreeHost failed");
    expect(fake_calls(&fake).kernels_run == ran, "cudaFreeHost waited for the copy");
    int again = 0;
    void *later[200];
    for (int i = 0; i < 200; i++) {
        expect(cudaHostAlloc(&later[i], MiB, 0) == cudaSuccess && later[i], "cudaHostAlloc failed");
        again |= later[i] == a;
        memset(later[i], 0xcd, MiB);   /* the program writes its next batch */
        if (i % 2)
            expect(cudaFreeHost(later[i]) == cudaSuccess, "cudaFreeHost failed");
    }
    fake.complete_all();
    expect(fake.corrupt_bytes() == 0, "corrupt bytes: the copy read %lu bytes the program wrote after the free",
           fake.corrupt_bytes());
    (void)again;
    fake.hold(0);
    for (int i = 0; i < 200; i += 2)
        expect(cudaFreeHost(later[i]) == cudaSuccess, "cudaFreeHost failed");
    expect(cudaStreamDestroy(s) == cudaSuccess, "cudaStreamDestroy failed");
}

/* pinned:0: every pinned allocation is CUDA's. */
static void check_pinned_off(void)
{
    start_runtime();
    fake_cuda_calls_t c0 = fake_calls(&fake);
    void *p[10];
    for (int i = 0; i < 10; i++)
        expect(cudaHostAlloc(&p[i], 4096, 0) == cudaSuccess, "cudaHostAlloc failed");
    expect(fake_calls(&fake).host_allocs == c0.host_allocs + 10, "with pinned:0, cuheap served pinned memory");
    for (int i = 0; i < 10; i++)
        expect(cudaFreeHost(p[i]) == cudaSuccess, "cudaFreeHost failed");
    expect(fake_calls(&fake).host_frees == c0.host_frees + 10, "with pinned:0, frees did not reach CUDA");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "threads"))
        check_threads();
    else if (!strcmp(mode, "entry-point"))
        check_entry_point();
    else if (!strcmp(mode, "pass-through"))
        check_pass_through();
    else if (!strcmp(mode, "double-free"))
        check_double_free();
    else if (!strcmp(mode, "zero-and-alignment"))
        check_zero_and_alignment();
    else if (!strcmp(mode, "out-of-memory"))
        check_out_of_memory();
    else if (!strcmp(mode, "fork"))
        check_fork();
    else if (!strcmp(mode, "ipc"))
        check_ipc();
    else if (!strcmp(mode, "new-stream-after-reuse"))
        check_new_stream_after_reuse();
    else if (!strcmp(mode, "capture"))
        check_capture();
    else if (!strcmp(mode, "capture-fences"))
        check_capture_fences();
    else if (!strcmp(mode, "unseen-capture"))
        check_unseen_capture();
    else if (!strcmp(mode, "capture-waits-for-fence"))
        check_capture_waits_for_fence();
    else if (!strcmp(mode, "ipc-safe"))
        check_ipc_safe();
    else if (!strcmp(mode, "ipc-callers"))
        check_ipc_callers();
    else if (!strcmp(mode, "free-ordering"))
        check_free_ordering(1);
    else if (!strcmp(mode, "free-ordering-unseen-stream"))
        check_free_ordering(0);
    else if (!strcmp(mode, "stream-destroy"))
        check_stream_destroy();
    else if (!strcmp(mode, "async-reuse"))
        check_async_reuse(1);
    else if (!strcmp(mode, "async-reuse-off"))
        check_async_reuse(0);
    else if (!strcmp(mode, "meminfo"))
        check_meminfo(1, 1);
    else if (!strcmp(mode, "meminfo-right-after-free"))
        check_meminfo(1, 0);
    else if (!strcmp(mode, "meminfo-uncached"))
        check_meminfo(0, 1);
    else if (!strcmp(mode, "peer-access"))
        check_peer_access();
    else if (!strcmp(mode, "two-devices"))
        check_two_devices();
    else if (!strcmp(mode, "device-reset"))
        check_device_reset();
    else if (!strcmp(mode, "pinned"))
        check_pinned();
    else if (!strcmp(mode, "pinned-double-free"))
        check_pinned_double_free();
    else if (!strcmp(mode, "pinned-ordering"))
        check_pinned_ordering();
    else if (!strcmp(mode, "steps-planned"))
        check_steps_planned();
    else if (!strcmp(mode, "pinned-off"))
        check_pinned_off();
    else {
        fprintf(stderr, "usage: %s threads|entry-point|pass-through|double-free|zero-and-alignment|"
                        "out-of-memory|fork|ipc|ipc-safe|ipc-callers|capture|capture-fences|capture-waits-for-fence|unseen-capture|new-stream-after-reuse|free-ordering|free-ordering-unseen-stream|stream-destroy|async-reuse|async-reuse-off|"
                        "meminfo|meminfo-right-after-free|meminfo-uncached|device-reset|pinned|pinned-double-free|"
                        "pinned-ordering|pinned-off|steps-planned\n", argv[0]);
        return 2;
    }
    return finish(mode);
}
