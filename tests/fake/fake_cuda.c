/* fake_cuda.c - a stand-in libcuda.so.1 for tests on machines without a GPU.
 *
 * It implements the driver functions cuheap's device_cuda.c loads and those a
 * CUDA runtime (fake_cudart.c) uses, with host memory standing in for device
 * memory, so the real driver path and the LD_PRELOAD hooks run in CI:
 *   contexts        FAKE_CUDA_DEVICES devices (default 1, at most 4), one
 *                   primary context each (its handle is the address of a
 *                   static byte); a per-thread stack of current contexts that
 *                   is empty (cuCtxGetCurrent gives NULL) until
 *                   cuCtxSetCurrent or cuCtxPushCurrent_v2 puts one there; a
 *                   primary context is active while retained; any other
 *                   context counts as device 0's;
 *   cuMemAlloc      aligned host memory (at a 2 MiB boundary from 2 MiB
 *                   up, as the driver places large allocations), counted
 *                   against FAKE_CUDA_CAPACITY per device (bytes, default
 *                   256 MiB) on the current
 *                   context's device (virtual memory pages count on device
 *                   0), remembered in a table so that
 *                   freeing an address that starts no allocation is refused
 *                   (CUDA_ERROR_INVALID_VALUE); allocating or freeing needs a
 *                   current context (else CUDA_ERROR_INVALID_CONTEXT). Frees
 *                   wait for all queued work first, as the driver's do;
 *   streams         handles are pointers to stream records, kept for the
 *                   life of the process so that an event recorded on a
 *                   destroyed stream stays valid. 0 and 0x1 name the legacy
 *                   default stream; 0x2, the per-thread default stream, is
 *                   treated as the legacy stream too (one blocking stream);
 *   GPU work        pretend kernels (fake_cuda_enqueue_check and _fill, see
 *                   fake_cuda.h) run when enqueued, or, while the test holds
 *                   work (fake_cuda_hold), when it completes their stream;
 *                   cuStreamWaitEvent queues a wait that first runs the
 *                   work the event waits for;
 *   events          an event remembers how much work was queued on its
 *                   stream when recorded, and is complete once that work ran
 *                   (cuEventSynchronize runs it). An event on the legacy
 *                   stream also waits for the work queued before it on every
 *                   blocking stream; non-blocking streams are independent.
 *                   Work a blocking stream would wait for on the legacy stream
 *                   is not modelled. cuCtxRecordEvent records on every stream
 *                   at once, cuCtxWaitEvent queues a wait on every stream and
 *                   on each stream created later (both CUDA_ERROR_NOT_SUPPORTED
 *                   with FAKE_CUDA_NO_CTX_EVENTS=1, as a driver before 12.5);
 *   captures        cuStreamBeginCapture_v2 marks a stream capturing (no
 *                   graph is built) and cuStreamEndCapture unmarks it; a
 *                   device-wide event call during a capture breaks it, as the
 *                   real driver does;
 *   cuGetProcAddress  answers from a static table (never dlsym, which a
 *                   preloaded library may intercept): versioned names map to
 *                   their _v2 functions, the per-thread flag maps the
 *                   stream-ordered allocator to its _ptsz forms, every other
 *                   exported name to itself;
 *   virtual memory  reservations, memfds for physical allocations, and the
 *                   mappings booked so that a map over a mapped range and a
 *                   partial unmap are refused (fake_vm.c);
 *   pinned memory   cuMemHostAlloc and cuMemAllocHost_v2 give anonymous
 *                   host memory with its flags remembered; only DEVICEMAP
 *                   memory has a device pointer (stricter than the real
 *                   driver, to show the flags arrived); cuMemFreeHost runs
 *                   all queued work first, as the real one synchronizes.
 * It is linked with -Bsymbolic: its own references (the cuGetProcAddress
 * table, calls between its functions) name its own definitions, as in the
 * real driver, never those of a preloaded library. Everything is thread-safe.
 * Any driver call may be made to fail by a fault plan (FAKE_CUDA_FAULTS,
 * fake_faults.c). What the files share is in fake_internal.h.
 * Counters for tests: fake_cuda_counters() (virtual memory),
 * fake_cuda_calls() and the calls of each driver function, fake_cuda_count()
 * (fake_cuda.h).
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One lock guards every table below (allocations, streams, events, work). */
pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t capacity;              /* per device */
static size_t used[MAX_DEVICES];     /* device allocations; virtual memory pages count on device 0 */
int fake_num_devices = 1;
static int no_ctx_events;            /* FAKE_CUDA_NO_CTX_EVENTS: a driver before CUDA 12.5 */
static int initialized;
static char primary_contexts[MAX_DEVICES];   /* their addresses are the context handles */
static int primary_retains[MAX_DEVICES];
fake_cuda_calls_t fake_calls;

/* ---- calls by function ------------------------------------------------------ *
 * Every driver entry point counts its calls under its own name (CALLED() at
 * its top, fake_internal.h), so that a test or a benchmark can say which
 * driver calls a path makes and how many (fake_cuda_count,
 * fake_cuda_count_list). A form that only forwards (the _ptsz forms,
 * cuGetProcAddress) counts as the function it forwards to. Slots are taken at
 * a function's first call and never freed. */

fake_counted_t fake_counted[MAX_COUNTED];
static int num_counted;
static pthread_mutex_t counted_lock = PTHREAD_MUTEX_INITIALIZER;

