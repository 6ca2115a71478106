// free_sync.cu - does giving device memory back wait for the GPU?
//
// Before a growth to a new peak cuheap gives back the segments that hold no
// block, and if the GPU has not yet passed the frees that left them idle, it
// waits for those frees first (heap.c, release_idle_segments_locked). That
// wait is meant to cost nothing extra because returning a segment to the
// driver waits for the device anyway. This measures it: how long cuMemFree
// (what cuheap calls) and cudaFree take to return while a kernel that touches
// none of the memory spins for about 200 ms on a non-blocking stream, against
// the same calls on an idle GPU. Prints milliseconds (median of 5 rounds).
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
#define CHECK_CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s: error %d\n", #x, (int)r_); return 1; } } while (0)

__global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }

static double ms_since(std::chrono::steady_clock::time_point t0)
{
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main()
{
    CHECK(cudaFree(0));   // the primary context, shared with the driver API below
    cudaStream_t side;
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const long long cycles = (long long)clock_khz * 200;   // about 200 ms
    const size_t size = 64 << 20;
    std::vector<double> cu_busy, cu_idle, rt_busy, rt_idle, kernel_left;
    for (int round = 0; round < 5; round++) {
        for (int busy = 0; busy < 2; busy++) {
            CUdeviceptr d = 0;
            void *p = nullptr;
            CHECK_CU(cuMemAlloc(&d, size));
            CHECK(cudaMalloc(&p, size));
            CHECK(cudaDeviceSynchronize());
            auto started = std::chrono::steady_clock::now();
            if (busy)
                spin<<<1, 1, 0, side>>>(cycles);
            auto t0 = std::chrono::steady_clock::now();
            CHECK_CU(cuMemFree(d));
            (busy ? cu_busy : cu_idle).push_back(ms_since(t0));
            t0 = std::chrono::steady_clock::now();
            CHECK(cudaFree(p));
            (busy ? rt_busy : rt_idle).push_back(ms_since(t0));
            if (busy) {
                // How much of the kernel was left when the frees returned.
                double before = ms_since(started);
                CHECK(cudaStreamSynchronize(side));
                kernel_left.push_back(ms_since(started) - before);
            }
        }
    }
    printf("| call | GPU idle (ms) | a 200 ms kernel running on another stream (ms) |\n|---|---|---|\n");
    printf("| cuMemFree of 64 MiB | %.3f | %.3f |\n", median(cu_idle), median(cu_busy));
    printf("| cudaFree of 64 MiB (right after) | %.3f | %.3f |\n", median(rt_idle), median(rt_busy));
    printf("kernel time left when both had returned: %.3f ms (median)\n", median(kernel_left));
    printf("%s\n", median(cu_busy) > 100.0 ? "cuMemFree waited for the running kernel"
                                            : "cuMemFree did not wait for the running kernel");
    return 0;
}
