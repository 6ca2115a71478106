/* floor_preload.c - the floor (floor.h) for LD_PRELOAD:
 *
 *   LD_PRELOAD=libfloor_preload.so PYTORCH_NO_CUDA_MEMORY_CACHING=1 python ...
 *
 * defines cudaMalloc and cudaFree, the two calls PyTorch makes for every
 * tensor with its cache off, and serves them from the arena of the calling
 * thread's device (cudaGetDevice). Each arena is taken once with the real
 * cudaMalloc, the next definition after this library (dlsym(RTLD_NEXT)):
 * the runtime the program loaded. cudaFree of a pointer that is not the
 * floor's, cudaFree(NULL) included (how programs start the runtime), goes to
 * the real cudaFree; everything else the program calls is the runtime's.
 * Unlike the real cudaFree, the floor's does not wait for the device: it
 * measures the way in, and keeps no order.
 *
 * FLOOR_FENCE=1 makes it the fenced floor: the least a cudaFree that keeps
 * its promise without making the CPU wait can cost. cudaFree records one
 * device-wide event (cuCtxRecordEvent: after all work queued so far, on
 * every stream) before the block can be handed out again, and the next
 * cudaMalloc on that device queries it; if it is still running, every later
 * piece of work waits for it on the GPU (cuCtxWaitEvent). So a freed block
 * is reused only after the work queued before its free, as with the real
 * cudaFree, at two driver calls a pair. A mutex per device keeps the fence
 * and the arena in step across threads. Needs the driver's device-wide
 * events (CUDA 12.5 or later); without them every request is refused in
 * words. FLOOR_FENCE=0 (or unset) is the plain floor.
 *
 * Out of arena, cudaMalloc answers cudaErrorMemoryAllocation after the
 * message that says which setting to raise, as any cudaMalloc may. No CUDA
 * library is linked; built with -DFLOOR_CUDA_HEADERS and CUDA's include
 * folder, the compiler checks these definitions against cuda_runtime_api.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* RTLD_NEXT */
#endif
#include "floor.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FLOOR_CUDA_HEADERS
#include <cuda_runtime_api.h>
#define FLOOR_SUCCESS cudaSuccess
#define FLOOR_INVALID_VALUE cudaErrorInvalidValue
#define FLOOR_OUT_OF_MEMORY cudaErrorMemoryAllocation
#define FLOOR_NO_RUNTIME cudaErrorInitializationError
#else
typedef int cudaError_t;
#define FLOOR_SUCCESS 0
#define FLOOR_INVALID_VALUE 1
#define FLOOR_OUT_OF_MEMORY 2
#define FLOOR_NO_RUNTIME 3
#endif

#define API __attribute__((visibility("default")))

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);
typedef cudaError_t (*get_device_fn)(int *);

/* The real runtime's `name` (the next definition after this library),
 * looked up once into *cache; NULL when there is none (said once). */
static void *real(const char *name, void *_Atomic *cache)
{
    void *fn = atomic_load_explicit(cache, memory_order_acquire);
    if (!fn) {
        fn = dlsym(RTLD_NEXT, name);
        if (!fn) {
            static atomic_int told;
            if (!atomic_exchange(&told, 1))
                fprintf(stderr, "floor: no CUDA runtime after the floor in the process (dlsym(RTLD_NEXT, \"%s\") "
                        "found nothing)\n", name);
            return NULL;
        }
        atomic_store_explicit(cache, fn, memory_order_release);
    }
    return fn;
}

