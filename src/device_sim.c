/* device_sim.c - a simulated GPU for tests and for cuheap-replay.
 *
 * It has a capacity and an address space, nothing more: no host memory stands
 * behind a simulated segment, so replaying an 80 GiB training trace costs a
 * few megabytes. Addresses start high, are 2 MiB-aligned, and a 2 MiB gap
 * separates segments so that no code can mistake two segments for one. Each
 * new segment lies above the last, or below it (top_down), so that a test
 * can show the heap places blocks alike either way.
 *
 * Streams are modelled by two counters each: events recorded and events
 * completed. By default every recorded event completes at once (the GPU is
 * infinitely fast, which is what a replay wants). A test can hold events
 * incomplete, as a busy GPU would, and complete a stream's work when it
 * chooses; a host wait on an event completes the work it waits for, as a real
 * wait would. Work completes as on a GPU: a stream's work done means the work
 * it waited for (stream waits on events, directly or through other streams)
 * is done too. Device-wide fences (cuCtxRecordEvent and cuCtxWaitEvent on a
 * GPU) are an event whose clock takes every stream's position, and a wait
 * that every stream, and every stream created after it, inherits; a test can
 * take them away (a driver before CUDA 12.5) or make them refuse (a graph
 * capture underway). Memory used by other processes is a knob (external
 * bytes).
 */
#include "device.h"

#include "common.h"
#include "ptrmap.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>

#define SIM_BASE ((uintptr_t)0x100000000000ull)
#define SIM_SPACE ((uintptr_t)1 << 42)   /* 4 TiB of addresses per device, never reused */
#define SIM_MAX_ORDINALS 1024            /* slices up to 2^52: valid device addresses */
#define EVENT_MAGIC 0x5e7e47u

typedef struct sim_stream_s {
    cuh_stream_t handle;
    uint64_t recorded;
    uint64_t completed;
    int idle;                    /* no work: its events complete at once, held or not */
    /* What work enqueued on it from now on starts after: dep[j] is the
     * position on stream j (index in sim_device_t.streams) it waits for,
     * through stream waits on events (a vector clock). */
    uint64_t *dep;
    size_t num_dep;
    /* dep as it was from each position on where it grew (at the stream's
     * next record, an event or a piece of work): completing the stream's
     * work up to a position completes the other streams' work of the last
     * mark it reaches too, since a GPU runs no work past a wait before the
     * event waited for has completed. Marks the stream has completed are
     * dropped. */
    struct sim_mark_s {
        uint64_t pos;            /* the first record that waited for clock */
        uint64_t *clock;
        size_t num_clock;
    } *marks;
    size_t num_marks, cap_marks;
    int dep_changed;             /* dep grew since the last mark */
} sim_stream_t;

struct cuh_event_s {
    uint32_t magic;
    int recorded;
    int all;                     /* recorded by event_record_all: clock is all that tells */
    cuh_stream_t stream;
    uint64_t seq;
    uint64_t *clock;             /* the recording stream's dep at the record, its own position included */
    size_t num_clock;
};

typedef struct sim_device_s {
    cuh_device_t base;
    pthread_mutex_t lock;
    size_t capacity;
    size_t external;
    uintptr_t next_addr;         /* bottom-up: the next segment starts here */
    uintptr_t space_end;         /* the slice's end; top-down, the next segment ends 2 MiB below it */
    int top_down;
    cuh_ptrmap_t ordinals;       /* segment address -> its ordinal + 1 (cuh_sim_segment_of) */
    uint64_t next_ordinal;
    int hold;
    int no_device_fences;        /* cuh_sim_device_fences(dev, 0) */
    int capturing;               /* cuh_sim_capturing */
    /* What every stream created from now on waits for: the clocks of the
     * device-wide waits so far (wait_all). */
    uint64_t *all_dep;
    size_t num_all_dep;
    sim_stream_t *streams;
    size_t num_streams, cap_streams;
    cuh_ptrmap_t segments;       /* address -> size (stored as pointer-sized int) */
    cuh_ptrmap_t reservations;   /* va -> size */
    /* Physical allocations by an id of the sim's own, never reused; the
     * handle a caller holds names one until it is released. With
     * cuh_sim_reuse_handles, a released handle's value names the next
     * allocation made, as a driver may: while the old allocation lives on in
     * a mapping, the two share a value and only their ids tell them apart. */
    cuh_ptrmap_t physical;       /* id -> size and flags (PHYS_*) */
    cuh_ptrmap_t mappings;       /* va -> id, one entry per mapped allocation */
    cuh_ptrmap_t handles;        /* handle -> id, until the handle is released */
    cuh_ptrmap_t values;         /* id -> the handle it was made with */
    size_t largest_mapping;      /* bytes of the largest allocation ever mapped */
    uint64_t next_handle, next_id;
    int reuse_handles;
    uint64_t *free_handles;      /* released handles, to be given again (reuse_handles) */
    size_t num_free_handles, cap_free_handles;
    struct sim_host_chunk_s {
        uintptr_t base;
        size_t size;
        unsigned flags;
    } *host_chunks;              /* page-locked host memory handed out, unordered */
    size_t num_host_chunks, cap_host_chunks;
    size_t host_capacity;        /* 0: unlimited */
    cuh_sim_counters_t counters;
} sim_device_t;

