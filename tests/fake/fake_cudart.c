/* fake_cudart.c - a stand-in CUDA runtime that reaches the driver the way the
 * real one does, so cuheap's hooks meet in CI what they meet on a GPU.
 *
 * On first use it loads the driver with dlopen("libcuda.so.1"), looks up
 * cuGetProcAddress_v2 with dlsym on that handle, and takes every driver
 * function it uses through cuGetProcAddress_v2 (CUDA 13.0; the per-thread
 * flag for the _ptsz entry points), never by symbol. It then retains device
 * 0's primary context and makes it current, in each thread that calls it.
 * cudaFree synchronizes the context before freeing, as the real runtime
 * does; driver codes 0 to 4, 214 and 700 to 719 are returned as they are
 * (success, invalid value, out of memory, not initialized, and the sticky
 * errors), any other as 999 (unknown), as the real runtime maps them.
 *
 * It is built twice: as build/fake/libcudart.so.13, which a program links to
 * (the shared runtime: a preloaded cudaMalloc is found before this one), and
 * compiled with -DFAKE_CUDART_STATIC -fvisibility=hidden into a test program
 * (the static runtime, nvcc's default: the program's calls stay inside it,
 * and only the dlsym and cuGetProcAddress path can reach cuheap).
 */
#define _GNU_SOURCE
#include "fake_cudart.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#ifdef FAKE_CUDART_STATIC
#define RUNTIME_API
#else
#define RUNTIME_API __attribute__((visibility("default")))
#endif

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void *CUcontext;

#define DRIVER_VERSION 13000
#define PER_THREAD_DEFAULT_STREAM 0x2ull
#define CUDA_ERROR_UNKNOWN_RUNTIME 999
#define CU_MEM_ATTACH_GLOBAL 0x1u

static struct {
    pthread_once_t once;
    int ready;
    CUcontext primary;
    CUresult (*cuGetProcAddress_v2)(const char *, void **, int, unsigned long long, int *);
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxReset)(CUdevice);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, cudaStream_t);
    CUresult (*cuMemAllocAsync_ptsz)(CUdeviceptr *, size_t, cudaStream_t);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, cudaStream_t);
    CUresult (*cuMemFreeAsync_ptsz)(CUdeviceptr, cudaStream_t);
    CUresult (*cuMemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*cuMemGetInfo)(size_t *, size_t *);
    CUresult (*cuStreamCreate)(cudaStream_t *, unsigned);
    CUresult (*cuStreamDestroy)(cudaStream_t);
    CUresult (*cuStreamBeginCapture)(cudaStream_t, int);
    CUresult (*cuStreamEndCapture)(cudaStream_t, void **);
    CUresult (*cuIpcGetMemHandle)(void *, CUdeviceptr);
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
    CUresult (*cuMemAllocHost)(void **, size_t);
    CUresult (*cuMemFreeHost)(void *);
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
    CUresult (*cuMemHostGetFlags)(unsigned *, void *);
} driver = {.once = PTHREAD_ONCE_INIT};

static _Thread_local int context_made_current;

static void *driver_function(const char *name, unsigned long long flags)
{
    void *fn = NULL;
    int status = -1;
    if (driver.cuGetProcAddress_v2(name, &fn, DRIVER_VERSION, flags, &status) != 0)
        return NULL;
    return fn;
}

static int resolve(void *field, const char *name, unsigned long long flags)
{
    void *fn = driver_function(name, flags);
    memcpy(field, &fn, sizeof fn);
    return fn != NULL;
}

