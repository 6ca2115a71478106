/* ptrmap.h - the two ways the heap finds its metadata from a device address.
 *
 * cuh_ptrmap_t  an open-addressing hash map from a block's start address to
 *               its record: the large blocks handed out. Linear probing with
 *               backward-shift deletion (no tombstones), grown at half load.
 *               Not thread-safe: the heap's lock guards it.
 * cuh_pagemap_t a radix tree from 64 KiB pages of device address space to the
 *               slab that covers them. Readers need no lock (entries are
 *               published with release stores), so the free path of a small
 *               object can find its slab without contention; writers hold
 *               the heap's lock. Interior nodes are never freed before the
 *               map is destroyed.
 */
#ifndef CUH_PTRMAP_H
#define CUH_PTRMAP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cuh_ptrmap_entry_s {
    uintptr_t key;    /* 0 = empty */
    void *value;
} cuh_ptrmap_entry_t;

typedef struct cuh_ptrmap_s {
    cuh_ptrmap_entry_t *slots;
    size_t mask;      /* capacity - 1; capacity is a power of two */
    size_t count;
} cuh_ptrmap_t;

int cuh_ptrmap_init(cuh_ptrmap_t *map, size_t capacity);
void cuh_ptrmap_destroy(cuh_ptrmap_t *map);
/* 0 on success, -1 if the table could not grow. key must not be 0 or present. */
int cuh_ptrmap_insert(cuh_ptrmap_t *map, uintptr_t key, void *value);
/* Maps key to value whether or not it was present, with one walk of its
 * run: 0 with the value it replaced (NULL if none) in *old, -1 if the table
 * could not grow (nothing changed). key must not be 0. */
int cuh_ptrmap_put(cuh_ptrmap_t *map, uintptr_t key, void *value, void **old);
void *cuh_ptrmap_get(const cuh_ptrmap_t *map, uintptr_t key);
/* Removes key; returns its value or NULL if absent. */
void *cuh_ptrmap_remove(cuh_ptrmap_t *map, uintptr_t key);

#define CUH_PAGEMAP_SHIFT 16   /* 64 KiB pages */
#define CUH_PAGEMAP_LEVEL_BITS 12
#define CUH_PAGEMAP_LEVEL_SIZE ((size_t)1 << CUH_PAGEMAP_LEVEL_BITS)
#define CUH_PAGEMAP_LEVELS 4   /* 4 x 12 bits + 16-bit page = 64-bit addresses */

typedef struct cuh_pagemap_node_s {
    _Atomic(void *) slot[CUH_PAGEMAP_LEVEL_SIZE];
} cuh_pagemap_node_t;

typedef struct cuh_pagemap_s {
    cuh_pagemap_node_t *root;
} cuh_pagemap_t;

static inline size_t cuh_pagemap_level_index(uintptr_t page, int level)
{
    return (size_t)(page >> ((CUH_PAGEMAP_LEVELS - 1 - level) * CUH_PAGEMAP_LEVEL_BITS)) &
           (CUH_PAGEMAP_LEVEL_SIZE - 1);
}

/* 0, or -1 if the root node could not be allocated. */
int cuh_pagemap_init(cuh_pagemap_t *map);
void cuh_pagemap_destroy(cuh_pagemap_t *map);
/* Maps every 64 KiB page of [addr, addr+len) to value (NULL unmaps).
 * addr and len are multiples of 64 KiB. Returns -1 if a node could not be
 * allocated (then nothing is guaranteed mapped). Caller holds the heap lock. */
int cuh_pagemap_set(cuh_pagemap_t *map, uintptr_t addr, size_t len, void *value);
/* Lock-free lookup (inline: every small free does one). */
static inline void *cuh_pagemap_get(const cuh_pagemap_t *map, uintptr_t addr)
{
    uintptr_t page = addr >> CUH_PAGEMAP_SHIFT;
    cuh_pagemap_node_t *n = map->root;
    for (int level = 0; n && level < CUH_PAGEMAP_LEVELS - 1; level++)
        n = atomic_load_explicit(&n->slot[cuh_pagemap_level_index(page, level)], memory_order_acquire);
    return n ? atomic_load_explicit(&n->slot[cuh_pagemap_level_index(page, CUH_PAGEMAP_LEVELS - 1)],
                                    memory_order_acquire)
             : NULL;
}

#endif /* CUH_PTRMAP_H */
