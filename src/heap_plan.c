/* heap_plan.c - step plans (step_plan:1): a training step's blocks laid out
 * once, from the steps before, and placed there every step after.
 *
 * The heap places a block when it is asked for, knowing nothing of the rest
 * of the step, and under vmm:1 moves pages where free memory lies in the
 * wrong place: below a small vmm_margin, every step. Most training jobs ask
 * for the same blocks in the same order every step, and laid out with the
 * whole step known (step_plan.h, greedy by size) a step of the corpus's
 * jobs that repeat holds within 1% of its live peak (bench/README.md, "A
 * step laid out in advance"). So with step_plan the heap records each
 * step's block allocations and frees (a step ends at cuh_heap_mark_step:
 * cuheap's PyTorch package marks every optimizer step). At a mark, when the
 * step just ended asked for what the step before asked for, in the same
 * order and with the same lives, and moved pages, it is laid out: every
 * block allocated on the step's busiest stream and freed there in the step,
 * or in the next step before its own next copy comes (its life wraps round).
 * The layout goes in a window cut from the unused top of the reservation.
 * The window's free room is out of the arena's reach (used extents the plan
 * owns, "room"), so its pages, once mapped, stay: moving in costs the
 * window's pages once, in the first step the plan is in force.
 *
 * A plan is made only where the device and the limit leave the window's
 * size free: moving in may need that much while the step before's blocks
 * are still where they were.
 *
 * cudaMalloc's blocks (LD_PRELOAD) form one more lane beside the streams,
 * the device-wide one: a step whose busiest lane it is gets a plan for its
 * cudaMalloc blocks freed by cudaFree. Their room comes back when the
 * cudaFree's batch finishes (heap_devicewide.c: the GPU passed the free, or
 * every stream's later work waits for it), and a block whose place is not
 * back yet takes back what cudaFree gave, as the allocation ladder's first
 * step would, before it gives up its place.
 *
 * In the next steps the k-th block allocation takes its place in the window
 * if it asks for what the k-th did and its place is room; pages behind it
 * are mapped as always, moved from free memory first. A planned block freed
 * on the plan's stream becomes room again. The first request that differs
 * from the plan ends placements for the step, and at its mark the plan is
 * dropped: the room goes back to the arena as memory freed on the plan's
 * stream. So does it when the heap would otherwise run out of memory (the
 * allocation ladder, heap.c), release its cached memory or exceed a new
 * limit.
 *
 * Rules kept here (heap.h): a block is placed only in room, memory no block
 * owns; room comes back only from the plan's blocks freed on the plan's
 * stream, so a block placed there runs after the work of the block before
 * it on that stream (the stream rule), or for the device-wide lane once
 * cudaFree's promise is kept; a request the plan does not expect is served
 * as it would be without a plan.
 */
#include "heap_internal.h"
#include "step_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_NONE SIZE_MAX

/* The owner of the window's room extents (used extents no block owns). */
static char room_owner;
#define ROOM ((void *)&room_owner)

/* The lane of cudaMalloc's blocks (device-wide: any stream may use them),
 * in the records and as a plan's stream. */
#define LANE_DEVICE_WIDE ((cuh_stream_t)UINTPTR_MAX)

/* The heap's state for a plan's lane: the device-wide one, or its stream's
 * (NULL when host memory runs out). */
static stream_state_t *lane_state_locked(cuh_heap_t *h, cuh_stream_t lane)
{
    return lane == LANE_DEVICE_WIDE ? &h->device_wide : cuh_hp_stream_get_locked(h, lane);
}

static int is_room(const cuh_extent_t *e)
{
    return e && e->state == CUH_EXTENT_BLOCK && e->owner == ROOM;
}

int cuh_hp_plan_is_room(const cuh_extent_t *e) { return is_room(e); }

int cuh_hp_plan_check_locked(const cuh_heap_t *h, size_t room, char *msg, size_t len)
{
    const plan_t *p = &h->plan;
    size_t listed = 0;
    for (size_t i = 0; i < p->num_rooms; i++) {
        const cuh_extent_t *e = p->rooms[i];
        listed += e->size;
        if (!is_room(e) || (i && p->rooms[i - 1]->addr + p->rooms[i - 1]->size > e->addr)) {
            snprintf(msg, len, "step plan: room %zu at 0x%llx is not room, or out of order", i,
                     (unsigned long long)e->addr);
            return -1;
        }
    }
    if (listed != room || (!p->active && room)) {
        snprintf(msg, len, "step plan: %zu bytes of room in the arena, %zu listed (plan %s)", room, listed,
                 p->active ? "in force" : "dropped");
        return -1;
    }
    return 0;
}