static sim_device_t *sim_of(cuh_device_t *dev) { return (sim_device_t *)dev; }

/* Raises clock[j] to at least pos, growing the clock; 0 out of memory. */
static int clock_raise(uint64_t **clock, size_t *num, size_t j, uint64_t pos)
{
    if (j >= *num) {
        uint64_t *grown = realloc(*clock, (j + 1) * sizeof *grown);
        if (!grown)
            return 0;
        memset(grown + *num, 0, (j + 1 - *num) * sizeof *grown);
        *clock = grown;
        *num = j + 1;
    }
    if ((*clock)[j] < pos)
        (*clock)[j] = pos;
    return 1;
}

/* Raises every clock[j] to at least from[j]; 0 out of memory. */
static int clock_merge(uint64_t **clock, size_t *num, const uint64_t *from, size_t n)
{
    for (size_t j = 0; j < n; j++)
        if (!clock_raise(clock, num, j, from[j]))
            return 0;
    return 1;
}

/* st's work from now on waits for the positions of `clock`. 0 out of memory. */
static int stream_waits_on(sim_stream_t *st, const uint64_t *clock, size_t n)
{
    if (!clock_merge(&st->dep, &st->num_dep, clock, n))
        return 0;
    st->dep_changed |= n != 0;
    return 1;
}

static sim_stream_t *stream_state(sim_device_t *s, cuh_stream_t handle)
{
    for (size_t i = 0; i < s->num_streams; i++)
        if (s->streams[i].handle == handle)
            return &s->streams[i];
    if (s->num_streams == s->cap_streams) {
        size_t cap = s->cap_streams ? 2 * s->cap_streams : 8;
        sim_stream_t *grown = realloc(s->streams, cap * sizeof *grown);
        if (!grown)
            return NULL;
        s->streams = grown;
        s->cap_streams = cap;
    }
    sim_stream_t *st = &s->streams[s->num_streams++];
    st->handle = handle;
    st->recorded = st->completed = 0;
    st->idle = 0;
    st->dep = NULL;
    st->num_dep = 0;
    st->marks = NULL;
    st->num_marks = st->cap_marks = 0;
    st->dep_changed = 0;
    if (!stream_waits_on(st, s->all_dep, s->num_all_dep)) {
        free(st->dep);
        s->num_streams--;
        return NULL;
    }
    return st;
}

/* A record on st (an event or a piece of work): what completing st's work
 * up to it requires of the other streams is st's dep now. 0 out of memory. */
static int note_record(sim_stream_t *st)
{
    if (!st->dep_changed)
        return 1;
    if (st->num_marks == st->cap_marks) {
        size_t cap = st->cap_marks ? 2 * st->cap_marks : 4;
        struct sim_mark_s *grown = realloc(st->marks, cap * sizeof *grown);
        if (!grown)
            return 0;
        st->marks = grown;
        st->cap_marks = cap;
    }
    struct sim_mark_s *m = &st->marks[st->num_marks];
    m->pos = st->recorded + 1;
    m->clock = NULL;
    m->num_clock = 0;
    if (!clock_merge(&m->clock, &m->num_clock, st->dep, st->num_dep))
        return 0;
    st->num_marks++;
    st->dep_changed = 0;
    return 1;
}

/* The work at positions up to clock[j] of every stream j has completed. */
static void complete_clock(sim_device_t *s, const uint64_t *clock, size_t num)
{
    for (size_t j = 0; j < num && j < s->num_streams; j++)
        if (s->streams[j].completed < clock[j])
            s->streams[j].completed = clock[j];
}

/* 1 if the work at positions up to clock[j] of every stream j but `self` has
 * completed. */
static int clock_done(const sim_device_t *s, const uint64_t *clock, size_t num, size_t self)
{
    for (size_t j = 0; j < num; j++)
        if (j != self && (j >= s->num_streams || s->streams[j].completed < clock[j]))
            return 0;
    return 1;
}

/* st's work up to position pos has completed, and so has what that work
 * waited for: a GPU runs no work past a stream wait before the event waited
 * for has completed. */
static void complete_stream_to(sim_device_t *s, sim_stream_t *st, uint64_t pos)
{
    if (pos > st->completed)
        st->completed = pos;
    size_t applied = 0;
    while (applied < st->num_marks && st->marks[applied].pos <= pos)
        applied++;
    if (!applied)
        return;
    /* dep only grows: the last mark reached holds every earlier one. */
    complete_clock(s, st->marks[applied - 1].clock, st->marks[applied - 1].num_clock);
    for (size_t i = 0; i < applied; i++)
        free(st->marks[i].clock);
    st->num_marks -= applied;
    memmove(st->marks, st->marks + applied, st->num_marks * sizeof *st->marks);
}

/* All of st's work so far has completed, and so has what it waited for. */
static void complete_stream(sim_device_t *s, sim_stream_t *st)
{
    complete_stream_to(s, st, st->recorded);
}

/* The next `size` bytes of the device's slice, 2 MiB apart from the rest;
 * 0 when the slice is used up. */
