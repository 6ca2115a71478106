// vm_regroup.cu - whether free pages scattered over the reservation can be
// gathered behind a block for less than moving them one by one.
//
// Under vmm:1 each page is a physical allocation of its own (the driver maps
// only whole allocations: vm_offset_probe.cu), and a page moved costs an
// unmap, a map and an access grant, about 55 us on an H200, most of it the
// grant, which costs per allocation in the range (vm_costs.cu). Issue 42's
// bound on memory asks for more moves than that price allows. This asks the
// driver what the other way costs: unmap the k scattered pages, release them,
// create one allocation of k pages and map and grant it once ("regroup"),
// beside moving the k pages one by one; what cuMemCreate and cuMemRelease
// cost alone; and whether one cuMemUnmap may span several adjacent mappings
// (then a run of old mappings would go in one call). Prints microseconds per
// page (median of ROUNDS), with the GPU idle and with a kernel running on
// another stream.
#include "vm_bench.h"

#include <cuda_runtime.h>

static CUmemAllocationProp prop;
static CUmemAccessDesc access;
static size_t page;

// k pages, each its own allocation, mapped and granted at every other page
// of `from` (scattered, as free pages lie between live blocks).
static int scatter(CUdeviceptr from, std::vector<CUmemGenericAllocationHandle> &h, size_t k)
{
    h.resize(k);
    for (size_t i = 0; i < k; i++) {
        CHECK(cuMemCreate(&h[i], page, &prop, 0));
        CHECK(cuMemMap(from + 2 * i * page, page, 0, h[i], 0));
        CHECK(cuMemSetAccess(from + 2 * i * page, page, &access, 1));
    }
    return 0;
}

int main()
{
    const int ROUNDS = 5;
    vm_device d;
    CHECK(vm_device_open(&d));
    prop = d.prop;
    access = d.access;
    page = d.page;
    const size_t KMAX = 256;
    CUdeviceptr from, to;
    CHECK(cuMemAddressReserve(&from, 2 * KMAX * page, 0, 0, 0));
    CHECK(cuMemAddressReserve(&to, KMAX * page, 0, 0, 0));
    cudaStream_t busy;
    cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking);
    printf("page %zu KiB, median of %d rounds, us per page\n\n", page >> 10, ROUNDS);
    printf("| pages | GPU | moved one by one | regrouped | of which unmap | release | create | map + grant |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (size_t k = 1; k <= KMAX; k *= 4) {
        for (int busy_gpu = 0; busy_gpu < 2; busy_gpu++) {
            std::vector<double> moved, regrouped, t_unmap, t_release, t_create, t_map;
            for (int round = 0; round < ROUNDS; round++) {
                std::vector<CUmemGenericAllocationHandle> h;
                if (scatter(from, h, k)) return 1;
                cudaDeviceSynchronize();
                if (busy_gpu) spin<<<1, 1, 0, busy>>>(4000000000LL);   // about 2 s
                // one by one: unmap at the old place, map and grant at the new
                double t0 = now_us();
                for (size_t i = 0; i < k; i++) {
                    CHECK(cuMemUnmap(from + 2 * i * page, page));
                    CHECK(cuMemMap(to + i * page, page, 0, h[i], 0));
                    CHECK(cuMemSetAccess(to + i * page, page, &access, 1));
                }
                moved.push_back((now_us() - t0) / (double)k);
                for (size_t i = 0; i < k; i++) {   // back where they were (not timed)
                    CHECK(cuMemUnmap(to + i * page, page));
                    CHECK(cuMemMap(from + 2 * i * page, page, 0, h[i], 0));
                    CHECK(cuMemSetAccess(from + 2 * i * page, page, &access, 1));
                }
                // regrouped: unmap and release the k pages, one allocation of k pages instead
                double r0 = now_us();
                for (size_t i = 0; i < k; i++) CHECK(cuMemUnmap(from + 2 * i * page, page));
                double r1 = now_us();
                for (size_t i = 0; i < k; i++) CHECK(cuMemRelease(h[i]));
                double r2 = now_us();
                CUmemGenericAllocationHandle one;
                CHECK(cuMemCreate(&one, k * page, &prop, 0));
                double r3 = now_us();
                CHECK(cuMemMap(to, k * page, 0, one, 0));
                CHECK(cuMemSetAccess(to, k * page, &access, 1));
                double r4 = now_us();
                regrouped.push_back((r4 - r0) / (double)k);
                t_unmap.push_back((r1 - r0) / (double)k);
                t_release.push_back((r2 - r1) / (double)k);
                t_create.push_back((r3 - r2) / (double)k);
                t_map.push_back((r4 - r3) / (double)k);
                CHECK(cuMemUnmap(to, k * page));
                CHECK(cuMemRelease(one));
                if (busy_gpu) cudaStreamSynchronize(busy);
            }
            printf("| %zu | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", k, busy_gpu ? "busy" : "idle",
                   median(moved), median(regrouped), median(t_unmap), median(t_release), median(t_create),
                   median(t_map));
        }
    }
    // Does one cuMemUnmap take a range of several adjacent mappings?
    {
        const size_t k = 16;
        std::vector<CUmemGenericAllocationHandle> h(k);
        for (size_t i = 0; i < k; i++) {
            CHECK(cuMemCreate(&h[i], page, &prop, 0));
            CHECK(cuMemMap(to + i * page, page, 0, h[i], 0));
            CHECK(cuMemSetAccess(to + i * page, page, &access, 1));
        }
        double t0 = now_us();
        CUresult r = cuMemUnmap(to, k * page);
        double us = now_us() - t0;
        const char *name = "CUDA_SUCCESS";
        if (r != CUDA_SUCCESS) {
            cuGetErrorName(r, &name);
            for (size_t i = 0; i < k; i++) CHECK(cuMemUnmap(to + i * page, page));
        }
        printf("\none cuMemUnmap over %zu adjacent mappings of a page each: %s (%s)", k,
               r == CUDA_SUCCESS ? "accepted" : "refused", name ? name : "?");
        if (r == CUDA_SUCCESS)
            printf(", %.1f us per page", us / (double)k);
        printf("\n");
        for (auto &x : h) CHECK(cuMemRelease(x));
    }
    cuMemAddressFree(from, 2 * KMAX * page);
    cuMemAddressFree(to, KMAX * page);
    return 0;
}
