/* floor_checks.c - the floor (bench/torch/floor.h) on the fake driver: the
 * blocks it hands out are distinct, aligned and reused, each device's arena
 * is taken once, and an exhausted arena is refused in words. Run by
 * tests/test_floor.sh, one mode per process:
 *
 *   floor_checks plugin LIB            floor_alloc/floor_free of LIB (dlopen, as PyTorch does)
 *   floor_checks plugin-exhaust LIB    allocates 1 MiB blocks until the plugin stops the process
 *   floor_checks runtime               cudaMalloc/cudaFree, under LD_PRELOAD=libfloor_preload.so
 *   floor_checks runtime-exhaust       cudaMalloc of 1 MiB until it answers out of memory
 *   floor_checks runtime-fenced        FLOOR_FENCE=1: a freed block comes back behind a fence
 *   floor_checks runtime-unfenced      FLOOR_FENCE unset: no fence at all
 *
 * The exhaust modes expect FLOOR_ARENA=8M; the others FAKE_CUDA_DEVICES=2.
 * Each prints "ok MODE" or what failed.
 */
#define _GNU_SOURCE
#include "fake_cudart.h"
#include "support.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define BLOCKS 200
#define ALIGNMENT 512

typedef void *(*plugin_alloc_fn)(ssize_t, int, void *);
typedef void (*plugin_free_fn)(void *, ssize_t, int, void *);

/* The way in under test: the plugin's pair or the runtime's. */
static plugin_alloc_fn plugin_alloc;
static plugin_free_fn plugin_free;
static fake_helpers_t fake;

static void *driver_lookup(const char *name)
{
    static void *lib;
    if (!lib)
        lib = dlopen("libcuda.so.1", RTLD_NOW);
    return lib ? dlsym(lib, name) : NULL;
}

static void *take(size_t size, int device)
{
    if (plugin_alloc)
        return plugin_alloc((ssize_t)size, device, NULL);
    void *p = NULL;
    if (!expect(cudaSetDevice(device) == cudaSuccess, "cudaSetDevice(%d) failed", device))
        return NULL;
    cudaError_t rc = cudaMalloc(&p, size);
    expect(rc == cudaSuccess, "cudaMalloc(%zu) on device %d answered %d", size, device, rc);
    return p;
}

static void give(void *p, size_t size, int device)
{
    if (plugin_free)
        plugin_free(p, (ssize_t)size, device, NULL);
    else
        expect(cudaFree(p) == cudaSuccess, "cudaFree(%p) failed", p);
}

static size_t size_of(int i)
{
    static const size_t sizes[] = {1, 512, 513, 4096, 65536, 100000, 1 << 20, 3 << 20};
    return sizes[i % (int)(sizeof sizes / sizeof sizes[0])];
}