/* ---- the room: used extents of the window, sorted by address --------------------- */

/* The index of the first room extent above addr (so the one before it, if
 * any, starts at or below addr). */
static size_t room_upper(const plan_t *p, uintptr_t addr)
{
    size_t lo = 0, hi = p->num_rooms;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->rooms[mid]->addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int room_insert(plan_t *p, cuh_extent_t *e)
{
    if (p->num_rooms == p->cap_rooms) {
        size_t cap = p->cap_rooms ? 2 * p->cap_rooms : 64;
        cuh_extent_t **grown = realloc(p->rooms, cap * sizeof *grown);
        if (!grown)
            return -1;
        p->rooms = grown;
        p->cap_rooms = cap;
    }
    size_t i = room_upper(p, e->addr);
    memmove(&p->rooms[i + 1], &p->rooms[i], (p->num_rooms - i) * sizeof *p->rooms);
    p->rooms[i] = e;
    p->num_rooms++;
    return 0;
}

static void room_remove(plan_t *p, const cuh_extent_t *e)
{
    size_t i = room_upper(p, e->addr);
    if (i == 0 || p->rooms[i - 1] != e)
        return;   /* not a room extent: nothing to remove */
    memmove(&p->rooms[i - 1], &p->rooms[i], (p->num_rooms - i) * sizeof *p->rooms);
    p->num_rooms--;
}

/* Used extent e of the window becomes room, joined with room next to it.
 * 0, or -1 when host memory runs out (e is then left as it was). */
static int to_room(cuh_heap_t *h, cuh_extent_t *e)
{
    plan_t *p = &h->plan;
    e->owner = ROOM;
    e->requested = 0;
    if (room_insert(p, e) != 0) {
        e->owner = NULL;
        return -1;
    }
    if (is_room(e->next) && e->next->addr == e->addr + e->size) {
        room_remove(p, e->next);
        cuh_arena_join_used(&h->arena, e);
    }
    if (is_room(e->prev) && e->prev->addr + e->prev->size == e->addr) {
        room_remove(p, e);
        cuh_arena_join_used(&h->arena, e->prev);
    }
    return 0;
}

/* Carves [a, a + size) out of the room for a block of stream st; NULL if
 * that range is not all room (or host memory ran out). */
static cuh_extent_t *take_room(cuh_heap_t *h, uintptr_t a, size_t size, const stream_state_t *st)
{
    plan_t *p = &h->plan;
    size_t i = room_upper(p, a);
    if (i == 0)
        return NULL;
    cuh_extent_t *r = p->rooms[i - 1];
    if (a + size > r->addr + r->size)
        return NULL;
    cuh_extent_t *b = r;
    if (a > r->addr) {
        if (!(b = cuh_arena_split_used(&h->arena, r, a)))
            return NULL;
        b->owner = ROOM;
        if (room_insert(p, b) != 0) {
            cuh_arena_join_used(&h->arena, r);
            return NULL;
        }
    }
    if (a + size < b->addr + b->size) {
        cuh_extent_t *rest = cuh_arena_split_used(&h->arena, b, a + size);
        if (!rest)
            return NULL;   /* b stays room */
        rest->owner = ROOM;
        if (room_insert(p, rest) != 0) {
            cuh_arena_join_used(&h->arena, b);
            return NULL;
        }
    }
    room_remove(p, b);
    b->owner = NULL;
    b->tag = st->tag;
    return b;
}

/* ---- recording ------------------------------------------------------------------- */

/* The longest step looked for in a program's allocations where it marks
 * none, in block allocations (the detector's 32 bytes of host memory each,
 * and up to 4 events of 32 bytes each recorded, allocated at the program's
 * first block). */
#define DETECT_HISTORY ((size_t)1 << 15)

/* Events kept of a program that marks no steps while no step has been
 * found in them: twice what the longest step found may hold (an event for
 * each allocation and free), the oldest half going when that fills. A step
 * that holds more events than that (a program that stopped marking, or
 * marks an epoch) is not recorded: no plan is made from it, and the record
 * stays within 8 MiB. */
#define UNMARKED_EVENTS (4 * DETECT_HISTORY)

static void record(plan_t *p, plan_event_t ev)
{
    const int c = p->cur;
    if (p->unrecorded)
        return;
    if (p->num_events[c] >= 2 * UNMARKED_EVENTS) {
        if (p->program_marks || p->detect.period) {
            p->unrecorded = 1;   /* too long a step to plan */
            p->num_events[c] = 0;
            return;
        }
        memmove(p->events[c], p->events[c] + UNMARKED_EVENTS, (p->num_events[c] - UNMARKED_EVENTS) * sizeof *p->events[c]);
        p->num_events[c] -= UNMARKED_EVENTS;
    }
    if (p->num_events[c] == p->cap_events[c]) {
        size_t cap = p->cap_events[c] ? 2 * p->cap_events[c] : 1024;
        plan_event_t *grown = realloc(p->events[c], cap * sizeof *grown);
        if (!grown) {
            p->unrecorded = 1;   /* this step cannot be compared or planned */
            return;
        }
        p->events[c] = grown;
        p->cap_events[c] = cap;
    }
    p->events[c][p->num_events[c]++] = ev;
}

void cuh_hp_plan_note_free_locked(cuh_heap_t *h, const cuh_extent_t *e, cuh_stream_t stream, int device_wide)
{
    if (e->seq) {
        h->plan.live_blocks -= e->size;
        record(&h->plan, (plan_event_t){.seq = e->seq, .stream = device_wide ? LANE_DEVICE_WIDE : stream, .free = 1});
    }
}

/* ---- steps found in the allocations --------------------------------------------- */


void cuh_hp_plan_program_marks_locked(cuh_heap_t *h)
{
    plan_t *p = &h->plan;
    if (!p->program_marks) {
        p->program_marks = 1;
        cuh_step_detect_free(&p->detect);
    }
}

/* The detector found a step of `period` allocations that repeated in full:
 * the events recorded are cut where it says the last two steps began, as
 * if they had been marked, so that the step about to be marked is compared
 * with the one before it at once. No cut if they are not all there. */
static void cut_found_steps(plan_t *p, uint64_t period)
{
    const int c = p->cur;
    plan_event_t *ev = p->events[c];
    const size_t n = p->num_events[c];
    if (p->unrecorded || p->next_seq < 2 * period)
        return;
    const uint64_t s1 = p->next_seq - period + 1, s0 = s1 - period;   /* the two steps' first allocations */
    size_t e1 = n, e0 = n;
    for (size_t k = n; k-- > 0;) {
        if (ev[k].free)
            continue;
        if (ev[k].seq == s1)
            e1 = k;
        if (ev[k].seq == s0) {
            e0 = k;
            break;
        }
    }
    if (e0 == n || e1 == n)
        return;
    const int b = !c;
    if (p->cap_events[b] < e1 - e0) {
        plan_event_t *grown = realloc(p->events[b], (e1 - e0) * sizeof *grown);
        if (!grown)
            return;
        p->events[b] = grown;
        p->cap_events[b] = e1 - e0;
    }
    memcpy(p->events[b], ev + e0, (e1 - e0) * sizeof *ev);
    p->num_events[b] = e1 - e0;
    memmove(ev, ev + e1, (n - e1) * sizeof *ev);
    p->num_events[c] = n - e1;
    p->first_seq[b] = s0 - 1;
    p->first_seq[c] = s1 - 1;
    p->first_older = s0 - 1 > period ? s0 - 1 - period : 0;
    p->have_prev = 1;
    p->prev_unrecorded = 0;
    p->pos = p->next_seq - (s1 - 1);
}

/* A block allocation of `block` bytes on `lane` comes: where the program
 * marks no steps, it may begin one (step_detect.h), which is marked first. */
static void find_step_locked(cuh_heap_t *h, cuh_stream_t lane, size_t block)
{
    plan_t *p = &h->plan;
    if (p->program_marks || p->detect_failed || !h->vm)
        return;
    if (!p->detect.keys && cuh_step_detect_init(&p->detect, DETECT_HISTORY) != 0) {
        p->detect_failed = 1;
        return;
    }
    const uint64_t key = ((uint64_t)block * 0x9e3779b97f4a7c15ull) ^ (uint64_t)lane;
    const int begins = cuh_step_detect_push(&p->detect, key, p->live_blocks);
    if (p->found_period && !p->detect.period) {
        /* The step found changed and no other is in sight: no mark will
         * come to drop the plan, whose room would sit idle meanwhile. */
        p->found_period = 0;
        cuh_hp_plan_drop_locked(h);
    }
    if (begins) {
        if (p->detect.period != p->found_period) {   /* a step newly found */
            p->found_period = p->detect.period;
            cut_found_steps(p, p->found_period);
        }
        cuh_hp_mark_step_locked(h);
    }
}

/* ---- placing and freeing ---------------------------------------------------------- */

/* The block the plan puts at a: carved from the room, its pages mapped
 * (moved from free memory first: the window's pages are the heap's, not
 * more of them), and counted live. 0 if it cannot go there. */
static uintptr_t place_locked(cuh_heap_t *h, stream_state_t *st, uintptr_t a, size_t block, size_t size)
{
    cuh_extent_t *e = take_room(h, a, block, st);
    if (!e)
        return 0;
    grow_result_t why;
    h->plan.mapping = 1;
    int mapped = cuh_hp_map_range_locked(h, a, block, st, &why);
    h->plan.mapping = 0;
    if (!mapped || cuh_ptrmap_insert(&h->blocks, a, e)) {
        (void)to_room(h, e);   /* cannot fail: it was room a moment ago (and if it did, e is a used extent no one finds) */
        return 0;
    }
    cuh_hp_large_mark_live_locked(h, e, size);
    e->plan = h->plan.gen;
    h->num_cache_hits++;
    return a;
}

static void record_alloc(cuh_heap_t *h, cuh_extent_t *e, cuh_stream_t stream, size_t size);

/* What cudaFree gave back comes home before a device-wide block is placed,
 * as the allocation ladder's first step would bring it (heap.c): with
 * device-wide fences a take-back of all of it, with fences per stream what
 * the GPU has passed. 1 if anything came back. */
static int bring_back_locked(cuh_heap_t *h)
{
    if (!h->held_bytes)
        return 0;
    if (!cuh_hp_fences_per_stream_locked(h))
        return cuh_hp_take_back_for_block_locked(h, NULL, 0, 0, NULL);
    return cuh_hp_batches_poll_locked(h, 0);
}

cuheap_status_t cuh_hp_plan_alloc_locked(cuh_heap_t *h, stream_state_t *st, cuh_stream_t stream, int device_wide,
                                         size_t size, uintptr_t *addr)
{
    plan_t *p = &h->plan;
    const size_t block = cuh_align_up(size, CUH_ALIGN);
    const cuh_stream_t lane = device_wide ? LANE_DEVICE_WIDE : stream;
    *addr = 0;
    find_step_locked(h, lane, block);
    if (p->active && !p->off_track && !h->captures) {
        const size_t k = p->pos;
        if (k < p->num_allocs && p->sizes[k] == block && p->streams[k] == lane) {
            if (p->addrs[k]) {
                /* A planned cudaMalloc block's room comes back once the
                 * GPU has passed its cudaFree (cuh_hp_plan_room_finished_locked). */
                *addr = place_locked(h, st, p->addrs[k], block, size);
                if (!*addr && device_wide && bring_back_locked(h))
                    *addr = place_locked(h, st, p->addrs[k], block, size);
                p->placed += *addr != 0;
                p->missed += *addr == 0;
            }
        } else {
            p->off_track = 1;   /* the step asks for something else: as always from here */
        }
    }
    /* Out of memory with a plan in force, the allocation ladder gives the
     * room back and tries again (cuh_hp_extent_alloc_locked). */
    cuheap_status_t status = *addr ? CUHEAP_OK : cuh_hp_large_alloc_locked(h, st, size, addr);
    if (status != CUHEAP_OK) {
        p->pos++;
        return status;
    }
    cuh_extent_t *e = cuh_ptrmap_get(&h->blocks, *addr);
    if (e)
        record_alloc(h, e, lane, size);
    else
        p->pos++;
    return CUHEAP_OK;
}

void cuh_hp_plan_note_alloc_locked(cuh_heap_t *h, cuh_extent_t *e, cuh_stream_t stream, size_t size)
{
    find_step_locked(h, stream, cuh_align_up(size, CUH_ALIGN));
    record_alloc(h, e, stream, size);
}

static void record_alloc(cuh_heap_t *h, cuh_extent_t *e, cuh_stream_t stream, size_t size)
{
    plan_t *p = &h->plan;
    p->pos++;
    p->live_blocks += e->size;
    e->seq = ++p->next_seq;
    record(p, (plan_event_t){.seq = e->seq, .size = cuh_align_up(size, CUH_ALIGN), .stream = stream});
}

/* Planned block e, freed in the plan's lane, leaves the heap's blocks for
 * the room: 1, or 0 (e left as it was) if host memory ran out. */
static int block_to_room(cuh_heap_t *h, cuh_extent_t *e)
{
    cuh_ptrmap_remove(&h->blocks, e->addr);
    if (to_room(h, e) != 0) {
        (void)cuh_ptrmap_insert(&h->blocks, e->addr, e);   /* room was just freed from it: cannot fail */
        return 0;
    }
    return 1;
}

int cuh_hp_plan_room_locked(cuh_heap_t *h, const live_block_t *b, uintptr_t addr, cuh_stream_t stream)
{
    const plan_t *p = &h->plan;
    (void)addr;   /* the block's extent starts there */
    if (!p->active || !b->ext || b->ext->plan != p->gen || stream != p->stream || h->captures)
        return 0;
    return block_to_room(h, b->ext);
}

int cuh_hp_plan_room_finished_locked(cuh_heap_t *h, cuh_extent_t *e)
{
    const plan_t *p = &h->plan;
    if (!p->active || e->plan != p->gen || p->stream != LANE_DEVICE_WIDE || h->captures)
        return 0;
    return block_to_room(h, e);
}

/* ---- dropping and making plans ------------------------------------------------------ */

void cuh_hp_plan_drop_locked(cuh_heap_t *h)
{
    plan_t *p = &h->plan;
    if (!p->active)
        return;
    /* The room goes back as memory freed on the plan's stream: its last
     * blocks' work ran there. A device-wide plan's room came back when the
     * GPU had passed its frees, or every stream's later work waited for
     * them: global memory. */
    const int global = p->stream == LANE_DEVICE_WIDE;
    stream_state_t *st = global ? NULL : cuh_hp_stream_get_locked(h, p->stream);
    for (size_t i = 0; i < p->num_rooms; i++) {
        cuh_extent_t *e = p->rooms[i];
        e->owner = NULL;
        cuh_arena_release(&h->arena, e, st ? st->tag : CUH_TAG_GLOBAL);
    }
    if (!st && !global)
        cuh_hp_cpu_wait_device(h);   /* released as global memory: the GPU must have passed it */
    p->num_rooms = 0;
    p->room_bytes = 0;
    p->active = 0;
    p->dropped++;
}

/* Where a freed block came from, seen from the step that freed it (whose
 * first allocation followed `first`, the step before's `before`): 1 + its
 * index in that step, FROM_STEP_BEFORE, or FROM_OLDER. Which block of the
 * step before does not count: its place there depends on that step, and a
 * second step that follows a longer first one still repeats the third (the
 * plan takes the lives of the blocks that wrap from the step it lays out). */
#define FROM_STEP_BEFORE ((uint64_t)1 << 62)
#define FROM_OLDER ((uint64_t)1 << 63)

static uint64_t freed_from(uint64_t seq, uint64_t first, uint64_t before)
{
    if (seq > first)
        return seq - first;
    return seq > before ? FROM_STEP_BEFORE : FROM_OLDER;
}

/* 1 if the two recorded steps asked for the same blocks in the same order
 * and freed them alike (freed_from). */
static int steps_alike(const plan_t *p)
{
    const int a = p->cur, b = !p->cur;
    if (p->num_events[a] != p->num_events[b])
        return 0;
    for (size_t i = 0; i < p->num_events[a]; i++) {
        const plan_event_t *x = &p->events[a][i], *y = &p->events[b][i];
        if (x->free != y->free || x->stream != y->stream || x->size != y->size)
            return 0;
        if (x->free ? freed_from(x->seq, p->first_seq[a], p->first_seq[b]) !=
                          freed_from(y->seq, p->first_seq[b], p->first_older)
                    : x->seq - p->first_seq[a] != y->seq - p->first_seq[b])
            return 0;
    }
    return 1;
}

/* The stream whose allocations in the step asked for the most bytes. */
static cuh_stream_t busiest_stream(const plan_event_t *ev, size_t n)
{
    enum { KEPT = 8 };
    cuh_stream_t seen[KEPT];
    size_t bytes[KEPT], num = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].free)
            continue;
        size_t k = 0;
        while (k < num && seen[k] != ev[i].stream)
            k++;
        if (k == num) {
            if (num == KEPT)
                continue;
            seen[num] = ev[i].stream;
            bytes[num++] = 0;
        }
        bytes[k] += ev[i].size;
    }
    size_t best = 0;
    for (size_t k = 1; k < num; k++)
        if (bytes[k] > bytes[best])
            best = k;
    return num ? seen[best] : 0;
}

