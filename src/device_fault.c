/* device_fault.c - a device that fails on purpose: fault plans for tests.
 *
 * A real driver fails in more ways than running out of memory: an event
 * record or query returns an error, a map fails after the physical memory
 * was created, an unmap fails, a stream wait is refused, page-locked memory
 * runs out, and after an illegal address the context is lost and every call
 * from then on returns the same error (CUDA's sticky errors). This device
 * wraps another (the simulated GPU, in the tests and the fuzz target) and
 * makes its calls fail by a plan: the Nth call of a kind from now, each call
 * of a kind with a seeded probability, every call from some call on
 * (sticky), or every unmap of one range (a mapping the driver will not let
 * go). A failed call does nothing on the device beneath, as a failed
 * driver call does nothing; every other call goes through unchanged. The
 * calls that return nothing (event_destroy, vm_unreserve, vm_release,
 * host_free) cannot fail here: the driver's own failures of those are the
 * fake driver's to inject (tests/fake/fake_cuda.c).
 *
 * The plan is the test's: one thread sets it while the heap is quiet. The
 * counting is thread-safe.
 */
#include "device.h"

#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fault_rule_s {
    uint64_t nth;            /* fail the call that makes calls[k] reach this; 0: none */
    double probability;      /* fail each call with this probability; 0: never */
    uint64_t rng;            /* xorshift state of the random rule */
    cuh_dev_status_t status; /* what a failed call returns */
} fault_rule_t;

typedef struct fault_device_s {
    cuh_device_t base;
    cuh_device_t *inner;
    pthread_mutex_t lock;
    fault_rule_t rule[CUH_FAULT_NUM_CALLS];
    uint64_t calls[CUH_FAULT_NUM_CALLS];     /* calls made, failed or not */
    uint64_t injected[CUH_FAULT_NUM_CALLS];  /* calls failed on purpose */
    uint64_t total_calls;
    uint64_t sticky_from;                    /* from this call (of any kind) on, every call fails; 0: never */
    cuh_dev_status_t sticky_status;
    int sticky;                              /* the sticky error has struck */
    uintptr_t stuck_va;                      /* every vm_unmap of a range starting here fails; 0: none */
} fault_device_t;

static const char *const call_names[CUH_FAULT_NUM_CALLS] = {
    [CUH_FAULT_MEM_ALLOC] = "mem_alloc",       [CUH_FAULT_MEM_FREE] = "mem_free",
    [CUH_FAULT_MEM_INFO] = "mem_info",         [CUH_FAULT_EVENT_CREATE] = "event_create",
    [CUH_FAULT_EVENT_RECORD] = "event_record", [CUH_FAULT_EVENT_QUERY] = "event_query",
    [CUH_FAULT_EVENT_WAIT] = "event_wait",     [CUH_FAULT_STREAM_WAIT] = "stream_wait",
    [CUH_FAULT_RECORD_ALL] = "event_record_all", [CUH_FAULT_WAIT_ALL] = "wait_all",
    [CUH_FAULT_SYNCHRONIZE] = "synchronize",   [CUH_FAULT_VM_RESERVE] = "vm_reserve",
    [CUH_FAULT_VM_CREATE] = "vm_create",       [CUH_FAULT_VM_MAP] = "vm_map",
    [CUH_FAULT_VM_UNMAP] = "vm_unmap",         [CUH_FAULT_VM_ALLOW_PEER] = "vm_allow_peer",
    [CUH_FAULT_HOST_ALLOC] = "host_alloc",
};

const char *cuh_fault_call_name(cuh_fault_call_t call)
{
    return (unsigned)call < CUH_FAULT_NUM_CALLS ? call_names[call] : "?";
}

int cuh_fault_call_by_name(const char *name)
{
    for (int k = 0; k < CUH_FAULT_NUM_CALLS; k++)
        if (strcmp(call_names[k], name) == 0)
            return k;
    return -1;
}

static fault_device_t *fault_of(cuh_device_t *dev) { return (fault_device_t *)dev; }

