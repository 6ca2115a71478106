// vm_bench.h - what the virtual-memory benchmarks share (vm_costs.cu,
// vm_regroup.cu): a driver call checked (the failing call and its line on
// stderr, and main returns 1), a kernel that keeps the GPU busy, a clock in
// microseconds and the median of a round's figures.
#pragma once
#include <cuda.h>
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

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
