/* ptrmap.c - hash map of block addresses and radix page map of slabs (see
 * ptrmap.h for why each exists).
 */
#include "ptrmap.h"

#include <stdatomic.h>
#include <stdlib.h>

/* ---- hash map -------------------------------------------------------- */

static size_t slot_of(const cuh_ptrmap_t *m, uintptr_t key)
{
    /* Blocks are 512-aligned: drop the zero bits, then Fibonacci hashing. */
    uint64_t h = (uint64_t)(key >> 9) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & m->mask;
}

int cuh_ptrmap_init(cuh_ptrmap_t *m, size_t capacity)
{
    size_t cap = 16;
    while (cap < capacity)
        cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots)
        return -1;
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

void cuh_ptrmap_destroy(cuh_ptrmap_t *m)
{
    free(m->slots);
    m->slots = NULL;
    m->count = 0;
}

static void place(cuh_ptrmap_t *m, uintptr_t key, void *value)
{
    size_t i = slot_of(m, key);
    while (m->slots[i].key)
        i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].value = value;
}

static int grow(cuh_ptrmap_t *m)
{
    cuh_ptrmap_t bigger;
    if (cuh_ptrmap_init(&bigger, (m->mask + 1) * 2))
        return -1;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key)
            place(&bigger, m->slots[i].key, m->slots[i].value);
    bigger.count = m->count;
    free(m->slots);
    *m = bigger;
    return 0;
}

int cuh_ptrmap_insert(cuh_ptrmap_t *m, uintptr_t key, void *value)
{
    if ((m->count + 1) * 2 > m->mask + 1 && grow(m))
        return -1;
    place(m, key, value);
    m->count++;
    return 0;
}

int cuh_ptrmap_put(cuh_ptrmap_t *m, uintptr_t key, void *value, void **old)
{
    size_t i = slot_of(m, key);
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    if (m->slots[i].key) {
        *old = m->slots[i].value;
        m->slots[i].value = value;
        return 0;
    }
    *old = NULL;
    if ((m->count + 1) * 2 > m->mask + 1) {
        if (grow(m))
            return -1;
        place(m, key, value);
    } else {
        m->slots[i].key = key;   /* the end of its run: where place() would put it */
        m->slots[i].value = value;
    }
    m->count++;
    return 0;
}

void *cuh_ptrmap_get(const cuh_ptrmap_t *m, uintptr_t key)
{
    size_t i = slot_of(m, key);
    while (m->slots[i].key) {
        if (m->slots[i].key == key)
            return m->slots[i].value;
        i = (i + 1) & m->mask;
    }
    return NULL;
}

void *cuh_ptrmap_remove(cuh_ptrmap_t *m, uintptr_t key)
{
    size_t i = slot_of(m, key);
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    if (!m->slots[i].key)
        return NULL;
    void *value = m->slots[i].value;
    /* Backward-shift: pull later members of the probe run into the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        size_t home = slot_of(m, m->slots[j].key);
        /* Move j into the hole unless its home lies cyclically in (hole, j]. */
        int home_in_between = (hole <= j) ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!home_in_between) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = 0;
    m->slots[hole].value = NULL;
    m->count--;
    return value;
}

/* ---- page map -------------------------------------------------------- */

#define LEVEL_SIZE CUH_PAGEMAP_LEVEL_SIZE
#define LEVELS CUH_PAGEMAP_LEVELS
typedef cuh_pagemap_node_t pagemap_node_t;
#define level_index cuh_pagemap_level_index

int cuh_pagemap_init(cuh_pagemap_t *m)
{
    m->root = calloc(1, sizeof(pagemap_node_t));
    return m->root ? 0 : -1;
}

static void destroy_node(pagemap_node_t *n, int level)
{
    if (!n)
        return;
    if (level < LEVELS - 1)
        for (size_t i = 0; i < LEVEL_SIZE; i++)
            destroy_node(atomic_load_explicit(&n->slot[i], memory_order_relaxed), level + 1);
    free(n);
}

void cuh_pagemap_destroy(cuh_pagemap_t *m)
{
    destroy_node(m->root, 0);
    m->root = NULL;
}

int cuh_pagemap_set(cuh_pagemap_t *m, uintptr_t addr, size_t len, void *value)
{
    uintptr_t first = addr >> CUH_PAGEMAP_SHIFT, pages = len >> CUH_PAGEMAP_SHIFT;
    for (uintptr_t page = first; page - first < pages; page++) {   /* no overflow at the top page */
        pagemap_node_t *n = m->root;
        for (int level = 0; level < LEVELS - 1; level++) {
            _Atomic(void *) *slot = &n->slot[level_index(page, level)];
            pagemap_node_t *child = atomic_load_explicit(slot, memory_order_relaxed);
            if (!child) {
                if (!value)
                    break;   /* unmapping a page that was never mapped */
                child = calloc(1, sizeof(pagemap_node_t));
                if (!child)
                    return -1;
                atomic_store_explicit(slot, child, memory_order_release);
            }
            n = child;
            if (level == LEVELS - 2)
                atomic_store_explicit(&n->slot[level_index(page, LEVELS - 1)], value, memory_order_release);
        }
    }
    return 0;
}