static int take_addresses(sim_device_t *s, size_t size, uintptr_t *a)
{
    if (size > s->space_end - s->next_addr || s->space_end - s->next_addr - size < CUH_SEGMENT_GRAIN)
        return 0;
    if (s->top_down) {
        *a = s->space_end - CUH_SEGMENT_GRAIN - size;
        s->space_end = *a;
    } else {
        *a = s->next_addr;
        s->next_addr += size + CUH_SEGMENT_GRAIN;
    }
    return 1;
}

static cuh_dev_status_t sim_mem_alloc(cuh_device_t *dev, size_t size, uintptr_t *addr)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    if (size == 0 || size % CUH_SEGMENT_GRAIN) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: segment of %zu bytes is not a multiple of 2 MiB",
                 size);
        rc = CUH_DEV_ERROR;
    } else if (size > s->capacity - s->counters.used - s->external) {   /* used + external <= capacity */
        s->counters.mem_refusals++;
        rc = CUH_DEV_OOM;
    } else {
        uintptr_t a = 0;
        if (!take_addresses(s, size, &a)) {
            snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN,
                     "sim: device %d has used up its %llu TiB of simulated address space", dev->ordinal,
                     (unsigned long long)(SIM_SPACE >> 40));
            rc = CUH_DEV_ERROR;
        } else if (cuh_ptrmap_insert(&s->segments, a, (void *)size) ||
                   cuh_ptrmap_insert(&s->ordinals, a, (void *)(uintptr_t)++s->next_ordinal)) {
            cuh_ptrmap_remove(&s->segments, a);
            snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: out of host memory");
            rc = CUH_DEV_ERROR;
        } else {
            s->counters.used += size;
            s->counters.mem_allocs++;
            *addr = a;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static cuh_dev_status_t sim_mem_free(cuh_device_t *dev, uintptr_t addr, size_t size)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    size_t held = (size_t)cuh_ptrmap_get(&s->segments, addr);
    if (!held || held != size) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN,
                 "sim: free of 0x%llx (%zu bytes) which is not a live segment (held: %zu bytes)",
                 (unsigned long long)addr, size, held);
        rc = CUH_DEV_ERROR;
    } else {
        cuh_ptrmap_remove(&s->segments, addr);
        cuh_ptrmap_remove(&s->ordinals, addr);
        s->counters.used -= size;
        s->counters.mem_frees++;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static cuh_dev_status_t sim_mem_info(cuh_device_t *dev, size_t *free_bytes, size_t *total_bytes)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    size_t taken = s->counters.used + s->external;
    *free_bytes = taken >= s->capacity ? 0 : s->capacity - taken;
    *total_bytes = s->capacity;
    pthread_mutex_unlock(&s->lock);
    return CUH_DEV_OK;
}

static cuh_dev_status_t sim_event_create(cuh_device_t *dev, cuh_event_t *event)
{
    sim_device_t *s = sim_of(dev);
    cuh_event_t e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: out of host memory");
        return CUH_DEV_ERROR;
    }
    e->magic = EVENT_MAGIC;
    pthread_mutex_lock(&s->lock);
    s->counters.live_events++;
    pthread_mutex_unlock(&s->lock);
    *event = e;
    return CUH_DEV_OK;
}

static void sim_event_destroy(cuh_device_t *dev, cuh_event_t event)
{
    sim_device_t *s = sim_of(dev);
    if (!event || event->magic != EVENT_MAGIC)
        return;
    event->magic = 0;
    free(event->clock);
    free(event);
    pthread_mutex_lock(&s->lock);
    s->counters.live_events--;
    pthread_mutex_unlock(&s->lock);
}

static cuh_dev_status_t sim_event_record(cuh_device_t *dev, cuh_event_t event, cuh_stream_t stream)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    sim_stream_t *st = stream_state(s, stream);
    if (!st || event->magic != EVENT_MAGIC) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: bad event or out of memory");
        rc = CUH_DEV_ERROR;
    } else {
        if (!note_record(st)) {
            snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: out of host memory");
            pthread_mutex_unlock(&s->lock);
            return CUH_DEV_ERROR;
        }
        st->recorded++;
        if (!s->hold)
            complete_stream(s, st);
        event->recorded = 1;
        event->all = 0;
        event->stream = stream;
        event->seq = st->recorded;
        s->counters.events_recorded++;
        /* The event stands for its stream's work so far and for all the work
         * that work waited for. */
        size_t self = (size_t)(st - s->streams);
        if (event->num_clock)
            memset(event->clock, 0, event->num_clock * sizeof *event->clock);
        if (!clock_merge(&event->clock, &event->num_clock, st->dep, st->num_dep) ||
            !clock_raise(&event->clock, &event->num_clock, self, st->recorded)) {
            snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: out of host memory");
            rc = CUH_DEV_ERROR;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static cuh_dev_status_t sim_event_query(cuh_device_t *dev, cuh_event_t event)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    s->counters.event_queries++;
    if (event->recorded && event->all) {
        if (!clock_done(s, event->clock, event->num_clock, SIZE_MAX))
            rc = CUH_DEV_NOT_READY;
    } else if (event->recorded) {
        sim_stream_t *st = stream_state(s, event->stream);
        if (st && st->completed < event->seq) {
            /* An idle stream runs no work of its own: its event completes
             * once what the stream waited for before it has. */
            if (st->idle && clock_done(s, event->clock, event->num_clock, (size_t)(st - s->streams)))
                st->completed = event->seq;
            else
                rc = CUH_DEV_NOT_READY;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static cuh_dev_status_t sim_event_wait(cuh_device_t *dev, cuh_event_t event)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    s->counters.event_waits++;
    if (event->recorded)
        complete_clock(s, event->clock, event->num_clock);   /* its own stream's position included */
    pthread_mutex_unlock(&s->lock);
    return CUH_DEV_OK;
}

/* Simulated streams carry no data: a GPU-side wait is counted, and the
 * stream's work from now on is ordered after the event's (its clock), which
 * cuh_sim_stream_waits_for answers. */
static cuh_dev_status_t sim_stream_wait(cuh_device_t *dev, cuh_stream_t stream, cuh_event_t event)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    s->counters.stream_waits++;
    sim_stream_t *st = stream_state(s, stream);
    int ok = st && event && event->magic == EVENT_MAGIC;
    if (ok && event->recorded)
        ok = stream_waits_on(st, event->clock, event->num_clock);
    if (!ok) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: bad event or out of memory");
        rc = CUH_DEV_ERROR;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Whether a device-wide call on `event` may go ahead: OK, or why not. */
static cuh_dev_status_t sim_fences_usable(sim_device_t *s, cuh_device_t *dev, cuh_event_t event)
{
    if (s->no_device_fences) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN,
                 "sim: no device-wide fences (as a driver before CUDA 12.5)");
        return CUH_DEV_UNSUPPORTED;
    }
    if (s->capturing) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: a graph capture is underway");
        return CUH_DEV_CAPTURING;
    }
    if (!event || event->magic != EVENT_MAGIC) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: bad event");
        return CUH_DEV_ERROR;
    }
    return CUH_DEV_OK;
}