static void load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *entry = lib ? dlsym(lib, "cuGetProcAddress_v2") : NULL;
    if (!entry)
        return;
    memcpy(&driver.cuGetProcAddress_v2, &entry, sizeof entry);
    int ok = resolve(&driver.cuInit, "cuInit", 0) && resolve(&driver.cuDeviceGet, "cuDeviceGet", 0) &&
             resolve(&driver.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0) &&
             resolve(&driver.cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 0) &&
             resolve(&driver.cuCtxGetCurrent, "cuCtxGetCurrent", 0) &&
             resolve(&driver.cuCtxSetCurrent, "cuCtxSetCurrent", 0) &&
             resolve(&driver.cuCtxGetDevice, "cuCtxGetDevice", 0) &&
             resolve(&driver.cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 0) &&
             resolve(&driver.cuCtxSynchronize, "cuCtxSynchronize", 0) &&
             resolve(&driver.cuMemAlloc, "cuMemAlloc", 0) &&
             resolve(&driver.cuMemAllocManaged, "cuMemAllocManaged", 0) &&
             resolve(&driver.cuMemFree, "cuMemFree", 0) &&
             resolve(&driver.cuMemAllocAsync, "cuMemAllocAsync", 0) &&
             resolve(&driver.cuMemAllocAsync_ptsz, "cuMemAllocAsync", PER_THREAD_DEFAULT_STREAM) &&
             resolve(&driver.cuMemFreeAsync, "cuMemFreeAsync", 0) &&
             resolve(&driver.cuMemFreeAsync_ptsz, "cuMemFreeAsync", PER_THREAD_DEFAULT_STREAM) &&
             resolve(&driver.cuMemAllocPitch, "cuMemAllocPitch", 0) &&
             resolve(&driver.cuMemGetInfo, "cuMemGetInfo", 0) &&
             resolve(&driver.cuStreamCreate, "cuStreamCreate", 0) &&
             resolve(&driver.cuStreamDestroy, "cuStreamDestroy", 0) &&
             resolve(&driver.cuStreamBeginCapture, "cuStreamBeginCapture", 0) &&
             resolve(&driver.cuStreamEndCapture, "cuStreamEndCapture", 0) &&
             resolve(&driver.cuIpcGetMemHandle, "cuIpcGetMemHandle", 0) &&
             resolve(&driver.cuMemHostAlloc, "cuMemHostAlloc", 0) &&
             resolve(&driver.cuMemAllocHost, "cuMemAllocHost", 0) &&
             resolve(&driver.cuMemFreeHost, "cuMemFreeHost", 0) &&
             resolve(&driver.cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer", 0) &&
             resolve(&driver.cuMemHostGetFlags, "cuMemHostGetFlags", 0);
    CUdevice device;
    if (!ok || driver.cuInit(0) != 0 || driver.cuDeviceGet(&device, 0) != 0 ||
        driver.cuDevicePrimaryCtxRetain(&driver.primary, device) != 0)
        return;
    driver.ready = 1;
}

/* Loads the driver once and makes the primary context current in this
 * thread if no context is; 0 when the runtime is usable. */
static int ready(void)
{
    pthread_once(&driver.once, load_driver);
    if (!driver.ready)
        return -1;
    if (!context_made_current) {
        CUcontext current = NULL;
        if (driver.cuCtxGetCurrent(&current) == 0 && !current)
            driver.cuCtxSetCurrent(driver.primary);
        context_made_current = 1;
    }
    return 0;
}

/* The runtime's code for a driver code: the real runtime's equals the
 * driver's for these (its sticky errors among them: an illegal address and
 * the other faults of a kernel, a lost or destroyed context). */
static cudaError_t runtime_code(CUresult r)
{
    int same = r == 0 || r == 1 || r == 2 || r == 3 || r == 4 || r == 214 || (r >= 700 && r <= 719);
    return same ? r : CUDA_ERROR_UNKNOWN_RUNTIME;
}

#define READY_OR_FAIL()                         \
    do {                                        \
        if (ready() != 0)                       \
            return CUDA_ERROR_UNKNOWN_RUNTIME;  \
    } while (0)

