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
    floor_arena_t *a = floor_device_arena(device, take_from_runtime);
    uintptr_t p = a ? floor_arena_alloc(a, size, "cudaMalloc") : 0;
    if (!p)
        return FLOOR_OUT_OF_MEMORY;
    *ptr = (void *)p;
    return FLOOR_SUCCESS;
}

cudaError_t cudaFree(void *ptr)
{
    floor_arena_t *a = ptr ? floor_arena_owning((uintptr_t)ptr) : NULL;
    if (a)
        return floor_arena_free(a, (uintptr_t)ptr, "cudaFree") == 1 ? FLOOR_SUCCESS : FLOOR_INVALID_VALUE;
    REAL(free_fn, real_free, "cudaFree");
    return real_free ? real_free(ptr) : FLOOR_NO_RUNTIME;
}
