// vm_unmap_thread.cu - whether a page's unmap can leave the allocating thread.
//
// An alias move (heap_pages.c) maps a free physical page behind a new block
// (cuMemMap + cuMemSetAccess) while its old mapping stays, and unmaps the old
// range later. The unmap is about 40% of a move's driver time. If another
// thread can unmap while the allocating thread maps, without the driver
// serializing the two, the allocating thread pays only the map and the grant.
// This measures, per page of the device's granularity, median of 5 rounds of
// 512 pages, the GPU idle and with a kernel running:
//   one thread:  map + access at the new range, then unmap the old one
//   two threads: the same maps and grants on this thread while a second
//                thread unmaps each old range as soon as its page is mapped
//                anew: this thread's time, the second's, and the wall time
// and, to see whether the driver serializes kernel launches behind unmaps,
// an empty kernel launched in a loop with and without a thread unmapping.
#include "vm_bench.h"

#include <atomic>
#include <cuda_runtime.h>
#include <thread>

__global__ void nothing() {}

int main()
{
    const int PAGES = 512, ROUNDS = 5, LAUNCHES = 2000;
    vm_device d;
    CHECK(vm_device_open(&d));
    CUcontext ctx;
    CHECK(cuCtxGetCurrent(&ctx));
    const CUmemAllocationProp prop = d.prop;
    const CUmemAccessDesc access = d.access;
    const size_t page = d.page;
    std::vector<CUmemGenericAllocationHandle> h(PAGES);
    for (auto &x : h) CHECK(cuMemCreate(&x, page, &prop, 0));
    CUdeviceptr old_va, new_va;
    CHECK(cuMemAddressReserve(&old_va, page * PAGES, 0, 0, 0));
    CHECK(cuMemAddressReserve(&new_va, page * PAGES, 0, 0, 0));
    cudaStream_t busy;
    cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking);

    // Every page mapped (and granted) at the old range, as before a move.
    auto map_old = [&]() -> int {
        for (int i = 0; i < PAGES; i++) {
            CHECK(cuMemMap(old_va + i * page, page, 0, h[i], 0));
            CHECK(cuMemSetAccess(old_va + i * page, page, &access, 1));
        }
        return 0;
    };
    auto unmap_new = [&]() -> int {
        for (int i = 0; i < PAGES; i++) CHECK(cuMemUnmap(new_va + i * page, page));
        return 0;
    };

    printf("page %zu KiB, %d pages per round, median of %d rounds, us per page\n\n", page >> 10, PAGES, ROUNDS);
    printf("| GPU | one thread: move | two threads: this thread | the unmapping thread | wall |\n");
    printf("|---|---|---|---|---|\n");
    for (int busy_gpu = 0; busy_gpu < 2; busy_gpu++) {
        std::vector<double> one, mine, theirs, wall;
        for (int round = 0; round < ROUNDS; round++) {
            if (busy_gpu) spin<<<1, 1, 0, busy>>>(4000000000LL);   // about 2 s
            // One thread: each page mapped and granted anew, its old range unmapped.
            if (map_old()) return 1;
            double t0 = now_us();
            for (int i = 0; i < PAGES; i++) {
                CHECK(cuMemMap(new_va + i * page, page, 0, h[i], 0));
                CHECK(cuMemSetAccess(new_va + i * page, page, &access, 1));
                CHECK(cuMemUnmap(old_va + i * page, page));
            }
            one.push_back((now_us() - t0) / PAGES);
            if (unmap_new()) return 1;
            // Two threads: the old ranges unmapped behind this thread's maps.
            if (map_old()) return 1;
            std::atomic<int> mapped{0};
            std::atomic<int> failed{0};
            double worker_us = 0;
            double t1 = now_us();
            std::thread worker([&] {
                if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) { failed = 1; return; }
                double w0 = now_us();
                for (int i = 0; i < PAGES; i++) {
                    while (mapped.load(std::memory_order_acquire) <= i) {}
                    if (cuMemUnmap(old_va + i * page, page) != CUDA_SUCCESS) failed = 1;
                }
                worker_us = now_us() - w0;
            });
            for (int i = 0; i < PAGES; i++) {
                CHECK(cuMemMap(new_va + i * page, page, 0, h[i], 0));
                CHECK(cuMemSetAccess(new_va + i * page, page, &access, 1));
                mapped.store(i + 1, std::memory_order_release);
            }
            double t2 = now_us();
            worker.join();
            double t3 = now_us();
            if (failed) { fprintf(stderr, "the second thread's unmap failed\n"); return 1; }
            mine.push_back((t2 - t1) / PAGES);
            theirs.push_back(worker_us / PAGES);
            wall.push_back((t3 - t1) / PAGES);
            if (unmap_new()) return 1;
            if (busy_gpu) CHECK(cuCtxSynchronize());
        }
        printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", busy_gpu ? "a kernel running" : "idle", median(one),
               median(mine), median(theirs), median(wall));
    }

    // Kernel launches while another thread unmaps.
    printf("\n| empty kernel launches, us each | alone | while a thread unmaps %d pages |\n|---|---|---|\n", PAGES);
    std::vector<double> alone, beside;
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = now_us();
        for (int i = 0; i < LAUNCHES; i++) nothing<<<1, 1>>>();
        alone.push_back((now_us() - t0) / LAUNCHES);
        CHECK(cuCtxSynchronize());
        if (map_old()) return 1;
        std::atomic<int> go{0};
        std::thread worker([&] {
            if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return;
            go = 1;
            for (int i = 0; i < PAGES; i++) (void)cuMemUnmap(old_va + i * page, page);
            go = 2;
        });
        while (!go.load()) {}
        double t1 = now_us();
        int n = 0;
        while (go.load() == 1 || n < LAUNCHES) {
            nothing<<<1, 1>>>();
            n++;
            if (n >= 20 * LAUNCHES) break;
        }
        beside.push_back((now_us() - t1) / n);
        worker.join();
        CHECK(cuCtxSynchronize());
    }
    printf("| | %.2f | %.2f |\n", median(alone), median(beside));
    return 0;
}
