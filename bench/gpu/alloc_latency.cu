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
// --cuheap-only times cuheap alone (the other columns read -), to compare
// two builds of cuheap side by side.
//
//   nvcc -O2 -arch=sm_90 -std=c++17 -Iinclude bench/gpu/alloc_latency.cu \
//        build/libcuheap.a -ldl -lpthread -o build/alloc_latency
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuheap.h"
#include "latency_loop.h"

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "alloc_latency: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

enum Allocator { CUHEAP, CUDA_MALLOC, CUDA_ASYNC, NUM_ALLOCATORS };

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

int main(int argc, char **argv)
{
    long pairs = 20000;
    bool cuheap_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = atol(argv[++i]);
        else if (!strcmp(argv[i], "--cuheap-only"))
            cuheap_only = true;
        else {
            fprintf(stderr, "usage: %s [--pairs N] [--cuheap-only]\n", argv[0]);
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
    printf("| pattern | threads | cuheap ns | cudaMalloc ns | async ns | cudaMalloc / cuheap | async / cuheap |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (const LatencyPattern &p : kLatencyPatterns) {
        for (int threads : {1, 16}) {
            double ns[NUM_ALLOCATORS] = {0};
            for (int a = 0; a < NUM_ALLOCATORS; a++) {
                if (cuheap_only && a != CUHEAP)
                    continue;
                // cudaMalloc synchronizes on every free: fewer pairs keep it short.
                long n = a == CUDA_MALLOC ? std::max(200L, pairs / 20) : pairs;
                Allocator which = (Allocator)a;
                ns[a] = latency_measure([which](size_t size, cudaStream_t s) { return do_malloc(which, size, s); },
                                        [which](void *q, cudaStream_t s) { do_free(which, q, s); }, p, threads, n,
                                        streams);
            }
            if (cuheap_only)
                printf("| %s | %d | %.0f | - | - | - | - |\n", p.name, threads, ns[CUHEAP]);
            else
                printf("| %s | %d | %.0f | %.0f | %.0f | %.1fx | %.1fx |\n", p.name, threads, ns[CUHEAP],
                       ns[CUDA_MALLOC], ns[CUDA_ASYNC], ns[CUDA_MALLOC] / ns[CUHEAP], ns[CUDA_ASYNC] / ns[CUHEAP]);
            fflush(stdout);
        }
    }
    cuheap_release_cached(0);
    return 0;
}