int fake_count_slot(const char *name)
{
    pthread_mutex_lock(&counted_lock);
    int i = 0;
    while (i < num_counted && strcmp(fake_counted[i].name, name) != 0)
        i++;
    if (i == num_counted && num_counted < MAX_COUNTED)
        fake_counted[num_counted++].name = name;
    pthread_mutex_unlock(&counted_lock);
    return i < MAX_COUNTED ? i : -1;
}

API unsigned long fake_cuda_count(const char *name)
{
    unsigned long n = 0;
    pthread_mutex_lock(&counted_lock);
    for (int i = 0; i < num_counted; i++)
        if (!name || strcmp(fake_counted[i].name, name) == 0)
            n += __atomic_load_n(&fake_counted[i].n, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&counted_lock);
    return n;
}

API int fake_cuda_count_list(const char **names, unsigned long *counts, int max)
{
    pthread_mutex_lock(&counted_lock);
    int n = 0;
    for (int i = 0; i < num_counted && n < max; i++, n++) {
        names[n] = fake_counted[i].name;
        counts[n] = __atomic_load_n(&fake_counted[i].n, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&counted_lock);
    return n;
}

/* ---- current contexts, per thread ------------------------------------------- */

static _Thread_local CUcontext context_stack[MAX_CONTEXT_DEPTH];
static _Thread_local int context_depth;

static CUcontext current_context(void)
{
    return context_depth ? context_stack[context_depth - 1] : NULL;
}

/* The device of a context: its primary context's device, 0 for any other. */
static int context_device(CUcontext ctx)
{
    const char *c = ctx;
    return c >= primary_contexts && c < primary_contexts + MAX_DEVICES ? (int)(c - primary_contexts) : 0;
}

static int current_device(void)
{
    return context_device(current_context());
}


API CUresult cuGetErrorName(CUresult e, const char **s)
{
    CALLED_NEVER_FAILS();
    *s = e == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : e == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_FAKE";
    return OK;
}
API CUresult cuGetErrorString(CUresult e, const char **s)
{
    CALLED_NEVER_FAILS();
    *s = e == OUT_OF_MEMORY ? "out of memory" : "error in the fake driver";
    return OK;
}
API CUresult cuInit(unsigned flags)
{
    CALLED();
    (void)flags;
    pthread_mutex_lock(&fake_lock);
    if (!initialized) {
        const char *c = getenv("FAKE_CUDA_CAPACITY");
        capacity = c ? strtoull(c, NULL, 0) : (size_t)256 << 20;
        const char *n = getenv("FAKE_CUDA_DEVICES");
        fake_num_devices = n ? atoi(n) : 1;
        if (fake_num_devices < 1 || fake_num_devices > MAX_DEVICES)
            fake_num_devices = 1;
        /* Read once: a benchmark calls cuCtxRecordEvent for every cudaFree. */
        const char *v = getenv("FAKE_CUDA_NO_CTX_EVENTS");
        no_ctx_events = v && *v && strcmp(v, "0") != 0;
        initialized = 1;
    }
    pthread_mutex_unlock(&fake_lock);
    return OK;
}
API CUresult cuDeviceGetCount(int *n)
{
    CALLED();
    *n = fake_num_devices;
    return initialized ? OK : NOT_INITIALIZED;
}
API CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CALLED();
    if (ordinal < 0 || ordinal >= fake_num_devices)
        return INVALID_DEVICE;
    *dev = ordinal;
    return OK;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    CALLED();
    if (dev < 0 || dev >= fake_num_devices)
        return INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    primary_retains[dev]++;
    pthread_mutex_unlock(&fake_lock);
    *ctx = &primary_contexts[dev];
    return OK;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CALLED();
    if (dev < 0 || dev >= fake_num_devices)
        return INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    if (primary_retains[dev] > 0)
        primary_retains[dev]--;
    pthread_mutex_unlock(&fake_lock);
    return OK;
}
API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned *flags, int *active)
{
    CALLED();
    if (dev < 0 || dev >= fake_num_devices)
        return INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    *flags = 0;
    *active = primary_retains[dev] > 0;
    pthread_mutex_unlock(&fake_lock);
    return OK;
}
API CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    CALLED();
    *ctx = current_context();
    return OK;
}
API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CALLED();
    if (context_depth == 0) {
        if (ctx)
            context_stack[context_depth++] = ctx;
    } else {
        context_stack[context_depth - 1] = ctx;
        if (!ctx)
            context_depth--;
    }
    return OK;
}
/* The current context's device may access the peer context's memory. */
API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
    CALLED();
    if (flags || !peer || !current_context())
        return INVALID_VALUE;
    if (context_device(peer) == current_device())
        return INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    fake_calls.peer_enables++;
    pthread_mutex_unlock(&fake_lock);
    return OK;
}
API CUresult cuCtxGetDevice(CUdevice *dev)
{
    CALLED();
    *dev = current_device();
    return current_context() ? OK : INVALID_CONTEXT;
}
API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CALLED();
    if (!ctx || context_depth == MAX_CONTEXT_DEPTH)
        return INVALID_VALUE;
    context_stack[context_depth++] = ctx;
    return OK;
}
API CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    CALLED();
    if (context_depth == 0)
        return INVALID_CONTEXT;
    CUcontext popped = context_stack[--context_depth];
    if (ctx)
        *ctx = popped;
    return OK;
}
API CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    CALLED();
    (void)mode;
    return OK;
}

/* ---- streams and pretend GPU work ------------------------------------------- */

