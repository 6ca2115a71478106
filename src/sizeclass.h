/* sizeclass.h - the size classes of small requests, computed, not listed.
 *
 * Classes are multiples of 512 bytes (every block is 512-aligned): eight
 * classes of 512-byte steps up to 4 KiB, then four classes per doubling
 * (5, 6, 7, 8 KiB; 10, 12, 14, 16 KiB; ...). A request wastes at most 25% of
 * its block above 4 KiB and less than 512 bytes below; small requests are a
 * few percent of a training job's bytes, so that waste stays small in total.
 * Classes stop at the configured small_max (at most 1 MiB: 40 classes).
 *
 * Each class is served from slabs: pieces of a segment holding several
 * objects of the class, 64 KiB-aligned so that an address finds its slab
 * through a page map of 64 KiB pages.
 */
#ifndef CUH_SIZECLASS_H
#define CUH_SIZECLASS_H

#include <stddef.h>

#define CUH_SMALL_MAX_LIMIT ((size_t)1 << 20)
#define CUH_MAX_CLASSES 40
#define CUH_SLAB_PAGE ((size_t)64 << 10)

/* Index of the class serving `size` (0 < size <= CUH_SMALL_MAX_LIMIT). */
unsigned cuh_sizeclass_index(size_t size);
/* Block size of class `index`. */
size_t cuh_sizeclass_size(unsigned index);
/* Number of classes needed to serve every size up to small_max. */
unsigned cuh_sizeclass_count(size_t small_max);
/* Bytes of one slab of class `index`: a multiple of CUH_SLAB_PAGE holding at
 * least 16 objects. */
size_t cuh_sizeclass_slab_bytes(unsigned index);

#endif /* CUH_SIZECLASS_H */
