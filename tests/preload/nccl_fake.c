/* nccl_fake.c - stands in for NCCL in the preload tests: a shared library,
 * built as libnccl_fake.so (its file name holds "libnccl", what cuheap's
 * ipc_callers setting looks for by default), with its own copy of the fake
 * runtime compiled in, as NCCL links the CUDA runtime statically. Its
 * cudaMalloc therefore reaches cuheap only through the driver
 * (cuMemAlloc_v2 from cuGetProcAddress), from code inside this library:
 * what the hooks meet when NCCL takes its buffers with cudaMalloc to share
 * them with other processes through IPC handles.
 */
#include "fake_cudart.h"

#include <stddef.h>

__attribute__((visibility("default"))) void *nccl_fake_alloc(size_t size);
__attribute__((visibility("default"))) int nccl_fake_free(void *ptr);

/* A buffer of `size` bytes from this library's runtime, or NULL. */
void *nccl_fake_alloc(size_t size)
{
    void *ptr = NULL;
    return cudaMalloc(&ptr, size) == cudaSuccess ? ptr : NULL;
}

int nccl_fake_free(void *ptr) { return cudaFree(ptr); }
