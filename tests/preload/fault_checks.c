/* fault_checks.c - one hooked CUDA call made under LD_PRELOAD=libcuheap.so
 * while the fake driver fails the calls cuheap makes on its behalf.
 *
 *   fault_checks ENTRY PLAN
 *
 * starts the runtime, sets the fake driver's fault plan (PLAN, the syntax of
 * FAKE_CUDA_FAULTS, tests/fake/fake_faults.c), makes one call of ENTRY
 * (cudaMalloc, cuMemAlloc_v2, ..., a free of a block allocated before the
 * plan) and prints "ENTRY -> CODE" with the code the program got, and how
 * many driver calls failed on purpose. tests/test_preload_faults.sh says
 * which code each case must give: the one CUDA itself would have given.
 */
#define _GNU_SOURCE
#include "fake_cudart.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

#define SIZE (8 * MiB)

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: fault_checks ENTRY PLAN\n");
        return 2;
    }
    const char *entry = argv[1];
    int (*plan)(const char *) = (int (*)(const char *))fakeCudartDriverFunction("fake_cuda_faults");
    unsigned long (*injected)(void) = (unsigned long (*)(void))fakeCudartDriverFunction("fake_cuda_faults_injected");
    CUresult (*cu_alloc)(CUdeviceptr *, size_t) =
        (CUresult (*)(CUdeviceptr *, size_t))fakeCudartDriverFunction("cuMemAlloc_v2");
    CUresult (*cu_free)(CUdeviceptr) = (CUresult (*)(CUdeviceptr))fakeCudartDriverFunction("cuMemFree_v2");
    CUresult (*cu_alloc_async)(CUdeviceptr *, size_t, void *) =
        (CUresult (*)(CUdeviceptr *, size_t, void *))fakeCudartDriverFunction("cuMemAllocAsync");
    CUresult (*cu_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) =
        (CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))fakeCudartDriverFunction("cuMemAllocPitch_v2");
    CUresult (*cu_host)(void **, size_t, unsigned) =
        (CUresult (*)(void **, size_t, unsigned))fakeCudartDriverFunction("cuMemHostAlloc");
    if (!plan || !injected || !cu_alloc || !cu_free || !cu_alloc_async || !cu_pitch || !cu_host) {
        fprintf(stderr, "fault_checks: the fake driver lacks a function\n");
        return 2;
    }
    if (cudaFree(NULL) != cudaSuccess) {   /* the runtime starts */
        fprintf(stderr, "fault_checks: the runtime did not start\n");
        return 2;
    }
    /* A block to free, made before the plan, and a small one freed to sit
     * in the thread's cache. */
    void *before = NULL, *small = NULL;
    if (cudaMalloc(&before, SIZE) != cudaSuccess || cudaMalloc(&small, 4096) != cudaSuccess ||
        cudaFree(small) != cudaSuccess) {
        fprintf(stderr, "fault_checks: cudaMalloc before the plan failed\n");
        return 2;
    }
    if (plan(argv[2]) != 0)
        return 2;
    void *p = NULL;
    CUdeviceptr d = 0;
    size_t pitch = 0;
    int code;
    if (strncmp(entry, "after-", 6) == 0) {
        /* A call that meets the plan's error first (a segment the heap has
         * not got), then the entry point named, whose block or cache needs
         * no driver call: a small block freed just before the plan sits in
         * the thread's cache. */
        void *big = NULL;
        (void)cudaMalloc(&big, 64 * SIZE);
        entry += 6;
        fprintf(stderr, "(a first call met the plan)\n");
    }
    if (strcmp(entry, "cudaMalloc") == 0)
        code = cudaMalloc(&p, argv[1][0] == 'a' ? 4096 : 2 * SIZE);
    else if (strcmp(entry, "cudaMallocAsync") == 0)
        code = cudaMallocAsync(&p, 2 * SIZE, NULL);
    else if (strcmp(entry, "cudaMallocPitch") == 0)
        code = cudaMallocPitch(&p, &pitch, 4096, 4096);
    else if (strcmp(entry, "cudaHostAlloc") == 0)
        code = cudaHostAlloc(&p, SIZE, 0);
    else if (strcmp(entry, "cudaMallocHost") == 0)
        code = cudaMallocHost(&p, SIZE);
    else if (strcmp(entry, "cuMemAlloc_v2") == 0)
        code = cu_alloc(&d, argv[1][0] == 'a' ? 4096 : 2 * SIZE);
    else if (strcmp(entry, "cuMemAllocAsync") == 0)
        code = cu_alloc_async(&d, 2 * SIZE, NULL);
    else if (strcmp(entry, "cuMemAllocPitch_v2") == 0)
        code = cu_pitch(&d, &pitch, 4096, 4096, 4);
    else if (strcmp(entry, "cuMemHostAlloc") == 0)
        code = cu_host(&p, SIZE, 0);
    else if (strcmp(entry, "cudaFree") == 0)
        code = cudaFree(before);
    else if (strcmp(entry, "cudaFreeAsync") == 0)
        code = cudaFreeAsync(before, NULL);
    else if (strcmp(entry, "cuMemFree_v2") == 0)
        code = cu_free((CUdeviceptr)(uintptr_t)before);
    else {
        fprintf(stderr, "fault_checks: unknown entry point %s\n", entry);
        return 2;
    }
    printf("%s -> %d (%lu driver calls failed on purpose)\n", argv[1], code, injected());
    fflush(stdout);
    return 0;
}
