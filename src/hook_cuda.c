/* hook_cuda.c - the decisions the CUDA hooks share (see hook_cuda.h).
 *
 * Each entry point in hook_runtime.c and hook_driver.c reads its arguments,
 * asks one of these functions what to do, and either returns CUDA's code for
 * cuheap's answer or calls the real function. Everything here goes through
 * the runtime's heap functions (runtime.h); the only CUDA it asks about, the
 * current context and whether a stream is being captured, it asks through
 * the device interface.
 */
#include "hook_cuda.h"

#include "callers.h"
#include "common.h"
#include "pinned.h"
#include "runtime.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* The stream handles CUDA reserves (cudaStreamLegacy, cudaStreamPerThread;
 * CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define STREAM_LEGACY ((uintptr_t)0x1)
#define STREAM_PER_THREAD ((uintptr_t)0x2)

/* Program errors (double frees ...) are printed, the first this many. */
#define MAX_PRINTED_ERRORS 64

void *cuh_hook_real(void *(*lookup)(const char *), const char *name, void *_Atomic *cache)
{
    void *fn = atomic_load_explicit(cache, memory_order_acquire);
    if (!fn) {
        fn = lookup(name);
        atomic_store_explicit(cache, fn, memory_order_release);
    }
    return fn;
}

const void *cuh_hook_stream_handle(const void *stream, int per_thread_default)
{
    return stream == NULL && per_thread_default ? (const void *)STREAM_PER_THREAD : stream;
}

int cuh_hook_capturing(const void *stream, int per_thread_default)
{
    uintptr_t s = (uintptr_t)cuh_hook_stream_handle(stream, per_thread_default);
    if (s == 0 || s == STREAM_LEGACY)
        return 0;
    return cuh_cuda_stream_capturing((const void *)s);
}

cuh_hook_stream_t cuh_hook_stream(const void *stream, int per_thread_default)
{
    uintptr_t s = (uintptr_t)stream;
    if ((s == 0 && per_thread_default) || s == STREAM_PER_THREAD)
        return CUH_HOOK_ANY_STREAM;
    if (s == STREAM_LEGACY)
        s = 0;
    return (cuh_hook_stream_t){.device_wide = 0, .stream = (cuh_stream_t)s};
}

int cuh_hook_device(int runtime_api)
{
    int current;
    return cuh_hook_device_current(runtime_api, &current);
}

int cuh_hook_device_current(int runtime_api, int *current)
{
    int device;
    *current = 0;
    switch (cuh_cuda_current_context(&device)) {
    case CUH_CTX_PRIMARY:
        *current = 1;
        return device;
    case CUH_CTX_NONE:
        /* The runtime would make device 0's primary context current; the
         * driver API answers CUDA_ERROR_INVALID_CONTEXT. */
        return runtime_api ? 0 : -1;
    default:
        return -1;
    }
}

/* Every decision that reaches the runtime comes through here first: the
 * runtime learns that it stands in for CUDA's own calls before it reads its
 * settings (cuh_runtime_as_interposer). */
static void interposing(void)
{
    static atomic_int told;
    if (cuh_unlikely(!atomic_load_explicit(&told, memory_order_relaxed))) {
        cuh_runtime_as_interposer();
        atomic_store_explicit(&told, 1, memory_order_relaxed);
    }
}

static void print_program_error(const char *fn, const void *ptr)
{
    static atomic_int printed;
    int n = atomic_fetch_add(&printed, 1);
    if (n < MAX_PRINTED_ERRORS)
        cuh_log("%s(%p) refused: %s%s", fn, ptr, cuh_get_error(),
                n == MAX_PRINTED_ERRORS - 1 ? " (further such errors are not printed)" : "");
}

/* A hooked call starts: the failures counted from here on are its own. */
static unsigned long begin_call(void) { return cuh_failure_mark(); }

/* The CUDA code of a hooked call's outcome, as CUDA itself would have
 * given it: when a driver call cuheap made on the program's behalf failed
 * with a sticky error, that error (CUDA would answer it to any call now);
 * an allocation that failed, for whatever reason, out of memory (cuheap's
 * message on stderr names the driver call); a free refused in its argument,
 * invalid value. The runtime's codes equal the driver's for these. */
