/* floor.c - the floor's arenas (floor.h): one per device, taken at its
 * first use; in each a bump pointer, exact-size LIFO free lists, and the two
 * insert-only tables that make both O(1).
 */
#include "floor.h"

#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- settings ------------------------------------------------------------------ */

/* A byte count with an optional K, M or G (powers of 1024); 0 when bad. */
static size_t parse_bytes(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || s[0] == '-')
        return 0;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end || v > (SIZE_MAX >> shift))
        return 0;
    return (size_t)v << shift;
}

int floor_settings(size_t *arena_bytes, size_t *max_blocks)
{
    const char *arena = getenv("FLOOR_ARENA");
    const char *blocks = getenv("FLOOR_BLOCKS");
    *arena_bytes = arena && *arena ? parse_bytes(arena) : FLOOR_DEFAULT_ARENA;
    *max_blocks = blocks && *blocks ? parse_bytes(blocks) : FLOOR_DEFAULT_BLOCKS;
    if (*arena_bytes < FLOOR_ALIGN) {
        fprintf(stderr, "floor: FLOOR_ARENA=%s is not a size of at least %zu bytes (K, M, G suffixes)\n",
                arena ? arena : "", FLOOR_ALIGN);
        return -1;
    }
    if (*max_blocks == 0 || *max_blocks > ((size_t)1 << 28)) {
        fprintf(stderr, "floor: FLOOR_BLOCKS=%s is not a number of blocks from 1 to 2^28\n", blocks ? blocks : "");
        return -1;
    }
    *arena_bytes -= *arena_bytes % FLOOR_ALIGN;
    return 0;
}

/* ---- the arena ------------------------------------------------------------------- */

static size_t slot_of(uintptr_t key, size_t slots)
{
    return (size_t)(((uint64_t)key / FLOOR_ALIGN * 0x9E3779B97F4A7C15ull) >> 20) & (slots - 1);
}