/* Device `device`'s primary context (retained); a runtime error code. */
static cudaError_t primary_context(int device, CUcontext *ctx)
{
    CUdevice dev;
    if (driver.cuDeviceGet(&dev, device) != 0)
        return cudaErrorInvalidDevice;
    return driver.cuDevicePrimaryCtxRetain(ctx, dev) != 0 ? CUDA_ERROR_UNKNOWN_RUNTIME : cudaSuccess;
}

/* The device's primary context becomes this thread's current context. */
RUNTIME_API cudaError_t cudaSetDevice(int device)
{
    READY_OR_FAIL();
    CUcontext ctx;
    cudaError_t e = primary_context(device, &ctx);
    return e != cudaSuccess ? e : runtime_code(driver.cuCtxSetCurrent(ctx));
}

/* The current device may access `peer`'s memory: the driver's
 * cuCtxEnablePeerAccess with the peer's primary context, as the real
 * runtime does. */
RUNTIME_API cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    READY_OR_FAIL();
    CUcontext ctx;
    cudaError_t e = primary_context(peer, &ctx);
    return e != cudaSuccess ? e : runtime_code(driver.cuCtxEnablePeerAccess(ctx, flags));
}

RUNTIME_API cudaError_t cudaGetDevice(int *device)
{
    READY_OR_FAIL();
    CUdevice dev;
    if (!device || driver.cuCtxGetDevice(&dev) != 0)
        return cudaErrorInvalidValue;
    *device = dev;
    return cudaSuccess;
}

RUNTIME_API cudaError_t cudaMalloc(void **ptr, size_t size)
{
    READY_OR_FAIL();
    if (!ptr)
        return cudaErrorInvalidValue;
    *ptr = NULL;
    if (size == 0)
        return cudaSuccess;
    CUdeviceptr d = 0;
    CUresult r = driver.cuMemAlloc(&d, size);
    *ptr = (void *)(uintptr_t)d;
    return runtime_code(r);
}

RUNTIME_API cudaError_t cudaFree(void *ptr)
{
    READY_OR_FAIL();
    if (!ptr)
        return cudaSuccess;
    driver.cuCtxSynchronize();
    return runtime_code(driver.cuMemFree((CUdeviceptr)(uintptr_t)ptr));
}

static cudaError_t malloc_async(void **ptr, size_t size, cudaStream_t stream,
                                CUresult (*alloc)(CUdeviceptr *, size_t, cudaStream_t))
{
    if (!ptr)
        return cudaErrorInvalidValue;
    *ptr = NULL;
    if (size == 0)
        return cudaSuccess;
    CUdeviceptr d = 0;
    CUresult r = alloc(&d, size, stream);
    *ptr = (void *)(uintptr_t)d;
    return runtime_code(r);
}

RUNTIME_API cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    READY_OR_FAIL();
    return malloc_async(ptr, size, stream, driver.cuMemAllocAsync);
}

RUNTIME_API cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream)
{
    READY_OR_FAIL();
    return malloc_async(ptr, size, stream, driver.cuMemAllocAsync_ptsz);
}

RUNTIME_API cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    READY_OR_FAIL();
    return ptr ? runtime_code(driver.cuMemFreeAsync((CUdeviceptr)(uintptr_t)ptr, stream)) : cudaSuccess;
}

RUNTIME_API cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream)
{
    READY_OR_FAIL();
    return ptr ? runtime_code(driver.cuMemFreeAsync_ptsz((CUdeviceptr)(uintptr_t)ptr, stream)) : cudaSuccess;
}

RUNTIME_API cudaError_t cudaMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height)
{
    READY_OR_FAIL();
    if (!ptr || !pitch)
        return cudaErrorInvalidValue;
    CUdeviceptr d = 0;
    CUresult r = driver.cuMemAllocPitch(&d, pitch, width, height, 4);
    *ptr = (void *)(uintptr_t)d;
    return runtime_code(r);
}

RUNTIME_API cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    READY_OR_FAIL();
    return runtime_code(driver.cuMemGetInfo(free_bytes, total_bytes));
}