/* The event's clock: every stream's work so far (an idle stream has none of
 * its own) and everything that work waits for. Like an event recorded on
 * each stream, it is a record on every stream that runs work: held, it
 * stays incomplete until the test completes those streams. */
static cuh_dev_status_t sim_event_record_all(cuh_device_t *dev, cuh_event_t event)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    cuh_dev_status_t rc = sim_fences_usable(s, dev, event);
    if (rc == CUH_DEV_OK) {
        if (event->num_clock)
            memset(event->clock, 0, event->num_clock * sizeof *event->clock);
        int ok = 1;
        for (size_t i = 0; ok && i < s->num_streams; i++) {
            sim_stream_t *st = &s->streams[i];
            ok = clock_merge(&event->clock, &event->num_clock, st->dep, st->num_dep);
            if (ok && !st->idle && (ok = note_record(st))) {
                st->recorded++;
                if (!s->hold)
                    complete_stream(s, st);
                ok = clock_raise(&event->clock, &event->num_clock, i, st->recorded);
            }
        }
        if (!ok) {
            snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: out of host memory");
            rc = CUH_DEV_ERROR;
        } else {
            event->recorded = 1;
            event->all = 1;
            event->stream = 0;
            event->seq = 0;
            s->counters.events_recorded++;
            s->counters.events_recorded_all++;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Every stream's work from now on, and every later stream's, waits for the
 * event's clock. */
static cuh_dev_status_t sim_wait_all(cuh_device_t *dev, cuh_event_t event)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    cuh_dev_status_t rc = sim_fences_usable(s, dev, event);
    if (rc == CUH_DEV_OK && event->recorded) {
        int ok = clock_merge(&s->all_dep, &s->num_all_dep, event->clock, event->num_clock);
        for (size_t i = 0; ok && i < s->num_streams; i++)
            ok = stream_waits_on(&s->streams[i], event->clock, event->num_clock);
        if (!ok) {
            snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: out of host memory");
            rc = CUH_DEV_ERROR;
        }
    }
    if (rc == CUH_DEV_OK)
        s->counters.waits_all++;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void complete_all_locked(sim_device_t *s)
{
    for (size_t i = 0; i < s->num_streams; i++)
        s->streams[i].completed = s->streams[i].recorded;
}

static cuh_dev_status_t sim_synchronize(cuh_device_t *dev)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    s->counters.synchronizes++;
    complete_all_locked(s);
    pthread_mutex_unlock(&s->lock);
    return CUH_DEV_OK;
}

/* ---- virtual memory ----------------------------------------------------------
 * Reservations take addresses from the device's slice like segments; physical
 * allocations are numbers that count against the capacity; mappings are
 * books, checked for overlap and for mapping what exists. */

#define SIM_VM_PAGE CUH_SEGMENT_GRAIN

/* A physical allocation's entry in `physical`: its size (whole pages) with
 * flags in the low bits. As with the driver, a released allocation's memory
 * stays until its last mapping goes (cuMemRelease, cuMemUnmap). */
#define PHYS_EVER_MAPPED ((size_t)1)   /* the GPU may have touched it */
#define PHYS_RELEASED ((size_t)2)      /* released while still mapped */
#define PHYS_MAP_ONE ((size_t)4)       /* bits 2-20: the ranges mapping it now */
static size_t phys_size(size_t v) { return v & ~(size_t)(SIM_VM_PAGE - 1); }
static size_t phys_maps(size_t v) { return (v & (SIM_VM_PAGE - 1)) >> 2; }

static void phys_set(sim_device_t *s, uint64_t id, size_t v)
{
    cuh_ptrmap_remove(&s->physical, (uintptr_t)id << 9);
    (void)cuh_ptrmap_insert(&s->physical, (uintptr_t)id << 9, (void *)v);   /* the slot just freed */
}

/* The id of the allocation `handle` names, 0 if it names none (never made,
 * or released). */
static uint64_t id_of(const sim_device_t *s, uint64_t handle)
{
    return handle ? (uint64_t)(uintptr_t)cuh_ptrmap_get(&s->handles, (uintptr_t)handle << 9) : 0;
}

/* Allocation `id` is gone (released, and no mapping keeps it). */
static void phys_forget(sim_device_t *s, uint64_t id, size_t size)
{
    cuh_ptrmap_remove(&s->physical, (uintptr_t)id << 9);
    cuh_ptrmap_remove(&s->values, (uintptr_t)id << 9);
    s->counters.used -= size;
}

/* The allocation mapped over va, 0 if none, and where that mapping starts:
 * mappings never overlap, so the nearest one starting at or below va,
 * within the largest ever mapped, covers it or nothing does. */
static uint64_t mapping_at(const sim_device_t *s, uintptr_t va, uintptr_t *start)
{
    const uintptr_t top = va & ~(uintptr_t)(SIM_VM_PAGE - 1);
    for (uintptr_t a = top; top - a < s->largest_mapping; a -= SIM_VM_PAGE) {
        const uint64_t h = (uint64_t)(uintptr_t)cuh_ptrmap_get(&s->mappings, a);
        if (h) {
            *start = a;
            return va - a < phys_size((size_t)cuh_ptrmap_get(&s->physical, (uintptr_t)h << 9)) ? h : 0;
        }
        if (a < SIM_VM_PAGE)
            break;
    }
    return 0;
}

/* Whether any mapping covers a page of [va, va + size): the one over va, or
 * one starting inside the range. */
static int range_mapped(const sim_device_t *s, uintptr_t va, size_t size)
{
    uintptr_t start;
    for (uintptr_t a = va + SIM_VM_PAGE; a < va + size; a += SIM_VM_PAGE)
        if (cuh_ptrmap_get(&s->mappings, a))
            return 1;
    return mapping_at(s, va, &start) != 0;
}

static size_t sim_vm_granularity(cuh_device_t *dev)
{
    (void)dev;
    return SIM_VM_PAGE;
}

static cuh_dev_status_t sim_vm_reserve(cuh_device_t *dev, size_t size, uintptr_t *va)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    uintptr_t a = 0;
    if (!size || size % SIM_VM_PAGE || !take_addresses(s, size, &a) ||
        cuh_ptrmap_insert(&s->reservations, a, (void *)size)) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: cannot reserve %zu bytes of address space", size);
        rc = CUH_DEV_ERROR;
    } else {
        *va = a;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void sim_vm_unreserve(cuh_device_t *dev, uintptr_t va, size_t size)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    if ((size_t)cuh_ptrmap_get(&s->reservations, va) == size)
        cuh_ptrmap_remove(&s->reservations, va);
    pthread_mutex_unlock(&s->lock);
}

