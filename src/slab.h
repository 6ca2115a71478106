/* slab.h - slabs: extents of the arena cut into equal objects of one size
 * class, for small requests.
 *
 * A slab records, per object, four bits, the requested size and a label (the
 * allocator's, cuh_heap_malloc_labelled; 0 for none):
 *   live   handed out to the program (cleared at free: a second free finds it
 *          clear and is reported as a double free);
 *   avail  back in the slab, free for any stream. An object that is neither
 *          live nor avail sits in a stream's private cache (see heap_small.c);
 *   tcached  owned by a thread cache (tcache.h), handed out or held there;
 *          live stays set: the heap counts the object as allocated;
 *   held   freed by cudaFree and waiting in a batch for its fence
 *          (heap_devicewide.c); live stays set until the batch finishes, and
 *          a second free finds this bit (a double free). A bit rather than
 *          the heap's held map: with PyTorch's cache off every small tensor
 *          comes here, and the map's insert and remove were a tenth of what
 *          such a tensor cost the CPU (issue 45).
 * A slab whose objects are all avail goes back to the arena, so small objects
 * never pin memory that large requests could use. Slabs are 64 KiB-aligned and
 * found from an address through the heap's page map.
 */
#ifndef CUH_SLAB_H
#define CUH_SLAB_H

#include "arena.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cuh_slab_s {
    cuh_extent_t *extent;
    uintptr_t base;
    size_t obj_size;
    uintptr_t span;                   /* num_objs * obj_size, below 4 GiB */
    uint64_t div_magic;               /* 2^64 / obj_size rounded up: divides without a division */
    uint32_t size_class;
    uint32_t num_objs;
    uint32_t num_avail;
    uint32_t num_live;
    struct cuh_slab_s *prev, *next;   /* in its class's list of slabs with avail objects */
    int listed;
    uint32_t *requested;
    uint8_t *labels;
    uint64_t *avail;
    uint64_t *live;
    uint64_t *tcached;
    uint64_t *held;
} cuh_slab_t;

/* A slab over `ext` (already taken from the arena) with every object avail.
 * obj_size is at least 2 (classes start at 512) and the slab below 4 GiB. */
cuh_slab_t *cuh_slab_create(cuh_extent_t *ext, uint32_t size_class, size_t obj_size);
void cuh_slab_destroy(cuh_slab_t *slab);
/* Index of an avail object, made not avail; -1 if none. */
int64_t cuh_slab_take(cuh_slab_t *slab);
void cuh_slab_give_back(cuh_slab_t *slab, uint32_t index);
/* Object index of addr, or -1 if addr is not the start of an object. On the
 * free path of every small object, so it multiplies instead of dividing: for
 * offsets and sizes below 2^32, off is a multiple of obj_size exactly when
 * off * magic (mod 2^64) < magic, and the quotient is the high 64 bits of
 * off * magic (Lemire, Kaser and Kurz, "Faster remainder by direct
 * computation", 2019). */
static inline int64_t cuh_slab_index(const cuh_slab_t *slab, uintptr_t addr)
{
    uintptr_t off = addr - slab->base;   /* below base: wraps past span */
    if (off >= slab->span || (uint64_t)off * slab->div_magic >= slab->div_magic)
        return -1;
    return (int64_t)(((unsigned __int128)off * slab->div_magic) >> 64);
}

static inline int cuh_slab_bit(const uint64_t *bits, uint32_t i) { return (int)((bits[i >> 6] >> (i & 63)) & 1); }
static inline void cuh_slab_set(uint64_t *bits, uint32_t i) { bits[i >> 6] |= (uint64_t)1 << (i & 63); }
static inline void cuh_slab_clear(uint64_t *bits, uint32_t i) { bits[i >> 6] &= ~((uint64_t)1 << (i & 63)); }

#endif /* CUH_SLAB_H */