/* A pretend kernel: checks bytes (CHECK), writes them (FILL), or waits for
 * other streams' work (WAIT: cuStreamWaitEvent, the event's targets copied
 * when it was enqueued). */
enum { WORK_CHECK, WORK_FILL, WORK_WAIT };
struct fake_stream_s;
/* This much work done on that stream. */
typedef struct wait_target_s {
    struct fake_stream_s *stream;
    unsigned long target;
} wait_target_t;
typedef struct work_s {
    int kind;
    unsigned char *ptr;
    size_t n;
    unsigned char value;
    wait_target_t *waits;
    size_t num_waits;
} work_t;

/* Work item i of a stream is queue[i]; items [completed, enqueued) wait. */
typedef struct fake_stream_s {
    unsigned flags;
    int destroyed;
    int capturing;   /* cuStreamIsCapturing: 1 ACTIVE, 2 INVALIDATED (a device-wide call broke it) */
    work_t *queue;
    unsigned long enqueued, completed, queue_cap;
    struct fake_stream_s *next;
} fake_stream_t;

/* What an event waits for: this much work done on each of these streams. */
typedef struct fake_event_s {
    wait_target_t *waits;
    size_t num_waits, cap_waits;
} fake_event_t;

static int enqueue_locked(fake_stream_t *s, work_t w);
/* Queues on s a wait for a copy of waits[0..n). */
static CUresult enqueue_wait_locked(fake_stream_t *s, const wait_target_t *waits, size_t n)
{
    work_t w = {WORK_WAIT, NULL, 0, 0, NULL, n};
    if (n && !(w.waits = malloc(n * sizeof *w.waits)))
        return OUT_OF_MEMORY;
    if (n)
        memcpy(w.waits, waits, n * sizeof *w.waits);
    return enqueue_locked(s, w);
}
static fake_stream_t legacy_stream;
static fake_stream_t *streams;   /* created ones, newest first */
/* What every stream created from now on waits for (cuCtxWaitEvent). */
static wait_target_t *ctx_waits;
static size_t num_ctx_waits;
static int holding;
static unsigned long corrupt_bytes;

/* The record `handle` names, or NULL (counted) for one that does not exist. */
static fake_stream_t *stream_locked(CUstream handle)
{
    uintptr_t h = (uintptr_t)handle;
    if (h == 0 || h == 0x1 || h == 0x2)
        return &legacy_stream;
    for (fake_stream_t *s = streams; s; s = s->next)
        if (s == handle && !s->destroyed)
            return s;
    fake_calls.unknown_streams++;
    return NULL;
}

static void run_until_locked(fake_stream_t *s, unsigned long target)
{
    while (s->completed < target) {
        work_t *w = &s->queue[s->completed++];
        if (w->kind == WORK_WAIT) {
            /* The GPU runs what the event waits for first. */
            for (size_t i = 0; i < w->num_waits; i++)
                run_until_locked(w->waits[i].stream, w->waits[i].target);
            free(w->waits);
            w->waits = NULL;
            continue;
        }
        if (w->kind == WORK_FILL) {
            memset(w->ptr, w->value, w->n);
            continue;
        }
        for (size_t i = 0; i < w->n; i++)
            corrupt_bytes += w->ptr[i] != w->value;
        fake_calls.kernels_run++;
    }
}

static void run_all_locked(void)
{
    run_until_locked(&legacy_stream, legacy_stream.enqueued);
    for (fake_stream_t *s = streams; s; s = s->next)
        run_until_locked(s, s->enqueued);
}

static CUresult stream_create(CUstream *stream, unsigned flags)
{
    if (!stream)
        return INVALID_VALUE;
    fake_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return OUT_OF_MEMORY;
    s->flags = flags;
    pthread_mutex_lock(&fake_lock);
    s->next = streams;
    streams = s;
    CUresult r = num_ctx_waits ? enqueue_wait_locked(s, ctx_waits, num_ctx_waits) : OK;
    pthread_mutex_unlock(&fake_lock);
    *stream = s;
    return r;
}