#define REAL(type, var, name)                      \
    static void *_Atomic var##_cache;              \
    type var;                                      \
    void *var##_sym = real(name, &var##_cache);    \
    memcpy(&var, &var##_sym, sizeof var)

/* Takes the arena with the real cudaMalloc, on the device current in this
 * thread (the floor's open lock held: once per device). */
static int take_from_runtime(int device, size_t bytes, uintptr_t *base)
{
    REAL(malloc_fn, real_malloc, "cudaMalloc");
    void *p = NULL;
    cudaError_t rc = real_malloc ? real_malloc(&p, bytes) : FLOOR_NO_RUNTIME;
    if (rc != FLOOR_SUCCESS) {
        fprintf(stderr, "floor: device %d: the real cudaMalloc(%zu bytes) failed with error %d%s\n", device, bytes,
                (int)rc, rc == FLOOR_OUT_OF_MEMORY ? " (out of memory: lower FLOOR_ARENA)" : "");
        return -1;
    }
    *base = (uintptr_t)p;
    return 0;
}

/* ---- the fenced floor (FLOOR_FENCE=1) ------------------------------------------------- */

/* The driver's calls, by their C types (no CUDA header is needed). */
typedef int (*cu_ctx_get_current_fn)(void **ctx);
typedef int (*cu_event_create_fn)(void **event, unsigned int flags);
typedef int (*cu_ctx_event_fn)(void *ctx, void *event);   /* cuCtxRecordEvent, cuCtxWaitEvent */
typedef int (*cu_event_query_fn)(void *event);
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_ERROR_NOT_READY 600

static struct {
    cu_ctx_get_current_fn ctx_get_current;
    cu_event_create_fn event_create;
    cu_ctx_event_fn ctx_record, ctx_wait;
    cu_event_query_fn event_query;
} cu;

/* One device's fence: its context, the event its frees record, and whether
 * a free has recorded it since a cudaMalloc last looked. */
typedef struct {
    pthread_mutex_t lock;
    void *ctx, *event;
    int pending;
} fence_t;

static fence_t fences[FLOOR_MAX_DEVICES];
static pthread_once_t fence_once = PTHREAD_ONCE_INIT;
static int fence_mode = -1;   /* -1: FLOOR_FENCE is bad or the driver lacks what it needs */

/* Reads FLOOR_FENCE and, for 1, finds the driver's calls (once). */
static void fence_setup(void)
{
    const char *v = getenv("FLOOR_FENCE");
    if (!v || !*v || !strcmp(v, "0")) {
        fence_mode = 0;
        return;
    }
    if (strcmp(v, "1")) {
        fprintf(stderr, "floor: FLOOR_FENCE=%s is not 0 or 1; every request is refused\n", v);
        return;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        lib = dlopen("libcuda.so.1", RTLD_NOW);
    const char *names[] = {"cuCtxGetCurrent", "cuEventCreate", "cuCtxRecordEvent", "cuCtxWaitEvent", "cuEventQuery"};
    void *syms[5] = {0};
    for (int i = 0; i < 5; i++)
        if (!lib || !(syms[i] = dlsym(lib, names[i]))) {
            fprintf(stderr, "floor: FLOOR_FENCE=1 needs the driver's %s (libcuda.so.1, CUDA 12.5 or later), "
                    "not found; every request is refused\n", names[i]);
            return;
        }
    memcpy(&cu.ctx_get_current, &syms[0], sizeof syms[0]);
    memcpy(&cu.event_create, &syms[1], sizeof syms[1]);
    memcpy(&cu.ctx_record, &syms[2], sizeof syms[2]);
    memcpy(&cu.ctx_wait, &syms[3], sizeof syms[3]);
    memcpy(&cu.event_query, &syms[4], sizeof syms[4]);
    for (int d = 0; d < FLOOR_MAX_DEVICES; d++)
        pthread_mutex_init(&fences[d].lock, NULL);
    fence_mode = 1;
}

/* A driver call that failed: said, and the request refused. */
static cudaError_t fence_failed(const char *call, int rc, int device)
{
    fprintf(stderr, "floor: FLOOR_FENCE=1: %s failed with CUresult %d on device %d; the request is refused\n", call,
            rc, device);
    return FLOOR_NO_RUNTIME;
}

/* Before a cudaMalloc on `device` (its fence locked) may hand out a freed
 * block: the event the frees recorded has completed, or all later work
 * waits for it. The event is made at the device's first request, in the
 * context current then (the runtime's, which has just taken the arena). */
static cudaError_t fence_before_malloc(fence_t *f, int device)
{
    int rc;
    if (!f->event) {
        if ((rc = cu.ctx_get_current(&f->ctx)) != 0 || !f->ctx)
            return fence_failed("cuCtxGetCurrent", rc, device);
        if ((rc = cu.event_create(&f->event, CU_EVENT_DISABLE_TIMING)) != 0) {
            f->event = NULL;
            return fence_failed("cuEventCreate", rc, device);
        }
    }
    if (!f->pending)
        return FLOOR_SUCCESS;
    rc = cu.event_query(f->event);
    if (rc == CU_ERROR_NOT_READY && (rc = cu.ctx_wait(f->ctx, f->event)) != 0)
        return fence_failed("cuCtxWaitEvent", rc, device);
    if (rc != 0)
        return fence_failed("cuEventQuery", rc, device);
    f->pending = 0;
    return FLOOR_SUCCESS;
}

API cudaError_t cudaMalloc(void **ptr, size_t size);
API cudaError_t cudaFree(void *ptr);

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    REAL(get_device_fn, get_device, "cudaGetDevice");
    if (!ptr)
        return FLOOR_INVALID_VALUE;
    *ptr = NULL;
    if (size == 0)
        return FLOOR_SUCCESS;   /* as the real one: NULL, and success */
    int device = 0;
    if (!get_device)
        return FLOOR_NO_RUNTIME;
    cudaError_t rc = get_device(&device);
    if (rc != FLOOR_SUCCESS)
        return rc;
    pthread_once(&fence_once, fence_setup);
    if (fence_mode < 0)
        return FLOOR_INVALID_VALUE;
    floor_arena_t *a = floor_device_arena(device, take_from_runtime);
    if (!a)
        return FLOOR_OUT_OF_MEMORY;
    uintptr_t p;
    if (fence_mode) {
        fence_t *f = &fences[device];
        pthread_mutex_lock(&f->lock);
        rc = fence_before_malloc(f, device);
        p = rc == FLOOR_SUCCESS ? floor_arena_alloc(a, size, "cudaMalloc") : 0;
        pthread_mutex_unlock(&f->lock);
        if (rc != FLOOR_SUCCESS)
            return rc;
    } else {
        p = floor_arena_alloc(a, size, "cudaMalloc");
    }
    if (!p)
        return FLOOR_OUT_OF_MEMORY;
    *ptr = (void *)p;
    return FLOOR_SUCCESS;
}

cudaError_t cudaFree(void *ptr)
{
    floor_arena_t *a = ptr ? floor_arena_owning((uintptr_t)ptr) : NULL;
    if (a)
        pthread_once(&fence_once, fence_setup);   /* done already: the block came from a cudaMalloc */
    if (a && fence_mode == 1) {
        /* Recorded before the block is back in its list: no cudaMalloc can
         * take it unfenced. */
        fence_t *f = &fences[a->device];
        pthread_mutex_lock(&f->lock);
        int rc = f->event ? cu.ctx_record(f->ctx, f->event) : 0;
        int freed = rc == 0 ? floor_arena_free(a, (uintptr_t)ptr, "cudaFree") : 0;
        f->pending |= freed == 1;
        pthread_mutex_unlock(&f->lock);
        if (rc != 0)
            return fence_failed("cuCtxRecordEvent", rc, a->device);
        return freed == 1 ? FLOOR_SUCCESS : FLOOR_INVALID_VALUE;
    }
    if (a)
        return floor_arena_free(a, (uintptr_t)ptr, "cudaFree") == 1 ? FLOOR_SUCCESS : FLOOR_INVALID_VALUE;
    REAL(free_fn, real_free, "cudaFree");
    return real_free ? real_free(ptr) : FLOOR_NO_RUNTIME;
}