static cuh_dev_status_t sim_vm_create(cuh_device_t *dev, size_t size, uint64_t *handle)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    if (!size || size % SIM_VM_PAGE) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN,
                 "sim: physical allocation of %zu bytes is not whole pages", size);
        rc = CUH_DEV_ERROR;
    } else if (size > s->capacity - s->counters.used - s->external) {
        s->counters.mem_refusals++;
        rc = CUH_DEV_OOM;
    } else {
        /* The lowest released handle's value first (reuse_handles), as
         * file descriptors are given, else a new one. */
        const int reused = s->reuse_handles && s->num_free_handles;
        size_t lowest = 0;
        for (size_t i = 1; i < s->num_free_handles; i++)
            if (s->free_handles[i] < s->free_handles[lowest])
                lowest = i;
        const uint64_t value = reused ? s->free_handles[lowest] : s->next_handle + 1;
        const uint64_t id = s->next_id + 1;
        if (cuh_ptrmap_insert(&s->physical, id << 9, (void *)size)) {
            rc = CUH_DEV_ERROR;
        } else if (cuh_ptrmap_insert(&s->handles, value << 9, (void *)(uintptr_t)id)) {
            cuh_ptrmap_remove(&s->physical, id << 9);
            rc = CUH_DEV_ERROR;
        } else if (cuh_ptrmap_insert(&s->values, id << 9, (void *)(uintptr_t)value)) {
            cuh_ptrmap_remove(&s->physical, id << 9);
            cuh_ptrmap_remove(&s->handles, value << 9);
            rc = CUH_DEV_ERROR;
        }
        if (rc == CUH_DEV_ERROR) {
            snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: out of host memory for a physical allocation");
        } else {
            s->next_id = id;
            if (reused)
                s->free_handles[lowest] = s->free_handles[--s->num_free_handles];
            else
                s->next_handle = value;
            *handle = value;
            s->counters.used += size;
            s->counters.vm_creates++;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void sim_vm_release(cuh_device_t *dev, uint64_t handle)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    const uint64_t id = id_of(s, handle);
    const size_t v = id ? (size_t)cuh_ptrmap_get(&s->physical, (uintptr_t)id << 9) : 0;
    if (v) {
        cuh_ptrmap_remove(&s->handles, (uintptr_t)handle << 9);
        if (s->reuse_handles && s->num_free_handles == s->cap_free_handles) {
            size_t cap = s->cap_free_handles ? 2 * s->cap_free_handles : 16;
            uint64_t *grown = realloc(s->free_handles, cap * sizeof *grown);
            if (grown) {
                s->free_handles = grown;
                s->cap_free_handles = cap;
            }
        }
        if (s->reuse_handles && s->num_free_handles < s->cap_free_handles)
            s->free_handles[s->num_free_handles++] = handle;
        s->counters.vm_releases++;
        s->counters.vm_releases_used += v & PHYS_EVER_MAPPED;
        if (phys_maps(v)) {
            s->counters.vm_releases_mapped++;
            phys_set(s, id, v | PHYS_RELEASED);   /* its memory goes with its last mapping */
        } else {
            phys_forget(s, id, phys_size(v));
        }
    }
    pthread_mutex_unlock(&s->lock);
}

static cuh_dev_status_t sim_vm_map(cuh_device_t *dev, uintptr_t va, size_t size, uint64_t handle)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    const uint64_t id = id_of(s, handle);   /* none once released */
    const size_t v = id ? (size_t)cuh_ptrmap_get(&s->physical, (uintptr_t)id << 9) : 0;
    const size_t phys = phys_size(v);
    const int taken = size && range_mapped(s, va, size);
    if (phys != size || taken || cuh_ptrmap_insert(&s->mappings, va, (void *)(uintptr_t)id)) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN,
                 "sim: map of handle %llu (%zu bytes, allocation has %zu%s) at 0x%llx refused%s",
                 (unsigned long long)handle, size, phys, id ? "" : ", none or released",
                 (unsigned long long)va, taken ? ": already mapped" : "");
        rc = CUH_DEV_ERROR;
    } else {
        /* From now on the GPU may have touched the allocation. */
        phys_set(s, id, (v + PHYS_MAP_ONE) | PHYS_EVER_MAPPED);
        s->counters.vm_maps++;
        s->counters.vm_mapped += size;
        if (size > s->largest_mapping)
            s->largest_mapping = size;
        s->counters.vm_peer_grants += (uint64_t)__builtin_popcountll(s->counters.vm_peers);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Books the peer; a range must be mapped to be granted. */
static cuh_dev_status_t sim_vm_allow_peer(cuh_device_t *dev, int peer, uintptr_t va, size_t size)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    if (peer < 0 || peer >= 64 || peer == dev->ordinal || (size && !cuh_ptrmap_get(&s->mappings, va))) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: peer %d for [0x%llx, +%zu) refused", peer,
                 (unsigned long long)va, size);
        rc = CUH_DEV_ERROR;
    } else {
        s->counters.vm_peers |= 1ull << peer;
        s->counters.vm_peer_grants += size != 0;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static cuh_dev_status_t sim_vm_unmap(cuh_device_t *dev, uintptr_t va, size_t size)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    /* A refused unmap leaves the mapping as it was (the driver's does). */
    const uint64_t id = (uint64_t)(uintptr_t)cuh_ptrmap_get(&s->mappings, va);
    const size_t v = id ? (size_t)cuh_ptrmap_get(&s->physical, (uintptr_t)id << 9) : 0;
    if (!id || phys_size(v) != size) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN,
                 "sim: unmap of 0x%llx (%zu bytes): %s", (unsigned long long)va, size,
                 id ? "not the whole range one map mapped" : "nothing mapped there");
        rc = CUH_DEV_ERROR;
    } else {
        cuh_ptrmap_remove(&s->mappings, va);
        if (phys_maps(v) == 1 && (v & PHYS_RELEASED)) {   /* released: its memory goes now */
            phys_forget(s, id, size);
        } else if (phys_maps(v)) {
            phys_set(s, id, v - PHYS_MAP_ONE);
        }
        s->counters.vm_unmaps++;
        s->counters.vm_mapped -= size;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Page-locked host memory is plain anonymous memory here: tests write and
 * read it as programs would. */
static cuh_dev_status_t sim_host_alloc(cuh_device_t *dev, size_t size, unsigned flags, void **ptr)
{
    sim_device_t *s = sim_of(dev);
    cuh_dev_status_t rc = CUH_DEV_OK;
    pthread_mutex_lock(&s->lock);
    if (size == 0 || (flags & ~7u)) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: host_alloc(%zu bytes, flags 0x%x) refused", size,
                 flags);
        rc = CUH_DEV_ERROR;
    } else if (s->host_capacity && size > s->host_capacity - s->counters.host_bytes) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: host_alloc(%zu bytes): %zu of %zu bytes locked",
                 size, s->counters.host_bytes, s->host_capacity);
        rc = CUH_DEV_OOM;
    } else if (s->num_host_chunks == s->cap_host_chunks) {
        size_t cap = s->cap_host_chunks ? 2 * s->cap_host_chunks : 16;
        struct sim_host_chunk_s *grown = realloc(s->host_chunks, cap * sizeof *grown);
        if (grown) {
            s->host_chunks = grown;
            s->cap_host_chunks = cap;
        } else {
            rc = CUH_DEV_OOM;
        }
    }
    void *p = MAP_FAILED;
    if (rc == CUH_DEV_OK && (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) ==
                                MAP_FAILED) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "sim: host_alloc(%zu bytes): mmap failed", size);
        rc = CUH_DEV_OOM;
    }
    if (rc == CUH_DEV_OK) {
        s->host_chunks[s->num_host_chunks++] = (struct sim_host_chunk_s){(uintptr_t)p, size, flags};
        s->counters.host_allocs++;
        s->counters.host_bytes += size;
        *ptr = p;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void sim_host_free(cuh_device_t *dev, void *ptr, size_t size)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->num_host_chunks; i++)
        if (s->host_chunks[i].base == (uintptr_t)ptr && s->host_chunks[i].size == size) {
            munmap(ptr, size);
            s->host_chunks[i] = s->host_chunks[--s->num_host_chunks];
            s->counters.host_frees++;
            s->counters.host_bytes -= size;
            break;
        }
    pthread_mutex_unlock(&s->lock);
}

