/* support.h - what the LD_PRELOAD test programs share: failed expectations
 * counted and printed, cuheap's statistics reached the way a program run
 * under the preload can reach them (dlsym(RTLD_DEFAULT, "cuheap_get_stats"),
 * absent without the preload, which is then a failure), the fake driver's
 * test helpers, and data patterns written into blocks and read back.
 */
#ifndef PRELOAD_SUPPORT_H
#define PRELOAD_SUPPORT_H

#include "cuheap.h"
#include "fake_cuda.h"

#include <stddef.h>

#define MiB ((size_t)1 << 20)

/* Counts a failure and prints "FAIL: <message>" unless ok. Returns ok. */
int expect(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* cuheap's statistics of device 0; zeros and a failure when libcuheap.so is
 * not in the process. */
void heap_stats(cuheap_stats_t *out);
/* The same for any device. */
void heap_stats_of(int device, cuheap_stats_t *out);
/* cuheap's pinned host memory statistics, the same way. */
void host_stats(cuheap_host_stats_t *out);

/* The fake driver's test helpers, each looked up by name with `lookup`. */
typedef struct fake_helpers_s {
    fake_cuda_calls_fn calls;
    fake_cuda_hold_fn hold;
    fake_cuda_enqueue_check_fn enqueue_check;
    fake_cuda_enqueue_fill_fn enqueue_fill;
    fake_cuda_complete_fn complete;
    fake_cuda_complete_all_fn complete_all;
    fake_cuda_corrupt_bytes_fn corrupt_bytes;
    fake_cuda_alloc_foreign_fn alloc_foreign;
    fake_cuda_stream_create_unseen_fn stream_create_unseen;
    fake_cuda_set_capturing_fn set_capturing;
    fake_cuda_pause_ctx_events_fn pause_ctx_events;
} fake_helpers_t;
/* Exits with a failure when a helper is missing. */
void fake_helpers_load(fake_helpers_t *out, void *(*lookup)(const char *name));
/* The fake driver's calls (fake_helpers_load first). */
fake_cuda_calls_t fake_calls(const fake_helpers_t *fake);

/* Fills n bytes with a pattern made from seed; 1 when it is still there. */
void pattern_fill(void *p, size_t n, unsigned seed);
int pattern_intact(const void *p, size_t n, unsigned seed);

/* Prints "ok <mode>" or the failure count; the program's exit status. */
int finish(const char *mode);

#endif /* PRELOAD_SUPPORT_H */