/* The window: `size` bytes of unused address space at the top of the
 * reservation, as one room extent; its address, or 0 if there is not that
 * much. */
static uintptr_t cut_window_locked(cuh_heap_t *h, size_t size, const stream_state_t *st)
{
    cuh_extent_t *top = h->vm->first;
    while (top->next)
        top = top->next;
    if (top->state != CUH_EXTENT_FREE || top->tag != CUH_TAG_GLOBAL)
        return 0;
    const uintptr_t at = cuh_addr_align_up(top->addr, h->vm_page);
    if (at < top->addr || at + size < at || at + size > top->addr + top->size)
        return 0;
    cuh_extent_t *w = cuh_arena_take_at(&h->arena, top, at, size, CUH_EXTENT_BLOCK, st->tag);
    if (!w)
        return 0;
    if (to_room(h, w) != 0) {
        cuh_arena_release(&h->arena, w, CUH_TAG_GLOBAL);   /* never mapped, never used */
        return 0;
    }
    h->plan.room_bytes = size;
    return at;
}

/* 1 if the device, and the limit, leave `window` bytes free beyond what the
 * heap holds. Moving into the window can take up to that much: the step
 * before's blocks stay where they were until freed, and pages only partly
 * free cannot move. Near the device's end the transition would run out of
 * memory, drop the plan and leave the heap cut up (the corpus's smallest
 * device for unet_denoiser under LD_PRELOAD: 1.014x -> 1.031x its live peak). */
