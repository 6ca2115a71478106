// pinned_costs.cu - what pinned host memory costs on a real GPU: cuheap's
// pinned cache against CUDA's own cudaHostAlloc/cudaFreeHost, side by side
// in one process (part of `make gpu-bench`).
//
//  1. allocation: for 4 KiB to 64 MiB, the time of one alloc+free pair
//       cuda    cudaHostAlloc + cudaFreeHost (the free synchronizes)
//       cuheap  cuheap_host_alloc + cuheap_host_free (libcuheap.a: the same
//               cache the LD_PRELOAD hooks serve cudaHostAlloc from)
//     each the median of 7 rounds of a few pairs, rounds interleaved; the
//     ratio is cuda / cuheap. No kernels run.
//  2. bandwidth: cudaMemcpyAsync host-to-device of 1, 16 and 64 MiB from a
//     buffer of each, timed with events, median of 15 interleaved copies;
//     the ratio is cuheap / cuda (1.00: the same speed).
//
//   nvcc -O2 -arch=sm_90 -std=c++17 -Iinclude bench/gpu/pinned_costs.cu \
//        build/libcuheap.a -ldl -lpthread -o build/pinned_costs
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuheap.h"

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "pinned_costs: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CHECK_HEAP(x) do { cuheap_status_t s_ = (x); if (s_ != CUHEAP_OK) { \
    fprintf(stderr, "pinned_costs: %s: %s\n", #x, cuheap_last_error()); exit(1); } } while (0)

static double now_us()
{
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Microseconds per alloc+free pair, `pairs` pairs.
static double cuda_pairs(size_t size, int pairs)
{
    double t0 = now_us();
    for (int i = 0; i < pairs; i++) {
        void *p;
        CHECK(cudaHostAlloc(&p, size, cudaHostAllocDefault));
        *(volatile char *)p = 1;
        CHECK(cudaFreeHost(p));
    }
    return (now_us() - t0) / pairs;
}

static double cuheap_pairs(size_t size, int pairs)
{
    double t0 = now_us();
    for (int i = 0; i < pairs; i++) {
        void *p;
        CHECK_HEAP(cuheap_host_alloc(&p, size, 0));
        *(volatile char *)p = 1;
        CHECK_HEAP(cuheap_host_free(p));
    }
    return (now_us() - t0) / pairs;
}

static double copy_gbps(void *dst, const void *src, size_t n, cudaStream_t s, cudaEvent_t a, cudaEvent_t b)
{
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return n / (ms * 1e-3) / 1e9;
}

int main()
{
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(nullptr));
    const size_t sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
    printf("| size | cudaHostAlloc+cudaFreeHost (us) | cuheap (us) | cuda / cuheap |\n|---|---|---|---|\n");
    for (size_t size : sizes) {
        int pairs = size <= (1 << 20) ? 20 : 3;
        cuheap_pairs(size, 2);   // warm: the cache has taken its chunk
        cuda_pairs(size, 1);
        std::vector<double> cuda, heap;
        for (int round = 0; round < 7; round++) {
            cuda.push_back(cuda_pairs(size, pairs));
            heap.push_back(cuheap_pairs(size, pairs * 50));
        }
        double c = median(cuda), h = median(heap);
        char label[32];
        if (size >= (1 << 20))
            snprintf(label, sizeof label, "%zu MiB", size >> 20);
        else
            snprintf(label, sizeof label, "%zu KiB", size >> 10);
        printf("| %s | %.1f | %.3f | %.0fx |\n", label, c, h, c / h);
    }

    printf("\n| copy | from cudaHostAlloc (GB/s) | from cuheap (GB/s) | cuheap / cuda |\n|---|---|---|---|\n");
    const size_t big = 64 << 20;
    void *native, *cached, *dev;
    CHECK(cudaHostAlloc(&native, big, 0));
    CHECK_HEAP(cuheap_host_alloc(&cached, big, 0));
    CHECK(cudaMalloc(&dev, big));
    memset(native, 1, big);
    memset(cached, 2, big);
    cudaStream_t s;
    cudaEvent_t a, b;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    const size_t copies[] = {1 << 20, 16 << 20, 64 << 20};
    for (size_t n : copies) {
        copy_gbps(dev, native, n, s, a, b);
        copy_gbps(dev, cached, n, s, a, b);
        std::vector<double> from_cuda, from_cuheap;
        for (int i = 0; i < 15; i++) {
            from_cuda.push_back(copy_gbps(dev, native, n, s, a, b));
            from_cuheap.push_back(copy_gbps(dev, cached, n, s, a, b));
        }
        double c = median(from_cuda), h = median(from_cuheap);
        printf("| %zu MiB | %.1f | %.1f | %.3f |\n", n >> 20, c, h, h / c);
    }
    cuheap_host_stats_t st;
    CHECK_HEAP(cuheap_get_host_stats(&st));
    printf("\ncuheap's cache: %llu allocations from %llu chunks, %.0f MiB page-locked\n",
           (unsigned long long)st.num_allocs, (unsigned long long)st.num_chunk_allocs, st.reserved.current / 1048576.0);
    CHECK_HEAP(cuheap_host_free(cached));
    CHECK(cudaFreeHost(native));
    CHECK(cudaFree(dev));
    return 0;
}
