/* runtime.h - the process-wide state behind the public API: the settings and
 * one heap per device, created at first use.
 *
 * Entry points (the C API in api.c, and later the hooks) reach heaps only
 * through here. Which devices stand behind the heaps is chosen once: the real
 * CUDA driver by default, or simulated devices for tests.
 */
#ifndef CUH_RUNTIME_H
#define CUH_RUNTIME_H

#include "heap.h"

#define CUH_MAX_DEVICES 64
/* Internal device argument: whichever heap owns the pointer. */
#define CUH_ANY_DEVICE (-2)

/* Serve every device from a simulated one of `capacity` bytes (tests). Only
 * before the first heap exists; returns -1 afterwards. */
int cuh_runtime_use_sim(size_t capacity);
/* Tears down every heap and forgets the settings (tests). */
void cuh_runtime_reset(void);
/* The process uses cuheap as PyTorch's pluggable allocator: unless
 * CUHEAP_CONF sets vmm, heaps run with vmm:1. No effect once the settings
 * have been read (the first heap, or cuheap_configure). */
void cuh_runtime_as_plugin(void);
/* The process's own CUDA allocation calls come to cuheap (LD_PRELOAD): unless
 * CUHEAP_CONF sets reuse_across_streams, heaps run with reuse_across_streams:1,
 * the ordering of the CUDA calls they replace. Same timing rule as above. */
void cuh_runtime_as_interposer(void);

/* The heap of `device` (CUHEAP_CURRENT_DEVICE: the calling thread's), created
 * if needed. On failure a status and cuh_set_error's message. */
cuheap_status_t cuh_runtime_heap(int device, cuh_heap_t **heap);
/* The heap of `device` if it exists, else NULL. */
cuh_heap_t *cuh_runtime_existing_heap(int device);
/* The device objects behind heaps (for tests of the simulated devices). */
cuh_device_t *cuh_runtime_device(int device);

/* ---- for the CUDA hooks (hook_*.c) ---------------------------------- */

/* Allocates on `device` (CUHEAP_CURRENT_DEVICE: the thread's) for `stream`,
 * or device-wide, then with `shareable` starting a segment of its own (see
 * cuh_heap_malloc_shareable); as cuheap_malloc, with `fn` naming the caller;
 * the block labelled `label` (0: none; cuh_heap_malloc_labelled). */
cuheap_status_t cuh_runtime_malloc(const char *fn, void **ptr, size_t size, int device, int device_wide,
                                   int shareable, cuh_stream_t stream, unsigned label);
/* Frees `ptr` in whichever heap owns it; on success *freed (if not NULL)
 * gives its requested bytes and label (cuh_heap_free_labelled).
 * CUHEAP_ERR_NOT_OWNED when none does (the hooks pass such pointers to
 * CUDA); a double free or a pointer inside a block is an error with its
 * message set. */
cuheap_status_t cuh_runtime_free_owned(const char *fn, void *ptr, int device_wide, cuh_stream_t stream,
                                       cuh_heap_freed_t *freed);
/* The device whose heap holds `addr` in a segment, or -1. */
int cuh_runtime_owner(uintptr_t addr);
/* A stream is about to be destroyed: every heap records its last event. */
void cuh_runtime_retire_stream(cuh_stream_t stream);
/* The device was reset: its heap and every block in it are gone. */
void cuh_runtime_drop_heap(int device);
/* Peer access was enabled: device `peer` may now access device `owner`'s
 * memory (see cuh_heap_allow_peer); remembered for a heap made later, once
 * per pair. */
cuheap_status_t cuh_runtime_allow_peer(int owner, int peer);
/* Pinned host memory (cudaHostAlloc & co.) from the pinned cache, for a
 * thread whose device is `device`; as cuheap_host_alloc, `fn` naming the
 * caller. Frees: CUHEAP_ERR_NOT_OWNED for a pointer the cache did not hand
 * out (the hooks pass it to CUDA). */
cuheap_status_t cuh_runtime_host_alloc(const char *fn, void **ptr, size_t size, unsigned flags, int device);
cuheap_status_t cuh_runtime_host_free(const char *fn, void *ptr);
/* The settings (CUHEAP_CONF read if not yet). */
const cuh_config_t *cuh_runtime_config(void);

#endif /* CUH_RUNTIME_H */
