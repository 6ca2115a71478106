/* hook_runtime.c - the CUDA runtime's allocation entry points, for programs
 * run with LD_PRELOAD=libcuheap.so that load libcudart dynamically (PyTorch
 * does): the program binds to these before the runtime's own.
 *
 * Served by cuheap: cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync
 * (and the per-thread-default-stream _ptsz forms), cudaMallocPitch; and
 * pinned host memory: cudaHostAlloc, cudaMallocHost, cudaFreeHost. Watched
 * and passed on: cudaStreamCreateWithFlags/WithPriority and cudaStreamDestroy (the streams
 * cudaFree's promise must cover), cudaIpcGetMemHandle (never a handle to the
 * wrong memory), cudaDeviceReset (drops the device's heap),
 * cudaDeviceEnablePeerAccess (the peer gets access to cuheap's virtual
 * memory). Everything else,
 * and every pointer cuheap did not hand out, goes to the real runtime
 * untouched. A program with a static runtime never calls these; its runtime
 * reaches the driver, where hook_driver.c serves it. cudaMemGetInfo is left
 * to the runtime: it asks the driver's cuMemGetInfo_v2, which hook_driver.c
 * answers for both kinds of runtime (here it would count the cache twice).
 */
#include "hook_cuda.h"


typedef int cudaError_t;
typedef void *cudaStream_t;

/* `fn`: the real runtime function, or `missing` from the hook. */
#define REAL(type, name, missing) CUH_REAL(cuh_cuda_runtime_function, type, name, missing)

/* -1: not served (pass on); else the code. */
static cudaError_t serve_malloc(const char *fn, void **ptr, size_t size, cuh_hook_stream_t stream,
                                const void *caller)
{
    int current = 0;
    int device = ptr ? cuh_hook_device_current(1, &current) : -1;
    return device >= 0 ? cuh_hook_malloc_current(fn, ptr, size, device, current, stream, caller) : -1;
}

CUH_HOOK cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaMalloc(void **ptr, size_t size)
{
    cudaError_t code = serve_malloc("cudaMalloc", ptr, size, CUH_HOOK_ANY_STREAM, __builtin_return_address(0));
    if (code >= 0)
        return code;
    REAL(cudaError_t (*)(void **, size_t), "cudaMalloc", CUH_CUDA_UNKNOWN);
    return fn(ptr, size);
}

CUH_HOOK cudaError_t cudaFree(void *ptr);
cudaError_t cudaFree(void *ptr)
{
    int code;
    /* cudaFree(NULL) is how programs initialize the runtime: pass it on. */
    if (ptr && cuh_hook_free("cudaFree", ptr, CUH_HOOK_ANY_STREAM, &code))
        return code;
    REAL(cudaError_t (*)(void *), "cudaFree", CUH_CUDA_UNKNOWN);
    return fn(ptr);
}

static cudaError_t malloc_async(const char *name, void **ptr, size_t size, cudaStream_t stream, int ptds)
{
    if (cuh_hook_capturing(stream, ptds))
        return -1;   /* the graph's own memory node */
    return serve_malloc(name, ptr, size, cuh_hook_stream(stream, ptds), NULL);
}

CUH_HOOK cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    cudaError_t code = malloc_async("cudaMallocAsync", ptr, size, stream, 0);
    if (code >= 0)
        return code;
    REAL(cudaError_t (*)(void **, size_t, cudaStream_t), "cudaMallocAsync", CUH_CUDA_UNKNOWN);
    return fn(ptr, size, stream);
}

CUH_HOOK cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream)
{
    cudaError_t code = malloc_async("cudaMallocAsync_ptsz", ptr, size, stream, 1);
    if (code >= 0)
        return code;
    REAL(cudaError_t (*)(void **, size_t, cudaStream_t), "cudaMallocAsync_ptsz", CUH_CUDA_UNKNOWN);
    return fn(ptr, size, stream);
}

CUH_HOOK cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    int code;
    if (ptr && cuh_hook_capturing(stream, 0) && cuh_hook_keep_captured_free("cudaFreeAsync", ptr))
        return CUH_CUDA_SUCCESS;
    if (ptr && cuh_hook_free("cudaFreeAsync", ptr, cuh_hook_stream(stream, 0), &code))
        return code;
    REAL(cudaError_t (*)(void *, cudaStream_t), "cudaFreeAsync", CUH_CUDA_UNKNOWN);
    return fn(ptr, stream);
}