int cuh_sim_host_chunk(cuh_device_t *dev, const void *ptr, uintptr_t *base, size_t *size)
{
    sim_device_t *s = sim_of(dev);
    int flags = -1;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->num_host_chunks; i++)
        if ((uintptr_t)ptr - s->host_chunks[i].base < s->host_chunks[i].size) {
            flags = (int)s->host_chunks[i].flags;
            if (base)
                *base = s->host_chunks[i].base;
            if (size)
                *size = s->host_chunks[i].size;
        }
    pthread_mutex_unlock(&s->lock);
    return flags;
}

void cuh_sim_set_host_capacity(cuh_device_t *dev, size_t bytes)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    s->host_capacity = bytes;
    pthread_mutex_unlock(&s->lock);
}

static void sim_destroy(cuh_device_t *dev)
{
    sim_device_t *s = sim_of(dev);
    for (size_t i = 0; i < s->num_host_chunks; i++)
        munmap((void *)s->host_chunks[i].base, s->host_chunks[i].size);
    free(s->host_chunks);
    cuh_ptrmap_destroy(&s->segments);
    cuh_ptrmap_destroy(&s->ordinals);
    cuh_ptrmap_destroy(&s->reservations);
    cuh_ptrmap_destroy(&s->physical);
    cuh_ptrmap_destroy(&s->mappings);
    cuh_ptrmap_destroy(&s->handles);
    cuh_ptrmap_destroy(&s->values);
    free(s->free_handles);
    for (size_t i = 0; i < s->num_streams; i++) {
        free(s->streams[i].dep);
        for (size_t m = 0; m < s->streams[i].num_marks; m++)
            free(s->streams[i].marks[m].clock);
        free(s->streams[i].marks);
    }
    free(s->streams);
    free(s->all_dep);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const cuh_device_ops_t sim_ops = {
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .mem_info = sim_mem_info,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_wait = sim_event_wait,
    .stream_wait = sim_stream_wait,
    .event_record_all = sim_event_record_all,
    .wait_all = sim_wait_all,
    .synchronize = sim_synchronize,
    .destroy = sim_destroy,
    .vm_granularity = sim_vm_granularity,
    .vm_reserve = sim_vm_reserve,
    .vm_unreserve = sim_vm_unreserve,
    .vm_create = sim_vm_create,
    .vm_release = sim_vm_release,
    .vm_map = sim_vm_map,
    .vm_unmap = sim_vm_unmap,
    .vm_allow_peer = sim_vm_allow_peer,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
};

cuh_device_t *cuh_sim_create(const cuh_sim_params_t *params)
{
    sim_device_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (cuh_ptrmap_init(&s->segments, 64) || cuh_ptrmap_init(&s->ordinals, 64) ||
        cuh_ptrmap_init(&s->reservations, 16) || cuh_ptrmap_init(&s->physical, 1024) ||
        cuh_ptrmap_init(&s->mappings, 1024) || cuh_ptrmap_init(&s->handles, 1024) ||
        cuh_ptrmap_init(&s->values, 1024)) {
        cuh_ptrmap_destroy(&s->segments);
        cuh_ptrmap_destroy(&s->ordinals);
        cuh_ptrmap_destroy(&s->reservations);
        cuh_ptrmap_destroy(&s->physical);
        cuh_ptrmap_destroy(&s->mappings);
        cuh_ptrmap_destroy(&s->handles);
        cuh_ptrmap_destroy(&s->values);
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->base.ops = &sim_ops;
    s->base.kind = "sim";
    s->base.ordinal = params->ordinal;
    s->capacity = params->capacity;
    /* Each device gets its own slice of the address space. */
    if (params->ordinal < 0 || params->ordinal >= SIM_MAX_ORDINALS) {
        sim_destroy(&s->base);
        return NULL;
    }
    s->next_addr = SIM_BASE + (uintptr_t)params->ordinal * SIM_SPACE;
    s->space_end = s->next_addr + SIM_SPACE;
    s->top_down = params->top_down;
    /* The legacy default stream exists from the start, as on a GPU: a
     * device-wide event covers it before anything was recorded there. */
    if (!stream_state(s, 0)) {
        sim_destroy(&s->base);
        return NULL;
    }
    return &s->base;
}

void cuh_sim_set_external(cuh_device_t *dev, size_t bytes)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    /* Never more than what cuheap leaves free: the books stay within capacity. */
    size_t room = s->capacity - s->counters.used;
    s->external = bytes > room ? room : bytes;
    pthread_mutex_unlock(&s->lock);
}

void cuh_sim_hold_events(cuh_device_t *dev, int hold)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    s->hold = hold;
    pthread_mutex_unlock(&s->lock);
}

