// alloc_latency_torch.cpp - PyTorch's caching allocator beside cuheap, the
// same loop as bench/gpu/alloc_latency.cu: ns per malloc+free pair, by size
// and for a mixed pattern, 1 and 16 host threads (each with its own
// non-blocking stream), in one process (part of `make gpu-bench`).
//
//   torch    c10::cuda::CUDACachingAllocator::raw_alloc_with_stream /
//            raw_delete: PyTorch's allocator as every tensor reaches it,
//            without Python or tensor overhead
//   cuheap   cuheap_malloc / cuheap_free on the same stream (libcuheap.so,
//            loaded with dlopen: the path in argv[1])
// Warm: both allocators have seen the pattern once before the timed rounds;
// the figure is each thread's wall time over its pairs, median of 3 rounds.
// Built by scripts/gpu-bench.sh against the installed PyTorch's headers and
// libraries (libc10, libc10_cuda) with nvcc's CUDA headers.
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "alloc_latency_torch: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

typedef int (*cuheap_malloc_fn)(void **, size_t, int, cudaStream_t);
typedef int (*cuheap_free_fn)(void *, int, cudaStream_t);
static cuheap_malloc_fn cuheap_malloc;
static cuheap_free_fn cuheap_free;

enum Allocator { CUHEAP, TORCH };

struct Pattern {
    const char *name;
    size_t fixed;   // 0: mixed
};

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

// As alloc_latency.cu: 80% 512 B-64 KiB, 20% 1-64 MiB.
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
    if (a == TORCH)
        return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(size, s);
    if (cuheap_malloc(&p, size, 0, s) != 0) {
        fprintf(stderr, "alloc_latency_torch: cuheap_malloc(%zu) failed\n", size);
        exit(1);
    }
    return p;
}

static void do_free(Allocator a, void *p, cudaStream_t s)
{
    if (a == TORCH)
        c10::cuda::CUDACachingAllocator::raw_delete(p);
    else if (cuheap_free(p, 0, s) != 0) {
        fprintf(stderr, "alloc_latency_torch: cuheap_free failed\n");
        exit(1);
    }
}

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
    if (argc < 2) {
        fprintf(stderr, "usage: %s /path/to/libcuheap.so [pairs]\n", argv[0]);
        return 2;
    }
    long pairs = argc > 2 ? atol(argv[2]) : 20000;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "alloc_latency_torch: %s\n", dlerror());
        return 1;
    }
    void *m = dlsym(lib, "cuheap_malloc"), *f = dlsym(lib, "cuheap_free");
    memcpy(&cuheap_malloc, &m, sizeof m);
    memcpy(&cuheap_free, &f, sizeof f);
    if (!cuheap_malloc || !cuheap_free) {
        fprintf(stderr, "alloc_latency_torch: %s has no cuheap_malloc/cuheap_free\n", argv[1]);
        return 1;
    }
    CHECK(cudaSetDevice(0));
    c10::cuda::CUDACachingAllocator::init(1);
    std::vector<cudaStream_t> streams(16);
    for (auto &s : streams)
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const Pattern patterns[] = {{"512 B", 512},          {"4 KiB", 4096},           {"64 KiB", 65536},
                                {"1 MiB", (size_t)1 << 20}, {"16 MiB", (size_t)16 << 20}, {"256 MiB", (size_t)256 << 20},
                                {"mixed", 0}};
    printf("| pattern | threads | cuheap ns | PyTorch caching allocator ns | PyTorch / cuheap |\n");
    printf("|---|---|---|---|---|\n");
    for (const Pattern &p : patterns)
        for (int threads : {1, 16}) {
            double c = measure(CUHEAP, p, threads, pairs, streams);
            double t = measure(TORCH, p, threads, pairs, streams);
            printf("| %s | %d | %.0f | %.0f | %.2fx |\n", p.name, threads, c, t, t / c);
            fflush(stdout);
        }
    return 0;
}
