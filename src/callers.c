/* callers.c - device memory by the shared library that asked for it (see
 * callers.h).
 *
 * A library's bytes live, their peak and its allocations are atomics in one
 * cache line of their own. A cudaMalloc'd block carries its library's
 * label in the heap's own record (cuh_heap_malloc_labelled), which its free
 * hands back: no map of ours is touched. With PyTorch's cache off every
 * tensor passes here twice, and Python's interpreter pushes our data out of
 * the CPU's caches between tensors: the map's lines were about half of what
 * a small tensor cost cuheap over the floor then (issue 45,
 * bench_per_tensor --cold). Blocks of the stream-ordered calls
 * (cudaMallocAsync: a thread's cache serves them without the heap's lock,
 * where no label is set) are recorded by address: the record is its size,
 * its device and its library's number packed in one word (size << 12 |
 * device << 6 | number + 1), in the map of its shard, under a spin lock
 * (released by a store, not an exchange) held for a hash walk; their
 * allocations are counted per shard and added up by a snapshot.
 */
#include "callers.h"

#include "common.h"
#include "lock.h"
#include "ptrmap.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHARD_BITS 6
#define SHARDS (1u << SHARD_BITS)

typedef struct shard_s {
    cuh_spinlock_t lock;   /* all zero is unlocked */
    cuh_ptrmap_t map;
    int ready;
    uint64_t allocs[CUH_CALLERS_MAX];   /* allocations recorded here, by library */
} shard_t;

static shard_t shards[SHARDS];
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static char names[CUH_CALLERS_MAX][CUH_CALLER_NAME_MAX];
static atomic_int num_names;

/* A library's counts, a cache line to themselves. */
typedef struct counts_s {
    _Alignas(64) _Atomic uint64_t live;
    _Atomic uint64_t peak;
    _Atomic uint64_t allocs;   /* labelled allocations (the map's are counted per shard) */
} counts_t;
static counts_t counts[CUH_CALLERS_MAX];
static atomic_int recorded;   /* 1 once a block was recorded: frees look only then */

static shard_t *shard_of(uintptr_t ptr)
{
    return &shards[(uint32_t)(((uint64_t)ptr >> 9) * 0x9E3779B97F4A7C15ull >> (64 - SHARD_BITS))];
}

int cuh_callers_id(const char *library)
{
    if (!library)
        return -1;
    const char *slash = strrchr(library, '/');
    const char *name = slash ? slash + 1 : library;
    if (!name[0])
        return -1;
    pthread_mutex_lock(&names_lock);
    int n = atomic_load(&num_names), id = -1;
    for (int i = 0; i < n && id < 0; i++)
        if (strncmp(names[i], name, CUH_CALLER_NAME_MAX - 1) == 0)
            id = i;
    if (id < 0 && n < CUH_CALLERS_MAX - 1) {
        snprintf(names[n], CUH_CALLER_NAME_MAX, "%s", name);
        atomic_store(&num_names, n + 1);
        id = n;
    } else if (id < 0) {
        snprintf(names[CUH_CALLERS_MAX - 1], CUH_CALLER_NAME_MAX, "%s", "other libraries");
        atomic_store(&num_names, CUH_CALLERS_MAX);
        id = CUH_CALLERS_MAX - 1;
    }
    pthread_mutex_unlock(&names_lock);
    return id;
}

static void count_free(uintptr_t record)
{
    int id = (int)(record & 63) - 1;
    atomic_fetch_sub_explicit(&counts[id].live, (uint64_t)(record >> 12), memory_order_relaxed);
}

static void count_live(int id, size_t size)
{
    uint64_t now = atomic_fetch_add_explicit(&counts[id].live, size, memory_order_relaxed) + size;
    uint64_t seen = atomic_load_explicit(&counts[id].peak, memory_order_relaxed);
    while (now > seen && !atomic_compare_exchange_weak_explicit(&counts[id].peak, &seen, now, memory_order_relaxed,
                                                                memory_order_relaxed))
        ;
}

void cuh_callers_count_alloc(int id, size_t size)
{
    if (id < 0 || id >= CUH_CALLERS_MAX)
        return;
    atomic_fetch_add_explicit(&counts[id].allocs, 1, memory_order_relaxed);
    count_live(id, size);
}

void cuh_callers_count_free(int id, size_t size)
{
    if (id < 0 || id >= CUH_CALLERS_MAX)
        return;
    atomic_fetch_sub_explicit(&counts[id].live, size, memory_order_relaxed);
}

void cuh_callers_forget_labelled(const uint64_t by_label[256])
{
    for (int id = 0; id < CUH_CALLERS_MAX; id++)
        if (by_label[cuh_callers_label(id)])
            atomic_fetch_sub_explicit(&counts[id].live, by_label[cuh_callers_label(id)], memory_order_relaxed);
}

static int device_of(uintptr_t record) { return (int)((record >> 6) & 63); }

