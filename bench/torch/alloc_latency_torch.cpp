// alloc_latency_torch.cpp - PyTorch's caching allocator beside cuheap, the
// loop of bench/gpu/alloc_latency.cu (bench/gpu/latency_loop.h): ns per malloc+free pair, by size
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

#include "../gpu/latency_loop.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "alloc_latency_torch: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

typedef int (*cuheap_malloc_fn)(void **, size_t, int, cudaStream_t);
typedef int (*cuheap_free_fn)(void *, int, cudaStream_t);
static cuheap_malloc_fn cuheap_malloc;
static cuheap_free_fn cuheap_free;

enum Allocator { CUHEAP, TORCH };

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
    printf("| pattern | threads | cuheap ns | PyTorch caching allocator ns | PyTorch / cuheap |\n");
    printf("|---|---|---|---|---|\n");
    auto measure = [&](Allocator a, const LatencyPattern &p, int threads) {
        return latency_measure([a](size_t size, cudaStream_t s) { return do_malloc(a, size, s); },
                               [a](void *q, cudaStream_t s) { do_free(a, q, s); }, p, threads, pairs, streams);
    };
    for (const LatencyPattern &p : kLatencyPatterns)
        for (int threads : {1, 16}) {
            double c = measure(CUHEAP, p, threads);
            double t = measure(TORCH, p, threads);
            printf("| %s | %d | %.0f | %.0f | %.2fx |\n", p.name, threads, c, t, t / c);
            fflush(stdout);
        }
    return 0;
}
