// ns_per_call.h - the timing loop the GPU call-cost benchmarks share
// (sync_costs.cu, ctx_fence.cu): nanoseconds per call of f(i), i from 0 to
// n - 1, the median of 5 rounds (the machines are noisy).
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

template <class F> static double ns_per_call(F f, int n)
{
    std::vector<double> r;
    for (int round = 0; round < 5; round++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; i++) f(i);
        auto t1 = std::chrono::steady_clock::now();
        r.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
    }
    std::sort(r.begin(), r.end());
    return r[2];
}
