// vm_bench.h - what the virtual-memory benchmarks share (vm_costs.cu,
// vm_regroup.cu, vm_unmap_thread.cu): the device's page setup, a driver call checked (the failing call and its line on
// stderr, and main returns 1), a kernel that keeps the GPU busy, a clock in
// microseconds and the median of a round's figures.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#define CHECK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = "?"; \
    cuGetErrorString(r_, &s_); fprintf(stderr, "line %d: %s: %s\n", __LINE__, #x, s_); return 1; } } while (0)

__global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }

static double now_us()
{
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The primary context made current, and what every page of this device's
// memory is made with: its properties, read-write access from the device, and
// the page (the allocation granularity). CUDA_SUCCESS or the failing call's code.
struct vm_device {
    CUdevice dev;
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    size_t page;
};

static CUresult vm_device_open(vm_device *d)
{
    cudaFree(0);   // the primary context
    *d = vm_device{};
    CUresult rc = cuCtxGetDevice(&d->dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    d->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    d->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d->prop.location.id = (int)d->dev;
    d->access.location = d->prop.location;
    d->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cuMemGetAllocationGranularity(&d->page, &d->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