static uint64_t next_random(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Counts a call of `kind`; CUH_DEV_OK to let it through, else the status a
 * planned failure returns, with its error text saying so. */
static cuh_dev_status_t planned(fault_device_t *f, cuh_fault_call_t kind)
{
    pthread_mutex_lock(&f->lock);
    uint64_t n = ++f->calls[kind];
    uint64_t total = ++f->total_calls;
    fault_rule_t *r = &f->rule[kind];
    cuh_dev_status_t st = CUH_DEV_OK;
    if (f->sticky || (f->sticky_from && total >= f->sticky_from)) {
        f->sticky = 1;
        st = f->sticky_status;
        snprintf(cuh_dev_error_text(&f->base), CUH_DEV_ERROR_LEN,
                 "%s failed: injected sticky error (the context is lost since call %llu)", call_names[kind],
                 (unsigned long long)f->sticky_from);
        cuh_dev_keep_lost_text(&f->base);
        atomic_store_explicit(&f->base.lost, CUH_FAULT_STICKY_CODE, memory_order_relaxed);
    } else if (r->nth && n == r->nth) {
        r->nth = 0;
        st = r->status;
        snprintf(cuh_dev_error_text(&f->base), CUH_DEV_ERROR_LEN, "%s failed: injected fault (call %llu of its kind)",
                 call_names[kind], (unsigned long long)n);
    } else if (r->probability > 0 &&
               (double)(next_random(&r->rng) >> 11) * 0x1.0p-53 < r->probability) {
        st = r->status;
        snprintf(cuh_dev_error_text(&f->base), CUH_DEV_ERROR_LEN,
                 "%s failed: injected fault (call %llu of its kind, at random)", call_names[kind],
                 (unsigned long long)n);
    }
    if (st != CUH_DEV_OK)
        f->injected[kind]++;
    pthread_mutex_unlock(&f->lock);
    return st;
}

/* A call of `kind` planned to fail, or the inner device's answer (whose
 * message is the calling thread's error text already). */
#define THROUGH(kind, call)                                      \
    do {                                                         \
        fault_device_t *f = fault_of(dev);                       \
        cuh_dev_status_t st_ = planned(f, kind);                 \
        return st_ != CUH_DEV_OK ? st_ : (call);                 \
    } while (0)

static cuh_dev_status_t f_mem_alloc(cuh_device_t *dev, size_t size, uintptr_t *addr)
{
    THROUGH(CUH_FAULT_MEM_ALLOC, fault_of(dev)->inner->ops->mem_alloc(fault_of(dev)->inner, size, addr));
}

static cuh_dev_status_t f_mem_free(cuh_device_t *dev, uintptr_t addr, size_t size)
{
    THROUGH(CUH_FAULT_MEM_FREE, fault_of(dev)->inner->ops->mem_free(fault_of(dev)->inner, addr, size));
}

static cuh_dev_status_t f_mem_info(cuh_device_t *dev, size_t *free_bytes, size_t *total_bytes)
{
    THROUGH(CUH_FAULT_MEM_INFO, fault_of(dev)->inner->ops->mem_info(fault_of(dev)->inner, free_bytes, total_bytes));
}

static cuh_dev_status_t f_event_create(cuh_device_t *dev, cuh_event_t *event)
{
    THROUGH(CUH_FAULT_EVENT_CREATE, fault_of(dev)->inner->ops->event_create(fault_of(dev)->inner, event));
}

static void f_event_destroy(cuh_device_t *dev, cuh_event_t event)
{
    fault_of(dev)->inner->ops->event_destroy(fault_of(dev)->inner, event);
}

static cuh_dev_status_t f_event_record(cuh_device_t *dev, cuh_event_t event, cuh_stream_t stream)
{
    THROUGH(CUH_FAULT_EVENT_RECORD, fault_of(dev)->inner->ops->event_record(fault_of(dev)->inner, event, stream));
}

static cuh_dev_status_t f_event_query(cuh_device_t *dev, cuh_event_t event)
{
    THROUGH(CUH_FAULT_EVENT_QUERY, fault_of(dev)->inner->ops->event_query(fault_of(dev)->inner, event));
}

static cuh_dev_status_t f_event_wait(cuh_device_t *dev, cuh_event_t event)
{
    THROUGH(CUH_FAULT_EVENT_WAIT, fault_of(dev)->inner->ops->event_wait(fault_of(dev)->inner, event));
}

static cuh_dev_status_t f_stream_wait(cuh_device_t *dev, cuh_stream_t stream, cuh_event_t event)
{
    THROUGH(CUH_FAULT_STREAM_WAIT, fault_of(dev)->inner->ops->stream_wait(fault_of(dev)->inner, stream, event));
}

static cuh_dev_status_t f_event_record_all(cuh_device_t *dev, cuh_event_t event)
{
    THROUGH(CUH_FAULT_RECORD_ALL, fault_of(dev)->inner->ops->event_record_all(fault_of(dev)->inner, event));
}

static cuh_dev_status_t f_wait_all(cuh_device_t *dev, cuh_event_t event)
{
    THROUGH(CUH_FAULT_WAIT_ALL, fault_of(dev)->inner->ops->wait_all(fault_of(dev)->inner, event));
}

/* A failed synchronize loses the device (device.h), as a sticky error does. */
static cuh_dev_status_t f_synchronize(cuh_device_t *dev)
{
    fault_device_t *f = fault_of(dev);
    cuh_dev_status_t st = planned(f, CUH_FAULT_SYNCHRONIZE);
    if (st == CUH_DEV_OK)
        return f->inner->ops->synchronize(f->inner);   /* its message is this thread's already */
    cuh_dev_keep_lost_text(&f->base);
    int none = 0;
    atomic_compare_exchange_strong(&f->base.lost, &none, CUH_FAULT_STICKY_CODE);
    return st;
}

static size_t f_vm_granularity(cuh_device_t *dev)
{
    return fault_of(dev)->inner->ops->vm_granularity(fault_of(dev)->inner);
}

static cuh_dev_status_t f_vm_reserve(cuh_device_t *dev, size_t size, uintptr_t *va)
{
    THROUGH(CUH_FAULT_VM_RESERVE, fault_of(dev)->inner->ops->vm_reserve(fault_of(dev)->inner, size, va));
}

static void f_vm_unreserve(cuh_device_t *dev, uintptr_t va, size_t size)
{
    fault_of(dev)->inner->ops->vm_unreserve(fault_of(dev)->inner, va, size);
}

static cuh_dev_status_t f_vm_create(cuh_device_t *dev, size_t size, uint64_t *handle)
{
    THROUGH(CUH_FAULT_VM_CREATE, fault_of(dev)->inner->ops->vm_create(fault_of(dev)->inner, size, handle));
}

static void f_vm_release(cuh_device_t *dev, uint64_t handle)
{
    fault_of(dev)->inner->ops->vm_release(fault_of(dev)->inner, handle);
}

static cuh_dev_status_t f_vm_map(cuh_device_t *dev, uintptr_t va, size_t size, uint64_t handle)
{
    THROUGH(CUH_FAULT_VM_MAP, fault_of(dev)->inner->ops->vm_map(fault_of(dev)->inner, va, size, handle));
}

/* Whether va is the stuck range (cuh_fault_unmap_stuck): then the unmap is
 * counted as injected and its error text says so. */
static int unmap_stuck(fault_device_t *f, uintptr_t va)
{
    pthread_mutex_lock(&f->lock);
    const int stuck = f->stuck_va && va == f->stuck_va;
    if (stuck) {
        f->injected[CUH_FAULT_VM_UNMAP]++;
        snprintf(cuh_dev_error_text(&f->base), CUH_DEV_ERROR_LEN,
                 "vm_unmap failed: injected fault (the mapping at 0x%llx stays)", (unsigned long long)va);
    }
    pthread_mutex_unlock(&f->lock);
    return stuck;
}

static cuh_dev_status_t f_vm_unmap(cuh_device_t *dev, uintptr_t va, size_t size)
{
    fault_device_t *f = fault_of(dev);
    cuh_dev_status_t st = planned(f, CUH_FAULT_VM_UNMAP);
    if (st == CUH_DEV_OK && unmap_stuck(f, va))
        st = CUH_DEV_ERROR;
    return st != CUH_DEV_OK ? st : f->inner->ops->vm_unmap(f->inner, va, size);
}

static cuh_dev_status_t f_vm_allow_peer(cuh_device_t *dev, int peer, uintptr_t va, size_t size)
{
    THROUGH(CUH_FAULT_VM_ALLOW_PEER, fault_of(dev)->inner->ops->vm_allow_peer(fault_of(dev)->inner, peer, va, size));
}

static cuh_dev_status_t f_host_alloc(cuh_device_t *dev, size_t size, unsigned flags, void **ptr)
{
    THROUGH(CUH_FAULT_HOST_ALLOC, fault_of(dev)->inner->ops->host_alloc(fault_of(dev)->inner, size, flags, ptr));
}

static void f_host_free(cuh_device_t *dev, void *ptr, size_t size)
{
    fault_of(dev)->inner->ops->host_free(fault_of(dev)->inner, ptr, size);
}

static void f_destroy(cuh_device_t *dev)
{
    fault_device_t *f = fault_of(dev);
    f->inner->ops->destroy(f->inner);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static const cuh_device_ops_t fault_ops = {
    .mem_alloc = f_mem_alloc,
    .mem_free = f_mem_free,
    .mem_info = f_mem_info,
    .event_create = f_event_create,
    .event_destroy = f_event_destroy,
    .event_record = f_event_record,
    .event_query = f_event_query,
    .event_wait = f_event_wait,
    .stream_wait = f_stream_wait,
    .event_record_all = f_event_record_all,
    .wait_all = f_wait_all,
    .synchronize = f_synchronize,
    .destroy = f_destroy,
    .vm_granularity = f_vm_granularity,
    .vm_reserve = f_vm_reserve,
    .vm_unreserve = f_vm_unreserve,
    .vm_create = f_vm_create,
    .vm_release = f_vm_release,
    .vm_map = f_vm_map,
    .vm_unmap = f_vm_unmap,
    .vm_allow_peer = f_vm_allow_peer,
    .host_alloc = f_host_alloc,
    .host_free = f_host_free,
};

cuh_device_t *cuh_fault_wrap(cuh_device_t *inner)
{
    if (!inner)
        return NULL;
    fault_device_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->base.ops = &fault_ops;
    f->base.kind = inner->kind;
    f->base.ordinal = inner->ordinal;
    f->inner = inner;
    pthread_mutex_init(&f->lock, NULL);
    return &f->base;
}

cuh_device_t *cuh_fault_inner(cuh_device_t *dev) { return fault_of(dev)->inner; }

void cuh_fault_nth(cuh_device_t *dev, cuh_fault_call_t call, uint64_t n, cuh_dev_status_t status)
{
    fault_device_t *f = fault_of(dev);
    pthread_mutex_lock(&f->lock);
    f->rule[call].nth = n ? f->calls[call] + n : 0;
    f->rule[call].status = status;
    pthread_mutex_unlock(&f->lock);
}

void cuh_fault_random(cuh_device_t *dev, cuh_fault_call_t call, double probability, uint64_t seed,
                      cuh_dev_status_t status)
{
    fault_device_t *f = fault_of(dev);
    pthread_mutex_lock(&f->lock);
    f->rule[call].probability = probability;
    f->rule[call].rng = seed * 0x9e3779b97f4a7c15ull + 1;
    f->rule[call].status = status;
    pthread_mutex_unlock(&f->lock);
}

void cuh_fault_sticky(cuh_device_t *dev, uint64_t after, cuh_dev_status_t status)
{
    fault_device_t *f = fault_of(dev);
    pthread_mutex_lock(&f->lock);
    f->sticky_from = after ? f->total_calls + after : 0;
    f->sticky_status = status;
    pthread_mutex_unlock(&f->lock);
}

void cuh_fault_unmap_stuck(cuh_device_t *dev, uintptr_t va)
{
    fault_device_t *f = fault_of(dev);
    pthread_mutex_lock(&f->lock);
    f->stuck_va = va;
    pthread_mutex_unlock(&f->lock);
}

void cuh_fault_clear(cuh_device_t *dev)
{
    fault_device_t *f = fault_of(dev);
    pthread_mutex_lock(&f->lock);
    memset(f->rule, 0, sizeof f->rule);
    f->stuck_va = 0;
    f->sticky_from = 0;
    f->sticky = 0;
    atomic_store_explicit(&f->base.lost, 0, memory_order_relaxed);
    atomic_store_explicit(&f->base.lost_told, 0, memory_order_relaxed);
    pthread_mutex_unlock(&f->lock);
}

int cuh_fault_is_sticky(cuh_device_t *dev)
{
    fault_device_t *f = fault_of(dev);
    pthread_mutex_lock(&f->lock);
    int s = f->sticky;
    pthread_mutex_unlock(&f->lock);
    return s;
}

uint64_t cuh_fault_injected(cuh_device_t *dev, cuh_fault_call_t call)
{
    fault_device_t *f = fault_of(dev);
    pthread_mutex_lock(&f->lock);
    uint64_t n = f->injected[call];
    pthread_mutex_unlock(&f->lock);
    return n;
}
