// segment_addresses.cu - where the CUDA driver puts the segments cuheap asks
// for: does each new cuMemAlloc lie above or below the last, and on what
// boundary? cuheap's best fit once broke ties among free extents of one size
// by address, so a replay on the simulated GPU (rising addresses) and a run
// on a real one parted; the simulator can now hand out falling addresses too
// (cuh_sim_params_t.top_down) and the heap ranks ties by creation instead.
// Prints one line per allocation and a summary line. On an H200 (driver
// 580.159.04, 2026-12-02) allocations from 64 MiB up each went below the last
// and smaller ones above; all on 2 MiB boundaries.
#include <cuda.h>
#include <cstdio>
#include <vector>

#define CHECK_CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
    fprintf(stderr, "%s: error %d\n", #x, (int)r_); return 1; } } while (0)

int main()
{
    CHECK_CU(cuInit(0));
    CUdevice dev;
    CHECK_CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK_CU(cuCtxSetCurrent(ctx));
    const size_t MiB = (size_t)1 << 20;
    const size_t sizes[] = {2 * MiB, 64 * MiB, 20 * MiB, 1024 * MiB, 2 * MiB, 300 * MiB, 2402 * MiB, 4 * MiB, 96 * MiB, 2 * MiB};
    std::vector<CUdeviceptr> got;
    int rising = 0, falling = 0, aligned = 0;
    for (size_t size : sizes) {
        CUdeviceptr p = 0;
        CHECK_CU(cuMemAlloc(&p, size));
        const char *where = got.empty() ? "first" : p > got.back() ? "above the last" : "below the last";
        if (!got.empty())
            (p > got.back() ? rising : falling)++;
        aligned += p % (2 * MiB) == 0;
        printf("cuMemAlloc(%5zu MiB) = 0x%llx, %s, %s a 2 MiB boundary\n", size / MiB, (unsigned long long)p, where,
               p % (2 * MiB) == 0 ? "on" : "off");
        got.push_back(p);
    }
    for (CUdeviceptr p : got)
        CHECK_CU(cuMemFree(p));
    printf("segment addresses: %d of %zu above the last, %d below; %d of %zu on a 2 MiB boundary\n", rising,
           got.size() - 1, falling, aligned, got.size());
    return 0;
}
