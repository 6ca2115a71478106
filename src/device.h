/* device.h - the device interface: the only door between cuheap and CUDA.
 *
 * The heap asks a device for segments of memory, for its free and total
 * memory, and for events that tell when GPU work on a stream has finished.
 * Two implementations stand behind this table of functions:
 *   device_cuda.c  the CUDA driver API, loaded at run time with
 *                  dlopen("libcuda.so.1"): no link-time dependency on CUDA;
 *   device_sim.c   a simulated GPU: a capacity and an address space, no host
 *                  memory behind it, events a test can hold incomplete.
 * Nothing above this layer includes a CUDA header or calls CUDA.
 *
 * Every function is thread-safe. Streams are the raw CUstream values (0 is the
 * legacy default stream); events are opaque handles owned by the device.
 */
#ifndef CUH_DEVICE_H
#define CUH_DEVICE_H

#include <stddef.h>
#include <stdint.h>

typedef uintptr_t cuh_stream_t;
typedef struct cuh_event_s *cuh_event_t;
typedef struct cuh_device_s cuh_device_t;

typedef enum cuh_dev_status_e {
    CUH_DEV_OK = 0,
    CUH_DEV_NOT_READY = 1,   /* event_query: the work has not finished yet */
    CUH_DEV_OOM = 2,         /* mem_alloc: the device has no memory for it */
    CUH_DEV_ERROR = 3,       /* anything else; cuh_dev_error_text explains */
    CUH_DEV_UNSUPPORTED = 4, /* the device (its driver) has no such call: never ask again */
    CUH_DEV_CAPTURING = 5    /* a CUDA graph capture is underway, which the call would break: not now */
} cuh_dev_status_t;

typedef struct cuh_device_ops_s {
    /* A segment of `size` bytes (a multiple of 2 MiB), aligned to 512 bytes at
     * least. CUH_DEV_OOM when the device cannot give it. */
    cuh_dev_status_t (*mem_alloc)(cuh_device_t *dev, size_t size, uintptr_t *addr);
    cuh_dev_status_t (*mem_free)(cuh_device_t *dev, uintptr_t addr, size_t size);
    /* Free and total memory of the device as the driver reports them. */
    cuh_dev_status_t (*mem_info)(cuh_device_t *dev, size_t *free_bytes, size_t *total_bytes);
    cuh_dev_status_t (*event_create)(cuh_device_t *dev, cuh_event_t *event);
    void (*event_destroy)(cuh_device_t *dev, cuh_event_t event);
    /* Captures the work issued on `stream` so far. */
    cuh_dev_status_t (*event_record)(cuh_device_t *dev, cuh_event_t event, cuh_stream_t stream);
    /* CUH_DEV_OK when that work has finished, CUH_DEV_NOT_READY when not. */
    cuh_dev_status_t (*event_query)(cuh_device_t *dev, cuh_event_t event);
    /* Blocks the calling thread until that work has finished. */
    cuh_dev_status_t (*event_wait)(cuh_device_t *dev, cuh_event_t event);
    /* Work issued on `stream` from now on waits, on the GPU, for what
     * `event` waits for; the event may be recorded again afterwards. */
    cuh_dev_status_t (*stream_wait)(cuh_device_t *dev, cuh_stream_t stream, cuh_event_t event);
    /* Device-wide fences, one call whatever the number of streams (CUDA
     * 12.5 and later: cuCtxRecordEvent, cuCtxWaitEvent). event_record_all
     * captures the work issued so far on every stream of the device, the
     * streams cuheap never heard of included; wait_all makes the work issued
     * from now on, on every stream (streams created later included), wait
     * on the GPU for what `event` waits for. CUH_DEV_UNSUPPORTED when the
     * driver has neither; CUH_DEV_CAPTURING while a graph capture is
     * underway on the device, which either call would invalidate. */
    cuh_dev_status_t (*event_record_all)(cuh_device_t *dev, cuh_event_t event);
    cuh_dev_status_t (*wait_all)(cuh_device_t *dev, cuh_event_t event);
    /* Blocks until all work on the device has finished: the heap's last
     * resort when an event cannot tell it that the GPU has passed a free.
     * If it fails, nothing the device ran is known to have finished, and
     * the device is lost (`lost` set to the error): the heap stops. */
    cuh_dev_status_t (*synchronize)(cuh_device_t *dev);
    void (*destroy)(cuh_device_t *dev);

    /* Virtual memory: address space and physical pages apart, so that any
     * free pages can be mapped behind one contiguous range. vm_granularity
     * is the page size, 0 when the device has no virtual memory management.
     * Physical pages count against the device's memory like segments. */
    size_t (*vm_granularity)(cuh_device_t *dev);
    /* Reserves `size` bytes of address space (no memory behind it). */
    cuh_dev_status_t (*vm_reserve)(cuh_device_t *dev, size_t size, uintptr_t *va);
    void (*vm_unreserve)(cuh_device_t *dev, uintptr_t va, size_t size);
    /* A physical allocation of `size` bytes (a multiple of the page);
     * CUH_DEV_OOM when the device has no memory for it. */
    cuh_dev_status_t (*vm_create)(cuh_device_t *dev, size_t size, uint64_t *handle);
    void (*vm_release)(cuh_device_t *dev, uint64_t handle);
    /* Maps a whole physical allocation at va and makes it read-write for the
     * device. Unmapping does not wait for GPU work: the caller must know
     * that no work issued before may still touch the range. */
    cuh_dev_status_t (*vm_map)(cuh_device_t *dev, uintptr_t va, size_t size, uint64_t handle);
    cuh_dev_status_t (*vm_unmap)(cuh_device_t *dev, uintptr_t va, size_t size);
    /* Peer access (cudaDeviceEnablePeerAccess) to virtual memory: device
     * `peer` may read and write [va, va + size), which is mapped, and every
     * range vm_map maps from now on. Plain segments need nothing: CUDA
     * grants peers those itself. */
    cuh_dev_status_t (*vm_allow_peer)(cuh_device_t *dev, int peer, uintptr_t va, size_t size);

    /* Page-locked host memory (cuMemHostAlloc in the device's primary
     * context): `size` bytes with cudaHostAlloc's `flags` (1 portable,
     * 2 mapped, 4 write-combined); CUH_DEV_OOM when the host has no more
     * to lock. The memory is host memory: the host reads and writes it. */
    cuh_dev_status_t (*host_alloc)(cuh_device_t *dev, size_t size, unsigned flags, void **ptr);
    void (*host_free)(cuh_device_t *dev, void *ptr, size_t size);
} cuh_device_ops_t;

