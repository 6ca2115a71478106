/* driver_checks.c - a CUDA driver program (linked with -lcuda, the fake
 * driver) run under LD_PRELOAD=libcuheap.so; its argument names the check.
 *
 * It reaches the driver's allocator the three ways programs do: by symbol
 * (its calls bind to cuheap's preloaded cuMemAlloc_v2), through dlsym on the
 * driver's handle, and through cuGetProcAddress (what CUDA runtimes do).
 * cuheap's service shows in its statistics and in the fake driver's count of
 * real allocations; what the driver refuses without cuheap (no current
 * context, a zero size) it must still refuse.
 */
#define _GNU_SOURCE
#include "support.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

CUresult cuInit(unsigned int flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, int device);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags);
CUresult cuMemAllocHost_v2(void **pp, size_t size);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostGetFlags(unsigned int *flags, void *p);

#define CUDA_ERROR_INVALID_CONTEXT 201
#define DRIVER_VERSION 13000
#define PER_THREAD_DEFAULT_STREAM 0x2ull
#define BLOCKS 200

typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*mem_free_fn)(CUdeviceptr);
typedef CUresult (*mem_alloc_async_fn)(CUdeviceptr *, size_t, void *);
typedef CUresult (*mem_free_async_fn)(CUdeviceptr, void *);
typedef CUresult (*get_proc_address_v2_fn)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*get_proc_address_fn)(const char *, void **, int, unsigned long long);

static fake_helpers_t fake;
static void *driver_handle;

static void *driver_symbol(const char *name)
{
    return dlsym(driver_handle, name);
}

static void make_primary_current(void)
{
    CUcontext ctx = NULL;
    expect(cuInit(0) == 0, "cuInit failed");
    expect(cuDevicePrimaryCtxRetain(&ctx, 0) == 0 && ctx, "cuDevicePrimaryCtxRetain failed");
    expect(cuCtxSetCurrent(ctx) == 0, "cuCtxSetCurrent failed");
}

/* Allocates, fills, checks and frees BLOCKS blocks with the given functions,
 * and expects cuheap to have served every one of them. */
static void expect_served(const char *how, mem_alloc_fn alloc, mem_free_fn release)
{
    cuheap_stats_t before, after;
    heap_stats(&before);
    fake_cuda_calls_t fb = fake_calls(&fake);
    CUdeviceptr blocks[BLOCKS] = {0};
    int failed = 0;
    for (int i = 0; i < BLOCKS; i++) {
        size_t size = 100 + (size_t)i * 5000;
        failed += alloc(&blocks[i], size) != 0 || !blocks[i] || blocks[i] % 512;
        if (blocks[i])
            pattern_fill((void *)(uintptr_t)blocks[i], size, (unsigned)i);
    }
    for (int i = 0; i < BLOCKS; i++) {
        size_t size = 100 + (size_t)i * 5000;
        failed += blocks[i] && !pattern_intact((void *)(uintptr_t)blocks[i], size, (unsigned)i);
        failed += release(blocks[i]) != 0;
    }
    heap_stats(&after);
    fake_cuda_calls_t fa = fake_calls(&fake);
    expect(failed == 0, "%s: %d failed calls, misaligned or damaged blocks", how, failed);
    expect(after.num_allocs - before.num_allocs == BLOCKS && after.num_frees - before.num_frees == BLOCKS,
           "%s: cuheap served %llu allocations and %llu frees of %d", how,
           (unsigned long long)(after.num_allocs - before.num_allocs),
           (unsigned long long)(after.num_frees - before.num_frees), BLOCKS);
    expect(fa.mem_allocs - fb.mem_allocs < BLOCKS / 2, "%s: the driver made %lu real allocations for %d", how,
           fa.mem_allocs - fb.mem_allocs, BLOCKS);
}

