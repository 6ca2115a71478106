/* hook_driver.c - the CUDA driver's allocation entry points, and the three
 * ways programs reach them: by symbol (a program linked with -lcuda), through
 * dlsym on the driver's handle, and through cuGetProcAddress.
 *
 * The CUDA runtime, static (nvcc's default) or shared, loads the driver with
 * dlopen("libcuda.so.1") and takes every function through dlsym and
 * cuGetProcAddress: symbol hooks alone see nothing of it. So libcuheap.so
 * also defines dlsym: any lookup whose answer is one of the driver functions
 * below gets cuheap's function instead, and cuGetProcAddress (itself reached
 * that way) does the same with what it returns. A function is recognized by
 * its address, compared with the real driver's, so every name and version
 * that leads to it is caught (cuMemAlloc at version 3020 is cuMemAlloc_v2;
 * cuMemAllocAsync with the per-thread flag is cuMemAllocAsync_ptsz).
 *
 * Served: cuMemAlloc_v2, cuMemFree_v2, cuMemAllocAsync, cuMemFreeAsync (and
 * _ptsz), cuMemAllocPitch_v2; pinned host memory: cuMemHostAlloc,
 * cuMemAllocHost_v2, cuMemFreeHost. Watched and passed on: cuMemGetInfo_v2,
 * cuStreamCreate, cuStreamCreateWithPriority, cuStreamDestroy_v2,
 * cuIpcGetMemHandle, cuDevicePrimaryCtxReset_v2, cuCtxEnablePeerAccess (the
 * peer gets access to cuheap's virtual memory), and the graph captures'
 * begins and ends (cuStreamBeginCapture in its five other forms,
 * cuStreamEndCapture and _ptsz). What the driver refuses
 * without cuheap (no current context, a zero size) it still refuses.
 *
 * dlsym(RTLD_NEXT, ...) keeps glibc's meaning (relative to its caller): it
 * is passed on as a tail call, and not substituted.
 */
#include "hook_cuda.h"
#include "common.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef int CUdevice;

/* ---- served and watched entry points ------------------------------------ */

/* `fn`: the real driver function (CUDA_ERROR_NOT_SUPPORTED if none). */
#define REAL(type, name) CUH_REAL(cuh_cuda_driver_function, type, name, CUH_CUDA_NOT_SUPPORTED)

/* -1: not served (pass on); else the code. */
static CUresult serve_malloc(const char *name, CUdeviceptr *dptr, size_t size, cuh_hook_stream_t stream,
                             const void *caller)
{
    int current = 0;
    int device = dptr ? cuh_hook_device_current(0, &current) : -1;
    if (device < 0)
        return -1;
    if (size == 0)
        return CUH_CUDA_INVALID_VALUE;   /* as the driver */
    void *p = NULL;
    CUresult code = cuh_hook_malloc_current(name, &p, size, device, current, stream, caller);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return code;
}

CUH_HOOK CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    CUresult code = serve_malloc("cuMemAlloc_v2", dptr, size, CUH_HOOK_ANY_STREAM, __builtin_return_address(0));
    if (code >= 0)
        return code;
    REAL(CUresult (*)(CUdeviceptr *, size_t), "cuMemAlloc_v2");
    return fn(dptr, size);
}

CUH_HOOK CUresult cuMemFree_v2(CUdeviceptr ptr);
CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    int code;
    if (ptr && cuh_hook_free("cuMemFree_v2", (void *)(uintptr_t)ptr, CUH_HOOK_ANY_STREAM, &code))
        return code;
    REAL(CUresult (*)(CUdeviceptr), "cuMemFree_v2");
    return fn(ptr);
}