void cuh_sim_device_fences(cuh_device_t *dev, int on)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    s->no_device_fences = !on;
    pthread_mutex_unlock(&s->lock);
}

void cuh_sim_capturing(cuh_device_t *dev, int on)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    s->capturing = on;
    pthread_mutex_unlock(&s->lock);
}

void cuh_sim_complete_stream(cuh_device_t *dev, cuh_stream_t stream)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    sim_stream_t *st = stream_state(s, stream);
    if (st)
        complete_stream(s, st);
    pthread_mutex_unlock(&s->lock);
}

void cuh_sim_complete_stream_upto(cuh_device_t *dev, cuh_stream_t stream, uint64_t pos)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    sim_stream_t *st = stream_state(s, stream);
    if (st && pos > st->completed && pos <= st->recorded)
        complete_stream_to(s, st, pos);
    pthread_mutex_unlock(&s->lock);
}

uint64_t cuh_sim_enqueue_work(cuh_device_t *dev, cuh_stream_t stream)
{
    sim_device_t *s = sim_of(dev);
    uint64_t pos = 0;
    pthread_mutex_lock(&s->lock);
    sim_stream_t *st = stream_state(s, stream);
    if (st && note_record(st)) {
        pos = ++st->recorded;
        if (!s->hold)
            complete_stream(s, st);
    }
    pthread_mutex_unlock(&s->lock);
    return pos;
}

