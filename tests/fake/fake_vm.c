/* fake_vm.c - the fake driver's virtual memory (see fake_cuda.c for the whole
 * fake): an address reservation is an inaccessible mapping of the process's
 * own address space; a physical allocation is a memfd, counted against its
 * device; cuMemMap maps the whole memfd (part of one is NOT_SUPPORTED, as on
 * the driver) with no access, and cuMemSetAccess makes it read-write, so a
 * missing grant faults as on a GPU; cuMemUnmap puts the inaccessible mapping
 * back. The mapped ranges are booked: a map over a range still mapped, and
 * an unmap of part of a mapping or of nothing, are INVALID_VALUE. Data
 * written through one mapping of an allocation is read back through any
 * other.
 */
#define _GNU_SOURCE
#include "fake_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static unsigned long maps, unmaps, creates, releases, set_access;

API void fake_cuda_counters(unsigned long out[5])
{
    out[0] = maps, out[1] = unmaps, out[2] = creates, out[3] = releases, out[4] = set_access;
}

API CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option)
{
    CALLED();
    (void)prop, (void)option;
    *g = PAGE;
    return OK;
}
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f)
{
    CALLED();
    (void)align, (void)addr, (void)f;
    void *m = mmap(NULL, size + PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return OUT_OF_MEMORY;
    *p = ((CUdeviceptr)(uintptr_t)m + PAGE - 1) & ~(CUdeviceptr)(PAGE - 1);
    return OK;
}
/* The ranges cuMemMap mapped and cuMemUnmap has not unmapped yet: a map
 * over a range still mapped is refused, as the driver refuses it (cuheap
 * keeps the mappings of pages that moved, and must unmap one before it maps
 * anything there), and an unmap takes whole mappings. */
static struct mapped_range_s {
    CUdeviceptr va;
    size_t size;
} *mapped_ranges;
static size_t num_mapped_ranges, cap_mapped_ranges;

/* Books [p, p + size) as mapped; 0 if any of it already is (lock held). */
static int mapped_add_locked(CUdeviceptr p, size_t size)
{
    for (size_t i = 0; i < num_mapped_ranges; i++)
        if (p < mapped_ranges[i].va + mapped_ranges[i].size && mapped_ranges[i].va < p + size)
            return 0;
    if (num_mapped_ranges == cap_mapped_ranges) {
        size_t cap = cap_mapped_ranges ? 2 * cap_mapped_ranges : 256;
        struct mapped_range_s *grown = realloc(mapped_ranges, cap * sizeof *grown);
        if (!grown)
            return 0;
        mapped_ranges = grown;
        cap_mapped_ranges = cap;
    }
    mapped_ranges[num_mapped_ranges++] = (struct mapped_range_s){p, size};
    return 1;
}

/* Forgets the mappings inside [p, p + size); 0 (nothing forgotten) if one
 * lies partly outside it or none lies inside (lock held). */
static int mapped_remove_locked(CUdeviceptr p, size_t size)
{
    size_t inside = 0;
    for (size_t i = 0; i < num_mapped_ranges; i++) {
        const struct mapped_range_s *m = &mapped_ranges[i];
        if (m->va < p + size && p < m->va + m->size) {
            if (m->va < p || m->va + m->size > p + size)
                return 0;
            inside++;
        }
    }
    if (!inside)
        return 0;
    size_t kept = 0;
    for (size_t i = 0; i < num_mapped_ranges; i++)
        if (!(mapped_ranges[i].va >= p && mapped_ranges[i].va + mapped_ranges[i].size <= p + size))
            mapped_ranges[kept++] = mapped_ranges[i];
    num_mapped_ranges = kept;
    return 1;
}

API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
    CALLED();
    /* Mappings left in the range go with it (the process's address space is
     * the fake's device). */
    pthread_mutex_lock(&fake_lock);
    size_t kept = 0;
    for (size_t i = 0; i < num_mapped_ranges; i++)
        if (!(mapped_ranges[i].va >= p && mapped_ranges[i].va < p + size))
            mapped_ranges[kept++] = mapped_ranges[i];
    num_mapped_ranges = kept;
    pthread_mutex_unlock(&fake_lock);
    munmap((void *)(uintptr_t)p, size);
    return OK;
}
/* A handle is the memfd + 1; its size is the file's. */
API CUresult cuMemCreate(unsigned long long *handle, size_t size, const void *prop, unsigned long long f)
{
    CALLED();
    (void)f;
    if (size % PAGE || !prop)
        return INVALID_VALUE;
    /* CUmemAllocationProp: {type, requestedHandleTypes, location {type, id}, ...};
     * the memory counts against the device the location names. */
    int device = ((const int *)prop)[3];
    if (device < 0 || device >= fake_num_devices)
        return INVALID_DEVICE;
    if (!fake_take(device, size))
        return OUT_OF_MEMORY;
    int fd = memfd_create("fake-cuda-page", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        fake_give(device, size);
        return OUT_OF_MEMORY;
    }
    /* The low half is the file (plus one, so no handle is 0), the high half
     * the device its bytes count against. */
    *handle = (unsigned long long)device << 32 | ((unsigned long long)fd + 1);
    __atomic_fetch_add(&creates, 1, __ATOMIC_RELAXED);
    return OK;
}
API CUresult cuMemRelease(unsigned long long handle)
{
    CALLED();
    int fd = (int)(handle & 0xffffffffu) - 1;
    off_t size = lseek(fd, 0, SEEK_END);
    close(fd);
    fake_give((int)(handle >> 32), (size_t)size);
    __atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
    return OK;
}
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, unsigned long long handle, unsigned long long f)
{
    CALLED();
    (void)f;
    /* As the driver (580.159, bench/gpu/vm_offset_probe.cu): a mapping takes
     * a whole allocation, never part of one at any offset. */
    const off_t whole = lseek((int)(handle & 0xffffffffu) - 1, 0, SEEK_END);
    if (whole < 0)
        return INVALID_VALUE;
    if (offset != 0 || size != (size_t)whole)
        return NOT_SUPPORTED;
    pthread_mutex_lock(&fake_lock);
    const int free_range = mapped_add_locked(p, size);
    pthread_mutex_unlock(&fake_lock);
    if (!free_range)
        return INVALID_VALUE;   /* already mapped */
    void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, (int)(handle & 0xffffffffu) - 1,
                   (off_t)offset);
    if (m == MAP_FAILED) {
        pthread_mutex_lock(&fake_lock);
        (void)mapped_remove_locked(p, size);
        pthread_mutex_unlock(&fake_lock);
        return INVALID_VALUE;
    }
    __atomic_fetch_add(&maps, 1, __ATOMIC_RELAXED);
    return OK;
}
API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count)
{
    CALLED();
    /* CUmemAccessDesc: {location {type, id}, flags}, three ints. */
    const int (*d)[3] = desc;
    pthread_mutex_lock(&fake_lock);
    for (size_t i = 0; d && i < count; i++)
        if (d[i][1] >= 0 && d[i][1] < 4)
            fake_calls.access_grants[d[i][1]]++;
    pthread_mutex_unlock(&fake_lock);
    __atomic_fetch_add(&set_access, 1, __ATOMIC_RELAXED);
    return mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) == 0 ? OK : INVALID_VALUE;
}
API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    CALLED();
    pthread_mutex_lock(&fake_lock);
    const int whole = mapped_remove_locked(p, size);
    pthread_mutex_unlock(&fake_lock);
    if (!whole)
        return INVALID_VALUE;   /* nothing mapped there, or part of a mapping */
    void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    __atomic_fetch_add(&unmaps, 1, __ATOMIC_RELAXED);
    return m == MAP_FAILED ? INVALID_VALUE : OK;
}
