/* hook_torch.h - the C functions PyTorch's CUDAPluggableAllocator calls
 * (exported from libcuheap.so; scripts/cuheap_torch.py wires them in). The
 * signatures are PyTorch's: see hook_torch.c.
 */
#ifndef CUH_HOOK_TORCH_H
#define CUH_HOOK_TORCH_H

#include <cuheap.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

void *cuheap_torch_alloc(ssize_t size, int device, cuheap_stream_t stream);
void cuheap_torch_free(void *ptr, ssize_t size, int device, cuheap_stream_t stream);
void cuheap_torch_init(int device_count);
void cuheap_torch_reset(void);
void cuheap_torch_memory_fraction(double fraction, int device);
void cuheap_torch_record_stream(void *ptr, cuheap_stream_t stream);
void *cuheap_torch_base_alloc(void *ptr, size_t *size);
void cuheap_torch_begin_pool(int device, uint64_t id_first, uint64_t id_second, const void *filter);
void cuheap_torch_end_pool(int device, uint64_t id_first, uint64_t id_second);
void cuheap_torch_release_pool(int device, uint64_t id_first, uint64_t id_second);
/* PyTorch's out-of-memory observer, as torch._C._cuda_attach_out_of_memory_observer
 * calls it: the device, the bytes asked for, the most the device may hold and
 * its free bytes. NULL: none. */
typedef void (*cuheap_torch_oom_observer_t)(int device, int64_t requested, int64_t allowed, int64_t device_free);
void cuheap_torch_set_oom_observer(cuheap_torch_oom_observer_t observer);

#endif /* CUH_HOOK_TORCH_H */