CUH_HOOK CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    CUresult code = cuh_hook_capturing(stream, 0) ? -1
                                                          : serve_malloc("cuMemAllocAsync", dptr, size, cuh_hook_stream(stream, 0), NULL);
    if (code >= 0)
        return code;
    REAL(CUresult (*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync");
    return fn(dptr, size, stream);
}

CUH_HOOK CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    CUresult code = cuh_hook_capturing(stream, 1) ? -1
                                                          : serve_malloc("cuMemAllocAsync_ptsz", dptr, size, cuh_hook_stream(stream, 1), NULL);
    if (code >= 0)
        return code;
    REAL(CUresult (*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync_ptsz");
    return fn(dptr, size, stream);
}

CUH_HOOK CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream)
{
    int code;
    if (ptr && cuh_hook_capturing(stream, 0) && cuh_hook_keep_captured_free("cuMemFreeAsync", (void *)(uintptr_t)ptr))
        return CUH_CUDA_SUCCESS;
    if (ptr && cuh_hook_free("cuMemFreeAsync", (void *)(uintptr_t)ptr, cuh_hook_stream(stream, 0), &code))
        return code;
    REAL(CUresult (*)(CUdeviceptr, CUstream), "cuMemFreeAsync");
    return fn(ptr, stream);
}

CUH_HOOK CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream)
{
    int code;
    if (ptr && cuh_hook_capturing(stream, 1) && cuh_hook_keep_captured_free("cuMemFreeAsync_ptsz", (void *)(uintptr_t)ptr))
        return CUH_CUDA_SUCCESS;
    if (ptr && cuh_hook_free("cuMemFreeAsync_ptsz", (void *)(uintptr_t)ptr, cuh_hook_stream(stream, 1), &code))
        return code;
    REAL(CUresult (*)(CUdeviceptr, CUstream), "cuMemFreeAsync_ptsz");
    return fn(ptr, stream);
}

CUH_HOOK CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                     unsigned int element_size);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int element_size)
{
    int device = cuh_hook_device(0);
    if (device >= 0 && dptr && pitch) {
        if (!width || !height || (element_size != 4 && element_size != 8 && element_size != 16))
            return CUH_CUDA_INVALID_VALUE;   /* as the driver */
        void *p = (void *)(uintptr_t)*dptr;   /* left as it was if the size overflows */
        CUresult code = cuh_hook_malloc_pitch("cuMemAllocPitch_v2", &p, pitch, width, height, device,
                                              __builtin_return_address(0));
        *dptr = (CUdeviceptr)(uintptr_t)p;
        return code;
    }
    REAL(CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int), "cuMemAllocPitch_v2");
    return fn(dptr, pitch, width, height, element_size);
}

CUH_HOOK CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    REAL(CUresult (*)(size_t *, size_t *), "cuMemGetInfo_v2");
    CUresult code = fn(free_bytes, total_bytes);
    if (code == CUH_CUDA_SUCCESS)
        cuh_hook_meminfo(free_bytes, total_bytes);
    return code;
}

CUH_HOOK CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    REAL(CUresult (*)(CUstream *, unsigned int), "cuStreamCreate");
    CUresult code = fn(stream, flags);
    if (code == CUH_CUDA_SUCCESS)
        cuh_hook_stream_created(*stream, flags);
    return code;
}

CUH_HOOK CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority);
CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned int flags, int priority)
{
    REAL(CUresult (*)(CUstream *, unsigned int, int), "cuStreamCreateWithPriority");
    CUresult code = fn(stream, flags, priority);
    if (code == CUH_CUDA_SUCCESS)
        cuh_hook_stream_created(*stream, flags);
    return code;
}

CUH_HOOK CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamDestroy_v2(CUstream stream)
{
    REAL(CUresult (*)(CUstream), "cuStreamDestroy_v2");
    cuh_hook_stream_destroying(stream);
    return fn(stream);
}

CUH_HOOK CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr ptr);
CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr ptr)
{
    CUresult code = cuh_hook_ipc_check("cuIpcGetMemHandle", (const void *)(uintptr_t)ptr);
    if (code != CUH_CUDA_SUCCESS)
        return code;
    REAL(CUresult (*)(void *, CUdeviceptr), "cuIpcGetMemHandle");
    return fn(handle, ptr);
}

CUH_HOOK CUresult cuCtxEnablePeerAccess(void *peer_context, unsigned int flags);
CUresult cuCtxEnablePeerAccess(void *peer_context, unsigned int flags)
{
    REAL(CUresult (*)(void *, unsigned int), "cuCtxEnablePeerAccess");
    CUresult code = fn(peer_context, flags);
    if (code == CUH_CUDA_SUCCESS)
        cuh_hook_peer_enabled(cuh_cuda_context_device(peer_context));
    return code;
}

CUH_HOOK CUresult cuDevicePrimaryCtxReset_v2(CUdevice device);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice device)
{
    REAL(CUresult (*)(CUdevice), "cuDevicePrimaryCtxReset_v2");
    int ordinal = cuh_cuda_device_ordinal(device);
    if (ordinal >= 0)
        cuh_hook_device_reset(ordinal);
    return fn(device);
}

CUH_HOOK CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    int code;
    if (cuh_hook_host_alloc("cuMemHostAlloc", pp, bytesize, flags, 0, &code))
        return code;
    REAL(CUresult (*)(void **, size_t, unsigned int), "cuMemHostAlloc");
    return fn(pp, bytesize, flags);
}