static int cuda_code(cuheap_status_t status, int allocation, unsigned long mark)
{
    int failed = 0;
    if (cuh_unlikely(cuh_failure_mark() != mark)) {   /* something failed somewhere since: one load to know */
        failed = cuh_cuda_failure_since(mark);
        if (!failed)
            failed = cuh_noted_lost_since(mark);   /* a heap that refused: its device was lost earlier */
        if (cuh_cuda_sticky(failed))
            return failed;   /* even where the heap could finish the call: CUDA would not have */
    }
    if (cuh_likely(status == CUHEAP_OK))
        return CUH_CUDA_SUCCESS;
    switch (status) {
    case CUHEAP_ERR_OUT_OF_MEMORY:
        return CUH_CUDA_OUT_OF_MEMORY;
    case CUHEAP_ERR_INVALID_ARGUMENT:
    case CUHEAP_ERR_DOUBLE_FREE:
        return CUH_CUDA_INVALID_VALUE;
    case CUHEAP_ERR_DEVICE:
        return allocation ? CUH_CUDA_OUT_OF_MEMORY : failed ? failed : CUH_CUDA_UNKNOWN;
    default:
        return CUH_CUDA_UNKNOWN;
    }
}

/* What the hooks know of a caller: whether it lies in a shared library
 * whose file name contains the ipc_callers text (its blocks may be shared),
 * and that library's number in the report's table of callers (-1 if dladdr
 * cannot name it). dladdr walks the loaded objects and reading the settings
 * takes the runtime's lock (the settings no longer change once a heap serves
 * allocations), so the answers are kept, for the few call sites that
 * allocate, in a table the process's threads share: one word a caller (its
 * address << 8 | (library + 1) << 1 | shares), read with one load, written
 * only when a caller is new. A table of each thread's own cost every
 * cudaMalloc a trip through __tls_get_addr, whose lines a Python program's
 * interpreter has pushed out of the CPU's caches by then (issue 45). */
typedef struct caller_info_s {
    int shares;
    int library;
} caller_info_t;

#define CALLER_SLOTS 256   /* a power of two */
#define CALLER_PROBES 4    /* slots looked at from a caller's own, within a cache line */
static _Atomic uint64_t caller_slots[CALLER_SLOTS];

static caller_info_t caller_info(const void *caller)
{
    caller_info_t info = {0, -1};
    const uint64_t key = (uint64_t)(uintptr_t)caller;
    if (!caller)
        return info;
    const unsigned home = (unsigned)((key * 0x9E3779B97F4A7C15ull) >> 56) & (CALLER_SLOTS - CALLER_PROBES);
    for (unsigned i = 0; i < CALLER_PROBES && !(key >> 56); i++) {
        const uint64_t v = atomic_load_explicit(&caller_slots[home + i], memory_order_relaxed);
        if (v >> 8 == key)
            return (caller_info_t){(int)(v & 1), (int)((v >> 1) & 127) - 1};
        if (!v)
            break;
    }
    const char *text = cuh_runtime_config()->ipc_callers;
    Dl_info where;
    if (dladdr(caller, &where) && where.dli_fname) {
        const char *name = strrchr(where.dli_fname, '/');
        name = name ? name + 1 : where.dli_fname;
        info.shares = text[0] && strstr(name, text) != NULL;
        info.library = cuh_callers_id(name);
    }
    if (key >> 56)
        return info;   /* no room in a word for such an address: asked each time */
    /* The first empty slot of the caller's, else its own: two threads that
     * meet here store the same answer, or another caller's, asked again. */
    unsigned slot = home;
    for (unsigned i = 0; i < CALLER_PROBES; i++)
        if (!atomic_load_explicit(&caller_slots[home + i], memory_order_relaxed)) {
            slot = home + i;
            break;
        }
    const uint64_t v = key << 8 | (uint64_t)(info.library + 1) << 1 | (uint64_t)info.shares;
    atomic_store_explicit(&caller_slots[slot], v, memory_order_relaxed);
    return info;
}

int cuh_hook_malloc(const char *fn, void **ptr, size_t size, int device, cuh_hook_stream_t stream,
                    const void *caller)
{
    return cuh_hook_malloc_current(fn, ptr, size, device, 0, stream, caller);
}