static int by_address(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* Blocks of mixed sizes: each aligned, none overlapping another. */
static void distinct_and_aligned(void **p)
{
    uintptr_t sorted[BLOCKS][2];
    for (int i = 0; i < BLOCKS; i++) {
        p[i] = take(size_of(i), 0);
        expect(p[i] != NULL && (uintptr_t)p[i] % ALIGNMENT == 0, "block %d (%zu bytes) at %p is not %d-aligned",
               i, size_of(i), p[i], ALIGNMENT);
        sorted[i][0] = (uintptr_t)p[i];
        sorted[i][1] = size_of(i);
    }
    qsort(sorted, BLOCKS, sizeof sorted[0], by_address);
    for (int i = 1; i < BLOCKS; i++)
        expect(sorted[i - 1][0] + sorted[i - 1][1] <= sorted[i][0], "blocks at %#lx (%lu bytes) and %#lx overlap",
               (unsigned long)sorted[i - 1][0], (unsigned long)sorted[i - 1][1], (unsigned long)sorted[i][0]);
}

static int among(void *x, void **set, int n)
{
    for (int i = 0; i < n; i++)
        if (set[i] == x)
            return 1;
    return 0;
}

static void checks(const char *mode)
{
    fake_helpers_load(&fake, driver_lookup);
    void *p[BLOCKS], *q[BLOCKS];
    distinct_and_aligned(p);
    unsigned long arenas = fake_calls(&fake).mem_allocs;
    expect(arenas == 1, "%lu device allocations for %d blocks: the arena is not taken once", arenas, BLOCKS);

    /* Freed blocks serve the same sizes again: no new memory is cut. */
    for (int i = 0; i < BLOCKS; i++)
        give(p[i], size_of(i), 0);
    for (int i = BLOCKS - 1; i >= 0; i--) {
        q[i] = take(size_of(i), 0);
        expect(among(q[i], p, BLOCKS), "block %d (%zu bytes) at %p is new memory, not a freed block", i, size_of(i),
               q[i]);
    }
    /* Last freed, first served, size by size. */
    void *a = q[0], *b = q[8];   /* both of size_of(0) */
    give(a, size_of(0), 0);
    give(b, size_of(0), 0);
    void *c = take(size_of(0), 0), *d = take(size_of(0), 0);
    expect(c == b && d == a, "LIFO: freed %p then %p, got %p then %p", a, b, c, d);

    /* A double free is refused and does not hand the block out twice. */
    give(c, size_of(0), 0);
    if (plugin_free)
        plugin_free(c, (ssize_t)size_of(0), 0, NULL);
    else
        expect(cudaFree(c) == cudaErrorInvalidValue, "a double cudaFree is not refused");
    void *e = take(size_of(0), 0), *f = take(size_of(0), 0);
    expect(e != f, "after a double free the same block is handed out twice (%p)", e);

    /* Each device has its own arena. */
    void *other = take(4096, 1);
    expect(fake_calls(&fake).mem_allocs == 2 && !among(other, q, BLOCKS),
           "device 1's block %p does not come from an arena of its own", other);
    give(other, 4096, 1);

    /* Memory the floor did not hand out goes to CUDA, NULL too. */
    if (!plugin_free) {
        unsigned long long foreign = 0;
        expect(fake.alloc_foreign(&foreign, MiB) == 0, "the fake driver gave no foreign memory");
        unsigned long freed = fake_calls(&fake).mem_frees;
        expect(cudaFree((void *)(uintptr_t)foreign) == cudaSuccess && fake_calls(&fake).mem_frees == freed + 1,
               "cudaFree of memory the floor did not hand out did not reach CUDA");
        expect(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL) failed");
        void *none = &none;
        expect(cudaMalloc(&none, 0) == cudaSuccess && none == NULL, "cudaMalloc of 0 bytes is not NULL and success");
    }
    (void)mode;
}

/* 1 MiB blocks until the arena (FLOOR_ARENA=8M) runs out. */
static void exhaust(const char *mode)
{
    for (int i = 0;; i++) {
        void *p = NULL;
        if (plugin_alloc) {
            p = plugin_alloc((ssize_t)MiB, 0, NULL);   /* stops the process when refused */
        } else {
            cudaError_t rc = cudaMalloc(&p, MiB);
            if (rc != cudaSuccess) {
                expect(rc == cudaErrorMemoryAllocation && i == 8, "cudaMalloc refused block %d with %d, not block 8 "
                       "with out of memory", i, rc);
                return;
            }
        }
        if (!expect(p != NULL && i < 8, "block %d of 1 MiB served from an 8 MiB arena", i) || !p)
            return;
    }
    (void)mode;
}

/* The fence calls of one cudaFree + cudaMalloc pair of 1 MiB, which must
 * give the freed block back: device-wide records, event queries, device-wide
 * waits. Work queued on the legacy stream before the free still waits
 * (`busy`) or has run. */
typedef struct {
    unsigned long records, queries, waits;
} fence_calls_t;

static fence_calls_t pair_fence_calls(int busy)
{
    void *fn = driver_lookup("fake_cuda_count");
    fake_cuda_count_fn count;
    memcpy(&count, &fn, sizeof fn);
    fence_calls_t calls = {0};
    if (!expect(count != NULL, "the fake driver has no fake_cuda_count"))
        return calls;
    void *a = take(MiB, 0);
    fake.hold(busy);
    if (busy)
        expect(fake.enqueue_fill(NULL, a, MiB, 0xAA) == 0, "a fill could not be queued");
    const fake_cuda_calls_t before = fake_calls(&fake);
    const unsigned long queries = count("cuEventQuery");
    give(a, MiB, 0);
    void *b = take(MiB, 0);
    expect(b == a, "the freed block %p did not come back (%p)", a, b);
    const fake_cuda_calls_t after = fake_calls(&fake);
    calls = (fence_calls_t){after.ctx_records - before.ctx_records, count("cuEventQuery") - queries,
                            after.ctx_waits - before.ctx_waits};
    fake.hold(0);
    fake.complete_all();
    give(b, MiB, 0);
    return calls;
}

/* FLOOR_FENCE=1: cudaFree records a device-wide event, the next cudaMalloc
 * queries it and, while the work before the free still waits, makes all
 * later work wait for it on the GPU; FLOOR_FENCE unset: none of these. */
static void fence(const char *mode)
{
    fake_helpers_load(&fake, driver_lookup);
    const int fenced = !strcmp(mode, "runtime-fenced");
    const fence_calls_t busy = pair_fence_calls(1), idle = pair_fence_calls(0);
    if (fenced) {
        expect(busy.records == 1 && busy.queries == 1 && busy.waits == 1,
               "work still queued: %lu records, %lu queries, %lu waits for a pair, not 1, 1, 1", busy.records,
               busy.queries, busy.waits);
        expect(idle.records == 1 && idle.queries == 1 && idle.waits == 0,
               "GPU idle: %lu records, %lu queries, %lu waits for a pair, not 1, 1, 0", idle.records, idle.queries,
               idle.waits);
    } else {
        expect(busy.records + busy.queries + busy.waits + idle.records + idle.queries + idle.waits == 0,
               "the plain floor made fence calls: %lu records, %lu queries, %lu waits", busy.records + idle.records,
               busy.queries + idle.queries, busy.waits + idle.waits);
    }
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int plugin = strncmp(mode, "plugin", 6) == 0;
    if (plugin) {
        void *lib = argc > 2 ? dlopen(argv[2], RTLD_NOW | RTLD_LOCAL) : NULL;
        if (!expect(lib != NULL, "cannot load the plugin %s: %s", argc > 2 ? argv[2] : "(none)", dlerror()))
            return finish(mode);
        void *alloc_sym = dlsym(lib, "floor_alloc"), *free_sym = dlsym(lib, "floor_free");
        if (!expect(alloc_sym && free_sym, "the plugin has no floor_alloc and floor_free"))
            return finish(mode);
        memcpy(&plugin_alloc, &alloc_sym, sizeof alloc_sym);
        memcpy(&plugin_free, &free_sym, sizeof free_sym);
    } else if (cudaFree(NULL) != cudaSuccess) {   /* CUDA's usual start */
        expect(0, "cudaFree(NULL) failed");
        return finish(mode);
    }
    if (!strcmp(mode, "plugin") || !strcmp(mode, "runtime"))
        checks(mode);
    else if (!strcmp(mode, "plugin-exhaust") || !strcmp(mode, "runtime-exhaust"))
        exhaust(mode);
    else if (!strcmp(mode, "runtime-fenced") || !strcmp(mode, "runtime-unfenced"))
        fence(mode);
    else
        expect(0, "usage: floor_checks plugin LIB | plugin-exhaust LIB | runtime | runtime-exhaust | "
               "runtime-fenced | runtime-unfenced");
    return finish(mode);
}