API CUresult cuStreamCreate(CUstream *stream, unsigned flags)
{
    CALLED();
    return stream_create(stream, flags);
}
API CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned flags, int priority)
{
    CALLED();
    (void)priority;
    return stream_create(stream, flags);
}
API void fake_cuda_set_capturing(void *stream, int on)
{
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = stream_locked(stream);
    if (s && s != &legacy_stream)
        s->capturing = on;
    pthread_mutex_unlock(&fake_lock);
}
/* A device-wide call: breaks every capture underway (0 if none was). */
static int break_captures_locked(void)
{
    int broke = 0;
    for (fake_stream_t *t = streams; t; t = t->next)
        if (t->capturing == 1) {
            t->capturing = 2;
            broke = 1;
        }
    if (broke)
        fake_calls.captures_broken++;
    return broke;
}
API CUresult cuStreamBeginCapture_v2(CUstream stream, int mode)
{
    CALLED();
    (void)mode;
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = stream_locked(stream);
    CUresult r = !s ? INVALID_HANDLE : s == &legacy_stream ? STREAM_CAPTURE_UNSUPPORTED : s->capturing ? ILLEGAL_STATE : OK;
    if (r == OK)
        s->capturing = 1;
    pthread_mutex_unlock(&fake_lock);
    return r;
}
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode)
{
    return cuStreamBeginCapture_v2(stream, mode);
}
API CUresult cuStreamEndCapture(CUstream stream, void **graph)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = stream_locked(stream);
    CUresult r = !s ? INVALID_HANDLE : !s->capturing ? STREAM_CAPTURE_UNMATCHED
                 : s->capturing == 2 ? STREAM_CAPTURE_INVALIDATED : OK;
    if (s && s->capturing)
        s->capturing = 0;
    if (graph)
        *graph = r == OK ? (void *)s : NULL;
    if (r == OK)
        fake_calls.captures_ended++;
    pthread_mutex_unlock(&fake_lock);
    return r;
}
API CUresult cuStreamEndCapture_ptsz(CUstream stream, void **graph)
{
    return cuStreamEndCapture(stream, graph);
}
API CUresult cuStreamIsCapturing(CUstream stream, int *status)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = stream_locked(stream);
    if (s)
        *status = s->capturing;   /* 0 NONE, 1 ACTIVE */
    pthread_mutex_unlock(&fake_lock);
    return s ? OK : INVALID_HANDLE;
}
API int fake_cuda_stream_create_unseen(void **stream, unsigned int flags)
{
    return stream_create(stream, flags);
}
/* As CUDA: returns at once; work already queued still runs. */
API CUresult cuStreamDestroy_v2(CUstream stream)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = stream_locked(stream);
    CUresult r = !s || s == &legacy_stream ? INVALID_HANDLE : OK;
    if (r == OK)
        s->destroyed = 1;
    pthread_mutex_unlock(&fake_lock);
    return r;
}
API CUresult cuStreamSynchronize(CUstream stream)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = stream_locked(stream);
    if (s)
        run_until_locked(s, s->enqueued);
    pthread_mutex_unlock(&fake_lock);
    return s ? OK : INVALID_HANDLE;
}
API CUresult cuCtxSynchronize(void)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    run_all_locked();
    pthread_mutex_unlock(&fake_lock);
    return OK;
}

API void fake_cuda_hold(int on)
{
    pthread_mutex_lock(&fake_lock);
    holding = on;
    pthread_mutex_unlock(&fake_lock);
}
static int enqueue_locked(fake_stream_t *s, work_t w);

API int fake_cuda_enqueue_check(void *stream, const void *ptr, size_t n, unsigned char expected)
{
    pthread_mutex_lock(&fake_lock);
    int r = enqueue_locked(stream_locked(stream), (work_t){WORK_CHECK, (unsigned char *)(uintptr_t)ptr, n, expected,
                                                           NULL, 0});
    pthread_mutex_unlock(&fake_lock);
    return r;
}
API int fake_cuda_enqueue_fill(void *stream, void *ptr, size_t n, unsigned char value)
{
    pthread_mutex_lock(&fake_lock);
    int r = enqueue_locked(stream_locked(stream), (work_t){WORK_FILL, ptr, n, value, NULL, 0});
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* Queues w on s (runs it at once unless work is held). */
static int enqueue_locked(fake_stream_t *s, work_t w)
{
    CUresult r = s ? OK : INVALID_HANDLE;
    if (s && s->enqueued == s->queue_cap) {
        unsigned long cap = s->queue_cap ? 2 * s->queue_cap : 16;
        work_t *grown = realloc(s->queue, cap * sizeof *grown);
        if (grown) {
            s->queue = grown;
            s->queue_cap = cap;
        } else {
            r = OUT_OF_MEMORY;
        }
    }
    if (r == OK) {
        s->queue[s->enqueued++] = w;
        if (!holding)
            run_until_locked(s, s->enqueued);
    } else {
        free(w.waits);
    }
    return r;
}
API void fake_cuda_complete(void *stream)
{
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = (uintptr_t)stream <= 0x2 ? &legacy_stream : NULL;
    for (fake_stream_t *t = streams; t && !s; t = t->next)
        if (t == stream)   /* destroyed ones too: their work still runs */
            s = t;
    if (s)
        run_until_locked(s, s->enqueued);
    pthread_mutex_unlock(&fake_lock);
}
API void fake_cuda_complete_all(void)
{
    pthread_mutex_lock(&fake_lock);
    run_all_locked();
    pthread_mutex_unlock(&fake_lock);
}
API unsigned long fake_cuda_corrupt_bytes(void)
{
    pthread_mutex_lock(&fake_lock);
    unsigned long n = corrupt_bytes;
    pthread_mutex_unlock(&fake_lock);
    return n;
}

/* ---- events ------------------------------------------------------------------ */

static int event_wait_add(fake_event_t *e, fake_stream_t *s)
{
    if (e->num_waits == e->cap_waits) {
        size_t cap = e->cap_waits ? 2 * e->cap_waits : 4;
        void *grown = realloc(e->waits, cap * sizeof *e->waits);
        if (!grown)
            return -1;
        e->waits = grown;
        e->cap_waits = cap;
    }
    e->waits[e->num_waits].stream = s;
    e->waits[e->num_waits].target = s->enqueued;
    e->num_waits++;
    return 0;
}

API CUresult cuEventCreate(CUevent *e, unsigned flags)
{
    CALLED();
    (void)flags;
    *e = calloc(1, sizeof(fake_event_t));
    return *e ? OK : OUT_OF_MEMORY;
}
API CUresult cuEventDestroy_v2(CUevent event)
{
    CALLED();
    fake_event_t *e = event;
    if (e)
        free(e->waits);
    free(e);
    return OK;
}
API CUresult cuEventRecord(CUevent event, CUstream stream)
{
    CALLED();
    fake_event_t *e = event;
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = stream_locked(stream);
    CUresult r = s ? OK : INVALID_HANDLE;
    if (s) {
        e->num_waits = 0;
        if (event_wait_add(e, s))
            r = OUT_OF_MEMORY;
        for (fake_stream_t *t = streams; r == OK && s == &legacy_stream && t; t = t->next)
            if (!t->destroyed && !(t->flags & STREAM_NON_BLOCKING) && event_wait_add(e, t))
                r = OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&fake_lock);
    return r;
}
/* The stream's later work waits for what the event waits for now. */
API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags)
{
    CALLED();
    (void)flags;
    fake_event_t *e = event;
    pthread_mutex_lock(&fake_lock);
    fake_stream_t *s = stream_locked(stream);
    CUresult r = s ? enqueue_wait_locked(s, e->waits, e->num_waits) : INVALID_HANDLE;
    if (r == OK)
        fake_calls.stream_waits++;
    pthread_mutex_unlock(&fake_lock);
    return r;
}
/* A real driver may crash in cuEventQuery when the calling thread has no
 * current context (a SIGSEGV under LD_PRELOAD with CUDA's shared runtime,
 * 2026-12-07, where a hooked cudaMalloc reaches cuheap before the runtime has
 * made a context current): the fake one stops the process, naming it, so a
 * test fails wherever cuheap would query so. */
