/* hook_torch.c - PyTorch's pluggable-allocator entry points.
 *
 * torch.cuda.memory.CUDAPluggableAllocator calls a pair of C functions for
 * every tensor allocation and free, with the device and the stream, plus
 * optional hooks (empty_cache, set_per_process_memory_fraction,
 * record_stream, graph pools). These functions only translate: each one
 * finds the device's heap and calls it; scripts/cuheap_torch.py wires them
 * in. Errors cannot be returned through PyTorch's signatures, so they go to
 * stderr, rate-limited; an allocation that fails throws a C++ exception
 * through PyTorch (a NULL would become a tensor with a null data pointer),
 * which Python sees as a RuntimeError naming the cause, after cuheap has
 * printed why.
 *
 * Graph pools: PyTorch passes a pool id (a pair of integers) and, on begin,
 * a C++ std::function filter by reference; cuheap ignores the filter and
 * treats every free on the device during a capture as belonging to the pool
 * (safe: such memory is only held longer).
 */
#include "hook_torch.h"

#include "common.h"
#include "runtime.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include <stdio.h>
#include <sys/types.h>

#define API __attribute__((visibility("default")))

static uint64_t pool_key(uint64_t first, uint64_t second)
{
    uint64_t k = first * 0x9E3779B97F4A7C15ull ^ second;
    return k ? k : 1;
}

/* The C++ runtime's functions, found in the global scope or, since Python
 * loads extension modules with RTLD_LOCAL and PyTorch's C++ runtime is then
 * not in it, by name in libstdc++ if it is loaded already (RTLD_NOLOAD). */
static int cxx_scope(void **scope)
{
    *scope = RTLD_DEFAULT;   /* a null handle: test the lookup, not it */
    if (dlsym(RTLD_DEFAULT, "__cxa_throw"))
        return 1;
    return (*scope = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD)) != NULL;
}

/* Room for the exception object: std::bad_alloc is a vtable pointer,
 * std::runtime_error that and a reference-counted string (16 bytes in
 * libstdc++'s ABI); more does no harm. */
#define CXX_EXCEPTION_ROOM 64

/* Throws std::runtime_error(message), as `throw std::runtime_error(message)`
 * compiles: an exception object built by the class's constructor, thrown
 * with its type_info and destructor. PyTorch turns it into a Python
 * RuntimeError carrying the message, which is how tools that retry with a
 * smaller batch recognise an out-of-memory ("CUDA out of memory."). Failing
 * that, std::bad_alloc (a vtable pointer, its address point two words in).
 * Returns only if the process has no C++ runtime. No lock is held here. */
static void throw_cxx_error(const char *message)
{
    void *scope;
    if (!cxx_scope(&scope))
        return;
    void *alloc_sym = dlsym(scope, "__cxa_allocate_exception");
    void *throw_sym = dlsym(scope, "__cxa_throw");
    if (!alloc_sym || !throw_sym)
        return;
    void *(*allocate_exception)(size_t);
    void (*cxa_throw)(void *, void *, void (*)(void *));
    void (*dtor)(void *);
    memcpy(&allocate_exception, &alloc_sym, sizeof alloc_sym);
    memcpy(&cxa_throw, &throw_sym, sizeof throw_sym);
    void *ctor_sym = dlsym(scope, "_ZNSt13runtime_errorC1EPKc");
    void *type_info = dlsym(scope, "_ZTISt13runtime_error");
    void *dtor_sym = dlsym(scope, "_ZNSt13runtime_errorD1Ev");
    if (ctor_sym && type_info && dtor_sym) {
        void (*ctor)(void *, const char *);
        memcpy(&ctor, &ctor_sym, sizeof ctor_sym);
        memcpy(&dtor, &dtor_sym, sizeof dtor_sym);
        void *exception = allocate_exception(CXX_EXCEPTION_ROOM);
        ctor(exception, message);
        cxa_throw(exception, type_info, dtor);
    }
    type_info = dlsym(scope, "_ZTISt9bad_alloc");
    void *vtable = dlsym(scope, "_ZTVSt9bad_alloc");
    dtor_sym = dlsym(scope, "_ZNSt9bad_allocD1Ev");
    if (!type_info || !vtable || !dtor_sym)
        return;
    memcpy(&dtor, &dtor_sym, sizeof dtor_sym);
    void **exception = allocate_exception(CXX_EXCEPTION_ROOM);
    *exception = (char *)vtable + 2 * sizeof(void *);
    cxa_throw(exception, type_info, dtor);
}

/* The out-of-memory observer cuheap_torch.py registers for the Python
 * observers of torch._C._cuda_attach_out_of_memory_observer (PyTorch's plugin
 * interface refuses them). Called as PyTorch's own allocator calls them:
 * after the failure was explained, before the exception, no lock held, with
 * the most the device may hold (the limit, or the device's memory) and its
 * free bytes at the failure. */
static _Atomic(cuheap_torch_oom_observer_t) oom_observer;

API void cuheap_torch_set_oom_observer(cuheap_torch_oom_observer_t observer)
{
    atomic_store_explicit(&oom_observer, observer, memory_order_release);
}

static void notify_oom(int device, ssize_t size)
{
    cuheap_torch_oom_observer_t observer = atomic_load_explicit(&oom_observer, memory_order_acquire);
    cuh_heap_t *heap = observer ? cuh_runtime_existing_heap(device) : NULL;
    cuh_oom_info_t info;
    if (heap && cuh_heap_last_oom(heap, &info))
        observer(device, (int64_t)size, (int64_t)(info.limit ? info.limit : info.device_total),
                 (int64_t)info.device_free);
}