/* The text that explains the calling thread's last CUH_DEV_ERROR (or
 * UNSUPPORTED, CAPTURING), whichever device answered it; `dev` names the
 * device the caller asked, for the reader. Each thread has its own (log.c):
 * a device's calls come from threads outside the heap's lock too (a thread's
 * slot records and queries its fence), and two failing at once must not
 * write one buffer. Read it right after the call that failed. A call that
 * loses the device (`lost`) keeps its text for every thread first:
 * cuh_dev_keep_lost_text, then `lost` set; cuh_dev_lost_text reads it ("" if
 * none was kept). */
#define CUH_DEV_ERROR_LEN 256
char *cuh_dev_error_text(const cuh_device_t *dev);
void cuh_dev_keep_lost_text(cuh_device_t *dev);
const char *cuh_dev_lost_text(const cuh_device_t *dev);

/* Every implementation embeds this as its first member. */
struct cuh_device_s {
    const cuh_device_ops_t *ops;
    const char *kind;          /* "cuda" or "sim" */
    int ordinal;               /* CUDA device number */
    /* Nonzero once a call met a sticky error (the driver's code; CUDA's
     * illegal address, failed launch, lost context): every call from then
     * on fails the same way, and the heap refuses new work. */
    _Atomic int lost;
    /* The error text of the call that lost the device, kept for every
     * thread's refusal after it (cuh_dev_keep_lost_text, cuh_dev_lost_text):
     * the error text itself is the failing thread's. */
    _Atomic int lost_told;     /* 0; 1 while lost_error is written; 2 once it is */
    char lost_error[CUH_DEV_ERROR_LEN];
};

/* ---- simulated device (device_sim.c) ---------------------------------- */

typedef struct cuh_sim_params_s {
    size_t capacity;           /* total device memory in bytes */
    int ordinal;
    int top_down;              /* each new segment below the last (default: above) */
} cuh_sim_params_t;