int floor_arena_init(floor_arena_t *a, int device, uintptr_t base, size_t bytes, size_t max_blocks)
{
    memset(a, 0, sizeof *a);
    size_t slots = 1;
    while (slots < 2 * max_blocks)
        slots <<= 1;
    a->blocks = calloc(max_blocks, sizeof *a->blocks);
    a->by_addr = calloc(slots, sizeof *a->by_addr);
    a->by_size = calloc(slots, sizeof *a->by_size);
    if (!a->blocks || !a->by_addr || !a->by_size) {
        free(a->blocks);
        free(a->by_addr);
        free(a->by_size);
        fprintf(stderr, "floor: no host memory for the books of %zu blocks\n", max_blocks);
        return -1;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->device = device;
    a->base = a->bump = base;
    a->end = base + bytes;
    a->max_blocks = max_blocks;
    a->slots = slots;
    return 0;
}

/* The free list of `size`, made if new; NULL only when the table is full,
 * which cannot happen before the blocks run out (it has twice their slots). */
static floor_list_t *list_of(floor_arena_t *a, size_t size)
{
    for (size_t i = slot_of(size, a->slots);; i = (i + 1) & (a->slots - 1)) {
        floor_list_t *l = &a->by_size[i];
        if (l->size == size)
            return l;
        if (l->size == 0) {
            l->size = size;
            return l;
        }
    }
}

static floor_block_t **addr_slot(floor_arena_t *a, uintptr_t addr)
{
    size_t i = slot_of(addr, a->slots);
    while (a->by_addr[i] && a->by_addr[i]->addr != addr)
        i = (i + 1) & (a->slots - 1);
    return &a->by_addr[i];
}

uintptr_t floor_arena_alloc(floor_arena_t *a, size_t size, const char *who)
{
    if (size > SIZE_MAX - FLOOR_ALIGN)
        size = SIZE_MAX - FLOOR_ALIGN;   /* refused below: no arena is that large */
    size_t block = (size + FLOOR_ALIGN - 1) / FLOOR_ALIGN * FLOOR_ALIGN;
    pthread_mutex_lock(&a->lock);
    floor_list_t *l = list_of(a, block);
    floor_block_t *b = l->head;
    if (b) {
        l->head = b->next_free;
    } else if (block <= a->end - a->bump && a->num_blocks < a->max_blocks) {
        b = &a->blocks[a->num_blocks++];
        b->addr = a->bump;
        b->size = block;
        a->bump += block;
        *addr_slot(a, b->addr) = b;
    } else {
        unsigned long refusals = ++a->refusals;
        size_t left = (size_t)(a->end - a->bump), cut = a->num_blocks;
        pthread_mutex_unlock(&a->lock);
        if (refusals <= 8)
            fprintf(stderr,
                    "floor: %s(%zu bytes) on device %d refused: the arena is exhausted (%zu of %zu bytes left "
                    "uncut, %zu of FLOOR_BLOCKS=%zu blocks cut, and no free block of %zu bytes); raise %s\n",
                    who, size, a->device, left, (size_t)(a->end - a->base), cut, a->max_blocks, block,
                    cut == a->max_blocks ? "FLOOR_BLOCKS" : "FLOOR_ARENA");
        return 0;
    }
    b->live = 1;
    b->next_free = NULL;
    pthread_mutex_unlock(&a->lock);
    return b->addr;
}

int floor_arena_free(floor_arena_t *a, uintptr_t addr, const char *who)
{
    if (addr < a->base || addr >= a->end)
        return 0;
    pthread_mutex_lock(&a->lock);
    floor_block_t *b = *addr_slot(a, addr);
    if (!b || !b->live) {
        pthread_mutex_unlock(&a->lock);
        fprintf(stderr, "floor: %s(%#llx) on device %d refused: %s\n", who, (unsigned long long)addr, a->device,
                b ? "the block is free already (a double free)" : "no block starts there");
        return -1;
    }
    b->live = 0;
    floor_list_t *l = list_of(a, b->size);
    b->next_free = l->head;
    l->head = b;
    pthread_mutex_unlock(&a->lock);
    return 1;
}

/* ---- one arena per device ---------------------------------------------------------- */

static floor_arena_t arenas[FLOOR_MAX_DEVICES];
static floor_arena_t *_Atomic opened[FLOOR_MAX_DEVICES];   /* set once the arena is ready */
static _Atomic int num_opened;                           /* opened[] in order of opening */
static int refused[FLOOR_MAX_DEVICES];
static int order[FLOOR_MAX_DEVICES];
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

floor_arena_t *floor_device_arena(int device, floor_take_fn take)
{
    if (device < 0 || device >= FLOOR_MAX_DEVICES) {
        fprintf(stderr, "floor: device %d is out of range (0 to %d)\n", device, FLOOR_MAX_DEVICES - 1);
        return NULL;
    }
    floor_arena_t *a = atomic_load_explicit(&opened[device], memory_order_acquire);
    if (a)
        return a;
    pthread_mutex_lock(&open_lock);
    size_t bytes, max_blocks;
    uintptr_t base;
    if (!(a = opened[device]) && !refused[device]) {
        if (floor_settings(&bytes, &max_blocks) == 0 && take(device, bytes, &base) == 0 &&
            floor_arena_init(&arenas[device], device, base, bytes, max_blocks) == 0) {
            a = &arenas[device];
            order[atomic_load(&num_opened)] = device;
            atomic_store_explicit(&opened[device], a, memory_order_release);
            atomic_fetch_add(&num_opened, 1);
        } else {
            refused[device] = 1;
            fprintf(stderr, "floor: device %d has no arena; its requests are refused\n", device);
        }
    }
    pthread_mutex_unlock(&open_lock);
    return a;
}

floor_arena_t *floor_arena_owning(uintptr_t addr)
{
    int n = atomic_load_explicit(&num_opened, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        floor_arena_t *a = &arenas[order[i]];
        if (addr >= a->base && addr < a->end)
            return a;
    }
    return NULL;
}