int cuh_hook_malloc_current(const char *fn, void **ptr, size_t size, int device, int current,
                            cuh_hook_stream_t stream, const void *caller)
{
    interposing();
    const unsigned long mark = begin_call();
    caller_info_t who = caller_info(caller);
    int shareable = stream.device_wide && who.shares;
    /* cudaMalloc's block carries its library's label in the heap's record;
     * a stream-ordered one (a thread's cache may serve it) is recorded by
     * address (callers.h). */
    const unsigned label = stream.device_wide && who.library >= 0 ? cuh_callers_label(who.library) : 0;
    if (current)
        cuh_cuda_assume_current(device);
    cuheap_status_t status =
        cuh_runtime_malloc(fn, ptr, size, device, stream.device_wide, shareable, stream.stream, label);
    if (current)
        cuh_cuda_assume_current(-1);
    if (status == CUHEAP_OK && *ptr) {
        if (label)
            cuh_callers_count_alloc(who.library, size);
        else
            cuh_callers_alloc((uintptr_t)*ptr, size, device, who.library);
    }
    /* Out of memory was explained already; anything else is unexpected (at
     * most a line a second: a program may retry in a loop). */
    if (status != CUHEAP_OK && status != CUHEAP_ERR_OUT_OF_MEMORY) {
        char what[96];
        snprintf(what, sizeof what, "%s(%zu bytes) on device %d failed", fn, size, device);
        cuh_log_error_rate_limited(what);
    }
    return cuda_code(status, 1, mark);
}

int cuh_hook_malloc_pitch(const char *fn, void **ptr, size_t *pitch, size_t width, size_t height, int device,
                          const void *caller)
{
    size_t row = (width + CUH_ALIGN - 1) / CUH_ALIGN * CUH_ALIGN;
    if (row < width || height > SIZE_MAX / row)
        return CUH_CUDA_OUT_OF_MEMORY;
    int code = cuh_hook_malloc(fn, ptr, row * height, device, CUH_HOOK_ANY_STREAM, caller);
    if (code == CUH_CUDA_SUCCESS)
        *pitch = row;
    return code;
}

int cuh_hook_keep_captured_free(const char *fn, void *ptr)
{
    if (cuh_runtime_owner((uintptr_t)ptr) < 0)
        return 0;
    static atomic_int told;
    if (!atomic_exchange(&told, 1))
        cuh_log("%s(%p) during a CUDA graph capture: the graph may use the block whenever it is "
                "replayed, so cuheap keeps it (and any other block freed in a capture) until the "
                "process exits",
                fn, ptr);
    return 1;
}

int cuh_hook_free(const char *fn, void *ptr, cuh_hook_stream_t stream, int *code)
{
    interposing();
    const unsigned long mark = begin_call();
    cuh_heap_freed_t freed;
    cuheap_status_t status = cuh_runtime_free_owned(fn, ptr, stream.device_wide, stream.stream, &freed);
    if (status == CUHEAP_ERR_NOT_OWNED)
        return 0;
    if (status == CUHEAP_OK && freed.label)
        cuh_callers_count_free((int)freed.label - 1, freed.requested);
    else if (status == CUHEAP_OK)
        cuh_callers_free((uintptr_t)ptr);
    else
        print_program_error(fn, ptr);
    *code = cuda_code(status, 0, mark);
    return 1;
}

int cuh_hook_host_alloc(const char *fn, void **ptr, size_t size, unsigned flags, int runtime_api, int *code)
{
    interposing();
    /* The setting, read once (settings do not change once CUDA calls come). */
    static atomic_int serve = -1;
    int on = atomic_load_explicit(&serve, memory_order_relaxed);
    if (on < 0)
        atomic_store_explicit(&serve, on = cuh_runtime_config()->pinned != 0, memory_order_relaxed);
    if (!on || !ptr || size == 0 || (flags & ~CUH_PINNED_SERVED_FLAGS))
        return 0;
    const unsigned long mark = begin_call();
    int device = cuh_hook_device(runtime_api);
    if (device < 0)
        return 0;
    cuheap_status_t status = cuh_runtime_host_alloc(fn, ptr, size, flags, device);
    if (status == CUHEAP_ERR_NOT_OWNED)
        return 0;   /* the cache no longer serves (devices reset too often) */
    if (status != CUHEAP_OK)
        cuh_log_error_rate_limited(status == CUHEAP_ERR_OUT_OF_MEMORY ? "out of pinned host memory"
                                                                        : "pinned host memory");
    *code = cuda_code(status, 1, mark);
    return 1;
}