cuh_device_t *cuh_sim_create(const cuh_sim_params_t *params);
/* Bytes used on the device by someone other than cuheap (other processes). */
void cuh_sim_set_external(cuh_device_t *dev, size_t bytes);
/* Hold: recorded events stay incomplete until the test completes them (or a
 * host wait does, as a real wait would). Off (the default): every recorded
 * event completes at once. */
void cuh_sim_hold_events(cuh_device_t *dev, int hold);
/* Off: the device has no device-wide fences (event_record_all and wait_all
 * answer CUH_DEV_UNSUPPORTED, as a driver before CUDA 12.5 would). On by
 * default. */
void cuh_sim_device_fences(cuh_device_t *dev, int on);
/* While on, event_record_all and wait_all answer CUH_DEV_CAPTURING (a graph
 * capture underway somewhere on the device). */
void cuh_sim_capturing(cuh_device_t *dev, int on);
/* Completes all work recorded so far on `stream`, or on every stream. */
void cuh_sim_complete_stream(cuh_device_t *dev, cuh_stream_t stream);
void cuh_sim_complete_all(cuh_device_t *dev);
/* Completes the work on `stream` up to position `pos` (cuh_sim_enqueue_work),
 * and the work on other streams it waited for, and leaves what was recorded
 * after it running. */
void cuh_sim_complete_stream_upto(cuh_device_t *dev, cuh_stream_t stream, uint64_t pos);
/* `stream` runs no work: events recorded on it complete at once, even while
 * events are held (a stream a program created and left idle). */
void cuh_sim_stream_idle(cuh_device_t *dev, cuh_stream_t stream);
/* Enqueues a piece of work on `stream` (a kernel, as far as ordering goes);
 * returns its position there, which completes like an event recorded now. */
uint64_t cuh_sim_enqueue_work(cuh_device_t *dev, cuh_stream_t stream);
/* 1 if work enqueued on `stream` from now on would start only after the work
 * at position `pos` of stream `on` (and all before it there): it has
 * completed, or it is `stream`'s own earlier work, or stream waits on events
 * (directly or through other streams' events) order it so. A stream's work
 * completes when the test completes that stream (or a host wait on one of its
 * events does); completion does not wait for what the work waited on. */
int cuh_sim_stream_waits_for(cuh_device_t *dev, cuh_stream_t stream, cuh_stream_t on, uint64_t pos);
/* 1 if the work at position `pos` of `stream` (and all before it there) has
 * completed: the test completed it, or a host wait on a later event of the
 * stream (or on an event whose work waited for it) did. */
int cuh_sim_work_done(cuh_device_t *dev, cuh_stream_t stream, uint64_t pos);
/* The segment (mem_alloc) holding addr: its base and its ordinal (0 for the
 * device's first segment, counting those freed since); 0 if none. */
int cuh_sim_segment_of(cuh_device_t *dev, uintptr_t addr, uintptr_t *base, uint64_t *ordinal);
/* The physical allocation mapped over `va`, 0 if none, and (when offset is
 * not NULL) va's byte offset into it: lets a test follow a page that moved,
 * alone or inside a unit of several pages. */
uint64_t cuh_sim_handle_at(cuh_device_t *dev, uintptr_t va, size_t *offset);
/* 1 if the allocation mapped over `va` was released: only a mapping keeps
 * it, and what the heap maps there anew is not what the device has there. */
int cuh_sim_released_at(cuh_device_t *dev, uintptr_t va);
/* From now on a new physical allocation takes a released one's handle
 * value when there is one, as a driver may hand out a released handle's
 * value again while a mapping keeps the released allocation alive. */