API CUresult cuEventQuery(CUevent event)
{
    CALLED();
    if (!current_context()) {
        fprintf(stderr, "fake CUDA driver: cuEventQuery with no current context (a real driver may crash there)\n");
        abort();
    }
    fake_event_t *e = event;
    CUresult r = OK;
    pthread_mutex_lock(&fake_lock);
    for (size_t i = 0; i < e->num_waits; i++)
        if (e->waits[i].stream->completed < e->waits[i].target)
            r = NOT_READY;
    pthread_mutex_unlock(&fake_lock);
    return r;
}
API CUresult cuEventSynchronize(CUevent event)
{
    CALLED();
    fake_event_t *e = event;
    pthread_mutex_lock(&fake_lock);
    for (size_t i = 0; i < e->num_waits; i++)
        run_until_locked(e->waits[i].stream, e->waits[i].target);
    pthread_mutex_unlock(&fake_lock);
    return OK;
}

/* Whether a device-wide call goes ahead: not without them
 * (FAKE_CUDA_NO_CTX_EVENTS), and not during a capture, which it breaks. */
static CUresult ctx_call_locked(void)
{
    if (no_ctx_events)
        return NOT_SUPPORTED;
    return break_captures_locked() ? STREAM_CAPTURE_UNSUPPORTED : OK;
}
/* The event waits for all the work queued so far on every stream. */
/* ---- device-wide calls held at their start (fake_cuda_pause_ctx_events) ---- */
static pthread_mutex_t pause_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pause_cond = PTHREAD_COND_INITIALIZER;
static int ctx_events_paused;            /* fake_cuda_pause_ctx_events's switch */
static unsigned long ctx_events_waiting; /* calls waiting for it now */
static _Atomic int ctx_events_pausable;  /* ever switched on: the one load a call pays otherwise */

static void ctx_event_pause_point(void)
{
    if (!atomic_load_explicit(&ctx_events_pausable, memory_order_acquire))
        return;
    pthread_mutex_lock(&pause_lock);
    ctx_events_waiting++;
    pthread_cond_broadcast(&pause_cond);
    while (ctx_events_paused)
        pthread_cond_wait(&pause_cond, &pause_lock);
    ctx_events_waiting--;
    pthread_mutex_unlock(&pause_lock);
}
API unsigned long fake_cuda_pause_ctx_events(int on)
{
    atomic_store(&ctx_events_pausable, 1);
    pthread_mutex_lock(&pause_lock);
    if (on >= 0) {
        ctx_events_paused = on;
        pthread_cond_broadcast(&pause_cond);
    }
    unsigned long waiting = ctx_events_waiting;
    pthread_mutex_unlock(&pause_lock);
    return waiting;
}

API CUresult cuCtxRecordEvent(CUcontext ctx, CUevent event)
{
    CALLED();
    ctx_event_pause_point();
    (void)ctx;
    fake_event_t *e = event;
    pthread_mutex_lock(&fake_lock);
    CUresult r = ctx_call_locked();
    if (r == OK) {
        e->num_waits = 0;
        if (event_wait_add(e, &legacy_stream))
            r = OUT_OF_MEMORY;
        for (fake_stream_t *t = streams; r == OK && t; t = t->next)
            if (event_wait_add(e, t))   /* destroyed ones too: their work still runs */
                r = OUT_OF_MEMORY;
    }
    if (r == OK)
        fake_calls.ctx_records++;
    pthread_mutex_unlock(&fake_lock);
    return r;
}
/* Every stream's later work, and every later stream's, waits for what the
 * event waits for now. */
