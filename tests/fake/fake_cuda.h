/* fake_cuda.h - the test helpers the fake driver (fake_cuda.c, built as
 * libcuda.so.1) exports beside its driver functions, for test programs and
 * the fake runtime (fake_cudart.c).
 *
 * GPU work is pretended: a "kernel" is a check that bytes of a block still
 * hold an expected value when it runs. While held, work waits in its
 * stream's queue until the test completes it, so a test decides when the GPU
 * "finishes", and a block handed out again too early shows up as corrupt
 * bytes. Programs reach these helpers with dlsym on the driver's handle or,
 * like any driver function, through cuGetProcAddress.
 */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include <stddef.h>

/* Calls the fake driver has seen, for tests to tell cuheap's service from
 * the driver's. */
typedef struct fake_cuda_calls_s {
    unsigned long mem_allocs;      /* device allocations made (cuMemAlloc_v2, Async, Pitch) */
    unsigned long mem_frees;       /* device or managed allocations freed */
    unsigned long managed_allocs;  /* cuMemAllocManaged */
    unsigned long refused_frees;   /* frees of an address that starts no allocation */
    unsigned long unknown_streams; /* calls naming a stream that does not exist (destroyed) */
    unsigned long primary_resets;  /* cuDevicePrimaryCtxReset_v2 */
    unsigned long kernels_run;     /* checking kernels that ran */
    unsigned long stream_waits;    /* cuStreamWaitEvent calls */
    size_t used;                   /* device bytes allocated now (managed not counted) */
    size_t capacity;
    unsigned long access_grants[4]; /* cuMemSetAccess descriptors naming device d (d < 4) */
    unsigned long peer_enables;    /* cuCtxEnablePeerAccess calls that succeeded */
    unsigned long host_allocs;     /* page-locked host allocations made (cuMemHostAlloc, cuMemAllocHost_v2) */
    unsigned long host_frees;      /* and freed (cuMemFreeHost) */
    size_t host_bytes;             /* page-locked bytes held now */
    unsigned long ctx_records;     /* cuCtxRecordEvent calls that succeeded */
    unsigned long ctx_waits;       /* cuCtxWaitEvent calls that succeeded */
    unsigned long captures_broken; /* device-wide calls made while a stream was capturing */
    unsigned long captures_ended;  /* cuStreamEndCapture calls that returned a graph */
} fake_cuda_calls_t;

typedef void (*fake_cuda_calls_fn)(fake_cuda_calls_t *out);
typedef void (*fake_cuda_hold_fn)(int on);
typedef int (*fake_cuda_enqueue_check_fn)(void *stream, const void *ptr, size_t n, unsigned char expected);
typedef int (*fake_cuda_enqueue_fill_fn)(void *stream, void *ptr, size_t n, unsigned char value);
typedef void (*fake_cuda_complete_fn)(void *stream);
typedef void (*fake_cuda_complete_all_fn)(void);
typedef unsigned long (*fake_cuda_corrupt_bytes_fn)(void);
typedef int (*fake_cuda_alloc_foreign_fn)(unsigned long long *dptr, size_t size);
typedef int (*fake_cuda_stream_create_unseen_fn)(void **stream, unsigned int flags);
typedef void (*fake_cuda_set_capturing_fn)(void *stream, int on);
typedef unsigned long (*fake_cuda_pause_ctx_events_fn)(int on);
typedef unsigned long (*fake_cuda_count_fn)(const char *name);
typedef int (*fake_cuda_count_list_fn)(const char **names, unsigned long *counts, int max);

/* fake_cuda_calls(out): the counters above. */
/* fake_cuda_hold(on): while on, pretend kernels wait in their stream's queue;
 * off, they run when enqueued (queued work stays queued). */
/* fake_cuda_enqueue_check(stream, ptr, n, expected): a kernel on `stream`
 * that, when it runs, counts the bytes of ptr[0..n) that differ from
 * `expected`. Returns a CUresult. */
/* fake_cuda_enqueue_fill(stream, ptr, n, value): a kernel on `stream` that,
 * when it runs, writes `value` to ptr[0..n). cuStreamWaitEvent makes a
 * stream's later work run after what the event waited for. */
/* fake_cuda_complete(stream), fake_cuda_complete_all(): runs the queued work
 * of one stream, of every stream. */
/* fake_cuda_corrupt_bytes(): mismatching bytes every kernel so far saw. */
/* fake_cuda_alloc_foreign(dptr, size): device memory exactly as
 * cuMemAlloc_v2 gives it, under a name no hook catches (a foreign pointer). */
/* fake_cuda_set_capturing(stream, on): cuStreamIsCapturing reports the
 * stream as captured into a graph (on) or not, as cuStreamBeginCapture_v2
 * and cuStreamEndCapture set it. A device-wide call (cuCtxRecordEvent,
 * cuCtxWaitEvent) while a stream is capturing breaks the capture, as on a
 * GPU: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture's end returns
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. */
/* fake_cuda_pause_ctx_events(on): while on (1), cuCtxRecordEvent and
 * cuCtxWaitEvent wait at their start, before they look at any stream, until
 * it is off (0); -1 changes nothing. Returns the calls waiting now. For
 * tests of what may happen while a device-wide call is underway. */
/* fake_cuda_stream_create_unseen(stream, flags): a stream as cuStreamCreate
 * makes it, under a name no hook catches (a stream cuheap never hears of). */
/* fake_cuda_count(name): the calls of the driver function `name` so far
 * (its exported name: "cuCtxGetCurrent", "cuEventRecord"); NULL: the calls
 * of every driver function added up. A _ptsz form counts as its plain form,
 * cuGetProcAddress as cuGetProcAddress_v2. For tests and benchmarks that
 * hold a path to the driver calls it makes: take the count before and after. */
/* fake_cuda_count_list(names, counts, max): every driver function called so
 * far and its calls, up to max of them; returns how many were written. */

/* The fault plan (fake_faults.c): FAKE_CUDA_FAULTS's rules, replaced by
 * `spec` (the same syntax; "" for none) with the sticky rule's count
 * starting again; -1 for a malformed plan (said on stderr), which is then
 * no plan. */
int fake_cuda_faults(const char *spec);
/* Calls failed on purpose so far. */
unsigned long fake_cuda_faults_injected(void);
/* For the driver's own functions: the code the plan makes the nth call of
 * `name` return, 0 to let it run. */
int fake_fault_planned(const char *name, unsigned long nth);

#endif /* FAKE_CUDA_H */