CUH_HOOK CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    int code;
    if (cuh_hook_host_alloc("cuMemAllocHost_v2", pp, bytesize, 0, 0, &code))
        return code;
    REAL(CUresult (*)(void **, size_t), "cuMemAllocHost_v2");
    return fn(pp, bytesize);
}

CUH_HOOK CUresult cuMemFreeHost(void *p);
CUresult cuMemFreeHost(void *p)
{
    int code;
    if (p && cuh_hook_host_free("cuMemFreeHost", p, &code))
        return code;
    REAL(CUresult (*)(void *), "cuMemFreeHost");
    return fn(p);
}

/* Graph captures: cuheap's device-wide fences (cuCtxRecordEvent,
 * cuCtxWaitEvent) would invalidate one, so device_cuda.c is told of each
 * capture before it begins and after each end. The runtime's captures reach
 * these too: it takes the driver's functions through cuGetProcAddress. */
typedef void *CUgraph;
#define CAPTURE_BEGIN(name, per_thread, params, args, type)                   \
    CUH_HOOK CUresult name params;                                             \
    CUresult name params                                                       \
    {                                                                          \
        REAL(type, #name);                                                     \
        cuh_cuda_capture_beginning(cuh_hook_stream_handle(stream, per_thread)); \
        CUresult code = fn args;                                               \
        cuh_cuda_capture_begin_returned(cuh_hook_stream_handle(stream, per_thread), \
                                        code == CUH_CUDA_SUCCESS);             \
        return code;                                                           \
    }
CAPTURE_BEGIN(cuStreamBeginCapture, 0, (CUstream stream), (stream), CUresult (*)(CUstream))
CAPTURE_BEGIN(cuStreamBeginCapture_ptsz, 1, (CUstream stream), (stream), CUresult (*)(CUstream))
CAPTURE_BEGIN(cuStreamBeginCapture_v2, 0, (CUstream stream, int mode), (stream, mode), CUresult (*)(CUstream, int))
CAPTURE_BEGIN(cuStreamBeginCapture_v2_ptsz, 1, (CUstream stream, int mode), (stream, mode),
              CUresult (*)(CUstream, int))
CAPTURE_BEGIN(cuStreamBeginCaptureToGraph, 0,
              (CUstream stream, CUgraph graph, const void *deps, const void *edges, size_t n, int mode),
              (stream, graph, deps, edges, n, mode),
              CUresult (*)(CUstream, CUgraph, const void *, const void *, size_t, int))
CAPTURE_BEGIN(cuStreamBeginCaptureToGraph_ptsz, 1,
              (CUstream stream, CUgraph graph, const void *deps, const void *edges, size_t n, int mode),
              (stream, graph, deps, edges, n, mode),
              CUresult (*)(CUstream, CUgraph, const void *, const void *, size_t, int))
#undef CAPTURE_BEGIN

#define CAPTURE_END(name, per_thread)                                          \
    CUH_HOOK CUresult name(CUstream stream, CUgraph *graph);                  \
    CUresult name(CUstream stream, CUgraph *graph)                             \
    {                                                                          \
        REAL(CUresult (*)(CUstream, CUgraph *), #name);                        \
        CUresult code = fn(stream, graph);                                     \
        cuh_cuda_capture_ended(cuh_hook_stream_handle(stream, per_thread));    \
        return code;                                                           \
    }
CAPTURE_END(cuStreamEndCapture, 0)
CAPTURE_END(cuStreamEndCapture_ptsz, 1)
#undef CAPTURE_END

/* ---- recognizing the driver's functions wherever they are handed out ---- */

CUH_HOOK CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags);
CUH_HOOK CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, unsigned long long flags,
                                      int *symbol_status);