void cuh_sim_reuse_handles(cuh_device_t *dev, int on);
/* Counters a test can read. */
typedef struct cuh_sim_counters_s {
    size_t used;               /* bytes in live segments and physical pages */
    uint64_t vm_creates, vm_releases, vm_maps, vm_unmaps;
    uint64_t vm_releases_used;   /* releases of allocations that had been mapped (the GPU may have used them) */
    uint64_t vm_releases_mapped; /* releases of allocations still mapped: their memory stays until the last unmap */
    size_t vm_mapped;          /* bytes mapped now */
    uint64_t mem_allocs, mem_frees, mem_refusals;
    uint64_t events_recorded, event_queries, event_waits, stream_waits, synchronizes;
    uint64_t events_recorded_all, waits_all;   /* device-wide: event_record_all and wait_all (also in events_recorded) */
    uint64_t vm_peer_grants;   /* (range, peer) pairs made accessible, by vm_allow_peer and vm_map */
    uint64_t vm_peers;         /* bit d: device d was allowed */
    uint64_t live_events;
    uint64_t host_allocs, host_frees;   /* page-locked host chunks (anonymous memory here) */
    size_t host_bytes;                  /* held now */
} cuh_sim_counters_t;
void cuh_sim_counters(cuh_device_t *dev, cuh_sim_counters_t *out);
/* The flags the page-locked host chunk holding ptr was allocated with (on
 * this device), with its base and size when not NULL; -1 when no chunk of
 * this device holds ptr. */
int cuh_sim_host_chunk(cuh_device_t *dev, const void *ptr, uintptr_t *base, size_t *size);
/* At most `bytes` of page-locked host memory at once (0: unlimited). */
void cuh_sim_set_host_capacity(cuh_device_t *dev, size_t bytes);

/* ---- a device that fails on purpose (device_fault.c; tools and tests) -- */

/* The calls a fault plan can fail (those that return a status). */
typedef enum cuh_fault_call_e {
    CUH_FAULT_MEM_ALLOC = 0, CUH_FAULT_MEM_FREE, CUH_FAULT_MEM_INFO,
    CUH_FAULT_EVENT_CREATE, CUH_FAULT_EVENT_RECORD, CUH_FAULT_EVENT_QUERY, CUH_FAULT_EVENT_WAIT,
    CUH_FAULT_STREAM_WAIT, CUH_FAULT_RECORD_ALL, CUH_FAULT_WAIT_ALL, CUH_FAULT_SYNCHRONIZE,
    CUH_FAULT_VM_RESERVE, CUH_FAULT_VM_CREATE, CUH_FAULT_VM_MAP, CUH_FAULT_VM_UNMAP, CUH_FAULT_VM_ALLOW_PEER,
    CUH_FAULT_HOST_ALLOC,
    CUH_FAULT_NUM_CALLS
} cuh_fault_call_t;

/* Wraps `inner` (it is destroyed with the wrapper): every call goes through
 * unless the plan fails it. NULL out of memory. */
cuh_device_t *cuh_fault_wrap(cuh_device_t *inner);
cuh_device_t *cuh_fault_inner(cuh_device_t *dev);
/* The n-th call of `call` from now (1: the next) fails with `status`
 * (CUH_DEV_ERROR, or CUH_DEV_OOM for an allocation); n = 0 cancels. */
void cuh_fault_nth(cuh_device_t *dev, cuh_fault_call_t call, uint64_t n, cuh_dev_status_t status);
/* Each call of `call` fails with probability p (a seeded, repeatable draw). */
void cuh_fault_random(cuh_device_t *dev, cuh_fault_call_t call, double p, uint64_t seed, cuh_dev_status_t status);
/* From the `after`-th call of any kind from now on, every call fails with
 * `status`: a lost context (the device's `lost` becomes
 * CUH_FAULT_STICKY_CODE, CUDA's illegal address). 0 cancels one that has
 * not struck. */
#define CUH_FAULT_STICKY_CODE 700
void cuh_fault_sticky(cuh_device_t *dev, uint64_t after, cuh_dev_status_t status);
/* Every vm_unmap of a range that starts at `va` fails from now on (a
 * mapping the driver will not let go), whatever else the plan says; 0
 * cancels. */
void cuh_fault_unmap_stuck(cuh_device_t *dev, uintptr_t va);
/* No more planned failures (a sticky error that struck is forgotten too,
 * and the device is no longer lost: a test's way to clean up). */
void cuh_fault_clear(cuh_device_t *dev);
int cuh_fault_is_sticky(cuh_device_t *dev);
/* Calls of `call` failed on purpose so far. */
uint64_t cuh_fault_injected(cuh_device_t *dev, cuh_fault_call_t call);
const char *cuh_fault_call_name(cuh_fault_call_t call);
/* The call named `name` ("vm_map"), or -1. */
int cuh_fault_call_by_name(const char *name);

/* ---- CUDA device (device_cuda.c) ------------------------------------- */