static int room_to_move_in_locked(cuh_heap_t *h, size_t window)
{
    const size_t reserved = cuh_hp_reserved_bytes(h);
    if (h->limit && (reserved > h->limit || h->limit - reserved < window))
        return 0;
    size_t free_bytes = 0, total = 0;
    return h->dev->ops->mem_info(h->dev, &free_bytes, &total) == CUH_DEV_OK && free_bytes >= window;
}

/* Makes a plan from the step just recorded, which repeated the step before:
 * what that step's blocks did in this one, this step's will do in the next.
 * Only where the step moved pages: a heap that has settled moves none, and a
 * plan would cost it the move into the window and lower no peak it has
 * reached. */
static void make_plan_locked(cuh_heap_t *h, uint64_t pages_moved)
{
    plan_t *p = &h->plan;
    const plan_event_t *ev = p->events[p->cur];
    const size_t n = p->num_events[p->cur];
    const uint64_t first = p->first_seq[p->cur];
    size_t num_allocs = 0;
    for (size_t i = 0; i < n; i++)
        num_allocs += !ev[i].free;
    if (!num_allocs || !pages_moved)
        return;
    cuh_hp_unpark_locked(h);   /* a parked block's take would pass the plan by */
    size_t *start = malloc(num_allocs * sizeof *start), *end = malloc(num_allocs * sizeof *end);
    size_t *wrap = malloc(num_allocs * sizeof *wrap), *sizes = malloc(num_allocs * sizeof *sizes);
    uintptr_t *addrs = calloc(num_allocs, sizeof *addrs);
    cuh_stream_t *streams = malloc(num_allocs * sizeof *streams);
    cuh_step_block_t *blocks = malloc(num_allocs * sizeof *blocks);
    size_t *index = malloc(num_allocs * sizeof *index);
    if (!start || !end || !wrap || !sizes || !addrs || !streams || !blocks || !index)
        goto out;
    const cuh_stream_t stream = busiest_stream(ev, n);
    stream_state_t *st = lane_state_locked(h, stream);
    if (!st)
        goto out;
    for (size_t k = 0; k < num_allocs; k++)
        end[k] = wrap[k] = PLAN_NONE;
    for (size_t i = 0, k = 0; i < n; i++) {
        const plan_event_t *x = &ev[i];
        if (!x->free) {
            start[k] = i;
            sizes[k] = x->size;
            streams[k++] = x->stream;
            continue;
        }
        const int ours = x->stream == stream;   /* freed in the plan's lane */
        if (x->seq > first && x->seq - first <= num_allocs)
            end[x->seq - first - 1] = ours ? i : PLAN_NONE - 1;   /* freed in the step (elsewhere: not planned) */
        else if (x->seq <= first && first - x->seq < num_allocs)
            wrap[num_allocs - 1 - (first - x->seq)] = ours ? i : PLAN_NONE - 1;   /* the step before's copy */
    }
    size_t nb = 0;
    for (size_t k = 0; k < num_allocs; k++) {
        if (streams[k] != stream)
            continue;
        if (end[k] < PLAN_NONE - 1)
            blocks[nb] = (cuh_step_block_t){.size = sizes[k], .start = start[k], .end = end[k]};
        else if (end[k] == PLAN_NONE && wrap[k] < start[k])
            blocks[nb] = (cuh_step_block_t){.size = sizes[k], .start = start[k], .end = wrap[k]};   /* lives on */
        else
            continue;   /* freed elsewhere, or lives through the next step: as always */
        index[nb++] = k;
    }
    const uint64_t footprint = cuh_step_plan_layout(blocks, nb, n);
    if (!footprint || footprint == UINT64_MAX)
        goto out;
    const size_t window_bytes = cuh_align_up((size_t)footprint, h->vm_page);
    if (!room_to_move_in_locked(h, window_bytes))
        goto out;
    const uintptr_t window = cut_window_locked(h, window_bytes, st);
    if (!window)
        goto out;
    for (size_t j = 0; j < nb; j++)
        addrs[index[j]] = window + (uintptr_t)blocks[j].offset;
    free(p->sizes);
    free(p->addrs);
    free(p->streams);
    p->sizes = sizes;
    p->addrs = addrs;
    p->streams = streams;
    sizes = NULL;
    addrs = NULL;
    streams = NULL;
    p->num_allocs = num_allocs;
    p->stream = stream;
    p->gen++;
    p->made++;
    p->active = 1;
out:
    free(start);
    free(end);
    free(wrap);
    free(sizes);
    free(addrs);
    free(streams);
    free(blocks);
    free(index);
}

