/* slab.c - slab records: bitmaps of live and avail objects (see slab.h).
 *
 * The bitmaps, the requested sizes and the labels share one host allocation
 * per slab.
 * Taking an object scans the avail bitmap a word at a time from a hint, so a
 * slab of 2048 objects is found free in a few instructions.
 */
#include "slab.h"

#include <stdlib.h>
#include <string.h>

cuh_slab_t *cuh_slab_create(cuh_extent_t *ext, uint32_t size_class, size_t obj_size)
{
    uint32_t n = (uint32_t)(ext->size / obj_size);
    size_t words = (n + 63) / 64;
    cuh_slab_t *s = calloc(1, sizeof *s + 4 * words * sizeof(uint64_t) + n * sizeof(uint32_t) + n);
    if (!s)
        return NULL;
    s->avail = (uint64_t *)(void *)(s + 1);
    s->live = s->avail + words;
    s->tcached = s->live + words;
    s->held = s->tcached + words;
    s->requested = (uint32_t *)(void *)(s->held + words);
    s->labels = (uint8_t *)(s->requested + n);
    s->extent = ext;
    s->base = ext->addr;
    s->obj_size = obj_size;
    s->span = (uintptr_t)n * obj_size;
    s->div_magic = UINT64_MAX / obj_size + 1;
    s->size_class = size_class;
    s->num_objs = n;
    s->num_avail = n;
    for (uint32_t i = 0; i < n; i++)
        cuh_slab_set(s->avail, i);
    return s;
}

void cuh_slab_destroy(cuh_slab_t *slab) { free(slab); }

int64_t cuh_slab_take(cuh_slab_t *s)
{
    if (!s->num_avail)
        return -1;
    size_t words = (s->num_objs + 63) / 64;
    for (size_t w = 0; w < words; w++) {
        if (s->avail[w]) {
            uint32_t i = (uint32_t)(w * 64 + (size_t)__builtin_ctzll(s->avail[w]));
            cuh_slab_clear(s->avail, i);
            s->num_avail--;
            return i;
        }
    }
    return -1;
}

void cuh_slab_give_back(cuh_slab_t *s, uint32_t index)
{
    cuh_slab_set(s->avail, index);
    s->num_avail++;
}
