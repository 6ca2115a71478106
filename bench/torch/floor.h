/* floor.h - the floor: an allocator that does nothing but hand out memory
 * taken once, to measure what the way in costs by itself.
 *
 * Issue 45 asks what one tensor costs through PyTorch's pluggable-allocator
 * interface and through LD_PRELOAD, beside what cuheap costs there. The
 * floor answers the first part: floor_plugin.c (PyTorch's plugin entry
 * points) and floor_preload.c (cudaMalloc and cudaFree for LD_PRELOAD) serve
 * every request from one arena per device, so whatever a tensor costs with
 * them is the way in's cost (PyTorch, Python, the dynamic linker), not an
 * allocator's. It is a benchmark's yardstick, not an allocator: it keeps no
 * stream order (a block freed on one stream is handed out on another at
 * once) and never gives memory back. The preload's FLOOR_FENCE=1 adds the
 * one order a cudaFree must keep (floor_preload.c: the fenced floor).
 *
 * The arena: one range of device memory, cut by a bump pointer into blocks
 * of the request rounded up to FLOOR_ALIGN, which are never split or merged.
 * A freed block waits in a free list of its exact size, last in first out,
 * for the next request of that size. The books are in host memory (device
 * memory is never touched): a table from address to block and one from
 * size to free list, both open addressing and insert only (a block, once
 * cut, stays), so every call is O(1). When the bump pointer reaches the end,
 * or the tables are full, a request is refused with a message that says
 * which setting to raise:
 *   FLOOR_ARENA    bytes per device (K, M, G suffixes), default 8G
 *   FLOOR_BLOCKS   most blocks ever cut per device, default 65536
 * One mutex per arena: PyTorch may call from any thread.
 */
#ifndef FLOOR_H
#define FLOOR_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define FLOOR_ALIGN ((size_t)512)
#define FLOOR_MAX_DEVICES 64
#define FLOOR_DEFAULT_ARENA ((size_t)8 << 30)
#define FLOOR_DEFAULT_BLOCKS ((size_t)65536)

typedef struct floor_block_s {
    uintptr_t addr;
    size_t size;                     /* the request rounded up to FLOOR_ALIGN */
    struct floor_block_s *next_free; /* in its size's free list */
    int live;
} floor_block_t;

typedef struct floor_list_s {
    size_t size;                     /* 0: an empty slot */
    floor_block_t *head;
} floor_list_t;

typedef struct floor_arena_s {
    pthread_mutex_t lock;
    int device;
    uintptr_t base, bump, end;
    floor_block_t *blocks;           /* max_blocks records, num_blocks used */
    size_t num_blocks, max_blocks;
    floor_block_t **by_addr;         /* slots: a power of two, at least twice max_blocks */
    floor_list_t *by_size;
    size_t slots;
    unsigned long refusals;
} floor_arena_t;

/* Takes `bytes` of device memory on `device` for its arena: 0 with *base
 * set, or -1 having said why on stderr. Each way in has its own. */
typedef int (*floor_take_fn)(int device, size_t bytes, uintptr_t *base);

/* The arena of `device`, taken with `take` at its first use (once: a device
 * whose arena could not be taken is not asked again); NULL when there is
 * none, said on stderr. */
floor_arena_t *floor_device_arena(int device, floor_take_fn take);
/* The arena whose range holds addr, or NULL. */
floor_arena_t *floor_arena_owning(uintptr_t addr);

/* The settings: FLOOR_ARENA and FLOOR_BLOCKS. Returns 0, or -1
 * with a message on stderr naming the bad value. */
int floor_settings(size_t *arena_bytes, size_t *max_blocks);

/* Sets up `a` over [base, base + bytes) of `device`; 0, or -1 when the host
 * has no memory for the books (said on stderr). */
int floor_arena_init(floor_arena_t *a, int device, uintptr_t base, size_t bytes, size_t max_blocks);

/* A block of at least `size` bytes (size > 0), aligned to FLOOR_ALIGN; 0
 * when the arena is exhausted, said on stderr with `who` (the entry point)
 * and the setting to raise. */
uintptr_t floor_arena_alloc(floor_arena_t *a, size_t size, const char *who);

/* 1: the block at addr is free again; 0: addr is not in the arena (someone
 * else's memory); -1: inside the arena but not a live block (a double free
 * or an inner pointer), said on stderr with `who`. */
int floor_arena_free(floor_arena_t *a, uintptr_t addr, const char *who);

#endif /* FLOOR_H */
