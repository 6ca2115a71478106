/* fake_cuda.c - a stand-in libcuda.so.1 for tests on machines without a GPU.
 *
 * It implements the driver functions cuheap's device_cuda.c loads, with host
 * memory standing in for device memory, so the real driver path runs in CI:
 *   cuMemAlloc      aligned host memory, counted against FAKE_CUDA_CAPACITY
 *                   (bytes, default 256 MiB);
 *   events          complete at once;
 *   virtual memory  an address reservation is an inaccessible mapping; a
 *                   physical allocation is a memfd; cuMemMap maps the memfd
 *                   there with no access, and cuMemSetAccess makes it
 *                   read-write (so a missing SetAccess faults, as on a GPU);
 *                   cuMemUnmap puts the inaccessible mapping back. Data
 *                   written through one mapping of a page is read back
 *                   through any other.
 * Counters for tests: fake_cuda_counters().
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101 };

#define API __attribute__((visibility("default")))
#define PAGE ((size_t)2 << 20)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t capacity, used;
static int initialized;
static char primary_context;   /* its address is the context handle */
static _Thread_local void *current;
static unsigned long maps, unmaps, creates, releases, set_access;

API void fake_cuda_counters(unsigned long out[5]);
API void fake_cuda_counters(unsigned long out[5])
{
    out[0] = maps, out[1] = unmaps, out[2] = creates, out[3] = releases, out[4] = set_access;
}

API CUresult cuGetErrorName(CUresult e, const char **s)
{
    *s = e == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : e == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_FAKE";
    return OK;
}
API CUresult cuGetErrorString(CUresult e, const char **s)
{
    *s = e == OUT_OF_MEMORY ? "out of memory" : "error in the fake driver";
    return OK;
}
API CUresult cuInit(unsigned flags)
{
    (void)flags;
    const char *c = getenv("FAKE_CUDA_CAPACITY");
    capacity = c ? strtoull(c, NULL, 0) : (size_t)256 << 20;
    initialized = 1;
    return OK;
}
API CUresult cuDeviceGetCount(int *n)
{
    *n = 1;
    return initialized ? OK : NOT_INITIALIZED;
}
API CUresult cuDeviceGet(int *dev, int ordinal)
{
    if (ordinal != 0)
        return INVALID_DEVICE;
    *dev = 0;
    return OK;
}
API CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    (void)dev;
    *ctx = &primary_context;
    return OK;
}
API CUresult cuDevicePrimaryCtxRelease_v2(int dev)
{
    (void)dev;
    return OK;
}
API CUresult cuCtxGetCurrent(void **ctx)
{
    *ctx = current;
    return OK;
}
API CUresult cuCtxGetDevice(int *dev)
{
    *dev = 0;
    return current ? OK : INVALID_VALUE;
}
API CUresult cuCtxPushCurrent_v2(void *ctx)
{
    current = ctx;
    return OK;
}
API CUresult cuCtxPopCurrent_v2(void **ctx)
{
    if (ctx)
        *ctx = current;
    current = NULL;
    return OK;
}
API CUresult cuCtxSynchronize(void) { return OK; }
API CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    (void)mode;
    return OK;
}

static int take(size_t size)
{
    pthread_mutex_lock(&lock);
    int ok = used + size <= capacity;
    if (ok)
        used += size;
    pthread_mutex_unlock(&lock);
    return ok;
}
static void give(size_t size)
{
    pthread_mutex_lock(&lock);
    used -= size;
    pthread_mutex_unlock(&lock);
}

/* cuMemAlloc blocks remember their size just before the block. */
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    if (!take(size))
        return OUT_OF_MEMORY;
    char *m = aligned_alloc(4096, 4096 + ((size + 4095) & ~(size_t)4095));
    if (!m) {
        give(size);
        return OUT_OF_MEMORY;
    }
    memcpy(m + 4096 - sizeof size, &size, sizeof size);
    *p = (CUdeviceptr)(uintptr_t)(m + 4096);
    return OK;
}
API CUresult cuMemFree_v2(CUdeviceptr p)
{
    char *m = (char *)(uintptr_t)p - 4096;
    size_t size;
    memcpy(&size, m + 4096 - sizeof size, sizeof size);
    give(size);
    free(m);
    return OK;
}
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    pthread_mutex_lock(&lock);
    *free_bytes = capacity - used;
    *total = capacity;
    pthread_mutex_unlock(&lock);
    return OK;
}

API CUresult cuEventCreate(void **e, unsigned flags)
{
    (void)flags;
    *e = malloc(1);
    return *e ? OK : OUT_OF_MEMORY;
}
API CUresult cuEventDestroy_v2(void *e)
{
    free(e);
    return OK;
}
API CUresult cuEventRecord(void *e, void *stream)
{
    (void)e, (void)stream;
    return OK;
}
API CUresult cuEventQuery(void *e)
{
    (void)e;
    return OK;
}
API CUresult cuEventSynchronize(void *e)
{
    (void)e;
    return OK;
}

/* ---- virtual memory --------------------------------------------------------- */

API CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option)
{
    (void)prop, (void)option;
    *g = PAGE;
    return OK;
}
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f)
{
    (void)align, (void)addr, (void)f;
    void *m = mmap(NULL, size + PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return OUT_OF_MEMORY;
    *p = ((CUdeviceptr)(uintptr_t)m + PAGE - 1) & ~(CUdeviceptr)(PAGE - 1);
    return OK;
}
API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
    munmap((void *)(uintptr_t)p, size);
    return OK;
}
/* A handle is the memfd + 1; its size is the file's. */
API CUresult cuMemCreate(unsigned long long *handle, size_t size, const void *prop, unsigned long long f)
{
    (void)prop, (void)f;
    if (size % PAGE)
        return INVALID_VALUE;
    if (!take(size))
        return OUT_OF_MEMORY;
    int fd = memfd_create("fake-cuda-page", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        give(size);
        return OUT_OF_MEMORY;
    }
    *handle = (unsigned long long)fd + 1;
    __atomic_fetch_add(&creates, 1, __ATOMIC_RELAXED);
    return OK;
}
API CUresult cuMemRelease(unsigned long long handle)
{
    int fd = (int)handle - 1;
    off_t size = lseek(fd, 0, SEEK_END);
    close(fd);
    give((size_t)size);
    __atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
    return OK;
}
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, unsigned long long handle, unsigned long long f)
{
    (void)f;
    void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, (int)handle - 1, (off_t)offset);
    if (m == MAP_FAILED)
        return INVALID_VALUE;
    __atomic_fetch_add(&maps, 1, __ATOMIC_RELAXED);
    return OK;
}
API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count)
{
    (void)desc, (void)count;
    __atomic_fetch_add(&set_access, 1, __ATOMIC_RELAXED);
    return mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) == 0 ? OK : INVALID_VALUE;
}
API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    void *m = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    __atomic_fetch_add(&unmaps, 1, __ATOMIC_RELAXED);
    return m == MAP_FAILED ? INVALID_VALUE : OK;
}
