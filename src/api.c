/* api.c - the public C API (include/cuheap.h) and the process-wide runtime
 * (runtime.h): settings read once, one heap per device created at first use.
 *
 * The settings come from cuheap_configure() or, at first use, from
 * CUHEAP_CONF. A bad CUHEAP_CONF stops the program with a message naming the
 * key: a job must not run on settings it did not ask for.
 */
#include "callers.h"
#include "common.h"
#include "pinned.h"
#include "runtime.h"
#include "trace_write.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t runtime_lock = PTHREAD_MUTEX_INITIALIZER;

static void arm_reports_locked(void);
static void open_trace_locked(void);
static void explain_oom(void);
static cuheap_status_t dump_all(const char *path, cuheap_report_format_t format, int ask_device);

static struct {
    /* What every allocation and free reads, in the first cache line: the
     * trace writer, if any, and the first devices' heaps (issue 45: each
     * line a call touches is a miss when Python has emptied the caches). */
    _Alignas(64) cuh_trace_writer_t *_Atomic trace;
    cuh_heap_t *_Atomic heaps[CUH_MAX_DEVICES];
    int configured;
    int reports_armed;
    pid_t reports_pid;            /* the process that armed them: a fork's child writes none */
    _Atomic int oom_reported;     /* a report shows the heap at an out-of-memory: exit keeps it */
    _Atomic long oom_report_second; /* the second the last one was written (one a second at most); 0 or -1: none */
    cuh_config_t cfg;
    size_t sim_capacity;          /* nonzero: simulated devices */
    cuh_device_t *devices[CUH_MAX_DEVICES];
    uint64_t peers[CUH_MAX_DEVICES];   /* bit p of peers[d]: device p may access device d's memory */
    _Atomic uint64_t heap_generation[CUH_MAX_DEVICES];   /* bumped when a heap is dropped */
    cuh_pinned_t *_Atomic pinned;      /* the pinned host memory cache, made at first use */
    cuh_pinned_t *retired_pinned[8];   /* caches a device reset ended (their frees still come) */
    size_t num_retired_pinned;
    int pinned_off;                    /* too many resets: pinned memory is left to CUDA */
    int plugin;                        /* PyTorch's allocator: its defaults apply (cuh_runtime_as_plugin) */
    int interposer;                    /* CUDA's own calls come to cuheap (cuh_runtime_as_interposer) */
} rt;

/* ---- runtime ---------------------------------------------------------------- */

/* The defaults of the ways this process reaches the heap by. */
static void way_defaults_locked(cuh_config_t *cfg)
{
    cuh_config_defaults_for(cfg, (rt.plugin ? CUH_WAY_PLUGIN : 0u) | (rt.interposer ? CUH_WAY_INTERPOSER : 0u));
}

static void configure_from_env_locked(void)
{
    if (rt.configured)
        return;
    way_defaults_locked(&rt.cfg);
    const char *env = getenv("CUHEAP_CONF");
    char err[512];
    if (env && cuh_config_parse(env, &rt.cfg, err, sizeof err)) {
        cuh_log("CUHEAP_CONF=\"%s\": %s", env, err);
        exit(2);
    }
    rt.configured = 1;
}

void cuh_runtime_as_plugin(void)
{
    pthread_mutex_lock(&runtime_lock);
    rt.plugin = 1;
    pthread_mutex_unlock(&runtime_lock);
}

void cuh_runtime_as_interposer(void)
{
    pthread_mutex_lock(&runtime_lock);
    rt.interposer = 1;
    pthread_mutex_unlock(&runtime_lock);
}

int cuh_runtime_use_sim(size_t capacity)
{
    pthread_mutex_lock(&runtime_lock);
    int rc = 0;
    for (int i = 0; i < CUH_MAX_DEVICES; i++)
        if (rt.heaps[i])
            rc = -1;
    if (!rc)
        rt.sim_capacity = capacity;
    pthread_mutex_unlock(&runtime_lock);
    return rc;
}

void cuh_runtime_reset(void)
{
    pthread_mutex_lock(&runtime_lock);
    cuh_pinned_t *pinned = atomic_exchange(&rt.pinned, NULL);
    pthread_mutex_unlock(&runtime_lock);
    cuh_pinned_destroy(pinned);   /* before the devices its chunks come from */
    pthread_mutex_lock(&runtime_lock);
    for (size_t i = 0; i < rt.num_retired_pinned; i++)
        cuh_pinned_destroy(rt.retired_pinned[i]);
    rt.num_retired_pinned = 0;
    for (int i = 0; i < CUH_MAX_DEVICES; i++) {
        if (rt.heaps[i])
            cuh_heap_destroy(rt.heaps[i]);
        if (rt.devices[i])
            rt.devices[i]->ops->destroy(rt.devices[i]);
        rt.heaps[i] = NULL;
        rt.devices[i] = NULL;
    }
    rt.configured = 0;
    rt.plugin = 0;
    rt.interposer = 0;
    rt.reports_armed = 0;   /* the exit handler stays registered but writes nothing */
    atomic_store(&rt.oom_reported, 0);
    atomic_store(&rt.oom_report_second, -1);
    cuh_trace_writer_close(rt.trace);
    rt.trace = NULL;
    rt.sim_capacity = 0;
    cuh_callers_reset();
    pthread_mutex_unlock(&runtime_lock);
}

