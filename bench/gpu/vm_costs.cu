// vm_costs.cu - what moving a page of CUDA virtual memory costs on a real GPU.
//
// Under vmm:1 cuheap moves free physical pages to where a block needs them:
// an unmap at the old address, a map and an access grant at the new one (see
// heap.c, map_range_locked). This measures each driver call per page of the
// device's granularity, and what granting access once over a run of pages
// costs instead of once per page, while the GPU is idle and while a kernel
// runs on another stream (the driver may serialize with running work); then
// whether one larger physical allocation costs per call or per page, and
// whether the driver maps a page of such an allocation on its own.
// Prints microseconds per page (median of 5 rounds over 512 pages).
#include "vm_bench.h"

#include <cuda_runtime.h>

int main()
{
    const int PAGES = 512, ROUNDS = 5;
    vm_device d;
    CHECK(vm_device_open(&d));
    const CUmemAllocationProp prop = d.prop;
    const CUmemAccessDesc access = d.access;
    const size_t page = d.page;
    std::vector<CUmemGenericAllocationHandle> h(PAGES);
    for (auto &x : h) CHECK(cuMemCreate(&x, page, &prop, 0));
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, page * PAGES, 0, 0, 0));
    cudaStream_t busy;
    cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking);

    printf("page %zu KiB, %d pages per round, median of %d rounds\n\n", page >> 10, PAGES, ROUNDS);
    printf("| call, per page | GPU idle (us) | kernel running (us) |\n|---|---|---|\n");
    double res[4][2];
    for (int busy_gpu = 0; busy_gpu < 2; busy_gpu++) {
        std::vector<double> map, grant_each, grant_run, unmap;
        for (int round = 0; round < ROUNDS; round++) {
            if (busy_gpu) spin<<<1, 1, 0, busy>>>(2000000000LL);   // about 1 s
            // map + access per page (cuheap's vm_map today)
            double t0 = now_us();
            for (int i = 0; i < PAGES; i++) CHECK(cuMemMap(va + i * page, page, 0, h[i], 0));
            double t1 = now_us();
            for (int i = 0; i < PAGES; i++) CHECK(cuMemSetAccess(va + i * page, page, &access, 1));
            double t2 = now_us();
            for (int i = 0; i < PAGES; i++) CHECK(cuMemUnmap(va + i * page, page));
            double t3 = now_us();
            // map every page, then one grant over the whole run
            for (int i = 0; i < PAGES; i++) CHECK(cuMemMap(va + i * page, page, 0, h[i], 0));
            double t4 = now_us();
            CHECK(cuMemSetAccess(va, page * PAGES, &access, 1));
            double t5 = now_us();
            for (int i = 0; i < PAGES; i++) CHECK(cuMemUnmap(va + i * page, page));
            map.push_back((t1 - t0) / PAGES);
            grant_each.push_back((t2 - t1) / PAGES);
            unmap.push_back((t3 - t2) / PAGES);
            grant_run.push_back((t5 - t4) / PAGES);
            if (busy_gpu) cudaStreamSynchronize(busy);
        }
        res[0][busy_gpu] = median(map);
        res[1][busy_gpu] = median(grant_each);
        res[2][busy_gpu] = median(grant_run);
        res[3][busy_gpu] = median(unmap);
    }
    const char *names[4] = {"cuMemMap", "cuMemSetAccess, one call per page",
                            "cuMemSetAccess, one call over the run", "cuMemUnmap"};
    for (int k = 0; k < 4; k++) printf("| %s | %.2f | %.2f |\n", names[k], res[k][0], res[k][1]);
    printf("| a page moved today (unmap + map + access per page) | %.2f | %.2f |\n",
           res[3][0] + res[0][0] + res[1][0], res[3][1] + res[0][1] + res[1][1]);
    printf("| a page moved, access granted over the run | %.2f | %.2f |\n",
           res[3][0] + res[0][0] + res[2][0], res[3][1] + res[0][1] + res[2][1]);

    // Larger physical allocations: is the cost per call or per page? One
    // handle of N pages mapped, granted and unmapped as one piece.
    printf("\n| one handle of | map + access + unmap (us) | per 2 MiB page (us) |\n|---|---|---|\n");
    for (size_t pages_per = 1; pages_per <= 256; pages_per *= 4) {
        const size_t bytes = pages_per * page, n = 8;
        std::vector<CUmemGenericAllocationHandle> big(n);
        for (auto &x : big) CHECK(cuMemCreate(&x, bytes, &prop, 0));
        CUdeviceptr bva;
        CHECK(cuMemAddressReserve(&bva, bytes * n, 0, 0, 0));
        std::vector<double> per_call;
        for (int round = 0; round < ROUNDS; round++) {
            double t0 = now_us();
            for (size_t i = 0; i < n; i++) {
                CHECK(cuMemMap(bva + i * bytes, bytes, 0, big[i], 0));
                CHECK(cuMemSetAccess(bva + i * bytes, bytes, &access, 1));
            }
            for (size_t i = 0; i < n; i++) CHECK(cuMemUnmap(bva + i * bytes, bytes));
            per_call.push_back((now_us() - t0) / n);
        }
        double us = median(per_call);
        printf("| %zu MiB | %.1f | %.2f |\n", bytes >> 20, us, us / (double)pages_per);
        for (auto &x : big) cuMemRelease(x);
        cuMemAddressFree(bva, bytes * n);
    }
    // Can one larger physical allocation be mapped a page at a time (an
    // offset into it), so that any page of it could still move alone?
    // CUDA 13.0 documents the offset as "must currently be zero": ask the
    // driver rather than assume, and print its answer. (On an H200, driver
    // 580.159.04: refused, so cuheap's pages are allocations of their own.)
    {
        CUmemGenericAllocationHandle chunk;
        CHECK(cuMemCreate(&chunk, 2 * page, &prop, 0));
        CUdeviceptr cva;
        CHECK(cuMemAddressReserve(&cva, 2 * page, 0, 0, 0));
        CUresult probe = cuMemMap(cva + page, page, page, chunk, 0);
        const char *name = "CUDA_SUCCESS";
        if (probe != CUDA_SUCCESS)
            cuGetErrorName(probe, &name);
        else
            CHECK(cuMemUnmap(cva + page, page));
        printf("\none page of a %zu MiB physical allocation mapped at a non-zero offset into it: %s (%s)\n",
               (2 * page) >> 20, probe == CUDA_SUCCESS ? "accepted" : "refused", name ? name : "?");
        cuMemRelease(chunk);
        cuMemAddressFree(cva, 2 * page);
    }
    for (auto &x : h) cuMemRelease(x);
    cuMemAddressFree(va, page * PAGES);
    return 0;
}