int cuh_sim_stream_waits_for(cuh_device_t *dev, cuh_stream_t stream, cuh_stream_t on, uint64_t pos)
{
    sim_device_t *s = sim_of(dev);
    int after = 0;
    pthread_mutex_lock(&s->lock);
    sim_stream_t *st = stream_state(s, stream);
    size_t i = st ? (size_t)(st - s->streams) : 0;
    sim_stream_t *other = st ? stream_state(s, on) : NULL;
    if (st && other) {
        st = &s->streams[i];   /* stream_state may have moved the array */
        size_t j = (size_t)(other - s->streams);
        after = other->completed >= pos || st == other || (j < st->num_dep && st->dep[j] >= pos);
    }
    pthread_mutex_unlock(&s->lock);
    return after;
}

int cuh_sim_work_done(cuh_device_t *dev, cuh_stream_t stream, uint64_t pos)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    sim_stream_t *st = stream_state(s, stream);
    int done = st && st->completed >= pos;
    pthread_mutex_unlock(&s->lock);
    return done;
}

void cuh_sim_stream_idle(cuh_device_t *dev, cuh_stream_t stream)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    sim_stream_t *st = stream_state(s, stream);
    if (st) {
        st->idle = 1;
        st->completed = st->recorded;
    }
    pthread_mutex_unlock(&s->lock);
}

void cuh_sim_complete_all(cuh_device_t *dev)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    complete_all_locked(s);
    pthread_mutex_unlock(&s->lock);
}

int cuh_sim_segment_of(cuh_device_t *dev, uintptr_t addr, uintptr_t *base, uint64_t *ordinal)
{
    sim_device_t *s = sim_of(dev);
    int found = 0;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; !found && i <= s->segments.mask; i++) {
        const cuh_ptrmap_entry_t *e = &s->segments.slots[i];
        if (e->key && addr - e->key < (size_t)(uintptr_t)e->value) {
            *base = e->key;
            *ordinal = (uint64_t)(uintptr_t)cuh_ptrmap_get(&s->ordinals, e->key) - 1;
            found = 1;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return found;
}

uint64_t cuh_sim_handle_at(cuh_device_t *dev, uintptr_t va, size_t *offset)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    uintptr_t start = 0;
    const uint64_t id = mapping_at(s, va, &start);
    const uint64_t handle = id ? (uint64_t)(uintptr_t)cuh_ptrmap_get(&s->values, (uintptr_t)id << 9) : 0;
    if (handle && offset)
        *offset = va - start;
    pthread_mutex_unlock(&s->lock);
    return handle;
}

int cuh_sim_released_at(cuh_device_t *dev, uintptr_t va)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    uintptr_t start = 0;
    const uint64_t id = mapping_at(s, va, &start);
    const size_t v = id ? (size_t)cuh_ptrmap_get(&s->physical, (uintptr_t)id << 9) : 0;
    pthread_mutex_unlock(&s->lock);
    return (v & PHYS_RELEASED) != 0;
}

void cuh_sim_reuse_handles(cuh_device_t *dev, int on)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    s->reuse_handles = on;
    pthread_mutex_unlock(&s->lock);
}

void cuh_sim_counters(cuh_device_t *dev, cuh_sim_counters_t *out)
{
    sim_device_t *s = sim_of(dev);
    pthread_mutex_lock(&s->lock);
    *out = s->counters;
    pthread_mutex_unlock(&s->lock);
}