int cuh_hook_host_free(const char *fn, void *ptr, int *code)
{
    interposing();
    const unsigned long mark = begin_call();
    cuheap_status_t status = cuh_runtime_host_free(fn, ptr);
    if (status == CUHEAP_ERR_NOT_OWNED)
        return 0;
    if (status != CUHEAP_OK)
        print_program_error(fn, ptr);
    *code = cuda_code(status, 0, mark);
    return 1;
}

void cuh_hook_meminfo(size_t *free_bytes, size_t *total_bytes)
{
    interposing();
    if (!free_bytes || !total_bytes || !cuh_runtime_config()->meminfo_cached)
        return;
    int device = cuh_hook_device(1);
    cuh_heap_t *h = device >= 0 ? cuh_runtime_existing_heap(device) : NULL;
    if (!h)
        return;
    cuheap_stats_t st;
    cuh_heap_poll(h);   /* frees whose GPU work has finished count as ready */
    cuh_heap_stats(h, &st);
    uint64_t ready = st.cached.current > st.pending.current ? st.cached.current - st.pending.current : 0;
    if (ready > *total_bytes - *free_bytes)   /* never more free than total */
        ready = *total_bytes - *free_bytes;
    *free_bytes += ready;
}

int cuh_hook_ipc_check(const char *fn, const void *ptr)
{
    interposing();
    int device = cuh_runtime_owner((uintptr_t)ptr);
    cuh_heap_t *h = device >= 0 ? cuh_runtime_existing_heap(device) : NULL;
    if (!h)
        return 0;
    if (cuh_heap_in_virtual_memory(h, (uintptr_t)ptr)) {
        cuh_log("%s(%p) refused: the block lives in CUDA virtual memory (vmm:1, the default), which "
                "legacy IPC handles cannot share; name the library that shares it in ipc_callers (its "
                "blocks then get plain segments of their own), or set CUHEAP_CONF=ipc_safe:1 (a plain "
                "segment for every block)",
                fn, ptr);
        return CUH_CUDA_NOT_SUPPORTED;
    }
    uintptr_t base = 0;
    size_t size = 0;
    if (cuh_heap_segment_of(h, (uintptr_t)ptr, &base, &size) && base == (uintptr_t)ptr)
        return 0;   /* the handle names the segment, which starts at the block */
    cuh_log("%s(%p) refused: the block starts %llu bytes into a cuheap segment, so a handle would name "
            "other memory; set CUHEAP_CONF=ipc_safe:1 to give every block a segment of its own, or name the "
            "library that shares it in ipc_callers",
            fn, ptr, (unsigned long long)((uintptr_t)ptr - base));
    return CUH_CUDA_INVALID_VALUE;
}

void cuh_hook_stream_created(const void *stream, unsigned int flags)
{
    interposing();
    /* A blocking stream waits for the legacy default stream and is waited
     * for by it, so the legacy stream's events already cover it. */
    if (!stream || !(flags & 0x1u /* cudaStreamNonBlocking, CU_STREAM_NON_BLOCKING */))
        return;
    int device = cuh_hook_device(1);
    if (device < 0)
        return;
    if (cuheap_stream_register(device, (cuheap_stream_t)stream) != CUHEAP_OK)
        cuh_log("stream %p on device %d is not covered by cudaFree's ordering: %s", stream, device,
                cuh_get_error());
}

void cuh_hook_stream_destroying(const void *stream)
{
    if (stream)
        cuh_runtime_retire_stream((cuh_stream_t)stream);
}

void cuh_hook_device_reset(int device)
{
    cuh_runtime_drop_heap(device);
}

void cuh_hook_peer_enabled(int owner)
{
    int accessor = -1;
    int ctx = cuh_cuda_current_context(&accessor);
    if ((ctx != CUH_CTX_PRIMARY && ctx != CUH_CTX_OTHER) || accessor < 0 || owner < 0 || accessor == owner)
        return;
    if (cuh_runtime_allow_peer(owner, accessor) != CUHEAP_OK)
        cuh_log("peer access from device %d to device %d: %s (kernels on device %d may fault on cuheap's "
                "virtual memory of device %d)", accessor, owner, cuh_get_error(), accessor, owner);
}