API CUresult cuCtxWaitEvent(CUcontext ctx, CUevent event)
{
    CALLED();
    ctx_event_pause_point();
    (void)ctx;
    fake_event_t *e = event;
    pthread_mutex_lock(&fake_lock);
    CUresult r = ctx_call_locked();
    /* Work already done is no wait at all (and costs the fake nothing). */
    int pending = 0;
    for (size_t i = 0; i < e->num_waits; i++)
        pending |= e->waits[i].stream->completed < e->waits[i].target;
    /* Streams created later wait too: one target per stream, the highest. */
    for (size_t i = 0; r == OK && pending && i < e->num_waits; i++) {
        size_t k = 0;
        while (k < num_ctx_waits && ctx_waits[k].stream != e->waits[i].stream)
            k++;
        if (k == num_ctx_waits) {
            void *grown = realloc(ctx_waits, (num_ctx_waits + 1) * sizeof *ctx_waits);
            if (!grown) {
                r = OUT_OF_MEMORY;
                break;
            }
            ctx_waits = grown;
            ctx_waits[num_ctx_waits++] = e->waits[i];
        } else if (ctx_waits[k].target < e->waits[i].target) {
            ctx_waits[k].target = e->waits[i].target;
        }
    }
    for (fake_stream_t *s = &legacy_stream; r == OK && pending && s; s = s == &legacy_stream ? streams : s->next) {
        if (!s->destroyed)
            r = enqueue_wait_locked(s, e->waits, e->num_waits);
    }
    if (r == OK)
        fake_calls.ctx_waits++;
    pthread_mutex_unlock(&fake_lock);
    return r;
}

/* ---- device memory ------------------------------------------------------------ */

typedef struct allocation_s {
    uintptr_t base;
    size_t size;
    int managed;
    int device;
    struct allocation_s *next;
} allocation_t;

static allocation_t *allocations;

int fake_take(int device, size_t size)
{
    pthread_mutex_lock(&fake_lock);
    int ok = size <= capacity - used[device];
    if (ok)
        used[device] += size;
    pthread_mutex_unlock(&fake_lock);
    return ok;
}
void fake_give(int device, size_t size)
{
    pthread_mutex_lock(&fake_lock);
    used[device] -= size;
    pthread_mutex_unlock(&fake_lock);
}

static CUresult allocate(CUdeviceptr *p, size_t size, int managed)
{
    if (!p || size == 0)
        return INVALID_VALUE;
    if (!current_context())
        return INVALID_CONTEXT;
    const int device = current_device();
    if (!managed && !fake_take(device, size))
        return OUT_OF_MEMORY;
    /* From 2 MiB up at a 2 MiB boundary, as the driver places them. */
    const size_t alignment = size >= PAGE ? PAGE : ALLOCATION_ALIGNMENT;
    size_t rounded = (size + alignment - 1) & ~(alignment - 1);
    allocation_t *a = malloc(sizeof *a);
    void *m = a && rounded >= size ? aligned_alloc(alignment, rounded) : NULL;
    if (!m) {
        free(a);
        if (!managed)
            fake_give(device, size);
        return OUT_OF_MEMORY;
    }
    *a = (allocation_t){(uintptr_t)m, size, managed, device, NULL};
    pthread_mutex_lock(&fake_lock);
    a->next = allocations;
    allocations = a;
    if (managed)
        fake_calls.managed_allocs++;
    else
        fake_calls.mem_allocs++;
    pthread_mutex_unlock(&fake_lock);
    *p = (CUdeviceptr)a->base;
    return OK;
}

/* Frees the allocation starting at p after all queued work has run. */
static CUresult release(CUdeviceptr p)
{
    if (!current_context())
        return INVALID_CONTEXT;
    pthread_mutex_lock(&fake_lock);
    run_all_locked();
    allocation_t **link = &allocations;
    while (*link && (*link)->base != (uintptr_t)p)
        link = &(*link)->next;
    allocation_t *a = *link;
    if (a) {
        *link = a->next;
        if (!a->managed)
            used[a->device] -= a->size;
        fake_calls.mem_frees++;
    } else {
        fake_calls.refused_frees++;
    }
    pthread_mutex_unlock(&fake_lock);
    if (!a)
        return INVALID_VALUE;
    free((void *)a->base);
    free(a);
    return OK;
}

/* ---- page-locked host memory ---------------------------------------------- *
 * Host memory from mmap, with the flags it was asked with. Stricter than a
 * real driver with unified addressing: only memory allocated with
 * CU_MEMHOSTALLOC_DEVICEMAP has a device pointer, so a test sees whether the
 * flags reached the driver. cuMemFreeHost runs all queued work first (the
 * real one synchronizes). */
#define HOST_FLAGS_KNOWN 0x7u
#define HOST_DEVICEMAP 0x2u

typedef struct host_allocation_s {
    uintptr_t base;
    size_t size;
    unsigned flags;
    struct host_allocation_s *next;
} host_allocation_t;

static host_allocation_t *host_allocations;

static CUresult host_allocate(void **pp, size_t size, unsigned flags)
{
    if (!pp || size == 0 || (flags & ~HOST_FLAGS_KNOWN))
        return INVALID_VALUE;
    if (!current_context())
        return INVALID_CONTEXT;
    host_allocation_t *a = malloc(sizeof *a);
    void *m = a ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (m == MAP_FAILED) {
        free(a);
        return OUT_OF_MEMORY;
    }
    *a = (host_allocation_t){(uintptr_t)m, size, flags, NULL};
    pthread_mutex_lock(&fake_lock);
    a->next = host_allocations;
    host_allocations = a;
    fake_calls.host_allocs++;
    fake_calls.host_bytes += size;
    pthread_mutex_unlock(&fake_lock);
    *pp = m;
    return OK;
}

/* The allocation holding p (interior pointers too). Caller holds lock. */
static host_allocation_t *host_find_locked(const void *p)
{
    for (host_allocation_t *a = host_allocations; a; a = a->next)
        if ((uintptr_t)p - a->base < a->size)
            return a;
    return NULL;
}

