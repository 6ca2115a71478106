/* hook_cuda.h - what the CUDA hooks share (used under LD_PRELOAD).
 *
 * hook_runtime.c defines the runtime's entry points (cudaMalloc ...),
 * hook_driver.c the driver's (cuMemAlloc_v2 ...) together with dlsym and
 * cuGetProcAddress, through which programs with a static runtime reach the
 * driver. Both only translate: a call becomes one of the decisions below,
 * which in turn call the runtime's heap functions (runtime.h); what cuheap
 * does not serve goes to the real CUDA function (device.h). The runtime and
 * the driver give the codes used here the same numbers.
 */
#ifndef CUH_HOOK_CUDA_H
#define CUH_HOOK_CUDA_H

#include "device.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* An entry point libcuheap.so exports for programs to bind to. */
#define CUH_HOOK __attribute__((visibility("default")))

/* cudaError_t and CUresult values (equal in both APIs). */
enum {
    CUH_CUDA_SUCCESS = 0,
    CUH_CUDA_INVALID_VALUE = 1,
    CUH_CUDA_OUT_OF_MEMORY = 2,
    CUH_CUDA_NOT_SUPPORTED = 801,
    CUH_CUDA_UNKNOWN = 999
};

/* How a stream argument reads: the legacy default stream (0 or
 * cudaStreamLegacy) is stream 0; a per-thread default stream is a different
 * stream in each thread, which cuheap cannot name from another thread, so its
 * blocks are handled device-wide (safe on every stream). */
typedef struct cuh_hook_stream_s {
    int device_wide;
    cuh_stream_t stream;
} cuh_hook_stream_t;

cuh_hook_stream_t cuh_hook_stream(const void *stream, int per_thread_default);
/* cudaMalloc's and cudaFree's "any stream". */
#define CUH_HOOK_ANY_STREAM ((cuh_hook_stream_t){.device_wide = 1, .stream = 0})

/* 1 when `stream` is being captured into a CUDA graph. Stream-ordered
 * allocations there go to CUDA (they become the graph's memory nodes). */
int cuh_hook_capturing(const void *stream, int per_thread_default);
/* The handle that names `stream` everywhere: stream 0 of an entry point with
 * the per-thread default stream (_ptsz) is CU_STREAM_PER_THREAD. */
const void *cuh_hook_stream_handle(const void *stream, int per_thread_default);

/* A stream-ordered free of `ptr` during a capture: 1 when it is cuheap's,
 * which then keeps the block (a replay may use it at any later time; the
 * first time is reported on stderr); 0 when it is not (pass it on). */
int cuh_hook_keep_captured_free(const char *fn, void *ptr);

/* The device whose heap serves the calling thread, or -1 to pass the call to
 * CUDA: a thread whose current context is not a primary one (memory from the
 * primary context is not usable there), or, for the driver API, a thread
 * with no context at all (CUDA's error is the answer). */
int cuh_hook_device(int runtime_api);
/* The same, and *current 1 when the device's primary context is the one
 * current on the thread (0: none is, and the runtime would make it so). */
int cuh_hook_device_current(int runtime_api, int *current);

/* Serves an allocation on `device`; returns the CUDA code. Out of memory
 * prints cuheap's explanation; size 0 gives NULL and success. `caller` is
 * the hooked function's return address (__builtin_return_address(0)), or
 * NULL: a device-wide allocation called from a library named by the
 * ipc_callers setting gets a segment of its own, so that the library can
 * share it through an IPC handle. */
int cuh_hook_malloc(const char *fn, void **ptr, size_t size, int device, cuh_hook_stream_t stream,
                    const void *caller);
/* The same where cuh_hook_device_current found the device's primary context
 * current (`current`): the device's calls in it then take it to be, and do
 * not ask again (cuh_cuda_assume_current). */
int cuh_hook_malloc_current(const char *fn, void **ptr, size_t size, int device, int current,
                            cuh_hook_stream_t stream, const void *caller);

/* cudaMallocPitch and cuMemAllocPitch_v2 once their arguments are valid:
 * rows of `width` bytes rounded up to 512 (every block's alignment), the
 * pitch set on success; the CUDA code. */
int cuh_hook_malloc_pitch(const char *fn, void **ptr, size_t *pitch, size_t width, size_t height, int device,
                          const void *caller);

/* Frees a cuheap block: 1 with *code set when the pointer is cuheap's
 * (CUDA's invalid-value code, and a message on stderr, for a double free or
 * a pointer inside a block); 0 when it is not (pass it to CUDA). */
int cuh_hook_free(const char *fn, void *ptr, cuh_hook_stream_t stream, int *code);

/* Pinned host memory (cudaHostAlloc, cudaMallocHost, cuMemHostAlloc,
 * cuMemAllocHost_v2): 1 with *code set when cuheap's pinned cache served
 * the call; 0 to pass it to CUDA: setting pinned:0, size 0, flags cuheap
 * leaves to CUDA (write-combined, unknown bits), or no primary context
 * (the driver API without a current context). Out of memory prints
 * cuheap's explanation. */
int cuh_hook_host_alloc(const char *fn, void **ptr, size_t size, unsigned flags, int runtime_api, int *code);
/* cudaFreeHost, cuMemFreeHost: 1 with *code when the pointer is the
 * cache's (an error code and a message for a double free or a pointer
 * inside a buffer); 0 when it is not (pass it to CUDA). */
int cuh_hook_host_free(const char *fn, void *ptr, int *code);

/* cudaMemGetInfo and cuMemGetInfo: adds cuheap's cached bytes that are ready
 * for reuse to the device's free bytes (setting meminfo_cached). */
void cuh_hook_meminfo(size_t *free_bytes, size_t *total_bytes);

/* IPC handles: 0 when the call may go to CUDA (not cuheap's, or a block
 * that starts its segment, so the handle names exactly its memory); else
 * the CUDA code to return, with a message on stderr. */
int cuh_hook_ipc_check(const char *fn, const void *ptr);

/* Streams: a new non-blocking stream is covered by cudaFree's promise from
 * now on; a stream about to be destroyed gets its last events. */
void cuh_hook_stream_created(const void *stream, unsigned int flags);
void cuh_hook_stream_destroying(const void *stream);

/* The device's primary context is about to be reset: drop its heap. */
void cuh_hook_device_reset(int device);
/* Peer access was enabled from the current context's device to `owner`'s
 * memory (cudaDeviceEnablePeerAccess, cuCtxEnablePeerAccess succeeded):
 * cuheap's virtual memory on `owner` is made accessible to it. */
void cuh_hook_peer_enabled(int owner);

/* A CUDA function pointer from the void * dlsym gives. */
#define CUH_FN(dst, sym) memcpy(&(dst), &(void *){(sym)}, sizeof(dst))

/* The real function `name` found by `lookup` (cuh_cuda_runtime_function or
 * cuh_cuda_driver_function), looked up once into *cache. */
void *cuh_hook_real(void *(*lookup)(const char *), const char *name, void *_Atomic *cache);

/* In a hook: declares `fn`, the real function `name` of type `type`, or
 * returns `missing` from the hook when CUDA has no such function. */
#define CUH_REAL(lookup, type, name, missing)                       \
    static void *_Atomic cache_;                                    \
    __typeof__(type) fn;                                            \
    CUH_FN(fn, cuh_hook_real((lookup), (name), &cache_));           \
    if (!fn)                                                        \
        return (missing)

#endif /* CUH_HOOK_CUDA_H */