/* Set once PyTorch has called in: its defaults apply from then on. */
static _Atomic int plugin_noted;

static void note_plugin(void)
{
    if (!atomic_load_explicit(&plugin_noted, memory_order_relaxed)) {
        atomic_store_explicit(&plugin_noted, 1, memory_order_relaxed);
        cuh_runtime_as_plugin();
    }
}

API void *cuheap_torch_alloc(ssize_t size, int device, cuheap_stream_t stream)
{
    void *ptr = NULL;
    note_plugin();   /* in case PyTorch allocates before calling init */
    if (size < 0) {
        cuh_set_error("negative size %zd", size);
        cuh_log_error_rate_limited("allocation refused");
        return NULL;
    }
    cuheap_status_t s = cuheap_malloc(&ptr, (size_t)size, device, stream);
    if (s != CUHEAP_OK) {
        /* An out-of-memory was explained on stderr by cuheap_malloc; the
         * exception carries its gist, in the words PyTorch's own uses. */
        char message[CUH_ERROR_MAX + 256], bytes[32];
        cuh_format_bytes(bytes, sizeof bytes, (uint64_t)size);
        if (s == CUHEAP_ERR_OUT_OF_MEMORY) {
            snprintf(message, sizeof message,
                     "CUDA out of memory. Tried to allocate %s (%zd bytes) on device %d; cuheap, PyTorch's "
                     "allocator here: %s",
                     bytes, size, device, cuh_get_error());
            notify_oom(device, size);   /* after: an observer may call cuheap, which sets the error */
        } else {
            cuh_log_error_rate_limited("allocation failed");
            snprintf(message, sizeof message, "cuheap could not allocate %s (%zd bytes) on device %d: %s", bytes,
                     size, device, cuh_get_error());
        }
        throw_cxx_error(message);
    }
    return ptr;
}

API void cuheap_torch_free(void *ptr, ssize_t size, int device, cuheap_stream_t stream)
{
    (void)size;
    if (cuheap_free(ptr, device, stream) != CUHEAP_OK)
        cuh_log_error_rate_limited("free failed");
}

API void cuheap_torch_init(int device_count)
{
    (void)device_count;   /* heaps are created at first use */
    atomic_store_explicit(&plugin_noted, 1, memory_order_relaxed);
    cuh_runtime_as_plugin();
}

API void cuheap_torch_reset(void)
{
    for (int d = 0; d < CUH_MAX_DEVICES; d++)
        cuheap_release_cached(d);
}

API void cuheap_torch_memory_fraction(double fraction, int device)
{
    cuh_heap_t *h;
    if (!(fraction > 0.0 && fraction <= 1.0)) {
        cuh_set_error("memory fraction %g is not in (0, 1]", fraction);
        cuh_log_error_rate_limited("set_per_process_memory_fraction");
        return;
    }
    if (cuh_runtime_heap(device, &h) != CUHEAP_OK) {
        cuh_log_error_rate_limited("set_per_process_memory_fraction");
        return;
    }
    cuh_heap_set_limit(h, (size_t)((double)cuh_heap_device_total(h) * fraction));
}

static cuh_heap_t *heap_owning(uintptr_t addr)
{
    for (int d = 0; d < CUH_MAX_DEVICES; d++) {
        cuh_heap_t *h = cuh_runtime_existing_heap(d);
        if (h && cuh_heap_owns(h, addr))
            return h;
    }
    return NULL;
}

API void cuheap_torch_record_stream(void *ptr, cuheap_stream_t stream)
{
    cuh_heap_t *h = heap_owning((uintptr_t)ptr);
    if (!h || cuh_heap_record_stream(h, (uintptr_t)ptr, (cuh_stream_t)stream) != CUHEAP_OK) {
        if (!h)
            cuh_set_error("record_stream: %p was not allocated by cuheap", ptr);
        cuh_log_error_rate_limited("record_stream failed");
    }
}

API void *cuheap_torch_base_alloc(void *ptr, size_t *size)
{
    cuh_heap_t *h = heap_owning((uintptr_t)ptr);
    uintptr_t base = 0;
    size_t len = 0;
    if (h && cuh_heap_segment_of(h, (uintptr_t)ptr, &base, &len)) {
        if (size)
            *size = len;
        return (void *)base;
    }
    return ptr;
}

API void cuheap_torch_begin_pool(int device, uint64_t id_first, uint64_t id_second, const void *filter)
{
    (void)filter;
    cuh_heap_t *h;
    if (cuh_runtime_heap(device, &h) == CUHEAP_OK)
        cuh_heap_capture_begin(h, pool_key(id_first, id_second));
    else
        cuh_log_error_rate_limited("graph capture");
}

API void cuheap_torch_end_pool(int device, uint64_t id_first, uint64_t id_second)
{
    (void)id_first;
    (void)id_second;
    cuh_heap_t *h = cuh_runtime_existing_heap(device);
    if (h)
        cuh_heap_capture_end(h);
}

API void cuheap_torch_release_pool(int device, uint64_t id_first, uint64_t id_second)
{
    cuh_heap_t *h = cuh_runtime_existing_heap(device);
    if (h)
        cuh_heap_release_pool(h, pool_key(id_first, id_second));
}
