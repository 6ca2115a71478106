// latency_loop.h - the timed loop both allocation-latency benchmarks share
// (bench/gpu/alloc_latency.cu and bench/torch/alloc_latency_torch.cpp), so
// that their tables measure the same thing.
//
// A pattern is a fixed size, or mixed: 80% 512 B-64 KiB and 20% 1-64 MiB,
// up to 64 blocks live per thread (a ring: the oldest goes first). Each
// thread runs `pairs` malloc+free pairs on its own stream; a measurement is
// the mean of the threads' ns per pair, median of 3 rounds after a warm-up
// round. `alloc(size, stream)` and `release(ptr, stream)` are the allocator
// under test; they exit the program on failure.
#ifndef CUHEAP_BENCH_LATENCY_LOOP_H
#define CUHEAP_BENCH_LATENCY_LOOP_H

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

struct LatencyPattern {
    const char *name;
    size_t fixed;   // 0: mixed
};

static const LatencyPattern kLatencyPatterns[] = {
    {"512 B", 512},           {"4 KiB", 4096},           {"64 KiB", 65536}, {"1 MiB", (size_t)1 << 20},
    {"16 MiB", (size_t)16 << 20}, {"256 MiB", (size_t)256 << 20}, {"mixed", 0}};

static void latency_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "latency benchmark: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

static uint64_t latency_next_random(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static size_t latency_pick_size(const LatencyPattern &p, uint64_t *rng)
{
    if (p.fixed)
        return p.fixed;
    uint64_t r = latency_next_random(rng);
    if (r % 10 < 8)
        return 512 + (size_t)(r >> 8) % (64 * 1024 - 512);
    return ((size_t)1 << 20) + (size_t)(r >> 8) % ((size_t)63 << 20);
}

// One thread's loop; ns per pair.
template <class Alloc, class Release>
static double latency_run_thread(Alloc alloc, Release release, const LatencyPattern &p, long pairs, cudaStream_t s,
                                 uint64_t seed)
{
    const int live = p.fixed ? 1 : 64;
    std::vector<void *> ring(live, nullptr);
    uint64_t rng = seed | 1;
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < pairs; i++) {
        void *&slot = ring[i % live];
        if (slot)
            release(slot, s);
        slot = alloc(latency_pick_size(p, &rng), s);
    }
    auto t1 = std::chrono::steady_clock::now();
    for (void *q : ring)
        if (q)
            release(q, s);
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / (double)pairs;
}

// Median over 3 rounds of the mean per-thread ns per pair, `threads`
// threads each on its own stream of `streams`.
template <class Alloc, class Release>
static double latency_measure(Alloc alloc, Release release, const LatencyPattern &p, int threads, long pairs,
                              std::vector<cudaStream_t> &streams)
{
    std::vector<double> rounds;
    for (int round = 0; round < 4; round++) {   // round 0 warms up
        std::vector<double> per(threads);
        std::vector<std::thread> th;
        for (int t = 0; t < threads; t++)
            th.emplace_back([&, t] {
                latency_check(cudaSetDevice(0), "cudaSetDevice(0)");
                per[t] = latency_run_thread(alloc, release, p, pairs, streams[t],
                                            0x9e3779b97f4a7c15ull * (uint64_t)(t + 1));
            });
        for (auto &x : th)
            x.join();
        latency_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        double sum = 0;
        for (double v : per)
            sum += v;
        if (round > 0)
            rounds.push_back(sum / threads);
    }
    std::sort(rounds.begin(), rounds.end());
    return rounds[1];
}

#endif