#define HOOK_ENTRY(name) {#name, (void (*)(void))name}
static const struct {
    const char *name;
    void (*hook)(void);
} hooked[] = {
    HOOK_ENTRY(cuMemAlloc_v2),
    HOOK_ENTRY(cuMemFree_v2),
    HOOK_ENTRY(cuMemAllocAsync),
    HOOK_ENTRY(cuMemAllocAsync_ptsz),
    HOOK_ENTRY(cuMemFreeAsync),
    HOOK_ENTRY(cuMemFreeAsync_ptsz),
    HOOK_ENTRY(cuMemAllocPitch_v2),
    HOOK_ENTRY(cuMemGetInfo_v2),
    HOOK_ENTRY(cuStreamCreate),
    HOOK_ENTRY(cuStreamCreateWithPriority),
    HOOK_ENTRY(cuStreamDestroy_v2),
    HOOK_ENTRY(cuIpcGetMemHandle),
    HOOK_ENTRY(cuDevicePrimaryCtxReset_v2),
    HOOK_ENTRY(cuCtxEnablePeerAccess),
    HOOK_ENTRY(cuMemHostAlloc),
    HOOK_ENTRY(cuMemAllocHost_v2),
    HOOK_ENTRY(cuMemFreeHost),
    HOOK_ENTRY(cuStreamBeginCapture),
    HOOK_ENTRY(cuStreamBeginCapture_ptsz),
    HOOK_ENTRY(cuStreamBeginCapture_v2),
    HOOK_ENTRY(cuStreamBeginCapture_v2_ptsz),
    HOOK_ENTRY(cuStreamBeginCaptureToGraph),
    HOOK_ENTRY(cuStreamBeginCaptureToGraph_ptsz),
    HOOK_ENTRY(cuStreamEndCapture),
    HOOK_ENTRY(cuStreamEndCapture_ptsz),
    HOOK_ENTRY(cuGetProcAddress),
    HOOK_ENTRY(cuGetProcAddress_v2),
};
#define NUM_HOOKED (sizeof hooked / sizeof hooked[0])

/* The real addresses, known once the program has loaded the driver. */
static struct {
    atomic_int ready;
    pthread_mutex_t lock;
    void *real[NUM_HOOKED];
} driver = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* cuheap's function for `fn` if it is one of the real driver's hooked
 * functions; `fn` itself otherwise. */
CUH_EARLY static void *substitute(void *fn)
{
    if (!fn)
        return fn;
    if (!atomic_load_explicit(&driver.ready, memory_order_acquire)) {
        /* Look only once a function of the driver itself is handed out: a
         * process that never uses CUDA must not get it loaded by cuheap.
         * (dladdr, not dlopen: this may run inside a sanitizer's start-up,
         * before its dlopen interceptor works.) */
        Dl_info info;
        if (!dladdr(fn, &info) || !info.dli_fname)
            return fn;
        const char *base = strrchr(info.dli_fname, '/');
        base = base ? base + 1 : info.dli_fname;
        if (strncmp(base, "libcuda.so", 10) != 0)
            return fn;
        pthread_mutex_lock(&driver.lock);
        if (!atomic_load_explicit(&driver.ready, memory_order_relaxed)) {
            for (size_t i = 0; i < NUM_HOOKED; i++)
                driver.real[i] = cuh_cuda_driver_function(hooked[i].name);
            atomic_store_explicit(&driver.ready, 1, memory_order_release);
        }
        pthread_mutex_unlock(&driver.lock);
    }
    for (size_t i = 0; i < NUM_HOOKED; i++)
        if (fn == driver.real[i]) {
            void *hook;
            memcpy(&hook, &(void (*)(void)){hooked[i].hook}, sizeof hook);
            return hook;
        }
    return fn;
}

CUH_HOOK void *dlsym(void *handle, const char *name);
/* The tail call below must be one in every build (sibling calls are an -O2
 * optimization): hence the optimize attribute. */
CUH_EARLY __attribute__((optimize("optimize-sibling-calls"))) void *dlsym(void *handle, const char *name)
{
    /* glibc answers RTLD_NEXT relative to the code that called its dlsym,
     * found from the return address: jump to it (a tail call), so that
     * address is our caller's, not libcuheap's. Otherwise an interposer
     * loaded after libcuheap.so would be handed its own function as the
     * "next" one. A driver function asked for this way is not substituted
     * (the runtime asks with the driver's handle). */
    if (handle == RTLD_NEXT) {
        void *(*real)(void *, const char *) = cuh_cuda_dlsym_function();
        return real(handle, name);
    }
    return substitute(cuh_cuda_real_dlsym(handle, name));
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags)
{
    REAL(CUresult (*)(const char *, void **, int, unsigned long long), "cuGetProcAddress");
    CUresult code = fn(symbol, pfn, cuda_version, flags);
    if (code == CUH_CUDA_SUCCESS && pfn)
        *pfn = substitute(*pfn);
    return code;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, unsigned long long flags,
                             int *symbol_status)
{
    REAL(CUresult (*)(const char *, void **, int, unsigned long long, int *), "cuGetProcAddress_v2");
    CUresult code = fn(symbol, pfn, cuda_version, flags, symbol_status);
    if (code == CUH_CUDA_SUCCESS && pfn)
        *pfn = substitute(*pfn);
    return code;
}