static void check_no_context(void)
{
    cuheap_stats_t before, after;
    heap_stats(&before);
    CUdeviceptr d = 0;
    expect(cuInit(0) == 0, "cuInit failed");
    CUresult r = cuMemAlloc_v2(&d, 1 * MiB);
    expect(r == CUDA_ERROR_INVALID_CONTEXT, "cuMemAlloc_v2 with no current context returned %d, not 201", r);
    heap_stats(&after);
    expect(after.num_allocs == before.num_allocs, "cuheap served a driver call made with no context");
}

static void check_symbol(void)
{
    make_primary_current();
    expect_served("by symbol", cuMemAlloc_v2, cuMemFree_v2);
}

static void check_dlsym(void)
{
    make_primary_current();
    mem_alloc_fn alloc;
    mem_free_fn release;
    void *a = driver_symbol("cuMemAlloc_v2"), *f = driver_symbol("cuMemFree_v2");
    if (!expect(a && f, "dlsym found no cuMemAlloc_v2 or cuMemFree_v2"))
        return;
    memcpy(&alloc, &a, sizeof a);
    memcpy(&release, &f, sizeof f);
    expect_served("through dlsym", alloc, release);
}

static void *proc_address(const char *name, unsigned long long flags)
{
    void *entry = driver_symbol("cuGetProcAddress_v2");
    get_proc_address_v2_fn get;
    memcpy(&get, &entry, sizeof entry);
    void *fn = NULL;
    int status = -1;
    if (!expect(get && get(name, &fn, DRIVER_VERSION, flags, &status) == 0 && fn && status == 0,
                "cuGetProcAddress_v2(%s, flags %llu) failed", name, flags))
        return NULL;
    return fn;
}

static void check_get_proc_address(void)
{
    make_primary_current();
    mem_alloc_fn alloc;
    mem_free_fn release;
    void *a = proc_address("cuMemAlloc", 0), *f = proc_address("cuMemFree", 0);
    if (!a || !f)
        return;
    memcpy(&alloc, &a, sizeof a);
    memcpy(&release, &f, sizeof f);
    expect_served("through cuGetProcAddress_v2", alloc, release);

    /* cuGetProcAddress (the first version) too. */
    void *entry = driver_symbol("cuGetProcAddress");
    get_proc_address_fn get_v1;
    memcpy(&get_v1, &entry, sizeof entry);
    void *a1 = NULL;
    expect(get_v1 && get_v1("cuMemAlloc", &a1, DRIVER_VERSION, 0) == 0 && a1 == a,
           "cuGetProcAddress(cuMemAlloc) gave %p, cuGetProcAddress_v2 %p", a1, a);

    /* The stream-ordered allocator, default and per-thread default stream. */
    void *async = proc_address("cuMemAllocAsync", 0);
    void *async_ptsz = proc_address("cuMemAllocAsync", PER_THREAD_DEFAULT_STREAM);
    void *free_ptsz = proc_address("cuMemFreeAsync", PER_THREAD_DEFAULT_STREAM);
    expect(async != async_ptsz, "the per-thread flag gave the same cuMemAllocAsync");
    if (!async_ptsz || !free_ptsz)
        return;
    mem_alloc_async_fn alloc_ptsz;
    mem_free_async_fn release_ptsz;
    memcpy(&alloc_ptsz, &async_ptsz, sizeof async_ptsz);
    memcpy(&release_ptsz, &free_ptsz, sizeof free_ptsz);
    cuheap_stats_t before, after;
    heap_stats(&before);
    CUdeviceptr d = 0;
    expect(alloc_ptsz(&d, 5000, NULL) == 0 && d, "cuMemAllocAsync_ptsz failed");
    if (d)
        pattern_fill((void *)(uintptr_t)d, 5000, 1);
    expect(release_ptsz(d, NULL) == 0, "cuMemFreeAsync_ptsz failed");
    heap_stats(&after);
    expect(after.num_allocs == before.num_allocs + 1 && after.num_frees == before.num_frees + 1,
           "cuMemAllocAsync/cuMemFreeAsync with the per-thread flag were not served by cuheap");
}