RUNTIME_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    READY_OR_FAIL();
    return runtime_code(driver.cuStreamCreate(stream, flags));
}

RUNTIME_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    READY_OR_FAIL();
    return runtime_code(driver.cuStreamDestroy(stream));
}

RUNTIME_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode)
{
    READY_OR_FAIL();
    return runtime_code(driver.cuStreamBeginCapture(stream, mode));
}

RUNTIME_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, void **graph)
{
    READY_OR_FAIL();
    return runtime_code(driver.cuStreamEndCapture(stream, graph));
}

RUNTIME_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr)
{
    READY_OR_FAIL();
    return runtime_code(driver.cuIpcGetMemHandle(handle, (CUdeviceptr)(uintptr_t)ptr));
}

/* Resets the current device, as the real runtime does. */
RUNTIME_API cudaError_t cudaDeviceReset(void)
{
    READY_OR_FAIL();
    CUdevice dev = 0;
    if (driver.cuCtxGetDevice(&dev) != 0)
        dev = 0;
    return runtime_code(driver.cuDevicePrimaryCtxReset(dev));
}

RUNTIME_API cudaError_t cudaMallocManaged(void **ptr, size_t size, unsigned int flags)
{
    READY_OR_FAIL();
    if (!ptr)
        return cudaErrorInvalidValue;
    CUdeviceptr d = 0;
    CUresult r = driver.cuMemAllocManaged(&d, size, flags ? flags : CU_MEM_ATTACH_GLOBAL);
    *ptr = (void *)(uintptr_t)d;
    return runtime_code(r);
}

RUNTIME_API cudaError_t cudaDeviceSynchronize(void)
{
    READY_OR_FAIL();
    return runtime_code(driver.cuCtxSynchronize());
}

RUNTIME_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags, int *status)
{
    READY_OR_FAIL();
    if (!symbol || !fn)
        return cudaErrorInvalidValue;
    return runtime_code(driver.cuGetProcAddress_v2(symbol, fn, DRIVER_VERSION, flags, status));
}

RUNTIME_API void *fakeCudartDriverFunction(const char *name)
{
    return ready() == 0 ? driver_function(name, 0) : NULL;
}

/* Pinned host memory: cudaHostAlloc takes the driver's cuMemHostAlloc,
 * cudaMallocHost its cuMemAllocHost; size 0 gives NULL. cudaFreeHost does
 * not wait itself: the driver's cuMemFreeHost does. */
RUNTIME_API cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    READY_OR_FAIL();
    if (!ptr)
        return cudaErrorInvalidValue;
    *ptr = NULL;
    return size ? runtime_code(driver.cuMemHostAlloc(ptr, size, flags)) : cudaSuccess;
}

RUNTIME_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    READY_OR_FAIL();
    if (!ptr)
        return cudaErrorInvalidValue;
    *ptr = NULL;
    return size ? runtime_code(driver.cuMemAllocHost(ptr, size)) : cudaSuccess;
}

RUNTIME_API cudaError_t cudaFreeHost(void *ptr)
{
    READY_OR_FAIL();
    return ptr ? runtime_code(driver.cuMemFreeHost(ptr)) : cudaSuccess;
}

RUNTIME_API cudaError_t cudaHostGetDevicePointer(void **device_ptr, void *host_ptr, unsigned int flags)
{
    READY_OR_FAIL();
    if (!device_ptr)
        return cudaErrorInvalidValue;
    CUdeviceptr d = 0;
    CUresult r = driver.cuMemHostGetDevicePointer(&d, host_ptr, flags);
    *device_ptr = (void *)(uintptr_t)d;
    return runtime_code(r);
}

RUNTIME_API cudaError_t cudaHostGetFlags(unsigned int *flags, void *host_ptr)
{
    READY_OR_FAIL();
    return runtime_code(driver.cuMemHostGetFlags(flags, host_ptr));
}
