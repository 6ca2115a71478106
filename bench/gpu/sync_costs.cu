// sync_costs.cu - what cuheap's cudaFree bookkeeping costs the CPU on a real GPU.
//
// cuheap keeps cudaFree's promise with events and stream waits (see heap.c,
// take_back_all_locked): at a batch close an event per known stream, at a
// take-back a query per event and a wait per stream. This measures each call
// as a program sees it: 32 idle non-blocking streams (what PyTorch's stream
// pool leaves) and a legacy default stream kept busy by a spinning kernel.
// Prints nanoseconds per call (median of 5 rounds of 20000 calls).
#include <cuda_runtime.h>
#include "ns_per_call.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess && e_ != cudaErrorNotReady) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }


int main()
{
    const int N = 20000, S = 32;
    cudaStream_t idle[S];
    for (int i = 0; i < S; i++) CHECK(cudaStreamCreateWithFlags(&idle[i], cudaStreamNonBlocking));
    std::vector<cudaEvent_t> ev(N);
    for (auto &e : ev) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    spin<<<1, 1>>>(4000000000LL);   // about 2 s of a busy legacy stream
    CHECK(cudaGetLastError());
    cudaEvent_t running;
    CHECK(cudaEventCreateWithFlags(&running, cudaEventDisableTiming));
    CHECK(cudaEventRecord(running, 0));
    printf("| call | ns per call |\n|---|---|\n");
    printf("| cudaEventRecord, idle stream | %.0f |\n", ns_per_call([&](int i) { cudaEventRecord(ev[i], idle[i % S]); }, N));
    printf("| cudaEventRecord, busy legacy stream | %.0f |\n", ns_per_call([&](int i) { cudaEventRecord(ev[i], 0); }, N));
    printf("| cudaEventQuery, completed | %.0f |\n", ns_per_call([&](int i) { (void)i; cudaEventQuery(ev[0]); }, N));
    printf("| cudaEventQuery, running | %.0f |\n", ns_per_call([&](int i) { (void)i; cudaEventQuery(running); }, N));
    printf("| cudaStreamQuery, idle stream | %.0f |\n", ns_per_call([&](int i) { cudaStreamQuery(idle[i % S]); }, N));
    printf("| cudaStreamQuery, busy legacy stream | %.0f |\n", ns_per_call([&](int i) { (void)i; cudaStreamQuery(0); }, N));
    printf("| cudaStreamWaitEvent, idle stream on running event | %.0f |\n",
           ns_per_call([&](int i) { cudaStreamWaitEvent(idle[i % S], running, 0); }, N / 10));
    printf("| cudaStreamWaitEvent, idle stream on completed event | %.0f |\n",
           ns_per_call([&](int i) { cudaStreamWaitEvent(idle[i % S], ev[0], 0); }, N / 10));
    CHECK(cudaDeviceSynchronize());
    return 0;
}
