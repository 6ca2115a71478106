// alloc_latency.cu - what one allocation costs on a real GPU: cuheap against
// cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync, side by side in one
// run (what `make gpu-bench` prints first).
//
// For each size (512 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB) and for a
// mixed pattern (80% 512 B-64 KiB, 20% 1-64 MiB, up to 64 blocks live per
// thread), with 1 and with 16 host threads (each with its own non-blocking
// stream), it times malloc+free pairs through:
//   cuheap       cuheap_malloc / cuheap_free on the thread's stream (libcuheap.a)
//   cudaMalloc   cudaMalloc / cudaFree (each free synchronizes the device)
//   async        cudaMallocAsync / cudaFreeAsync on the thread's stream, default pool
//                with its release threshold raised so it caches like cuheap does
// Warm: every allocator has seen the pattern once before the timed loop. The
// figure is each thread's wall time over its pairs (median of 3 rounds), and
// the last columns are the ratios cudaMalloc/cuheap and async/cuheap. No
// kernels run: this is the allocator's own cost as the CPU sees it.
//
//   nvcc -O2 -arch=sm_90 -std=c++17 -Iinclude bench/gpu/alloc_latency.cu \
//        build/libcuheap.a -ldl -lpthread -o build/alloc_latency
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cuheap.h"

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "alloc_latency: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

enum Allocator { CUHEAP, CUDA_MALLOC, CUDA_ASYNC, NUM_ALLOCATORS };

struct Pattern {
    const char *name;
    size_t fixed;   // 0: mixed
};

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static size_t pick_size(const Pattern &p, uint64_t *rng)
{
    if (p.fixed)
        return p.fixed;
    uint64_t r = next_random(rng);
    if (r % 10 < 8)
        return 512 + (size_t)(r >> 8) % (64 * 1024 - 512);
    return ((size_t)1 << 20) + (size_t)(r >> 8) % ((size_t)63 << 20);
}

static void *do_malloc(Allocator a, size_t size, cudaStream_t s)
{
    void *p = nullptr;
    switch (a) {
    case CUHEAP:
        if (cuheap_malloc(&p, size, 0, (cuheap_stream_t)s) != CUHEAP_OK) {
            fprintf(stderr, "alloc_latency: cuheap_malloc(%zu): %s\n", size, cuheap_last_error());
            exit(1);
        }
        break;
    case CUDA_MALLOC: CHECK(cudaMalloc(&p, size)); break;
    case CUDA_ASYNC: CHECK(cudaMallocAsync(&p, size, s)); break;
    default: break;
    }
    return p;
}

static void do_free(Allocator a, void *p, cudaStream_t s)
{
    switch (a) {
    case CUHEAP:
        if (cuheap_free(p, 0, (cuheap_stream_t)s) != CUHEAP_OK) {
            fprintf(stderr, "alloc_latency: cuheap_free: %s\n", cuheap_last_error());
            exit(1);
        }
        break;
    case CUDA_MALLOC: CHECK(cudaFree(p)); break;
    case CUDA_ASYNC: CHECK(cudaFreeAsync(p, s)); break;
    default: break;
    }
}

// One thread's loop: `pairs` malloc+free pairs, keeping up to 64 blocks live
// for the mixed pattern (a ring: the oldest goes first), one at a time for a
// fixed size. Returns ns per pair.
static double run_thread(Allocator a, const Pattern &p, long pairs, cudaStream_t s, uint64_t seed)
{
    const int live = p.fixed ? 1 : 64;
    std::vector<void *> ring(live, nullptr);
    uint64_t rng = seed | 1;
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < pairs; i++) {
        void *&slot = ring[i % live];
        if (slot)
            do_free(a, slot, s);
        slot = do_malloc(a, pick_size(p, &rng), s);
    }
    auto t1 = std::chrono::steady_clock::now();
    for (void *q : ring)
        if (q)
            do_free(a, q, s);
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / (double)pairs;
}

// Median over 3 rounds of the mean per-thread ns per pair.
static double measure(Allocator a, const Pattern &p, int threads, long pairs, std::vector<cudaStream_t> &streams)
{
    std::vector<double> rounds;
    for (int round = 0; round < 4; round++) {   // round 0 warms up
        std::vector<double> per(threads);
        std::vector<std::thread> th;
        for (int t = 0; t < threads; t++)
            th.emplace_back([&, t] {
                CHECK(cudaSetDevice(0));
                per[t] = run_thread(a, p, pairs, streams[t], 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1));
            });
        for (auto &x : th)
            x.join();
        CHECK(cudaDeviceSynchronize());
        double sum = 0;
        for (double v : per)
            sum += v;
        if (round > 0)
            rounds.push_back(sum / threads);
    }
    std::sort(rounds.begin(), rounds.end());
    return rounds[1];
}

int main(int argc, char **argv)
{
    long pairs = 20000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--pairs N]\n", argv[0]);
            return 2;
        }
    }
    CHECK(cudaSetDevice(0));
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t threshold = UINT64_MAX;   // keep freed memory, as a caching allocator does
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    std::vector<cudaStream_t> streams(16);
    for (auto &s : streams)
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const Pattern patterns[] = {{"512 B", 512},          {"4 KiB", 4096},           {"64 KiB", 65536},
                                {"1 MiB", (size_t)1 << 20}, {"16 MiB", (size_t)16 << 20}, {"256 MiB", (size_t)256 << 20},
                                {"mixed", 0}};
    printf("| pattern | threads | cuheap ns | cudaMalloc ns | async ns | cudaMalloc / cuheap | async / cuheap |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (const Pattern &p : patterns) {
        for (int threads : {1, 16}) {
            double ns[NUM_ALLOCATORS];
            for (int a = 0; a < NUM_ALLOCATORS; a++) {
                // cudaMalloc synchronizes on every free: fewer pairs keep it short.
                long n = a == CUDA_MALLOC ? std::max(200L, pairs / 20) : pairs;
                ns[a] = measure((Allocator)a, p, threads, n, streams);
            }
            printf("| %s | %d | %.0f | %.0f | %.0f | %.1fx | %.1fx |\n", p.name, threads, ns[CUHEAP], ns[CUDA_MALLOC],
                   ns[CUDA_ASYNC], ns[CUDA_MALLOC] / ns[CUHEAP], ns[CUDA_ASYNC] / ns[CUHEAP]);
            fflush(stdout);
        }
    }
    cuheap_release_cached(0);
    return 0;
}
