// ctx_fence.cu - one fence for the whole device instead of one per stream.
//
// cudaFree promises that a freed block is not touched again by work issued
// before the free, on any stream. cuheap keeps that promise without the CPU
// waiting: an event on every stream it knows, then a GPU-side wait by every
// stream (heap.c, take_back_all_locked), which costs calls per stream, so it
// is rationed, and rationing costs memory. The driver (CUDA 12.5 and later)
// also has cuCtxRecordEvent, an event that covers all the work of a context
// on every stream, and cuCtxWaitEvent, which makes all later work of the
// context wait for one. This checks what they do and measures what they cost
// against the per-stream calls, with 32 idle non-blocking streams (PyTorch's
// stream pool) and with 160. The last line says whether the calls do what
// cuheap relies on (exit status 1 if not).
#include <cuda.h>
#include <cuda_runtime.h>
#include "ns_per_call.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
#define CHECK_CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s: error %d\n", #x, (int)r_); return 1; } } while (0)

__global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }
__global__ void nothing() {}


static const char *state(CUevent e)
{
    CUresult r = cuEventQuery(e);
    return r == CUDA_SUCCESS ? "complete" : r == CUDA_ERROR_NOT_READY ? "running" : "error";
}

int main()
{
    CHECK(cudaFree(0));
    CUcontext ctx;
    CHECK_CU(cuCtxGetCurrent(&ctx));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const long long ms = clock_khz;   // cycles per millisecond

    // What the calls do.
    cudaStream_t a, b;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CUevent all, on_b, on_new, on_legacy, on_b_before;
    for (CUevent *e : {&all, &on_b, &on_new, &on_legacy, &on_b_before})
        CHECK_CU(cuEventCreate(e, CU_EVENT_DISABLE_TIMING));
    spin<<<1, 1, 0, a>>>(300 * ms);
    CHECK(cudaGetLastError());
    CUresult r = cuCtxRecordEvent(ctx, all);
    if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_FOUND) {
        printf("device-wide fences: not in this driver (error %d): cuheap fences stream by stream\n", (int)r);
        return 0;
    }
    CHECK_CU(r);
    printf("semantics: a 300 ms kernel on non-blocking stream A\n");
    const char *recorded = state(all);
    printf("  cuCtxRecordEvent, queried at once: %s (expected running)\n", recorded);
    CHECK_CU(cuEventRecord(on_b_before, (CUstream)b));
    const char *before = state(on_b_before);
    printf("  an event on idle stream B before any wait: %s (expected complete)\n", before);
    CHECK_CU(cuCtxWaitEvent(ctx, all));
    CHECK_CU(cuEventRecord(on_b, (CUstream)b));
    CHECK_CU(cuEventRecord(on_legacy, (CUstream)0));
    cudaStream_t c;
    CHECK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
    CHECK_CU(cuEventRecord(on_new, (CUstream)c));
    const char *after_b = state(on_b), *after_legacy = state(on_legacy), *after_new = state(on_new);
    printf("  after cuCtxWaitEvent (expected running): an event on B: %s; on the legacy stream: %s; on a stream "
           "created after the wait: %s\n", after_b, after_legacy, after_new);
    CHECK(cudaDeviceSynchronize());
    printf("  after cudaDeviceSynchronize (expected complete): %s, %s, %s, %s\n", state(all), state(on_b),
           state(on_legacy), state(on_new));
    const char *running = "running", *complete = "complete";
    const bool as_relied_on = !strcmp(recorded, running) && !strcmp(before, complete) && !strcmp(after_b, running) &&
                              !strcmp(after_legacy, running) && !strcmp(after_new, running) &&
                              !strcmp(state(all), complete) && !strcmp(state(on_new), complete);

    // What they cost.
    for (int num_streams : {32, 160}) {
        std::vector<cudaStream_t> idle(num_streams);
        for (auto &s : idle) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        const int N = 2000;
        std::vector<CUevent> ev(num_streams + 1);
        for (auto &e : ev) CHECK_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
        CUevent running;
        CHECK_CU(cuEventCreate(&running, CU_EVENT_DISABLE_TIMING));
        spin<<<1, 1>>>(4000 * ms);   // a busy legacy stream for the rest of the run
        CHECK(cudaGetLastError());
        CHECK_CU(cuEventRecord(running, 0));
        printf("\n%d idle non-blocking streams and a busy legacy stream: ns per call (median of 5 rounds)\n", num_streams);
        printf("| call | ns |\n|---|---|\n");
        printf("| cuCtxRecordEvent | %.0f |\n", ns_per_call([&](int) { cuCtxRecordEvent(ctx, all); }, N));
        printf("| cuEventQuery on it (running) | %.0f |\n", ns_per_call([&](int) { cuEventQuery(all); }, N));
        printf("| cuCtxWaitEvent on a running event | %.0f |\n", ns_per_call([&](int) { cuCtxWaitEvent(ctx, running); }, N / 10));
        CHECK_CU(cuEventRecord(ev[0], idle[0]));
        CHECK_CU(cuEventSynchronize(ev[0]));
        printf("| cuCtxWaitEvent on a completed event | %.0f |\n", ns_per_call([&](int) { cuCtxWaitEvent(ctx, ev[0]); }, N / 10));
        // A take-back each way: events on every stream, queries, and waits
        // by every stream on the legacy stream's running one; against one
        // context event, a query and a context wait.
        const double per_stream = ns_per_call([&](int) {
            for (int s = 0; s < num_streams; s++) cuEventRecord(ev[s], idle[s]);
            cuEventRecord(ev[num_streams], 0);
            for (auto &e : ev) cuEventQuery(e);
            for (int s = 0; s < num_streams; s++) cuStreamWaitEvent(idle[s], ev[num_streams], 0);
        }, 50);
        const double whole = ns_per_call([&](int) {
            cuCtxRecordEvent(ctx, all);
            cuEventQuery(all);
            cuCtxWaitEvent(ctx, all);
        }, 50);
        printf("| a take-back, per stream (%d records, %d queries, %d waits) | %.0f |\n", num_streams + 1,
               num_streams + 1, num_streams, per_stream);
        printf("| a take-back, context-wide (a record, a query, a wait) | %.0f |\n", whole);
        CHECK(cudaDeviceSynchronize());
        // Does a context wait slow the launches after it?
        cudaStream_t s0 = idle[1];
        const double plain = ns_per_call([&](int) { nothing<<<1, 1, 0, s0>>>(); }, N);
        CHECK(cudaDeviceSynchronize());
        const double after_wait = ns_per_call([&](int) { cuCtxWaitEvent(ctx, ev[0]); nothing<<<1, 1, 0, s0>>>(); }, N);
        CHECK(cudaDeviceSynchronize());
        const double wait_only = ns_per_call([&](int) { cuCtxWaitEvent(ctx, ev[0]); }, N);
        CHECK(cudaDeviceSynchronize());
        printf("| a kernel launch, idle GPU | %.0f |\n", plain);
        printf("| cuCtxWaitEvent (completed event) then a launch | %.0f |\n", after_wait);
        printf("| cuCtxWaitEvent (completed event) alone, idle GPU | %.0f |\n", wait_only);
    }
    printf("device-wide fences: %s\n", as_relied_on ? "cover every stream, those created after the wait too"
                                                   : "NOT as cuheap relies on them");
    return as_relied_on ? 0 : 1;
}