static int resolve_device(int device)
{
    if (device != CUHEAP_CURRENT_DEVICE)
        return device;
    if (rt.sim_capacity)
        return 0;
    char err[256];
    int d = cuh_cuda_current_device(err, sizeof err);
    if (d < 0)
        cuh_set_error("finding the current device failed: %s", err);
    return d;
}

cuh_heap_t *cuh_runtime_existing_heap(int device)
{
    device = resolve_device(device);
    if (device < 0 || device >= CUH_MAX_DEVICES)
        return NULL;
    return rt.heaps[device];
}

cuh_device_t *cuh_runtime_device(int device)
{
    cuh_heap_t *h = cuh_runtime_existing_heap(device);
    return h ? cuh_heap_device(h) : NULL;
}

cuheap_status_t cuh_runtime_heap(int device, cuh_heap_t **out)
{
    *out = NULL;
    int d = resolve_device(device);
    if (d < 0)
        return CUHEAP_ERR_DEVICE;
    if (d >= CUH_MAX_DEVICES) {
        cuh_set_error("device %d is out of range (cuheap serves devices 0 to %d)", d, CUH_MAX_DEVICES - 1);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    cuh_heap_t *h = rt.heaps[d];
    if (cuh_likely(h != NULL)) {
        *out = h;
        return CUHEAP_OK;
    }
    cuheap_status_t status = CUHEAP_OK;
    pthread_mutex_lock(&runtime_lock);
    configure_from_env_locked();
    if (!(h = rt.heaps[d])) {
        char err[512];
        cuh_device_t *dev;
        if (rt.sim_capacity)
            dev = cuh_sim_create(&(cuh_sim_params_t){.capacity = rt.sim_capacity, .ordinal = d});
        else
            dev = cuh_cuda_open(d, err, sizeof err);
        if (!dev) {
            if (rt.sim_capacity)
                snprintf(err, sizeof err, "out of host memory");
            cuh_set_error("device %d: %s", d, err);
            status = strstr(err, "libcuda") ? CUHEAP_ERR_NO_DRIVER : CUHEAP_ERR_DEVICE;
        } else if (!(h = cuh_heap_create(dev, &rt.cfg, err, sizeof err))) {
            dev->ops->destroy(dev);
            cuh_set_error("device %d: %s", d, err);
            status = CUHEAP_ERR_CONFIG;
        } else {
            /* Peer access enabled before this heap existed (before it is
             * published: nobody else holds its lock yet). */
            for (int p = 0; p < CUH_MAX_DEVICES; p++)
                if (rt.peers[d] >> p & 1 && cuh_heap_allow_peer(h, p) != CUHEAP_OK)
                    cuh_log("%s", cuh_get_error());
            rt.devices[d] = dev;
            rt.heaps[d] = h;
            if (rt.cfg.report[0] && !rt.reports_armed)
                arm_reports_locked();
            if (rt.cfg.trace[0] && !rt.trace)
                open_trace_locked();
        }
    }
    pthread_mutex_unlock(&runtime_lock);
    *out = h;
    return status;
}

/* ---- public API ------------------------------------------------------------- */

cuheap_status_t cuheap_configure(const char *conf)
{
    cuh_clear_error();
    pthread_mutex_lock(&runtime_lock);
    cuheap_status_t status = CUHEAP_OK;
    int started = 0;
    for (int i = 0; i < CUH_MAX_DEVICES; i++)
        started |= rt.heaps[i] != NULL;
    cuh_config_t cfg;
    way_defaults_locked(&cfg);
    char err[512];
    if (started) {
        cuh_set_error("cuheap_configure: a heap is already in use; configure before the first allocation");
        status = CUHEAP_ERR_CONFIG;
    } else if (cuh_config_parse(conf ? conf : "", &cfg, err, sizeof err)) {
        cuh_set_error("cuheap_configure(\"%s\"): %s", conf, err);
        status = CUHEAP_ERR_CONFIG;
    } else {
        rt.cfg = cfg;
        rt.configured = 1;
    }
    pthread_mutex_unlock(&runtime_lock);
    return status;
}

/* Allocates for `stream`, or device-wide (traces have no "every stream":
 * device-wide blocks are recorded on stream 0); a shareable block is
 * device-wide and starts a segment of its own. */
static cuheap_status_t alloc_block(const char *fn, void **ptr, size_t size, int device, int device_wide,
                                   int shareable, cuheap_stream_t stream, unsigned label)
{
    if (!ptr) {
        cuh_set_error("%s: ptr is NULL", fn);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    *ptr = NULL;
    cuh_heap_t *h;
    cuheap_status_t status = cuh_runtime_heap(device, &h);
    if (status != CUHEAP_OK)
        return status;
    uintptr_t addr = 0;
    if (label)
        status = cuh_heap_malloc_labelled(h, size, device_wide, shareable, (cuh_stream_t)stream, label, &addr);
    else if (!device_wide)
        status = cuh_heap_malloc(h, size, (cuh_stream_t)stream, &addr);
    else if (shareable)
        status = cuh_heap_malloc_shareable(h, size, &addr);
    else
        status = cuh_heap_malloc_device_wide(h, size, &addr);
    *ptr = (void *)addr;
    if (cuh_unlikely(status == CUHEAP_ERR_OUT_OF_MEMORY))
        explain_oom();
    cuh_trace_writer_t *trace = rt.trace;
    if (cuh_unlikely(trace != NULL) && addr)
        cuh_trace_writer_alloc(trace, addr, size, device_wide ? 0 : (uintptr_t)stream);
    return status;
}

cuheap_status_t cuheap_malloc(void **ptr, size_t size, int device, cuheap_stream_t stream)
{
    return alloc_block("cuheap_malloc", ptr, size, device, 0, 0, stream, 0);
}

cuheap_status_t cuheap_malloc_device_wide(void **ptr, size_t size, int device)
{
    return alloc_block("cuheap_malloc_device_wide", ptr, size, device, 1, 0, NULL, 0);
}

/* Frees in h: the hooks ask what the block was (freed), the C API and the
 * plugin do not (the shorter path). */
static inline cuheap_status_t heap_free(cuh_heap_t *h, uintptr_t addr, int device_wide, cuh_stream_t stream,
                                        cuh_heap_freed_t *freed)
{
    if (freed)
        return cuh_heap_free_labelled(h, addr, device_wide, stream, freed);
    return device_wide ? cuh_heap_free_device_wide(h, addr) : cuh_heap_free(h, addr, stream);
}

/* Frees on `stream`, or device-wide; names the heap that owns a foreign
 * pointer, if any. On success *freed (if given) says what the block was. */
static cuheap_status_t free_block(const char *fn, void *ptr, int device, int device_wide, cuheap_stream_t stream,
                                  cuh_heap_freed_t *freed)
{
    if (!ptr)
        return CUHEAP_OK;
    uintptr_t addr = (uintptr_t)ptr;
    cuheap_status_t status = CUHEAP_ERR_NOT_OWNED;
    cuh_heap_t *h = NULL;
    if (device == CUH_ANY_DEVICE) {
        /* The hooks: a pointer is freed by the heap that owns it, whatever
         * the current device (cudaFree takes any device's pointer). */
        for (int d = 0; d < CUH_MAX_DEVICES && status == CUHEAP_ERR_NOT_OWNED; d++)
            if ((h = rt.heaps[d]))
                status = heap_free(h, addr, device_wide, (cuh_stream_t)stream, freed);
    } else if ((h = cuh_runtime_existing_heap(device))) {
        status = heap_free(h, addr, device_wide, (cuh_stream_t)stream, freed);
    }
    cuh_trace_writer_t *trace = rt.trace;
    if (cuh_unlikely(trace != NULL) && status == CUHEAP_OK)
        cuh_trace_writer_free(trace, addr);
    if (status != CUHEAP_ERR_NOT_OWNED || device == CUH_ANY_DEVICE)
        return status;
    for (int d = 0; d < CUH_MAX_DEVICES; d++) {
        cuh_heap_t *other = rt.heaps[d];
        if (other && other != h && cuh_heap_owns(other, addr)) {
            cuh_set_error("%s: %p belongs to device %d's heap, not device %d's", fn, ptr, d, device);
            return CUHEAP_ERR_INVALID_ARGUMENT;
        }
    }
    cuh_set_error("%s: %p was not allocated by cuheap", fn, ptr);
    return CUHEAP_ERR_NOT_OWNED;
}

cuheap_status_t cuh_runtime_free_owned(const char *fn, void *ptr, int device_wide, cuh_stream_t stream,
                                       cuh_heap_freed_t *freed)
{
    return free_block(fn, ptr, CUH_ANY_DEVICE, device_wide, (cuheap_stream_t)stream, freed);
}

cuheap_status_t cuh_runtime_malloc(const char *fn, void **ptr, size_t size, int device, int device_wide,
                                   int shareable, cuh_stream_t stream, unsigned label)
{
    return alloc_block(fn, ptr, size, device, device_wide, shareable, (cuheap_stream_t)stream, label);
}

int cuh_runtime_owner(uintptr_t addr)
{
    for (int d = 0; d < CUH_MAX_DEVICES; d++) {
        cuh_heap_t *h = rt.heaps[d];
        if (h && cuh_heap_owns(h, addr))
            return d;
    }
    return -1;
}

void cuh_runtime_retire_stream(cuh_stream_t stream)
{
    for (int d = 0; d < CUH_MAX_DEVICES; d++) {
        cuh_heap_t *h = rt.heaps[d];
        if (h)
            cuh_heap_retire_stream(h, stream);
    }
}

/* The reset of `device` frees the page-locked memory allocated in its
 * context: a pinned cache with chunks from it serves no more (its frees
 * still come), and a new one takes over. Called with no lock held: the
 * cache's locks come before the runtime's (a chunk is allocated, and a
 * fence made, with them held). */
static void retire_pinned_of(int device)
{
    cuh_pinned_t *pinned = rt.pinned;
    if (!pinned || !cuh_pinned_uses_device(pinned, device))
        return;
    pthread_mutex_lock(&runtime_lock);
    int retired = 0;
    if (rt.pinned == pinned) {
        if (rt.num_retired_pinned < sizeof rt.retired_pinned / sizeof rt.retired_pinned[0]) {
            rt.retired_pinned[rt.num_retired_pinned++] = pinned;
            rt.pinned = NULL;
            retired = 1;
        } else {
            rt.pinned_off = 1;   /* kept as rt.pinned for its frees, serving nothing */
        }
    }
    pthread_mutex_unlock(&runtime_lock);
    cuh_pinned_abandon(pinned);
    if (retired)
        cuh_log("device %d was reset: the pinned host memory CUDA allocated in its context is gone; cuheap "
                "starts a new pinned cache", device);
    else
        cuh_log("device %d was reset again: pinned host memory is no longer served by cuheap", device);
}

void cuh_runtime_drop_heap(int device)
{
    if (device < 0 || device >= CUH_MAX_DEVICES)
        return;
    pthread_mutex_lock(&runtime_lock);
    cuh_heap_t *h = rt.heaps[device];
    cuh_device_t *dev = rt.devices[device];
    rt.heaps[device] = NULL;
    rt.devices[device] = NULL;
    rt.peers[device] = 0;   /* a reset ends the peers' access to it */
    atomic_fetch_add(&rt.heap_generation[device], 1);
    pthread_mutex_unlock(&runtime_lock);
    retire_pinned_of(device);
    /* Its blocks are gone with it: the labelled ones the heap knows, the
     * others the table of callers. */
    uint64_t by_label[256] = {0};
    if (h)
        cuh_heap_live_by_label(h, by_label);
    cuh_callers_forget_labelled(by_label);
    cuh_callers_forget_device(device);
    if (h)
        cuh_heap_destroy(h);
    if (dev)
        dev->ops->destroy(dev);
}

cuheap_status_t cuh_runtime_allow_peer(int owner, int peer)
{
    if (owner < 0 || owner >= CUH_MAX_DEVICES || peer < 0 || peer >= CUH_MAX_DEVICES || owner == peer) {
        cuh_set_error("peer access from device %d to device %d: out of range", peer, owner);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&runtime_lock);
    int fresh = !(rt.peers[owner] >> peer & 1);
    rt.peers[owner] |= 1ull << peer;
    cuh_heap_t *h = rt.heaps[owner];
    pthread_mutex_unlock(&runtime_lock);
    return fresh && h ? cuh_heap_allow_peer(h, peer) : CUHEAP_OK;
}

const cuh_config_t *cuh_runtime_config(void)
{
    pthread_mutex_lock(&runtime_lock);
    configure_from_env_locked();
    pthread_mutex_unlock(&runtime_lock);
    return &rt.cfg;
}

cuheap_status_t cuheap_free(void *ptr, int device, cuheap_stream_t stream)
{
    return free_block("cuheap_free", ptr, device, 0, stream, NULL);
}

cuheap_status_t cuheap_free_device_wide(void *ptr, int device)
{
    return free_block("cuheap_free_device_wide", ptr, device, 1, NULL, NULL);
}

cuheap_status_t cuheap_stream_register(int device, cuheap_stream_t stream)
{
    cuh_heap_t *h;
    cuheap_status_t status = cuh_runtime_heap(device, &h);
    return status == CUHEAP_OK ? cuh_heap_register_stream(h, (cuh_stream_t)stream) : status;
}

cuheap_status_t cuheap_stream_retire(int device, cuheap_stream_t stream)
{
    cuh_heap_t *h = cuh_runtime_existing_heap(device);
    if (h)
        cuh_heap_retire_stream(h, (cuh_stream_t)stream);
    return CUHEAP_OK;
}

cuheap_status_t cuheap_get_stats(int device, cuheap_stats_t *stats)
{
    if (!stats) {
        cuh_set_error("cuheap_get_stats: stats is NULL");
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    memset(stats, 0, sizeof *stats);
    cuh_heap_t *h = cuh_runtime_existing_heap(device);
    if (h)
        cuh_heap_stats(h, stats);
    return CUHEAP_OK;
}

cuheap_status_t cuheap_release_cached(int device)
{
    cuh_heap_t *h = cuh_runtime_existing_heap(device);
    return h ? cuh_heap_release_cached(h) : CUHEAP_OK;
}

cuheap_status_t cuheap_reset_peaks(int device)
{
    cuh_heap_t *h = cuh_runtime_existing_heap(device);
    if (h)
        cuh_heap_reset_peaks(h);
    return CUHEAP_OK;
}

cuheap_status_t cuheap_mark_step(void)
{
    /* Under the runtime's lock, as a report takes its snapshots: no heap is
     * dropped (a device reset) while it is marked. */
    pthread_mutex_lock(&runtime_lock);
    for (int d = 0; d < CUH_MAX_DEVICES; d++) {
        cuh_heap_t *h = rt.heaps[d];
        if (h)
            cuh_heap_mark_step(h);
    }
    pthread_mutex_unlock(&runtime_lock);
    return CUHEAP_OK;
}

/* ---- pinned host memory ------------------------------------------------------ *
 * One pinned cache for the process (pinned.c). Its chunks come from the
 * device interface of the requesting thread's device; its fences cover
 * every device with a heap and every device whose primary context is
 * active (a program may copy on a device where cuheap serves no device
 * memory). */

typedef struct runtime_fence_s {
    size_t n;
    struct {
        int device;
        uint64_t generation;
        cuh_heap_t *heap;
        cuh_heap_fence_t *fence;
    } part[];
} runtime_fence_t;

static cuheap_status_t pinned_chunk_alloc(void *ctx, int device, unsigned flags, size_t size, void **ptr)
{
    (void)ctx;
    cuh_heap_t *h;
    cuheap_status_t status = cuh_runtime_heap(device, &h);
    if (status != CUHEAP_OK)
        return status;
    cuh_device_t *dev = cuh_heap_device(h);
    switch (dev->ops->host_alloc(dev, size, flags, ptr)) {
    case CUH_DEV_OK:
        return CUHEAP_OK;
    case CUH_DEV_OOM:
        cuh_set_error("%s", cuh_dev_error_text(dev));
        return CUHEAP_ERR_OUT_OF_MEMORY;
    default:
        cuh_set_error("%s", cuh_dev_error_text(dev));
        return CUHEAP_ERR_DEVICE;
    }
}

static void pinned_chunk_free(void *ctx, int device, void *ptr, size_t size)
{
    (void)ctx;
    cuh_heap_t *h = device >= 0 && device < CUH_MAX_DEVICES ? rt.heaps[device] : NULL;
    if (h)
        cuh_heap_device(h)->ops->host_free(cuh_heap_device(h), ptr, size);
}

static void *pinned_fence(void *ctx)
{
    (void)ctx;
    uint64_t active = rt.sim_capacity ? 0 : cuh_cuda_active_devices();
    for (int d = 0; d < 64 && d < CUH_MAX_DEVICES; d++)
        if (active >> d & 1 && !rt.heaps[d]) {
            cuh_heap_t *h;
            (void)cuh_runtime_heap(d, &h);
        }
    size_t n = 0;
    for (int d = 0; d < CUH_MAX_DEVICES; d++)
        n += rt.heaps[d] != NULL;
    runtime_fence_t *f = n ? calloc(1, sizeof *f + n * sizeof f->part[0]) : NULL;
    if (!f) {
        for (int d = 0; d < CUH_MAX_DEVICES; d++)   /* nothing to remember it in: wait now */
            if (rt.heaps[d])
                cuh_heap_device(rt.heaps[d])->ops->synchronize(cuh_heap_device(rt.heaps[d]));
        return NULL;
    }
    for (int d = 0; d < CUH_MAX_DEVICES && f->n < n; d++) {
        cuh_heap_t *h = rt.heaps[d];
        if (!h)
            continue;
        f->part[f->n].device = d;
        f->part[f->n].generation = atomic_load(&rt.heap_generation[d]);
        f->part[f->n].heap = h;
        f->part[f->n].fence = cuh_heap_fence(h);
        f->n++;
    }
    return f;
}

/* A part whose heap was dropped (a device reset, which waits for the
 * device) has passed, and its fence went with the heap. */
static int fence_part_alive(const runtime_fence_t *f, size_t i)
{
    int d = f->part[i].device;
    return rt.heaps[d] == f->part[i].heap && atomic_load(&rt.heap_generation[d]) == f->part[i].generation;
}

static int pinned_fence_passed(void *ctx, void *fence, int wait)
{
    (void)ctx;
    runtime_fence_t *f = fence;
    if (!f)
        return 1;
    for (size_t i = 0; i < f->n; i++)
        if (fence_part_alive(f, i) && !cuh_heap_fence_passed(f->part[i].heap, f->part[i].fence, wait))
            return 0;
    return 1;
}

static void pinned_fence_free(void *ctx, void *fence)
{
    (void)ctx;
    runtime_fence_t *f = fence;
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        if (fence_part_alive(f, i))
            cuh_heap_fence_free(f->part[i].heap, f->part[i].fence);
    free(f);
}

/* The pinned cache, made at first use; NULL with a status when none may be. */
static cuh_pinned_t *pinned_cache(cuheap_status_t *status)
{
    cuh_pinned_t *p = rt.pinned;
    *status = CUHEAP_OK;
    if (cuh_likely(p != NULL && !rt.pinned_off))
        return p;
    pthread_mutex_lock(&runtime_lock);
    configure_from_env_locked();
    if (rt.pinned_off) {
        cuh_set_error("pinned host memory is no longer served by cuheap (devices were reset too often)");
        *status = CUHEAP_ERR_NOT_OWNED;
    } else if (!(p = rt.pinned)) {
        static const cuh_pinned_source_t source = {
            .chunk_alloc = pinned_chunk_alloc,
            .chunk_free = pinned_chunk_free,
            .fence = pinned_fence,
            .fence_passed = pinned_fence_passed,
            .fence_free = pinned_fence_free,
        };
        char err[256];
        if (!(p = cuh_pinned_create(&source, rt.cfg.pinned_chunk, err, sizeof err))) {
            cuh_set_error("%s", err);
            *status = CUHEAP_ERR_OUT_OF_MEMORY;
        } else {
            rt.pinned = p;
        }
    }
    pthread_mutex_unlock(&runtime_lock);
    return *status == CUHEAP_OK ? p : NULL;
}

static cuheap_status_t host_alloc(const char *fn, void **ptr, size_t size, unsigned flags, int device)
{
    if (!ptr) {
        cuh_set_error("%s: ptr is NULL", fn);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    *ptr = NULL;
    int d = resolve_device(device);
    if (d < 0)
        return CUHEAP_ERR_DEVICE;
    cuheap_status_t status;
    cuh_pinned_t *p = pinned_cache(&status);
    if (!p)
        return status;
    status = cuh_pinned_alloc(p, size, flags, d, ptr);
    if (status != CUHEAP_OK) {
        char why[CUH_ERROR_MAX];
        snprintf(why, sizeof why, "%s", cuh_get_error());
        cuh_set_error("%s(%zu bytes, flags 0x%x): %s", fn, size, flags, why);
    }
    return status;
}

static cuheap_status_t host_free(const char *fn, void *ptr)
{
    if (!ptr)
        return CUHEAP_OK;
    cuheap_status_t status = CUHEAP_ERR_NOT_OWNED;
    cuh_pinned_t *p = rt.pinned;
    if (p)
        status = cuh_pinned_free(p, ptr);
    if (status != CUHEAP_OK && rt.num_retired_pinned) {
        /* A buffer from before a device reset (the new cache's chunks may
         * even lie where the old ones were). Retired caches are never freed
         * while the process runs: the list is copied, then used unlocked. */
        cuh_pinned_t *retired[sizeof rt.retired_pinned / sizeof rt.retired_pinned[0]];
        pthread_mutex_lock(&runtime_lock);
        size_t n = rt.num_retired_pinned;
        memcpy(retired, rt.retired_pinned, n * sizeof retired[0]);
        pthread_mutex_unlock(&runtime_lock);
        for (size_t i = 0; i < n && status != CUHEAP_OK; i++)
            if (cuh_pinned_free(retired[i], ptr) == CUHEAP_OK)
                status = CUHEAP_OK;
    }
    if (status == CUHEAP_ERR_NOT_OWNED)
        cuh_set_error("%s: %p was not allocated by cuheap's pinned cache", fn, ptr);
    else if (status != CUHEAP_OK) {
        char why[CUH_ERROR_MAX];
        snprintf(why, sizeof why, "%s", cuh_get_error());
        cuh_set_error("%s: %s", fn, why);
    }
    return status;
}

cuheap_status_t cuheap_host_alloc(void **ptr, size_t size, unsigned int flags)
{
    return host_alloc("cuheap_host_alloc", ptr, size, flags, CUHEAP_CURRENT_DEVICE);
}

cuheap_status_t cuheap_host_free(void *ptr)
{
    return host_free("cuheap_host_free", ptr);
}

cuheap_status_t cuheap_get_host_stats(cuheap_host_stats_t *stats)
{
    if (!stats) {
        cuh_set_error("cuheap_get_host_stats: stats is NULL");
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    memset(stats, 0, sizeof *stats);
    cuh_pinned_t *p = rt.pinned;
    if (p) {
        cuh_pinned_poll(p);
        cuh_pinned_stats(p, stats);
    }
    return CUHEAP_OK;
}

cuheap_status_t cuh_runtime_host_alloc(const char *fn, void **ptr, size_t size, unsigned flags, int device)
{
    return host_alloc(fn, ptr, size, flags, device);
}

cuheap_status_t cuh_runtime_host_free(const char *fn, void *ptr)
{
    return host_free(fn, ptr);
}

/* Expands %p in a report path to the process id. */
static void expand_path(const char *path, char *out, size_t len)
{
    size_t o = 0;
    for (const char *p = path; *p && o + 1 < len; p++) {
        if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(out + o, len - o, "%d", (int)getpid());
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o < len ? o : len - 1] = '\0';
}

static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;

/* Writes every heap's report to path (%p expanded), with the pinned host
 * memory cache's statistics when the process ever used it (a job that never
 * did gets no such section). ask_device 0 makes no device call: at exit the
 * driver may be gone. While the program runs, the heaps are read under the
 * runtime's lock: a device reset on another thread (cuh_runtime_drop_heap)
 * destroys a heap only once it is out of rt.heaps. At exit no lock is
 * taken: the thread that exits may hold it (a bad CUHEAP_CONF exits from
 * under it), and nothing resets a device then. */
static cuheap_status_t dump_all(const char *path, cuheap_report_format_t format, int ask_device)
{
    cuh_heap_snapshot_t *snaps[CUH_MAX_DEVICES];
    size_t n = 0;
    if (ask_device)
        pthread_mutex_lock(&runtime_lock);
    for (int d = 0; d < CUH_MAX_DEVICES; d++) {
        cuh_heap_t *h = rt.heaps[d];
        if (h && (snaps[n] = cuh_heap_snapshot(h, ask_device)))
            n++;
    }
    if (ask_device)
        pthread_mutex_unlock(&runtime_lock);
    cuheap_host_stats_t host = {0};
    cuh_pinned_t *cache = rt.pinned;
    if (ask_device)
        cuheap_get_host_stats(&host);   /* takes back finished frees first: pending is as of now */
    else if (cache)
        cuh_pinned_stats(cache, &host);   /* no poll: it queries events, and the driver may be gone */
    cuh_caller_stat_t callers[CUH_CALLERS_MAX];
    cuh_report_extra_t extra = {.pinned = host.num_allocs || host.reserved.peak ? &host : NULL,
                                .callers = callers,
                                .num_callers = cuh_callers_snapshot(callers, CUH_CALLERS_MAX)};
    char file[4096];
    expand_path(path, file, sizeof file);
    int to_stdout = strcmp(file, "-") == 0;
    /* A regular file (or a new one) is written beside its place and renamed
     * over it: whoever opens the report sees a whole one, the last or the
     * one before, never a half-written one. Anything else (a terminal, a
     * pipe, a symbolic link) is written in place. */
    struct stat st;
    char temp[sizeof file + 32];
    int in_place = to_stdout || (lstat(file, &st) == 0 && !S_ISREG(st.st_mode)) ||
                   snprintf(temp, sizeof temp, "%s.tmp-%d", file, (int)getpid()) >= (int)sizeof temp;
    pthread_mutex_lock(&report_lock);
    FILE *out = to_stdout ? stdout : fopen(in_place ? file : temp, "w");
    cuheap_status_t status = CUHEAP_OK;
    if (!out) {
        cuh_set_error("cannot write the report %s: %s", file, strerror(errno));
        status = CUHEAP_ERR_IO;
    } else {
        if (format == CUHEAP_REPORT_JSON)
            cuh_report_json(out, cuh_report_origin_now(), snaps, n, &extra);
        else if (format == CUHEAP_REPORT_HTML)
            cuh_report_html(out, cuh_report_origin_now(), snaps, n, &extra);
        else
            cuh_report_text(out, cuh_report_origin_now(), snaps, n, &extra);
        if (to_stdout ? fflush(out) != 0 : fclose(out) != 0) {
            cuh_set_error("writing the report %s failed: %s", file, strerror(errno));
            status = CUHEAP_ERR_IO;
        } else if (!in_place && rename(temp, file) != 0) {
            cuh_set_error("cannot put the report in place as %s: %s", file, strerror(errno));
            status = CUHEAP_ERR_IO;
        }
        if (!in_place && status != CUHEAP_OK)
            unlink(temp);
    }
    pthread_mutex_unlock(&report_lock);
    for (size_t i = 0; i < n; i++)
        cuh_heap_snapshot_free(snaps[i]);
    return status;
}

cuheap_status_t cuheap_dump_report(const char *path, cuheap_report_format_t format)
{
    if (!path || (format != CUHEAP_REPORT_TEXT && format != CUHEAP_REPORT_JSON && format != CUHEAP_REPORT_HTML)) {
        cuh_set_error("cuheap_dump_report: need a path and CUHEAP_REPORT_TEXT, _JSON or _HTML");
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    return dump_all(path, format, 1);
}

/* ---- automatic reports (CUHEAP_CONF report:PATH) ---------------------------- */

static cuheap_report_format_t format_for(const char *path)
{
    size_t n = strlen(path);
    if (n > 5 && strcmp(path + n - 5, ".json") == 0)
        return CUHEAP_REPORT_JSON;
    if (n > 5 && strcmp(path + n - 5, ".html") == 0)
        return CUHEAP_REPORT_HTML;
    return CUHEAP_REPORT_TEXT;
}

/* The configured report, if this is the process that configured it; 1 when
 * written. */
static int write_configured_report(int ask_device)
{
    /* The path as configured, read under the lock while the program runs:
     * after a device reset the program may configure again (cuheap_configure)
     * while the SIGUSR1 writer or an out-of-memory writes (see dump_all for
     * the exit). */
    char path[sizeof rt.cfg.report];
    if (ask_device)
        pthread_mutex_lock(&runtime_lock);
    int armed = rt.reports_armed && getpid() == rt.reports_pid;
    if (armed)
        memcpy(path, rt.cfg.report, sizeof path);
    if (ask_device)
        pthread_mutex_unlock(&runtime_lock);
    if (!armed)
        return 0;
    char saved[CUH_ERROR_MAX];
    snprintf(saved, sizeof saved, "%s", cuh_get_error());   /* keep the caller's last error */
    int written = dump_all(path, format_for(path), ask_device) == CUHEAP_OK;
    if (!written)
        cuh_log("%s", cuh_get_error());
    cuh_set_error("%s", saved);
    return written;
}

/* Under LD_PRELOAD, adds to the out-of-memory error the libraries that hold
 * device memory now: whether the framework itself, or a library beside it,
 * holds what is missing. The C API and the plugin record no callers. */
static void name_callers_in_error(void)
{
    char clause[CUH_CALLERS_SUMMARY_MAX];
    if (!cuh_callers_live_summary(clause, sizeof clause))
        return;
    char error[CUH_ERROR_MAX];
    snprintf(error, sizeof error, "%s", cuh_get_error());
    cuh_set_error("%s; %s", error, clause);
}

/* An out-of-memory: its explanation on stderr and the report, each at most
 * once a second. */
static void explain_oom(void)
{
    name_callers_in_error();
    cuh_log_error_rate_limited("CUDA out of memory");
    if (!rt.reports_armed)
        return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long prev = atomic_load(&rt.oom_report_second);
    if (now.tv_sec != prev && atomic_compare_exchange_strong(&rt.oom_report_second, &prev, (long)now.tv_sec) &&
        write_configured_report(1))
        atomic_store(&rt.oom_reported, 1);
}

static void report_at_exit(void)
{
    /* The heap at the failure is what a report of an out-of-memory is for:
     * by exit the program has usually let go of what filled it. */
    if (atomic_load(&rt.oom_reported)) {
        if (rt.reports_armed && getpid() == rt.reports_pid) {
            char file[4096];
            expand_path(rt.cfg.report, file, sizeof file);
            cuh_log("the report %s shows the heap at the last out-of-memory; it is not rewritten at exit", file);
        }
        return;
    }
    /* No device call: the CUDA context may already be gone. */
    write_configured_report(0);
}

static sem_t sigusr1_sem;

static void on_sigusr1(int sig)
{
    (void)sig;
    sem_post(&sigusr1_sem);   /* async-signal-safe; the thread below writes */
}

static void *sigusr1_writer(void *arg)
{
    (void)arg;
    for (;;) {
        if (sem_wait(&sigusr1_sem) == 0)
            (void)write_configured_report(1);
    }
    return NULL;
}

static void close_trace_at_exit(void)
{
    /* Finished, not freed: another thread may still be about to record. */
    cuh_trace_writer_finish(rt.trace);
}

/* Called once, when the first heap of a process with trace:PATH appears. */
static void open_trace_locked(void)
{
    char err[512];
    cuh_trace_writer_t *w = cuh_trace_writer_open(rt.cfg.trace, err, sizeof err);
    if (!w) {
        cuh_log("%s; nothing is recorded", err);
        return;
    }
    rt.trace = w;
    atexit(close_trace_at_exit);
}

/* Called once, when the first heap of a process with report:PATH appears. */
static void arm_reports_locked(void)
{
    rt.reports_armed = 1;
    rt.reports_pid = getpid();
    atexit(report_at_exit);
    /* Said now, not at the out-of-memory the report is for. */
    char file[4096], dir[4096];
    expand_path(rt.cfg.report, file, sizeof file);
    const char *slash = strrchr(file, '/');
    if (strcmp(file, "-") != 0) {
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else if (slash == file)
            snprintf(dir, sizeof dir, "/");
        else
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - file), file);
        if (access(dir, W_OK | X_OK) != 0)
            cuh_log("report:%s: cannot write into %s (%s): no report can be written there until it can",
                    rt.cfg.report, dir, strerror(errno));
    }
    struct sigaction old;
    if (sigaction(SIGUSR1, NULL, &old) == 0 && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
        cuh_log("report:%s: the program handles SIGUSR1 itself; reports on SIGUSR1 are off", rt.cfg.report);
        return;
    }
    pthread_t t;
    if (sem_init(&sigusr1_sem, 0, 0) != 0 || pthread_create(&t, NULL, sigusr1_writer, NULL) != 0) {
        cuh_log("report:%s: cannot start the SIGUSR1 writer; reports on SIGUSR1 are off", rt.cfg.report);
        return;
    }
    pthread_detach(t);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}

cuheap_status_t cuheap_trace_mark(const char *label)
{
    cuh_clear_error();
    if (!label) {
        cuh_set_error("cuheap_trace_mark: label is NULL");
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    size_t n = strlen(label);
    if (n == 0 || n > 200) {
        cuh_set_error("cuheap_trace_mark: the label must be 1 to 200 characters (it has %zu)", n);
        return CUHEAP_ERR_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)label[i] < 0x20 || label[i] == 0x7f) {
            cuh_set_error("cuheap_trace_mark: the label holds a control character at byte %zu: one printable line "
                          "only", i);
            return CUHEAP_ERR_INVALID_ARGUMENT;
        }
    cuh_trace_writer_t *trace = rt.trace;
    if (!trace) {
        cuh_set_error("cuheap_trace_mark: no trace is being recorded (%s)",
                      rt.cfg.trace[0] ? "trace: is set, but no allocation has opened it yet"
                                      : "set trace:PATH in CUHEAP_CONF");
        return CUHEAP_ERR_CONFIG;
    }
    cuh_trace_writer_mark(trace, label);
    return CUHEAP_OK;
}

const char *cuheap_status_string(cuheap_status_t status)
{
    switch (status) {
    case CUHEAP_OK: return "no error";
    case CUHEAP_ERR_OUT_OF_MEMORY: return "out of memory";
    case CUHEAP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case CUHEAP_ERR_NOT_OWNED: return "pointer not allocated by cuheap";
    case CUHEAP_ERR_DOUBLE_FREE: return "double free";
    case CUHEAP_ERR_DEVICE: return "CUDA driver error";
    case CUHEAP_ERR_CONFIG: return "bad configuration";
    case CUHEAP_ERR_NO_DRIVER: return "CUDA driver (libcuda.so.1) not found";
    case CUHEAP_ERR_IO: return "report could not be written";
    }
    return "unknown status";
}

const char *cuheap_last_error(void) { return cuh_get_error(); }
