/* fake_cudart.h - the CUDA runtime functions the fake runtime (fake_cudart.c)
 * implements, declared for test programs with the real runtime's signatures
 * and error codes (0 success, 1 invalid value, 2 out of memory).
 */
#ifndef FAKE_CUDART_H
#define FAKE_CUDART_H

#include <stddef.h>

typedef int cudaError_t;
typedef void *cudaStream_t;

enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidDevice = 101 };
#define cudaStreamNonBlocking 0x1u
#define cudaEnablePerThreadDefaultStream 0x2ull
#define CUDA_IPC_HANDLE_SIZE 64

typedef struct cudaIpcMemHandle_st {
    char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcMemHandle_t;

cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags);
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaMallocAsync_ptsz(void **ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void *ptr, cudaStream_t stream);
cudaError_t cudaMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
/* mode: 0 global, 1 thread-local, 2 relaxed (cudaStreamCaptureMode); no graph is built. */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, void **graph);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMallocManaged(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaHostGetDevicePointer(void **device_ptr, void *host_ptr, unsigned int flags);
cudaError_t cudaHostGetFlags(unsigned int *flags, void *host_ptr);
#define cudaHostAllocDefault 0x0u
#define cudaHostAllocPortable 0x1u
#define cudaHostAllocMapped 0x2u
#define cudaHostAllocWriteCombined 0x4u
cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags, int *status);

/* Not CUDA: the driver's function `name` (its test helpers included, see
 * fake_cuda.h) through the runtime's cuGetProcAddress_v2; NULL if none. */
void *fakeCudartDriverFunction(const char *name);

#endif /* FAKE_CUDART_H */