API CUresult cuMemHostAlloc(void **pp, size_t size, unsigned flags)
{
    CALLED();
    return host_allocate(pp, size, flags);
}

API CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
    CALLED();
    return host_allocate(pp, size, 0);
}

API CUresult cuMemFreeHost(void *p)
{
    CALLED();
    if (!current_context())
        return INVALID_CONTEXT;
    pthread_mutex_lock(&fake_lock);
    run_all_locked();
    host_allocation_t **link = &host_allocations;
    while (*link && (*link)->base != (uintptr_t)p)
        link = &(*link)->next;
    host_allocation_t *a = *link;
    if (a) {
        *link = a->next;
        fake_calls.host_frees++;
        fake_calls.host_bytes -= a->size;
    } else {
        fake_calls.refused_frees++;
    }
    pthread_mutex_unlock(&fake_lock);
    if (!a)
        return INVALID_VALUE;
    munmap((void *)a->base, a->size);
    free(a);
    return OK;
}

API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
    CALLED();
    if (!d || flags)
        return INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    host_allocation_t *a = host_find_locked(p);
    int mapped = a && (a->flags & HOST_DEVICEMAP);
    pthread_mutex_unlock(&fake_lock);
    if (!mapped)
        return INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p;
    return OK;
}

API CUresult cuMemHostGetFlags(unsigned *flags, void *p)
{
    CALLED();
    if (!flags)
        return INVALID_VALUE;
    pthread_mutex_lock(&fake_lock);
    host_allocation_t *a = host_find_locked(p);
    if (a)
        *flags = a->flags;
    pthread_mutex_unlock(&fake_lock);
    return a ? OK : INVALID_VALUE;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    CALLED();
    return allocate(p, size, 0);
}
API int fake_cuda_alloc_foreign(unsigned long long *dptr, size_t size)
{
    return allocate(dptr, size, 0);
}
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned flags)
{
    CALLED();
    (void)flags;
    return allocate(p, size, 1);
}
API CUresult cuMemFree_v2(CUdeviceptr p)
{
    CALLED();
    return release(p);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream stream)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    int known = stream_locked(stream) != NULL;
    pthread_mutex_unlock(&fake_lock);
    return known ? allocate(p, size, 0) : INVALID_HANDLE;
}
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream stream)
{
    return cuMemAllocAsync(p, size, stream);
}
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream stream)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    int known = stream_locked(stream) != NULL;
    pthread_mutex_unlock(&fake_lock);
    return known ? release(p) : INVALID_HANDLE;
}
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream stream)
{
    return cuMemFreeAsync(p, stream);
}
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned element_size)
{
    CALLED();
    (void)element_size;
    if (!pitch || width == 0 || height == 0)
        return INVALID_VALUE;
    size_t row = (width + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    if (height > SIZE_MAX / row)
        return OUT_OF_MEMORY;
    CUresult r = allocate(p, row * height, 0);
    if (r == OK)
        *pitch = row;
    return r;
}
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    *free_bytes = capacity - used[current_device()];
    *total = capacity;
    pthread_mutex_unlock(&fake_lock);
    return OK;
}
/* Success only for the start of a device allocation: a handle names a whole
 * allocation. */
API CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr p)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    allocation_t *a = allocations;
    while (a && a->base != (uintptr_t)p)
        a = a->next;
    int ok = a && !a->managed;
    pthread_mutex_unlock(&fake_lock);
    if (!ok || !handle)
        return INVALID_VALUE;
    memset(handle, 0, IPC_HANDLE_BYTES);
    memcpy(handle, &p, sizeof p);
    return OK;
}
/* Destroys every allocation of the device's primary context (after its work
 * ran). */
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CALLED();
    if (dev < 0 || dev >= fake_num_devices)
        return INVALID_DEVICE;
    pthread_mutex_lock(&fake_lock);
    run_all_locked();
    allocation_t *gone = NULL;
    for (allocation_t **link = &allocations; *link;) {
        allocation_t *a = *link;
        if (a->device == dev) {
            *link = a->next;
            a->next = gone;
            gone = a;
        } else {
            link = &a->next;
        }
    }
    used[dev] = 0;
    fake_calls.primary_resets++;
    pthread_mutex_unlock(&fake_lock);
    while (gone) {
        allocation_t *next = gone->next;
        free((void *)gone->base);
        free(gone);
        gone = next;
    }
    return OK;
}

API void fake_cuda_calls(fake_cuda_calls_t *out)
{
    pthread_mutex_lock(&fake_lock);
    *out = fake_calls;
    out->used = 0;
    for (int d = 0; d < MAX_DEVICES; d++)
        out->used += used[d];
    out->capacity = capacity;
    pthread_mutex_unlock(&fake_lock);
}

/* ---- cuGetProcAddress --------------------------------------------------------- */

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, unsigned long long flags,
                                 int *symbol_status);
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags);

typedef void (*any_function_t)(void);
#define SAME(name) {#name, (any_function_t)name}
#define VERSIONED(name, function) {name, (any_function_t)function}

