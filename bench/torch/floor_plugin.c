/* floor_plugin.c - the floor (floor.h) as PyTorch's pluggable allocator:
 *
 *   torch.cuda.memory.CUDAPluggableAllocator("libfloor_plugin.so", "floor_alloc", "floor_free")
 *
 * PyTorch calls floor_alloc and floor_free for every tensor, with the device
 * and the stream; the floor serves them from the device's arena and ignores
 * the stream. Each arena is taken once from the driver (libcuda.so.1, found
 * with dlopen; no CUDA library is linked): cuMemAlloc_v2 in the device's
 * primary context, retained for the process, pushed for that one call.
 *
 * PyTorch's plugin interface has no way to refuse an allocation (a NULL
 * becomes a tensor with no memory behind it), so a request the arena cannot
 * serve stops the process, after the message that says which setting to
 * raise: a benchmark must not go on with tensors that have no memory.
 *
 * Built with -DFLOOR_CUDA_HEADERS and CUDA's include folder, the compiler
 * checks the driver calls declared here against cuda.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* RTLD_NEXT */
#endif
#include "floor.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#ifdef FLOOR_CUDA_HEADERS
#include <cuda.h>
#include <cuda_runtime_api.h>
#define SAME_TYPE(fn, type) _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type), #fn " differs")
#else
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct CUstream_st *cudaStream_t;
#define SAME_TYPE(fn, type) _Static_assert(1, "")
#endif

#define API __attribute__((visibility("default")))

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*push_fn)(CUcontext);
typedef CUresult (*pop_fn)(CUcontext *);
typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
SAME_TYPE(cuInit, init_fn);
SAME_TYPE(cuDeviceGet, device_get_fn);
SAME_TYPE(cuDevicePrimaryCtxRetain, retain_fn);
SAME_TYPE(cuCtxPushCurrent_v2, push_fn);
SAME_TYPE(cuCtxPopCurrent_v2, pop_fn);
SAME_TYPE(cuMemAlloc_v2, mem_alloc_fn);

/* The driver's function `name`, or NULL (said on stderr). */
static void *driver(const char *name)
{
    static void *lib;
    if (!lib && !(lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL))) {
        fprintf(stderr, "floor: cannot load the CUDA driver: %s\n", dlerror());
        return NULL;
    }
    void *fn = dlsym(lib, name);
    if (!fn)
        fprintf(stderr, "floor: the CUDA driver has no %s\n", name);
    return fn;
}

/* A driver function pointer from dlsym's void *. */
#define DRIVER(type, var, name)                 \
    type var;                                   \
    do {                                        \
        void *sym_ = driver(name);              \
        if (!sym_)                              \
            return -1;                          \
        memcpy(&var, &sym_, sizeof var);        \
    } while (0)

/* Takes the arena with cuMemAlloc_v2 in the device's primary context (the
 * floor's open lock held: once per device). */
static int take_from_driver(int device, size_t bytes, uintptr_t *base)
{
    DRIVER(init_fn, init, "cuInit");
    DRIVER(device_get_fn, device_get, "cuDeviceGet");
    DRIVER(retain_fn, retain, "cuDevicePrimaryCtxRetain");
    DRIVER(push_fn, push, "cuCtxPushCurrent_v2");
    DRIVER(pop_fn, pop, "cuCtxPopCurrent_v2");
    DRIVER(mem_alloc_fn, mem_alloc, "cuMemAlloc_v2");
    CUdevice dev;
    CUcontext ctx, popped;
    CUdeviceptr ptr = 0;
    const char *what = "cuInit";
    CUresult r = init(0);
    if (r == 0 && (what = "cuDeviceGet", r = device_get(&dev, device)) == 0 &&
        (what = "cuDevicePrimaryCtxRetain", r = retain(&ctx, dev)) == 0 &&
        (what = "cuCtxPushCurrent_v2", r = push(ctx)) == 0) {
        what = "cuMemAlloc_v2";
        r = mem_alloc(&ptr, bytes);
        pop(&popped);
    }
    if (r != 0) {
        fprintf(stderr, "floor: device %d: %s failed with CUDA error %d%s\n", device, what, (int)r,
                r == 2 ? " (out of memory: lower FLOOR_ARENA)" : "");
        return -1;
    }
    *base = (uintptr_t)ptr;
    return 0;
}

API void *floor_alloc(ssize_t size, int device, cudaStream_t stream);
API void floor_free(void *ptr, ssize_t size, int device, cudaStream_t stream);

void *floor_alloc(ssize_t size, int device, cudaStream_t stream)
{
    (void)stream;
    if (size == 0)
        return NULL;   /* no memory asked for: PyTorch's own answer too */
    floor_arena_t *a = size > 0 ? floor_device_arena(device, take_from_driver) : NULL;
    uintptr_t p = a ? floor_arena_alloc(a, (size_t)size, "floor_alloc") : 0;
    if (!p) {
        fprintf(stderr, "floor: floor_alloc(%zd bytes, device %d) cannot be served, and PyTorch's plugin interface "
                "has no way to refuse: the process stops\n", size, device);
        abort();
    }
    return (void *)p;
}

void floor_free(void *ptr, ssize_t size, int device, cudaStream_t stream)
{
    (void)size, (void)device, (void)stream;
    if (!ptr)
        return;
    floor_arena_t *a = floor_arena_owning((uintptr_t)ptr);
    if (!a)
        fprintf(stderr, "floor: floor_free(%p) refused: not the floor's memory\n", ptr);
    else
        floor_arena_free(a, (uintptr_t)ptr, "floor_free");
}
