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

/* Serve every device from a simulated one of `capacity` bytes (tests). Only
 * before the first heap exists; returns -1 afterwards. */
int cuh_runtime_use_sim(size_t capacity);
/* Tears down every heap and forgets the settings (tests). */
void cuh_runtime_reset(void);

/* The heap of `device` (CUHEAP_CURRENT_DEVICE: the calling thread's), created
 * if needed. On failure a status and cuh_set_error's message. */
cuheap_status_t cuh_runtime_heap(int device, cuh_heap_t **heap);
/* The heap of `device` if it exists, else NULL. */
cuh_heap_t *cuh_runtime_existing_heap(int device);
/* The device objects behind heaps (for tests of the simulated devices). */
cuh_device_t *cuh_runtime_device(int device);

#endif /* CUH_RUNTIME_H */