void cuh_callers_alloc(uintptr_t ptr, size_t size, int device, int id)
{
    if (!ptr || id < 0 || id >= CUH_CALLERS_MAX || device < 0 || device > 63 || size >= ((size_t)1 << 51))
        return;
    uintptr_t record = ((uintptr_t)size << 12) | ((uintptr_t)device << 6) | (uintptr_t)(id + 1);
    shard_t *s = shard_of(ptr);
    cuh_spin_lock(&s->lock);
    if (!s->ready)
        s->ready = cuh_ptrmap_init(&s->map, 64) == 0;
    void *stale_record = NULL;
    int kept = s->ready && cuh_ptrmap_put(&s->map, ptr, (void *)record, &stale_record) == 0;
    if (!kept && s->ready)
        stale_record = cuh_ptrmap_remove(&s->map, ptr);   /* no room: a block there before is gone */
    if (kept)
        s->allocs[id]++;
    cuh_spin_unlock(&s->lock);
    uintptr_t stale = (uintptr_t)stale_record;
    if (stale)
        count_free(stale);
    if (!kept)
        return;   /* no room for the record: the block is not counted, its free finds nothing */
    if (!atomic_load_explicit(&recorded, memory_order_relaxed))
        atomic_store_explicit(&recorded, 1, memory_order_relaxed);   /* a store each time would bounce its line between threads */
    count_live(id, size);
}

void cuh_callers_free(uintptr_t ptr)
{
    if (!ptr || !atomic_load_explicit(&recorded, memory_order_relaxed))
        return;
    shard_t *s = shard_of(ptr);
    cuh_spin_lock(&s->lock);
    uintptr_t record = s->ready ? (uintptr_t)cuh_ptrmap_remove(&s->map, ptr) : 0;
    cuh_spin_unlock(&s->lock);
    if (record)
        count_free(record);
}

void cuh_callers_forget_device(int device)
{
    for (unsigned i = 0; i < SHARDS; i++) {
        shard_t *s = &shards[i];
        cuh_spin_lock(&s->lock);
        for (size_t k = 0; s->ready && k <= s->map.mask;) {
            const cuh_ptrmap_entry_t *slot = &s->map.slots[k];
            uintptr_t record = (uintptr_t)slot->value;
            if (slot->key && device_of(record) == device) {
                cuh_ptrmap_remove(&s->map, slot->key);   /* shifts later entries back: look here again */
                count_free(record);
            } else {
                k++;
            }
        }
        cuh_spin_unlock(&s->lock);
    }
}

static int most_live_first(const void *a, const void *b)
{
    const cuh_caller_stat_t *x = a, *y = b;
    if (x->live != y->live)
        return x->live < y->live ? 1 : -1;
    if (x->peak != y->peak)
        return x->peak < y->peak ? 1 : -1;
    return strcmp(x->library, y->library);
}

size_t cuh_callers_snapshot(cuh_caller_stat_t *out, size_t max)
{
    cuh_caller_stat_t all[CUH_CALLERS_MAX];
    pthread_mutex_lock(&names_lock);
    size_t n = (size_t)atomic_load(&num_names);
    for (size_t i = 0; i < n; i++) {
        memcpy(all[i].library, names[i], CUH_CALLER_NAME_MAX);
        all[i].live = atomic_load_explicit(&counts[i].live, memory_order_relaxed);
        all[i].peak = atomic_load_explicit(&counts[i].peak, memory_order_relaxed);
        all[i].allocs = atomic_load_explicit(&counts[i].allocs, memory_order_relaxed);
    }
    pthread_mutex_unlock(&names_lock);
    for (unsigned k = 0; k < SHARDS; k++) {
        cuh_spin_lock(&shards[k].lock);
        for (size_t i = 0; i < n; i++)
            all[i].allocs += shards[k].allocs[i];
        cuh_spin_unlock(&shards[k].lock);
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (all[i].allocs)
            all[kept++] = all[i];
    qsort(all, kept, sizeof all[0], most_live_first);
    if (kept > max)
        kept = max;
    memcpy(out, all, kept * sizeof all[0]);
    return kept;
}

/* Appends to out (len bytes, used of them taken), cutting what does not
 * fit; returns the length now. */
static size_t append(char *out, size_t len, size_t used, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out + used, len - used, fmt, ap);
    va_end(ap);
    used += w > 0 ? (size_t)w : 0;
    return used < len ? used : len - 1;
}

size_t cuh_callers_live_summary(char *out, size_t len)
{
    enum { SHOWN = 3 };
    if (!len)
        return 0;
    out[0] = '\0';
    cuh_caller_stat_t callers[CUH_CALLERS_MAX];
    size_t n = cuh_callers_snapshot(callers, CUH_CALLERS_MAX);
    size_t holding = 0;
    while (holding < n && callers[holding].live)
        holding++;   /* most bytes live first */
    if (!holding)
        return 0;
    size_t used = append(out, len, 0, "device memory live by calling library (every device):");
    for (size_t i = 0; i < holding && i < SHOWN; i++) {
        char bytes[32];
        used = append(out, len, used, "%s %s %s", i ? "," : "", callers[i].library,
                      cuh_format_bytes(bytes, sizeof bytes, callers[i].live));
    }
    if (holding > SHOWN)
        used = append(out, len, used, " and %zu more (a report:PATH names each)", holding - SHOWN);
    return used;
}

void cuh_callers_reset(void)
{
    for (unsigned i = 0; i < SHARDS; i++) {
        cuh_spin_lock(&shards[i].lock);
        if (shards[i].ready)
            cuh_ptrmap_destroy(&shards[i].map);
        shards[i].ready = 0;
        memset(shards[i].allocs, 0, sizeof shards[i].allocs);
        cuh_spin_unlock(&shards[i].lock);
    }
    pthread_mutex_lock(&names_lock);
    atomic_store(&num_names, 0);
    for (int i = 0; i < CUH_CALLERS_MAX; i++) {
        atomic_store(&counts[i].live, 0);
        atomic_store(&counts[i].peak, 0);
        atomic_store(&counts[i].allocs, 0);
    }
    pthread_mutex_unlock(&names_lock);
    atomic_store(&recorded, 0);
}