/* Loads the driver (once per process) and opens device `ordinal` through its
 * primary context. NULL on failure with the reason in errbuf. */
cuh_device_t *cuh_cuda_open(int ordinal, char *errbuf, size_t errlen);
/* The calling thread's current device (from its current context), or the
 * runtime's default 0 when no context is current. -1 with errbuf on error. */
int cuh_cuda_current_device(char *errbuf, size_t errlen);

/* ---- the real CUDA functions behind the hooks (device_cuda.c) -------- *
 * The hooks (hook_*.c) forward what cuheap does not serve to these. They
 * never call cuInit: a program that has not initialized CUDA gets CUDA's own
 * answer. */
/* glibc's dlsym, whatever `dlsym` the process binds to: called, or the
 * function itself (for a tail call that keeps the caller's identity). */
void *cuh_cuda_real_dlsym(void *handle, const char *name);
void *(*cuh_cuda_dlsym_function(void))(void *, const char *);
/* The driver's own function `name` in libcuda.so.1; NULL if none. */
void *cuh_cuda_driver_function(const char *name);
/* The CUDA runtime's own function `name` (the loaded libcudart); NULL if
 * none is loaded. */
void *cuh_cuda_runtime_function(const char *name);
/* What the calling thread's current context is; *device is its device
 * ordinal (-1 unless PRIMARY or OTHER). cuheap serves a thread only through
 * the primary context (the runtime's): blocks from it are not usable in
 * other contexts. Every allocation under LD_PRELOAD asks: a primary context
 * seen before costs one driver call (cuCtxGetCurrent), no more; so does
 * cuh_cuda_current_device (every call of the C API with
 * CUHEAP_CURRENT_DEVICE). */
enum { CUH_CTX_ERROR = -1, CUH_CTX_NONE = 0, CUH_CTX_PRIMARY = 1, CUH_CTX_OTHER = 2 };
int cuh_cuda_current_context(int *device);
/* For one hooked allocation: `device`'s primary context, which the call
 * found current on its thread (cuh_cuda_current_context answered PRIMARY),
 * is taken to be current by the device's calls until the call ends it with
 * -1, instead of asking the driver again (a cuCtxGetCurrent saved in each
 * cudaMalloc that queries a fence: issue 45). True meanwhile: nothing in
 * the call changes the thread's context but cuheap's own pushes, each
 * popped before its device call returns. Per thread. */
void cuh_cuda_assume_current(int device);
/* The ordinal of a CUdevice handle, or -1. */
int cuh_cuda_device_ordinal(int cudev);
/* The device ordinal of any context (made current for a moment), or -1. */
int cuh_cuda_context_device(void *ctx);
/* 1 when `stream` is being captured into a CUDA graph. */
int cuh_cuda_stream_capturing(const void *stream);
/* A graph capture is about to begin on `stream` (CU_STREAM_PER_THREAD, 0x2:
 * the calling thread's per-thread default stream), its begin call returned
 * (began: successfully), or an end of one was called. While a capture may be
 * underway the device-wide fences answer CUH_DEV_CAPTURING (the driver would
 * invalidate the capture). */
void cuh_cuda_capture_beginning(const void *stream);
void cuh_cuda_capture_begin_returned(const void *stream, int began);
void cuh_cuda_capture_ended(const void *stream);
/* Bit d set for every device whose primary context is active (the program
 * has used the device); 0 when the driver is not loaded. */
uint64_t cuh_cuda_active_devices(void);
/* The CUresult of the calling thread's last driver call that failed inside
 * an op of a CUDA device after `mark` (cuh_failure_mark, common.h) was
 * taken, 0 if none: the error CUDA itself would give the program for a
 * call cuheap made on its behalf. */
int cuh_cuda_failure_since(unsigned long mark);
/* 1 for CUDA's sticky errors: after one the context is lost, and CUDA
 * answers every later call with the same error (an illegal address, a
 * failed or timed-out launch, an uncorrectable ECC error, a destroyed
 * context, ...). A device op that meets one sets its device's `lost`. */
int cuh_cuda_sticky(int code);
/* 1 when the program has loaded libcuda.so.1 (cuheap loads nothing). */
int cuh_cuda_driver_loaded(void);

#endif /* CUH_DEVICE_H */