/* Names that resolve to a later version of the function. */
static const struct {
    const char *name;
    any_function_t function;
} versioned[] = {
    VERSIONED("cuMemAlloc", cuMemAlloc_v2),
    VERSIONED("cuMemFree", cuMemFree_v2),
    VERSIONED("cuMemGetInfo", cuMemGetInfo_v2),
    VERSIONED("cuStreamDestroy", cuStreamDestroy_v2),
    VERSIONED("cuMemAllocPitch", cuMemAllocPitch_v2),
    VERSIONED("cuEventDestroy", cuEventDestroy_v2),
    VERSIONED("cuCtxPushCurrent", cuCtxPushCurrent_v2),
    VERSIONED("cuCtxPopCurrent", cuCtxPopCurrent_v2),
    VERSIONED("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2),
    VERSIONED("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2),
    VERSIONED("cuMemAllocHost", cuMemAllocHost_v2),
    VERSIONED("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2),
    VERSIONED("cuStreamBeginCapture", cuStreamBeginCapture_v2),
}, per_thread[] = {
    VERSIONED("cuMemAllocAsync", cuMemAllocAsync_ptsz),
    VERSIONED("cuMemFreeAsync", cuMemFreeAsync_ptsz),
    VERSIONED("cuStreamBeginCapture", cuStreamBeginCapture_v2_ptsz),
    VERSIONED("cuStreamEndCapture", cuStreamEndCapture_ptsz),
}, exported[] = {
    SAME(cuCtxRecordEvent), SAME(cuCtxWaitEvent), SAME(cuStreamBeginCapture_v2), SAME(cuStreamBeginCapture_v2_ptsz),
    SAME(cuStreamEndCapture), SAME(cuStreamEndCapture_ptsz),
    SAME(fake_cuda_counters), SAME(fake_cuda_calls), SAME(fake_cuda_count), SAME(fake_cuda_count_list),
    SAME(fake_cuda_faults), SAME(fake_cuda_faults_injected),
    SAME(fake_cuda_hold), SAME(fake_cuda_enqueue_check), SAME(fake_cuda_enqueue_fill), SAME(cuStreamWaitEvent),
    SAME(fake_cuda_complete), SAME(fake_cuda_complete_all), SAME(fake_cuda_corrupt_bytes),
    SAME(fake_cuda_alloc_foreign), SAME(fake_cuda_stream_create_unseen), SAME(fake_cuda_set_capturing),
    SAME(fake_cuda_pause_ctx_events),
    SAME(cuStreamIsCapturing),
    SAME(cuGetErrorName), SAME(cuGetErrorString), SAME(cuInit), SAME(cuDeviceGetCount), SAME(cuDeviceGet),
    SAME(cuDevicePrimaryCtxRetain), SAME(cuDevicePrimaryCtxRelease_v2), SAME(cuDevicePrimaryCtxGetState),
    SAME(cuDevicePrimaryCtxReset_v2), SAME(cuCtxGetCurrent), SAME(cuCtxSetCurrent), SAME(cuCtxGetDevice),
    SAME(cuCtxPushCurrent_v2), SAME(cuCtxPopCurrent_v2), SAME(cuCtxSynchronize), SAME(cuCtxEnablePeerAccess),
    SAME(cuThreadExchangeStreamCaptureMode), SAME(cuStreamCreate), SAME(cuStreamCreateWithPriority),
    SAME(cuStreamDestroy_v2), SAME(cuStreamSynchronize), SAME(cuEventCreate), SAME(cuEventDestroy_v2),
    SAME(cuEventRecord), SAME(cuEventQuery), SAME(cuEventSynchronize), SAME(cuMemAlloc_v2),
    SAME(cuMemAllocManaged), SAME(cuMemFree_v2), SAME(cuMemAllocAsync), SAME(cuMemAllocAsync_ptsz),
    SAME(cuMemFreeAsync), SAME(cuMemFreeAsync_ptsz), SAME(cuMemAllocPitch_v2), SAME(cuMemGetInfo_v2),
    SAME(cuIpcGetMemHandle), SAME(cuMemGetAllocationGranularity), SAME(cuMemAddressReserve),
    SAME(cuMemAddressFree), SAME(cuMemCreate), SAME(cuMemRelease), SAME(cuMemMap), SAME(cuMemSetAccess),
    SAME(cuMemUnmap), SAME(cuGetProcAddress), SAME(cuGetProcAddress_v2),
    SAME(cuMemHostAlloc), SAME(cuMemAllocHost_v2), SAME(cuMemFreeHost), SAME(cuMemHostGetDevicePointer_v2),
    SAME(cuMemHostGetFlags),
};

#define COUNT(table) (sizeof(table) / sizeof(table)[0])

static any_function_t lookup(const char *symbol, unsigned long long flags)
{
    CALLED_NEVER_FAILS();
    if (flags & GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        for (size_t i = 0; i < COUNT(per_thread); i++)
            if (strcmp(symbol, per_thread[i].name) == 0)
                return per_thread[i].function;
    for (size_t i = 0; i < COUNT(versioned); i++)
        if (strcmp(symbol, versioned[i].name) == 0)
            return versioned[i].function;
    for (size_t i = 0; i < COUNT(exported); i++)
        if (strcmp(symbol, exported[i].name) == 0)
            return exported[i].function;
    return NULL;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, unsigned long long flags,
                             int *symbol_status)
{
    CALLED_NEVER_FAILS();
    (void)cuda_version;
    if (!symbol || !pfn)
        return INVALID_VALUE;
    any_function_t function = lookup(symbol, flags);
    *pfn = NULL;
    if (function)
        memcpy(pfn, &function, sizeof *pfn);
    if (symbol_status)
        *symbol_status = function ? SYMBOL_FOUND : SYMBOL_NOT_FOUND;
    return function ? OK : NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, unsigned long long flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, NULL);
}