CUH_HOOK cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream)
{
    int code;
    if (ptr && cuh_hook_capturing(stream, 1) && cuh_hook_keep_captured_free("cudaFreeAsync_ptsz", ptr))
        return CUH_CUDA_SUCCESS;
    if (ptr && cuh_hook_free("cudaFreeAsync_ptsz", ptr, cuh_hook_stream(stream, 1), &code))
        return code;
    REAL(cudaError_t (*)(void *, cudaStream_t), "cudaFreeAsync_ptsz", CUH_CUDA_UNKNOWN);
    return fn(ptr, stream);
}

CUH_HOOK cudaError_t cudaMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height);
cudaError_t cudaMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height)
{
    int device = cuh_hook_device(1);
    if (ptr && pitch && width && height && device >= 0)
        return cuh_hook_malloc_pitch("cudaMallocPitch", ptr, pitch, width, height, device,
                                     __builtin_return_address(0));
    REAL(cudaError_t (*)(void **, size_t *, size_t, size_t), "cudaMallocPitch", CUH_CUDA_UNKNOWN);
    return fn(ptr, pitch, width, height);
}

CUH_HOOK cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    REAL(cudaError_t (*)(cudaStream_t *, unsigned int), "cudaStreamCreateWithFlags", CUH_CUDA_UNKNOWN);
    cudaError_t code = fn(stream, flags);
    if (code == CUH_CUDA_SUCCESS)
        cuh_hook_stream_created(*stream, flags);
    return code;
}

CUH_HOOK cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority)
{
    REAL(cudaError_t (*)(cudaStream_t *, unsigned int, int), "cudaStreamCreateWithPriority", CUH_CUDA_UNKNOWN);
    cudaError_t code = fn(stream, flags, priority);
    if (code == CUH_CUDA_SUCCESS)
        cuh_hook_stream_created(*stream, flags);
    return code;
}

CUH_HOOK cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    REAL(cudaError_t (*)(cudaStream_t), "cudaStreamDestroy", CUH_CUDA_UNKNOWN);
    cuh_hook_stream_destroying(stream);
    return fn(stream);
}

CUH_HOOK cudaError_t cudaIpcGetMemHandle(void *handle, void *ptr);
cudaError_t cudaIpcGetMemHandle(void *handle, void *ptr)
{
    cudaError_t code = cuh_hook_ipc_check("cudaIpcGetMemHandle", ptr);
    if (code != CUH_CUDA_SUCCESS)
        return code;
    REAL(cudaError_t (*)(void *, void *), "cudaIpcGetMemHandle", CUH_CUDA_UNKNOWN);
    return fn(handle, ptr);
}

CUH_HOOK cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    REAL(cudaError_t (*)(int, unsigned int), "cudaDeviceEnablePeerAccess", CUH_CUDA_UNKNOWN);
    cudaError_t code = fn(peer, flags);
    if (code == CUH_CUDA_SUCCESS)
        cuh_hook_peer_enabled(peer);
    return code;
}

CUH_HOOK cudaError_t cudaDeviceReset(void);
cudaError_t cudaDeviceReset(void)
{
    REAL(cudaError_t (*)(void), "cudaDeviceReset", CUH_CUDA_UNKNOWN);
    int device = cuh_hook_device(1);
    if (device >= 0)
        cuh_hook_device_reset(device);
    return fn();
}

CUH_HOOK cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    int code;
    if (cuh_hook_host_alloc("cudaHostAlloc", ptr, size, flags, 1, &code))
        return code;
    REAL(cudaError_t (*)(void **, size_t, unsigned int), "cudaHostAlloc", CUH_CUDA_UNKNOWN);
    return fn(ptr, size, flags);
}

CUH_HOOK cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    int code;
    if (cuh_hook_host_alloc("cudaMallocHost", ptr, size, 0, 1, &code))
        return code;
    REAL(cudaError_t (*)(void **, size_t), "cudaMallocHost", CUH_CUDA_UNKNOWN);
    return fn(ptr, size);
}

CUH_HOOK cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaFreeHost(void *ptr)
{
    int code;
    if (ptr && cuh_hook_host_free("cudaFreeHost", ptr, &code))
        return code;
    REAL(cudaError_t (*)(void *), "cudaFreeHost", CUH_CUDA_UNKNOWN);
    return fn(ptr);
}
