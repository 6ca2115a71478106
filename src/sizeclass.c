/* sizeclass.c - size-class arithmetic (see sizeclass.h for the scheme).
 *
 * Below 4 KiB: class k holds sizes in (512k, 512(k+1)]. Above: for a size
 * s-1 in [2^n, 2^(n+1)), n >= 12, the class is the quarter of that doubling
 * that s falls in. Both directions are a few shifts, no table.
 */
#include "sizeclass.h"

#include "common.h"

static unsigned log2_floor(size_t x) { return (unsigned)(63 - __builtin_clzll((unsigned long long)x)); }

unsigned cuh_sizeclass_index(size_t size)
{
    if (size <= 4096)
        return (unsigned)((size - 1) >> 9);
    size_t s = size - 1;
    unsigned n = log2_floor(s);
    unsigned quarter = (unsigned)((s - ((size_t)1 << n)) >> (n - 2));
    return 8 + (n - 12) * 4 + quarter;
}

size_t cuh_sizeclass_size(unsigned index)
{
    if (index < 8)
        return (size_t)(index + 1) << 9;
    unsigned n = 12 + (index - 8) / 4;
    unsigned quarter = (index - 8) % 4;
    return ((size_t)1 << n) + (size_t)(quarter + 1) * ((size_t)1 << (n - 2));
}

unsigned cuh_sizeclass_count(size_t small_max)
{
    if (small_max == 0)
        return 0;
    return cuh_sizeclass_index(small_max) + 1;
}

size_t cuh_sizeclass_slab_bytes(unsigned index)
{
    size_t bytes = cuh_align_up(16 * cuh_sizeclass_size(index), CUH_SLAB_PAGE);
    return bytes;
}