static void check_zero_size(void)
{
    make_primary_current();
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc_v2(&d, 0);
    expect(r == 1, "cuMemAlloc_v2(&d, 0) returned %d, not 1 (CUDA_ERROR_INVALID_VALUE)", r);
    expect_served("after a zero size", cuMemAlloc_v2, cuMemFree_v2);
}

static void check_out_of_memory(void)
{
    make_primary_current();
    fake_cuda_calls_t fc = fake_calls(&fake);
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc_v2(&d, fc.capacity + 64 * MiB);
    expect(r == 2, "cuMemAlloc_v2 beyond the device returned %d, not 2 (CUDA_ERROR_OUT_OF_MEMORY)", r);
    cuheap_stats_t st;
    heap_stats(&st);
    expect(st.num_ooms >= 1, "cuheap counted no out-of-memory");
}
/* Pinned host memory by symbol: cuMemHostAlloc and cuMemAllocHost_v2 served
 * by cuheap's cache with the flags reaching the driver; with no current
 * context the driver's own answer (CUDA_ERROR_INVALID_CONTEXT). */
static void check_pinned(void)
{
    void *p = NULL;
    CUresult r = cuMemHostAlloc(&p, 4096, 0);
    expect(r == CUDA_ERROR_INVALID_CONTEXT, "cuMemHostAlloc with no context returned %d, not 201", r);
    cuheap_host_stats_t st;
    host_stats(&st);
    expect(st.num_allocs == 0, "cuheap served pinned memory with no context current");
    make_primary_current();
    fake_cuda_calls_t c0 = fake_calls(&fake);
    void *ptrs[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        unsigned flags = (unsigned)i % 4, got = 99;
        size_t size = 1 + (size_t)i * 1021;
        r = i % 5 == 0 ? cuMemAllocHost_v2(&ptrs[i], size) : cuMemHostAlloc(&ptrs[i], size, flags);
        if (i % 5 == 0)
            flags = 0;
        expect(r == 0 && ptrs[i], "pinned allocation %d failed (%d)", i, r);
        pattern_fill(ptrs[i], size, (unsigned)i);
        expect(cuMemHostGetFlags(&got, ptrs[i]) == 0 && got == flags, "flags %u came back as %u", flags, got);
    }
    for (int i = 0; i < BLOCKS; i++) {
        expect(pattern_intact(ptrs[i], 1 + (size_t)i * 1021, (unsigned)i), "pinned data damaged");
        expect(cuMemFreeHost(ptrs[i]) == 0, "cuMemFreeHost failed");
    }
    fake_cuda_calls_t c1 = fake_calls(&fake);
    host_stats(&st);
    expect(st.num_allocs == BLOCKS && st.num_frees == BLOCKS, "cuheap served %llu and freed %llu of %d",
           (unsigned long long)st.num_allocs, (unsigned long long)st.num_frees, BLOCKS);
    expect(c1.host_allocs - c0.host_allocs <= 8, "%lu page-locked allocations reached the driver",
           c1.host_allocs - c0.host_allocs);
    expect(c1.host_frees == c0.host_frees, "frees of cuheap's buffers reached the driver");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IOLBF, 0);
    driver_handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!expect(driver_handle != NULL, "libcuda.so.1 is not loaded"))
        return finish(mode);
    fake_helpers_load(&fake, driver_symbol);
    if (!strcmp(mode, "no-context"))
        check_no_context();
    else if (!strcmp(mode, "symbol"))
        check_symbol();
    else if (!strcmp(mode, "dlsym"))
        check_dlsym();
    else if (!strcmp(mode, "get-proc-address"))
        check_get_proc_address();
    else if (!strcmp(mode, "zero-size"))
        check_zero_size();
    else if (!strcmp(mode, "out-of-memory"))
        check_out_of_memory();
    else if (!strcmp(mode, "pinned"))
        check_pinned();
    else {
        fprintf(stderr, "usage: %s no-context|symbol|dlsym|get-proc-address|zero-size|out-of-memory|pinned\n",
                argv[0]);
        return 2;
    }
    return finish(mode);
}