void cuh_hp_plan_step_locked(cuh_heap_t *h, uint64_t pages_moved)
{
    plan_t *p = &h->plan;
    const int alike = p->have_prev && !p->unrecorded && !p->prev_unrecorded && steps_alike(p);
    if (p->active && (p->off_track || p->pos != p->num_allocs || p->unrecorded))
        cuh_hp_plan_drop_locked(h);   /* this step did not follow it */
    else if (p->active)
        p->steps_followed++;
    if (!p->active && alike && h->vm && !h->captures)
        make_plan_locked(h, pages_moved);
    /* The next step is recorded over the one before this. */
    p->prev_unrecorded = p->unrecorded;
    p->unrecorded = 0;
    p->first_older = p->first_seq[!p->cur];   /* the step before the one just ended */
    p->cur = !p->cur;
    p->num_events[p->cur] = 0;
    p->first_seq[p->cur] = p->next_seq;
    p->have_prev = 1;
    p->pos = 0;
    p->off_track = 0;
}

void cuh_hp_plan_free_records(cuh_heap_t *h)
{
    plan_t *p = &h->plan;
    for (int i = 0; i < 2; i++)
        free(p->events[i]);
    free(p->sizes);
    free(p->addrs);
    free(p->streams);
    free(p->rooms);
    cuh_step_detect_free(&p->detect);
    memset(p, 0, sizeof *p);
}
