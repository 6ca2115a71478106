/* device_cuda.c - the device interface (device.h) on a real GPU, through the
 * CUDA driver API.
 *
 * cuheap must not depend on CUDA at link time (the same libcuheap.so runs on a
 * machine without a GPU, against the simulated device), so no CUDA header is
 * included and no CUDA library is linked: the driver, libcuda.so.1, is opened
 * with dlopen once per process and the dozen functions cuheap needs are looked
 * up by their versioned names (cuMemAlloc_v2 ...) into one static table. The
 * few driver types and constants used are declared below with the values of
 * cuda.h. Each device is used through its primary context - the one the CUDA
 * runtime uses - and every operation makes that context current for the length
 * of the call and restores the caller's context afterwards.
 */
#include "device.h"
#include "common.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the driver's types and constants (values as in cuda.h) ------------- */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
/* The virtual-memory structures, laid out as in cuda.h (CUDA 10.2 and later). */
typedef struct {
    int type;   /* CUmemLocationType */
    int id;
} cuh_CUmemLocation;
typedef struct {
    int type;                   /* CUmemAllocationType */
    int requestedHandleTypes;   /* CUmemAllocationHandleType */
    cuh_CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} cuh_CUmemAllocationProp;
typedef struct {
    cuh_CUmemLocation location;
    int flags;   /* CUmemAccess_flags */
} cuh_CUmemAccessDesc;
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CU_EVENT_DISABLE_TIMING 0x2u
#define CU_STREAM_CAPTURE_MODE_RELAXED 2   /* CUstreamCaptureMode */
#define CU_STREAM_PER_THREAD ((uintptr_t)0x2)

#define CUH_CUDA_LIBRARY "libcuda.so.1"
/* Devices whose CUdevice handle is remembered for cuh_cuda_current_device. */
#define CUH_CUDA_MAX_DEVICES 64

typedef void *(*cuh_dlsym_fn)(void *handle, const char *name);
/* dlsym gives functions as void *; they are copied into function pointers of
 * the same size (POSIX guarantees the representation). */
_Static_assert(sizeof(void *) == sizeof(cuh_dlsym_fn), "function pointers differ from void *");

/* ---- the driver, loaded once ------------------------------------------- */

static struct {
    /* What every cudaMalloc and cudaFree under LD_PRELOAD reads, in one cache
     * line with the first devices' primary contexts: a Python program's
     * interpreter empties the CPU's caches between two tensors, and each
     * line touched is then a miss (issue 45; scripts/cold_misses.sh). */
    _Alignas(64) int ready;       /* 1: loaded, every symbol found, cuInit done */
    int device_count;
    CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
    CUresult (*cuEventQuery)(CUevent event);
    CUresult (*cuCtxRecordEvent)(CUcontext ctx, CUevent event);   /* device-wide fences (optional: CUDA 12.5 on) */
    /* Each device's primary context once known (cuh_cuda_current_context). */
    CUcontext _Atomic primary[CUH_CUDA_MAX_DEVICES];
    pthread_once_t once;
    pthread_once_t lib_once;      /* dlopen only (pass-through needs no cuInit) */
    pthread_once_t dlsym_once;    /* glibc's dlsym found */
    char error[384];              /* why not, when ready is 0 */
    void *lib;                    /* dlopen handle of libcuda.so.1 */
    cuh_dlsym_fn real_dlsym;      /* see cuda_sym() */
    CUdevice devices[CUH_CUDA_MAX_DEVICES];   /* CUdevice of each ordinal */
    pthread_mutex_t primary_lock;
    void *runtime_lib;            /* a loaded libcudart found by name, if needed */

    CUresult (*cuInit)(unsigned int flags);
    CUresult (*cuGetErrorName)(CUresult error, const char **str);
    CUresult (*cuGetErrorString)(CUresult error, const char **str);
    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGet)(CUdevice *device, int ordinal);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice device);
    CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice device);
    CUresult (*cuDevicePrimaryCtxGetState)(CUdevice device, unsigned int *flags, int *active);
    CUresult (*cuCtxGetDevice)(CUdevice *device);
    CUresult (*cuCtxPushCurrent_v2)(CUcontext ctx);
    CUresult (*cuCtxPopCurrent_v2)(CUcontext *ctx);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *dptr, size_t bytes);
    CUresult (*cuMemFree_v2)(CUdeviceptr dptr);
    CUresult (*cuMemGetInfo_v2)(size_t *free_bytes, size_t *total_bytes);
    CUresult (*cuEventCreate)(CUevent *event, unsigned int flags);
    CUresult (*cuEventDestroy_v2)(CUevent event);
    CUresult (*cuEventRecord)(CUevent event, CUstream stream);
    CUresult (*cuEventSynchronize)(CUevent event);
    CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags);
    CUresult (*cuThreadExchangeStreamCaptureMode)(int *mode);
    /* Virtual memory (optional: NULL when the driver lacks them). */
    CUresult (*cuMemGetAllocationGranularity)(size_t *gran, const cuh_CUmemAllocationProp *prop, int option);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags);
    CUresult (*cuMemAddressFree)(CUdeviceptr ptr, size_t size);
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *handle, size_t size, const cuh_CUmemAllocationProp *prop,
                            unsigned long long flags);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle handle);
    CUresult (*cuMemMap)(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags);
    CUresult (*cuMemUnmap)(CUdeviceptr ptr, size_t size);
    CUresult (*cuMemSetAccess)(CUdeviceptr ptr, size_t size, const cuh_CUmemAccessDesc *desc, size_t count);
    CUresult (*cuStreamIsCapturing)(CUstream stream, int *status);
    /* Device-wide fences (optional: CUDA 12.5 and later; cuCtxRecordEvent is above). */
    CUresult (*cuCtxWaitEvent)(CUcontext ctx, CUevent event);
    /* Page-locked host memory (optional). */
    CUresult (*cuMemHostAlloc)(void **pp, size_t bytes, unsigned int flags);
    CUresult (*cuMemFreeHost)(void *p);
} g_cu = { .once = PTHREAD_ONCE_INIT, .lib_once = PTHREAD_ONCE_INIT, .dlsym_once = PTHREAD_ONCE_INIT, .primary_lock = PTHREAD_MUTEX_INITIALIZER };

/* Our own copy of dlsym. A later feature of cuheap defines a `dlsym` of its
 * own to intercept programs (under LD_PRELOAD); a plain call to dlsym from
 * this file would then bind to that interceptor and recurse into it. So the
 * real one is fetched once, by version, with dlvsym(RTLD_NEXT, "dlsym", ...):
 * RTLD_NEXT skips this object (and anything preloaded before it), and the
 * version names glibc's definition (GLIBC_2.34 where dlsym moved into libc,
 * the older GLIBC_2.2.5 on x86-64 and GLIBC_2.17 on aarch64 otherwise). When
 * none of these is found - an unusual libc - nothing is found: the plain
 * dlsym may be cuheap's own (hook_driver.c), which calls back here.
 * Every driver symbol is looked up through cuda_sym() and nowhere else. */
CUH_EARLY static void *cuda_no_dlsym(void *handle, const char *name)
{
    (void)handle, (void)name;
    return NULL;
}

CUH_EARLY static cuh_dlsym_fn cuda_find_real_dlsym(void)
{
    static const char *const versions[] = { "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17" };
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        void *sym = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (sym != NULL) {
            cuh_dlsym_fn fn;
            memcpy(&fn, &sym, sizeof fn);   /* POSIX: a function's address */
            return fn;
        }
    }
    return cuda_no_dlsym;
}

static void *cuda_sym(const char *name)
{
    return g_cu.real_dlsym(g_cu.lib, name);
}

/* "CUDA_ERROR_INVALID_DEVICE (invalid device ordinal)" into buf. Works before
 * the driver is fully resolved (then only the number is known). */
static void cuda_describe(CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (g_cu.cuGetErrorName == NULL || g_cu.cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (g_cu.cuGetErrorString == NULL || g_cu.cuGetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    if (name != NULL && text != NULL)
        snprintf(buf, len, "%s (%s)", name, text);
    else if (name != NULL)
        snprintf(buf, len, "%s", name);
    else
        snprintf(buf, len, "CUDA error %d", r);
}

/* The length snprintf reported, clamped to what was really written. */
static size_t cuda_clamp(int n, size_t room)
{
    if (n < 0 || room == 0)
        return 0;
    return (size_t)n < room ? (size_t)n : room - 1;
}

/* Writes "<what>[ on device N] failed: <CUDA error>" into buf; `what` is a
 * printf format; ordinal < 0 leaves out the device. Built piece by piece so
 * that a long message is cut at the end, never lost. */
static void cuda_vformat_error(char *buf, size_t len, CUresult r, int ordinal,
                               const char *what, va_list ap)
{
    size_t used;
    if (buf == NULL || len == 0)
        return;
    used = cuda_clamp(vsnprintf(buf, len, what, ap), len);
    if (ordinal >= 0)
        used += cuda_clamp(snprintf(buf + used, len - used, " on device %d", ordinal), len - used);
    used += cuda_clamp(snprintf(buf + used, len - used, " failed: "), len - used);
    cuda_describe(r, buf + used, len - used);
}

static void cuda_format_error(char *buf, size_t len, CUresult r, const char *what, ...)
    __attribute__((format(printf, 4, 5)));
static void cuda_format_error(char *buf, size_t len, CUresult r, const char *what, ...)
{
    va_list ap;
    va_start(ap, what);
    cuda_vformat_error(buf, len, r, -1, what, ap);
    va_end(ap);
}

/* Opens libcuda.so.1 and finds glibc's dlsym; nothing else (the hooks' pass-
 * through needs the driver's functions but must not initialize it). */
CUH_EARLY static void cuda_find_dlsym(void)
{
    g_cu.real_dlsym = cuda_find_real_dlsym();
}

static void cuda_open_lib(void)
{
    pthread_once(&g_cu.dlsym_once, cuda_find_dlsym);
    dlerror();
    g_cu.lib = dlopen(CUH_CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
}

static void cuda_load(void)
{
    const char *missing = NULL;
    CUresult r;

    pthread_once(&g_cu.lib_once, cuda_open_lib);
    if (g_cu.lib == NULL) {
        const char *why = dlerror();
        snprintf(g_cu.error, sizeof g_cu.error,
                 "cannot load the CUDA driver: dlopen(\"%s\") failed: %s "
                 "(is the NVIDIA driver installed and on the library path?)",
                 CUH_CUDA_LIBRARY, why != NULL ? why : "unknown error");
        return;
    }

#define CU_RESOLVE(field)                                              \
    do {                                                               \
        void *sym_ = cuda_sym(#field);                                 \
        if (sym_ == NULL) {                                            \
            missing = #field;                                          \
            goto fail_symbol;                                          \
        }                                                              \
        memcpy(&g_cu.field, &sym_, sizeof g_cu.field);                 \
    } while (0)

    CU_RESOLVE(cuGetErrorName);
    CU_RESOLVE(cuGetErrorString);
    CU_RESOLVE(cuInit);
    CU_RESOLVE(cuDeviceGetCount);
    CU_RESOLVE(cuDeviceGet);
    CU_RESOLVE(cuDevicePrimaryCtxRetain);
    CU_RESOLVE(cuDevicePrimaryCtxRelease_v2);
    CU_RESOLVE(cuDevicePrimaryCtxGetState);
    CU_RESOLVE(cuCtxGetCurrent);
    CU_RESOLVE(cuCtxGetDevice);
    CU_RESOLVE(cuCtxPushCurrent_v2);
    CU_RESOLVE(cuCtxPopCurrent_v2);
    CU_RESOLVE(cuCtxSynchronize);
    CU_RESOLVE(cuMemAlloc_v2);
    CU_RESOLVE(cuMemFree_v2);
    CU_RESOLVE(cuMemGetInfo_v2);
    CU_RESOLVE(cuEventCreate);
    CU_RESOLVE(cuEventDestroy_v2);
    CU_RESOLVE(cuEventRecord);
    CU_RESOLVE(cuEventQuery);
    CU_RESOLVE(cuEventSynchronize);
    CU_RESOLVE(cuStreamWaitEvent);
    CU_RESOLVE(cuThreadExchangeStreamCaptureMode);
#undef CU_RESOLVE
#define CU_OPTIONAL(field)                                             \
    do {                                                               \
        void *sym_ = cuda_sym(#field);                                 \
        memcpy(&g_cu.field, &sym_, sizeof g_cu.field);                 \
    } while (0)
    CU_OPTIONAL(cuMemGetAllocationGranularity);
    CU_OPTIONAL(cuMemAddressReserve);
    CU_OPTIONAL(cuMemAddressFree);
    CU_OPTIONAL(cuMemCreate);
    CU_OPTIONAL(cuMemRelease);
    CU_OPTIONAL(cuMemMap);
    CU_OPTIONAL(cuMemUnmap);
    CU_OPTIONAL(cuMemSetAccess);
    CU_OPTIONAL(cuStreamIsCapturing);
    CU_OPTIONAL(cuCtxRecordEvent);
    CU_OPTIONAL(cuCtxWaitEvent);
    CU_OPTIONAL(cuMemHostAlloc);
    CU_OPTIONAL(cuMemFreeHost);
#undef CU_OPTIONAL

    r = g_cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        cuda_format_error(g_cu.error, sizeof g_cu.error, r, "cuInit(0)");
        return;
    }
    r = g_cu.cuDeviceGetCount(&g_cu.device_count);
    if (r != CUDA_SUCCESS) {
        cuda_format_error(g_cu.error, sizeof g_cu.error, r, "cuDeviceGetCount");
        return;
    }
    for (int i = 0; i < g_cu.device_count && i < CUH_CUDA_MAX_DEVICES; i++) {
        r = g_cu.cuDeviceGet(&g_cu.devices[i], i);
        if (r != CUDA_SUCCESS) {
            cuda_format_error(g_cu.error, sizeof g_cu.error, r, "cuDeviceGet(%d)", i);
            return;
        }
    }
    __atomic_store_n(&g_cu.ready, 1, __ATOMIC_RELEASE);
    return;

fail_symbol:
    /* The handle stays open: the pointers already resolved must stay valid. */
    snprintf(g_cu.error, sizeof g_cu.error,
             "the CUDA driver %s has no function %s (driver too old?)",
             CUH_CUDA_LIBRARY, missing);
}

/* 0 when the driver is usable; -1 with the reason in errbuf otherwise. */
static int cuda_ready(char *errbuf, size_t errlen)
{
    pthread_once(&g_cu.once, cuda_load);
    if (g_cu.ready)
        return 0;
    if (errbuf != NULL && errlen > 0)
        snprintf(errbuf, errlen, "%s", g_cu.error);
    return -1;
}

/* The ordinal of a CUdevice handle (the driver must be ready), or -1. */
static int cuda_ordinal_of(CUdevice cudev)
{
    for (int i = 0; i < g_cu.device_count && i < CUH_CUDA_MAX_DEVICES; i++)
        if (g_cu.devices[i] == cudev)
            return i;
    return -1;
}

/* ---- one opened device -------------------------------------------------- */

typedef struct cuh_cuda_device_s {
    cuh_device_t base;            /* first member: cuh_device_t * casts to this */
    CUdevice cudev;
    CUcontext ctx;                /* the retained primary context */
    uint64_t peers;               /* bit d: device d may access our virtual memory (vm_allow_peer) */
} cuh_cuda_device_t;

static cuh_cuda_device_t *cuda_dev(cuh_device_t *dev)
{
    return (cuh_cuda_device_t *)(void *)dev;
}

/* The driver's code of the calling thread's last failed call made for an
 * op, and its tick (cuh_failure_tick): what the hooks give the program. */
static _Thread_local struct {
    int code;
    unsigned long seq;
} last_failure;

int cuh_cuda_failure_since(unsigned long mark)
{
    if (cuh_failure_mark() == mark)
        return 0;   /* nothing failed anywhere: the common case, no thread-local access */
    return last_failure.seq > mark ? last_failure.code : 0;
}

int cuh_cuda_sticky(int code)
{
    switch (code) {
    case 3: case 4:                     /* not initialized, deinitialized */
    case 214:                           /* ECC uncorrectable */
    case 700: case 702: case 709:       /* illegal address, launch timeout, context destroyed */
    case 714: case 715: case 716: case 717: case 718: case 719:   /* hardware faults in a kernel, launch failed */
        return 1;
    default:
        return 0;
    }
}

/* Writes "<what> on device N failed: <CUDA error>" into cuh_dev_error_text(dev). */
static void cuda_dev_error(cuh_device_t *dev, CUresult r, const char *what, ...)
    __attribute__((format(printf, 3, 4)));
static void cuda_dev_error(cuh_device_t *dev, CUresult r, const char *what, ...)
{
    last_failure.code = (int)r;
    last_failure.seq = cuh_failure_tick();
    va_list ap;
    va_start(ap, what);
    cuda_vformat_error(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, r, dev->ordinal, what, ap);
    va_end(ap);
    if (cuh_cuda_sticky((int)r)) {
        cuh_dev_keep_lost_text(dev);
        atomic_store_explicit(&dev->lost, (int)r, memory_order_relaxed);
    }
}

/* The one helper every operation goes through to run with the device's
 * primary context current. cuda_ctx_enter() makes it current - nothing to do
 * when the calling thread already has it current (the common case: the CUDA
 * runtime made it so), a push otherwise - and cuda_ctx_leave() undoes exactly
 * what enter did, so the caller's own context is current again afterwards. */
/* The primary context a hooked allocation found current on its thread
 * (cuh_cuda_assume_current), for the length of that call. */
static _Thread_local CUcontext assumed_current;

void cuh_cuda_assume_current(int device)
{
    assumed_current = device >= 0 && device < CUH_CUDA_MAX_DEVICES ? g_cu.primary[device] : NULL;
}

static CUresult cuda_ctx_enter(cuh_cuda_device_t *d, int *pushed)
{
    *pushed = 0;
    CUcontext assumed = assumed_current;
    if (assumed && assumed == d->ctx)
        return CUDA_SUCCESS;   /* found current by this thread's call underway: not asked again */
    CUcontext cur = NULL;
    CUresult r = g_cu.cuCtxGetCurrent(&cur);
    if (r == CUDA_SUCCESS && cur == d->ctx)
        return CUDA_SUCCESS;
    r = g_cu.cuCtxPushCurrent_v2(d->ctx);
    if (r == CUDA_SUCCESS)
        *pushed = 1;
    return r;
}

static void cuda_ctx_leave(int pushed)
{
    if (pushed) {
        CUcontext popped = NULL;
        (void)g_cu.cuCtxPopCurrent_v2(&popped);
    }
}

/* Enters the context or returns CUH_DEV_ERROR from the calling op, naming
 * the op in its error text. Used at the top of every op. */
#define CUDA_ENTER(d, pushed, opname)                                          \
    do {                                                                       \
        CUresult enter_r_ = cuda_ctx_enter((d), &(pushed));                    \
        if (enter_r_ != CUDA_SUCCESS) {                                        \
            cuda_dev_error(&(d)->base, enter_r_,                               \
                           "cuCtxPushCurrent_v2 (primary context, for %s)",    \
                           (opname));                                          \
            return CUH_DEV_ERROR;                                              \
        }                                                                      \
    } while (0)

/* The whole body of an op that is one driver call: `call` in the device's
 * context, its failure named `opname` in its error text. */
#define CUDA_CALL(dev, opname, call)                                           \
    do {                                                                       \
        int pushed_;                                                           \
        cuh_cuda_device_t *d_ = cuda_dev(dev);                                 \
        CUDA_ENTER(d_, pushed_, (opname));                                     \
        CUresult r_ = (call);                                                  \
        cuda_ctx_leave(pushed_);                                               \
        if (r_ != CUDA_SUCCESS) {                                              \
            cuda_dev_error((dev), r_, "%s", (opname));                         \
            return CUH_DEV_ERROR;                                              \
        }                                                                      \
        return CUH_DEV_OK;                                                     \
    } while (0)

static cuh_dev_status_t cuda_mem_alloc(cuh_device_t *dev, size_t size, uintptr_t *addr)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    CUdeviceptr p = 0;
    int pushed;
    CUresult r;

    CUDA_ENTER(d, pushed, "cuMemAlloc_v2");
    /* A CUDA graph may be capturing in global mode, where cuMemAlloc would
     * invalidate the capture; relaxed mode for this thread makes it legal (as
     * PyTorch's own allocator does around cudaMalloc). */
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode);
    r = g_cu.cuMemAlloc_v2(&p, size);
    (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode);
    if (r == CUDA_SUCCESS && (p & 511u) != 0) {
        /* The driver aligns to far more than 512 bytes in practice; device.h
         * promises 512, so refuse rather than hand out a misaligned segment. */
        (void)g_cu.cuMemFree_v2(p);
        cuda_ctx_leave(pushed);
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN,
                 "cuMemAlloc_v2(%zu bytes) on device %d returned 0x%llx, "
                 "not aligned to 512 bytes", size, dev->ordinal, p);
        return CUH_DEV_ERROR;
    }
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuMemAlloc_v2(%zu bytes)", size);   /* an OOM's too, for whoever asks */
        return r == CUDA_ERROR_OUT_OF_MEMORY ? CUH_DEV_OOM : CUH_DEV_ERROR;
    }
    *addr = (uintptr_t)p;
    return CUH_DEV_OK;
}

static cuh_dev_status_t cuda_mem_free(cuh_device_t *dev, uintptr_t addr, size_t size)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    int pushed;
    CUresult r;

    /* At process exit the driver may shut down before cuheap returns its
     * segments (CUDA_ERROR_DEINITIALIZED); the memory goes with the process,
     * so that is no error. */
    r = cuda_ctx_enter(d, &pushed);
    if (r == CUDA_ERROR_DEINITIALIZED)
        return CUH_DEV_OK;
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuCtxPushCurrent_v2 (primary context, for %s)", "cuMemFree_v2");
        return CUH_DEV_ERROR;
    }
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;   /* see cuda_mem_alloc */
    (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode);
    r = g_cu.cuMemFree_v2((CUdeviceptr)addr);
    (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) {
        cuda_dev_error(dev, r, "cuMemFree_v2(0x%llx, %zu bytes)",
                       (unsigned long long)addr, size);
        return CUH_DEV_ERROR;
    }
    return CUH_DEV_OK;
}

static cuh_dev_status_t cuda_mem_info(cuh_device_t *dev, size_t *free_bytes, size_t *total_bytes)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    size_t f = 0, t = 0;
    int pushed;
    CUresult r;

    CUDA_ENTER(d, pushed, "cuMemGetInfo_v2");
    r = g_cu.cuMemGetInfo_v2(&f, &t);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuMemGetInfo_v2");
        return CUH_DEV_ERROR;
    }
    if (free_bytes != NULL)
        *free_bytes = f;
    if (total_bytes != NULL)
        *total_bytes = t;
    return CUH_DEV_OK;
}

static cuh_dev_status_t cuda_event_create(cuh_device_t *dev, cuh_event_t *event)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    CUevent ev = NULL;
    int pushed;
    CUresult r;

    CUDA_ENTER(d, pushed, "cuEventCreate");
    r = g_cu.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuEventCreate(CU_EVENT_DISABLE_TIMING)");
        return CUH_DEV_ERROR;
    }
    *event = (cuh_event_t)(void *)ev;
    return CUH_DEV_OK;
}

static void cuda_event_destroy(cuh_device_t *dev, cuh_event_t event)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    int pushed;

    if (event == NULL)
        return;
    /* Nothing to report to: a failure (a driver already shut down at exit)
     * leaves nothing behind that cuheap could release. */
    if (cuda_ctx_enter(d, &pushed) != CUDA_SUCCESS)
        return;
    (void)g_cu.cuEventDestroy_v2((CUevent)(void *)event);
    cuda_ctx_leave(pushed);
}

static cuh_dev_status_t cuda_event_record(cuh_device_t *dev, cuh_event_t event, cuh_stream_t stream)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    int pushed;
    CUresult r;

    CUDA_ENTER(d, pushed, "cuEventRecord");
    r = g_cu.cuEventRecord((CUevent)(void *)event, (CUstream)stream);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuEventRecord(stream 0x%llx)", (unsigned long long)stream);
        return CUH_DEV_ERROR;
    }
    return CUH_DEV_OK;
}

/* Inside the device's context, though the event carries its own: a driver
 * may crash in cuEventQuery on a thread with no current context (the GPU
 * check's stress under CUDA's shared runtime did, on an H100 with driver
 * 580.159, where a hooked cudaMalloc reaches here before the runtime has
 * made a context current; bench/HISTORY.md). The enter costs a
 * cuCtxGetCurrent where the context is current already. */
static cuh_dev_status_t cuda_event_query(cuh_device_t *dev, cuh_event_t event)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    int pushed;
    CUresult r;

    CUDA_ENTER(d, pushed, "cuEventQuery");
    r = g_cu.cuEventQuery((CUevent)(void *)event);
    cuda_ctx_leave(pushed);
    if (r == CUDA_SUCCESS)
        return CUH_DEV_OK;
    if (r == CUDA_ERROR_NOT_READY)
        return CUH_DEV_NOT_READY;
    cuda_dev_error(dev, r, "cuEventQuery");
    return CUH_DEV_ERROR;
}

static cuh_dev_status_t cuda_event_wait(cuh_device_t *dev, cuh_event_t event)
{
    CUDA_CALL(dev, "cuEventSynchronize", g_cu.cuEventSynchronize((CUevent)(void *)event));
}

static cuh_dev_status_t cuda_stream_wait(cuh_device_t *dev, cuh_stream_t stream, cuh_event_t event)
{
    CUDA_CALL(dev, "cuStreamWaitEvent", g_cu.cuStreamWaitEvent((CUstream)(void *)stream, (CUevent)(void *)event, 0));
}

/* A context that cannot synchronize is lost to cuheap, whatever the error
 * (device.h): nothing it ran is known to have finished. */
static cuh_dev_status_t cuda_synchronize(cuh_device_t *dev)
{
    int pushed;
    cuh_cuda_device_t *d = cuda_dev(dev);
    CUDA_ENTER(d, pushed, "cuCtxSynchronize");
    CUresult r = g_cu.cuCtxSynchronize();
    cuda_ctx_leave(pushed);
    if (r == CUDA_SUCCESS)
        return CUH_DEV_OK;
    cuda_dev_error(dev, r, "cuCtxSynchronize");
    cuh_dev_keep_lost_text(dev);
    int none = 0;
    atomic_compare_exchange_strong(&dev->lost, &none, (int)r);
    return CUH_DEV_ERROR;
}

/* ---- device-wide fences ------------------------------------------------------
 * cuCtxRecordEvent and cuCtxWaitEvent cover every stream of the context in
 * one call, but either one invalidates any graph capture underway in the
 * context. The hooks report every capture that begins and ends (through
 * whichever entry point: hook_driver.c); while one may be underway, both ops
 * answer CUH_DEV_CAPTURING and call nothing. The registry is a short list of
 * the capturing streams: an entry whose stream no longer captures (an end
 * the hooks missed) is dropped when a fence looks, by asking the driver. A
 * begin is registered before it is called and counted until it returns, and
 * no capture may begin between a fence's look and its call. While the
 * registry is empty (`any` 0) a fence takes no lock: it counts itself in
 * `calling`, then looks at `any`; a begin sets `any`, then waits until
 * `calling` is 0. Both in sequentially consistent order, so either the fence
 * sees the begin (and takes the lock's way) or the begin sees the fence and
 * waits for its call to return (a cudaFree's fence is one driver call, so
 * the lock's trip, the most a block's pair paid for here, is gone: issue 45).
 * Otherwise a fence holds the registry's lock from its look to its call. */

#define CAPTURES_MAX 64
static struct {
    pthread_mutex_t lock;
    int count;              /* entries in stream[] */
    int overflow;           /* more captures began at once than there is room for: for good */
    int beginning;          /* begins called and not yet returned */
    uintptr_t stream[CAPTURES_MAX];
    int per_thread[CAPTURES_MAX];   /* the per-thread default stream: only its own thread can ask */
    _Atomic int any;        /* count, overflow or beginning nonzero; written under the lock */
    _Atomic int calling;    /* fences between their look at `any` and their call's return, lock-free */
} g_captures = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Publishes whether the registry holds anything (the lock held). */
static void captures_publish_locked(void)
{
    atomic_store(&g_captures.any, g_captures.count != 0 || g_captures.overflow || g_captures.beginning);
}

/* The driver's answer for `stream` (the calling thread's per-thread default
 * stream for CU_STREAM_PER_THREAD): 1 capturing (or invalidated but not ended), 0 not, -1
 * cannot tell. */
static int stream_capture_status(uintptr_t stream)
{
    int status = 0;
    if (!g_cu.cuStreamIsCapturing || g_cu.cuStreamIsCapturing((CUstream)stream, &status) != CUDA_SUCCESS)
        return -1;
    return status != 0;
}

/* Drops entry i (the registry's lock held). */
static void capture_drop_locked(int i)
{
    g_captures.count--;
    g_captures.stream[i] = g_captures.stream[g_captures.count];
    g_captures.per_thread[i] = g_captures.per_thread[g_captures.count];
    captures_publish_locked();
}

void cuh_cuda_capture_beginning(const void *stream)
{
    uintptr_t s = (uintptr_t)stream;
    pthread_mutex_lock(&g_captures.lock);
    g_captures.beginning++;
    if (g_captures.count == CAPTURES_MAX) {
        g_captures.overflow = 1;
    } else {
        g_captures.per_thread[g_captures.count] = s == CU_STREAM_PER_THREAD;
        g_captures.stream[g_captures.count++] = s;
    }
    captures_publish_locked();
    pthread_mutex_unlock(&g_captures.lock);
    /* A fence that looked before `any` was set may be calling: the capture
     * begins once its call has returned. */
    while (atomic_load(&g_captures.calling) != 0)
        sched_yield();
}

void cuh_cuda_capture_begin_returned(const void *stream, int began)
{
    pthread_mutex_lock(&g_captures.lock);
    g_captures.beginning--;
    captures_publish_locked();
    pthread_mutex_unlock(&g_captures.lock);
    if (!began)
        cuh_cuda_capture_ended(stream);
}

void cuh_cuda_capture_ended(const void *stream)
{
    uintptr_t s = (uintptr_t)stream;
    /* An end that failed (not the stream the capture began on) leaves the
     * capture going: ask rather than assume. */
    if (stream_capture_status(s) == 1)
        return;
    pthread_mutex_lock(&g_captures.lock);
    for (int i = 0; i < g_captures.count; i++)
        if (g_captures.stream[i] == s) {
            capture_drop_locked(i);
            break;
        }
    pthread_mutex_unlock(&g_captures.lock);
}

/* 1 while a capture may be underway (the registry's lock held). */
static int captures_underway_locked(void)
{
    if (g_captures.beginning)
        return 1;
    for (int i = 0; i < g_captures.count;) {
        if (!g_captures.per_thread[i] && stream_capture_status(g_captures.stream[i]) == 0)
            capture_drop_locked(i);
        else
            i++;
    }
    return g_captures.count != 0 || g_captures.overflow;
}

/* One of the two device-wide calls: OK, UNSUPPORTED (no such call in this
 * driver), CAPTURING, or ERROR (the error text says why; for a capture the hooks
 * never saw, which the driver has now broken, it says so: the heap prints it
 * and fences stream by stream from then on, breaking no other). */
static cuh_dev_status_t cuda_fence_all(cuh_device_t *dev, CUresult (*call)(CUcontext, CUevent), const char *name,
                                       cuh_event_t event)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    if (!call) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "the CUDA driver has no %s (before CUDA 12.5)", name);
        return CUH_DEV_UNSUPPORTED;
    }
    /* The context is an argument: the driver ignores the current one, so
     * none is made current (a cuCtxGetCurrent saved per cudaFree's fence). */
    CUresult r;
    int called = 0;
    /* The first look keeps fences that would take the lock's way anyway out
     * of `calling`, which a beginning capture waits to see at 0. */
    if (cuh_likely(atomic_load_explicit(&g_captures.any, memory_order_relaxed) == 0)) {
        atomic_fetch_add(&g_captures.calling, 1);
        if (cuh_likely(atomic_load(&g_captures.any) == 0)) {
            r = call(d->ctx, (CUevent)(void *)event);
            called = 1;
        }
        atomic_fetch_sub_explicit(&g_captures.calling, 1, memory_order_release);
    }
    if (!called) {
        pthread_mutex_lock(&g_captures.lock);
        if (captures_underway_locked()) {
            pthread_mutex_unlock(&g_captures.lock);
            snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "%s: a CUDA graph capture is underway", name);
            return CUH_DEV_CAPTURING;
        }
        r = call(d->ctx, (CUevent)(void *)event);
        pthread_mutex_unlock(&g_captures.lock);
    }
    if (r == CUDA_SUCCESS)
        return CUH_DEV_OK;
    cuda_dev_error(dev, r, "%s", name);
    if (r == CUDA_ERROR_NOT_SUPPORTED)
        return CUH_DEV_UNSUPPORTED;
    if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) {
        size_t len = strlen(cuh_dev_error_text(dev));
        snprintf(cuh_dev_error_text(dev) + len, CUH_DEV_ERROR_LEN - len,
                 ": a CUDA graph capture that cuheap did not see was underway, and the driver has "
                 "invalidated it; cuheap fences stream by stream from now on");
    }
    return CUH_DEV_ERROR;
}

static cuh_dev_status_t cuda_event_record_all(cuh_device_t *dev, cuh_event_t event)
{
    return cuda_fence_all(dev, g_cu.cuCtxRecordEvent, "cuCtxRecordEvent", event);
}

static cuh_dev_status_t cuda_wait_all(cuh_device_t *dev, cuh_event_t event)
{
    return cuda_fence_all(dev, g_cu.cuCtxWaitEvent, "cuCtxWaitEvent", event);
}

/* ---- virtual memory -------------------------------------------------------- */

static cuh_CUmemAllocationProp cuda_vm_prop(const cuh_cuda_device_t *d)
{
    cuh_CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d->base.ordinal;
    return prop;
}

static size_t cuda_vm_granularity(cuh_device_t *dev)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    if (!g_cu.cuMemGetAllocationGranularity || !g_cu.cuMemAddressReserve || !g_cu.cuMemCreate || !g_cu.cuMemMap ||
        !g_cu.cuMemUnmap || !g_cu.cuMemSetAccess || !g_cu.cuMemRelease || !g_cu.cuMemAddressFree)
        return 0;
    cuh_CUmemAllocationProp prop = cuda_vm_prop(d);
    size_t gran = 0;
    int pushed;
    if (cuda_ctx_enter(d, &pushed) != CUDA_SUCCESS)
        return 0;
    CUresult r = g_cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    cuda_ctx_leave(pushed);
    return r == CUDA_SUCCESS ? gran : 0;
}

/* Runs one virtual-memory call in the device's context and relaxed capture
 * mode (these calls would invalidate a graph capture in global mode). */
#define CUDA_VM_CALL(d, r, call)                                        \
    do {                                                                \
        int pushed_, mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;            \
        (r) = cuda_ctx_enter((d), &pushed_);                            \
        if ((r) == CUDA_SUCCESS) {                                      \
            (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode_);       \
            (r) = (call);                                               \
            (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode_);       \
            cuda_ctx_leave(pushed_);                                    \
        }                                                               \
    } while (0)

static cuh_dev_status_t cuda_vm_reserve(cuh_device_t *dev, size_t size, uintptr_t *va)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    CUdeviceptr p = 0;
    CUresult r;
    CUDA_VM_CALL(d, r, g_cu.cuMemAddressReserve(&p, size, 0, 0, 0));
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuMemAddressReserve(%zu bytes)", size);
        return CUH_DEV_ERROR;
    }
    *va = (uintptr_t)p;
    return CUH_DEV_OK;
}

static void cuda_vm_unreserve(cuh_device_t *dev, uintptr_t va, size_t size)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    CUresult r;
    CUDA_VM_CALL(d, r, g_cu.cuMemAddressFree((CUdeviceptr)va, size));
    (void)r;
}

static cuh_dev_status_t cuda_vm_create(cuh_device_t *dev, size_t size, uint64_t *handle)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    cuh_CUmemAllocationProp prop = cuda_vm_prop(d);
    CUmemGenericAllocationHandle h = 0;
    CUresult r;
    CUDA_VM_CALL(d, r, g_cu.cuMemCreate(&h, size, &prop, 0));
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        cuda_dev_error(dev, r, "cuMemCreate(%zu bytes)", size);
        return CUH_DEV_OOM;
    }
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuMemCreate(%zu bytes)", size);
        return CUH_DEV_ERROR;
    }
    *handle = (uint64_t)h;
    return CUH_DEV_OK;
}

static void cuda_vm_release(cuh_device_t *dev, uint64_t handle)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    CUresult r;
    CUDA_VM_CALL(d, r, g_cu.cuMemRelease((CUmemGenericAllocationHandle)handle));
    (void)r;
}

/* Read-write access for device `id`. */
static void cuda_access_desc(cuh_CUmemAccessDesc *out, int id)
{
    memset(out, 0, sizeof *out);
    out->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    out->location.id = id;
    out->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* Read-write access for the device and its peers: up to 65 descriptors. */
static size_t cuda_access_list(const cuh_cuda_device_t *d, cuh_CUmemAccessDesc *out)
{
    size_t n = 0;
    cuda_access_desc(&out[n++], d->base.ordinal);
    for (int id = 0; id < 64; id++)
        if (d->peers >> id & 1)
            cuda_access_desc(&out[n++], id);
    return n;
}

static cuh_dev_status_t cuda_vm_allow_peer(cuh_device_t *dev, int peer, uintptr_t va, size_t size)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    if (peer < 0 || peer >= 64 || peer == dev->ordinal) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "device %d: peer %d out of range", dev->ordinal, peer);
        return CUH_DEV_ERROR;
    }
    d->peers |= 1ull << peer;
    if (!size)
        return CUH_DEV_OK;
    cuh_CUmemAccessDesc access;
    cuda_access_desc(&access, peer);
    CUresult r;
    CUDA_VM_CALL(d, r, g_cu.cuMemSetAccess((CUdeviceptr)va, size, &access, 1));
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuMemSetAccess(0x%llx, %zu bytes) for peer device %d", (unsigned long long)va, size,
                       peer);
        return CUH_DEV_ERROR;
    }
    return CUH_DEV_OK;
}

static cuh_dev_status_t cuda_vm_map(cuh_device_t *dev, uintptr_t va, size_t size, uint64_t handle)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    cuh_CUmemAccessDesc access[65];
    const size_t num_access = cuda_access_list(d, access);
    CUresult r;
    CUDA_VM_CALL(d, r, g_cu.cuMemMap((CUdeviceptr)va, size, 0, (CUmemGenericAllocationHandle)handle, 0));
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuMemMap(0x%llx, %zu bytes)", (unsigned long long)va, size);
        return CUH_DEV_ERROR;
    }
    CUDA_VM_CALL(d, r, g_cu.cuMemSetAccess((CUdeviceptr)va, size, access, num_access));
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuMemSetAccess(0x%llx, %zu bytes)", (unsigned long long)va, size);
        CUresult u;
        CUDA_VM_CALL(d, u, g_cu.cuMemUnmap((CUdeviceptr)va, size));
        (void)u;
        return CUH_DEV_ERROR;
    }
    return CUH_DEV_OK;
}

static cuh_dev_status_t cuda_vm_unmap(cuh_device_t *dev, uintptr_t va, size_t size)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    CUresult r;
    CUDA_VM_CALL(d, r, g_cu.cuMemUnmap((CUdeviceptr)va, size));
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) {
        cuda_dev_error(dev, r, "cuMemUnmap(0x%llx, %zu bytes)", (unsigned long long)va, size);
        return CUH_DEV_ERROR;
    }
    return CUH_DEV_OK;
}

static cuh_dev_status_t cuda_host_alloc(cuh_device_t *dev, size_t size, unsigned flags, void **ptr)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    int pushed;
    if (!g_cu.cuMemHostAlloc || !g_cu.cuMemFreeHost) {
        snprintf(cuh_dev_error_text(dev), CUH_DEV_ERROR_LEN, "the CUDA driver has no cuMemHostAlloc/cuMemFreeHost");
        return CUH_DEV_ERROR;
    }
    CUDA_ENTER(d, pushed, "cuMemHostAlloc");
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;   /* see cuda_mem_alloc */
    (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode);
    void *p = NULL;
    CUresult r = g_cu.cuMemHostAlloc(&p, size, flags);
    (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS) {
        cuda_dev_error(dev, r, "cuMemHostAlloc(%zu bytes, flags 0x%x)", size, flags);
        return r == CUDA_ERROR_OUT_OF_MEMORY ? CUH_DEV_OOM : CUH_DEV_ERROR;
    }
    *ptr = p;
    return CUH_DEV_OK;
}

static void cuda_host_free(cuh_device_t *dev, void *ptr, size_t size)
{
    cuh_cuda_device_t *d = cuda_dev(dev);
    int pushed;
    if (!g_cu.cuMemFreeHost || cuda_ctx_enter(d, &pushed) != CUDA_SUCCESS)
        return;   /* at exit the driver may be gone, and the memory with the process */
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode);
    CUresult r = g_cu.cuMemFreeHost(ptr);
    (void)g_cu.cuThreadExchangeStreamCaptureMode(&mode);
    cuda_ctx_leave(pushed);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED)
        cuda_dev_error(dev, r, "cuMemFreeHost(%p, %zu bytes)", ptr, size);
}

static void cuda_destroy(cuh_device_t *dev)
{
    cuh_cuda_device_t *d = cuda_dev(dev);

    if (d == NULL)
        return;
    /* Fails harmlessly (CUDA_ERROR_DEINITIALIZED) when the driver has already
     * shut down at process exit. */
    (void)g_cu.cuDevicePrimaryCtxRelease_v2(d->cudev);
    free(d);
}

static const cuh_device_ops_t cuda_ops = {
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .mem_info = cuda_mem_info,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_wait = cuda_event_wait,
    .stream_wait = cuda_stream_wait,
    .event_record_all = cuda_event_record_all,
    .wait_all = cuda_wait_all,
    .synchronize = cuda_synchronize,
    .destroy = cuda_destroy,
    .vm_granularity = cuda_vm_granularity,
    .vm_reserve = cuda_vm_reserve,
    .vm_unreserve = cuda_vm_unreserve,
    .vm_create = cuda_vm_create,
    .vm_release = cuda_vm_release,
    .vm_map = cuda_vm_map,
    .vm_allow_peer = cuda_vm_allow_peer,
    .vm_unmap = cuda_vm_unmap,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
};

/* ---- entry points (device.h) -------------------------------------------- */

cuh_device_t *cuh_cuda_open(int ordinal, char *errbuf, size_t errlen)
{
    char scratch[8];
    cuh_cuda_device_t *d;
    CUresult r;

    if (errbuf == NULL || errlen == 0) {
        errbuf = scratch;
        errlen = sizeof scratch;
    }
    errbuf[0] = '\0';
    if (cuda_ready(errbuf, errlen) != 0)
        return NULL;
    if (g_cu.device_count <= 0) {
        snprintf(errbuf, errlen, "CUDA device %d does not exist: cuDeviceGetCount reports "
                 "no device (check CUDA_VISIBLE_DEVICES)", ordinal);
        return NULL;
    }
    if (ordinal < 0 || ordinal >= g_cu.device_count) {
        snprintf(errbuf, errlen,
                 "CUDA device %d does not exist: cuDeviceGetCount reports %d device%s "
                 "(valid ordinals 0..%d)", ordinal, g_cu.device_count,
                 g_cu.device_count == 1 ? "" : "s", g_cu.device_count - 1);
        return NULL;
    }
    if (ordinal >= CUH_CUDA_MAX_DEVICES) {
        snprintf(errbuf, errlen, "CUDA device %d: cuheap supports devices 0..%d only",
                 ordinal, CUH_CUDA_MAX_DEVICES - 1);
        return NULL;
    }
    d = calloc(1, sizeof *d);
    if (d == NULL) {
        snprintf(errbuf, errlen, "out of host memory opening CUDA device %d", ordinal);
        return NULL;
    }
    d->cudev = g_cu.devices[ordinal];
    r = g_cu.cuDevicePrimaryCtxRetain(&d->ctx, d->cudev);
    if (r != CUDA_SUCCESS) {
        cuda_format_error(errbuf, errlen, r, "cuDevicePrimaryCtxRetain(device %d)", ordinal);
        free(d);
        return NULL;
    }
    pthread_mutex_lock(&g_cu.primary_lock);
    if (g_cu.primary[ordinal] == NULL) {
        /* Kept for cuh_cuda_current_context; the retain above is released
         * when the device is destroyed, this one never (a primary context's
         * handle stays the same for the life of the process). */
        CUcontext again = NULL;
        if (g_cu.cuDevicePrimaryCtxRetain(&again, d->cudev) == CUDA_SUCCESS)
            g_cu.primary[ordinal] = again;
    }
    pthread_mutex_unlock(&g_cu.primary_lock);
    d->base.ops = &cuda_ops;
    d->base.kind = "cuda";
    d->base.ordinal = ordinal;
    return &d->base;
}

/* The device whose primary context `ctx` is, among the primary contexts
 * cuheap knows, or -1: answered without asking the driver for the context's
 * device (cuheap retains each one it knows, so its handle names no other
 * context). */
static int known_primary_device(CUcontext ctx)
{
    int known = __atomic_load_n(&g_cu.ready, __ATOMIC_ACQUIRE) ? g_cu.device_count : 0;
    for (int i = 0; ctx && i < known && i < CUH_CUDA_MAX_DEVICES; i++)
        if (g_cu.primary[i] == ctx)
            return i;
    return -1;
}

int cuh_cuda_current_device(char *errbuf, size_t errlen)
{
    CUcontext ctx = NULL;
    CUdevice cudev = 0;
    CUresult r;

    if (cuda_ready(errbuf, errlen) != 0)
        return -1;
    r = g_cu.cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS) {
        if (errbuf != NULL && errlen > 0)
            cuda_format_error(errbuf, errlen, r, "cuCtxGetCurrent");
        return -1;
    }
    if (ctx == NULL)
        return 0;   /* what the CUDA runtime would pick */
    int known = known_primary_device(ctx);   /* every call with CUHEAP_CURRENT_DEVICE */
    if (known >= 0)
        return known;
    r = g_cu.cuCtxGetDevice(&cudev);
    if (r != CUDA_SUCCESS) {
        if (errbuf != NULL && errlen > 0)
            cuda_format_error(errbuf, errlen, r, "cuCtxGetDevice");
        return -1;
    }
    /* A CUdevice is a handle, not an ordinal: map it back. */
    int ordinal = cuda_ordinal_of(cudev);
    if (ordinal >= 0)
        return ordinal;
    if (errbuf != NULL && errlen > 0)
        snprintf(errbuf, errlen,
                 "the current context's device (CUdevice %d) is none of the %d devices "
                 "cuDeviceGet reported", cudev, g_cu.device_count);
    return -1;
}

/* ---- the real entry points behind the hooks ------------------------------ */

CUH_EARLY void *(*cuh_cuda_dlsym_function(void))(void *, const char *)
{
    pthread_once(&g_cu.dlsym_once, cuda_find_dlsym);
    return g_cu.real_dlsym;
}

CUH_EARLY void *cuh_cuda_real_dlsym(void *handle, const char *name)
{
    /* Every dlsym of the process comes here under LD_PRELOAD: the driver is
     * not loaded for it. */
    pthread_once(&g_cu.dlsym_once, cuda_find_dlsym);
    return g_cu.real_dlsym(handle, name);
}

void *cuh_cuda_driver_function(const char *name)
{
    pthread_once(&g_cu.lib_once, cuda_open_lib);
    return g_cu.lib ? g_cu.real_dlsym(g_cu.lib, name) : NULL;
}

/* dl_iterate_phdr callback: the path of the first loaded libcudart. */
static int cuda_find_runtime(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *name = info->dlpi_name;
    const char *base = name ? strrchr(name, '/') : NULL;
    base = base ? base + 1 : name;
    if (base && strncmp(base, "libcudart.so", 12) == 0) {
        snprintf(data, PATH_MAX, "%s", name);
        return 1;
    }
    return 0;
}

void *cuh_cuda_runtime_function(const char *name)
{
    pthread_once(&g_cu.lib_once, cuda_open_lib);
    /* The next definition after libcuheap in the global scope: the runtime
     * the program loaded, when it is there (PyTorch loads it globally). */
    void *fn = g_cu.real_dlsym(RTLD_NEXT, name);
    if (fn)
        return fn;
    /* A runtime loaded with RTLD_LOCAL is outside the global scope: find it
     * among the loaded objects by name. */
    void *lib = __atomic_load_n(&g_cu.runtime_lib, __ATOMIC_ACQUIRE);
    if (!lib) {
        char path[PATH_MAX] = "";
        if (!dl_iterate_phdr(cuda_find_runtime, path) || !path[0])
            return NULL;
        lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
        if (!lib)
            return NULL;
        void *expected = NULL;
        if (!__atomic_compare_exchange_n(&g_cu.runtime_lib, &expected, lib, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE)) {
            dlclose(lib);
            lib = expected;
        }
    }
    return g_cu.real_dlsym(lib, name);
}

int cuh_cuda_current_context(int *device)
{
    char err[400];
    CUcontext ctx = NULL;
    *device = -1;
    /* A program that has not loaded the driver has no context, and cuheap
     * must not be the one to load it or call cuInit for it. */
    CUresult (*ctx_get_current)(CUcontext *) = NULL;
    if (__atomic_load_n(&g_cu.ready, __ATOMIC_ACQUIRE)) {
        ctx_get_current = g_cu.cuCtxGetCurrent;   /* the common case: no lookup */
    } else {
        if (!cuh_cuda_driver_loaded())
            return CUH_CTX_NONE;
        pthread_once(&g_cu.lib_once, cuda_open_lib);
        if (!g_cu.lib)
            return CUH_CTX_ERROR;
        void *get_current = g_cu.real_dlsym(g_cu.lib, "cuCtxGetCurrent");
        memcpy(&ctx_get_current, &get_current, sizeof ctx_get_current);
    }
    if (!ctx_get_current || ctx_get_current(&ctx) != CUDA_SUCCESS)
        return CUH_CTX_ERROR;
    if (ctx == NULL)
        return CUH_CTX_NONE;
    /* Every allocation under LD_PRELOAD asks this. */
    int known = known_primary_device(ctx);
    if (known >= 0) {
        *device = known;
        return CUH_CTX_PRIMARY;
    }
    if (cuda_ready(err, sizeof err) != 0)
        return CUH_CTX_ERROR;
    CUdevice cudev;
    if (g_cu.cuCtxGetDevice(&cudev) != CUDA_SUCCESS)
        return CUH_CTX_ERROR;
    int d = cuda_ordinal_of(cudev);
    if (d < 0)
        return CUH_CTX_ERROR;
    *device = d;
    CUcontext primary = g_cu.primary[d];
    if (primary == NULL) {
        /* Unknown yet. An inactive primary context cannot be the current
         * one; an active one is retained (never created) to learn it. */
        unsigned int flags = 0;
        int active = 0;
        if (g_cu.cuDevicePrimaryCtxGetState(cudev, &flags, &active) != CUDA_SUCCESS || !active)
            return CUH_CTX_OTHER;
        pthread_mutex_lock(&g_cu.primary_lock);
        if (g_cu.primary[d] == NULL && g_cu.cuDevicePrimaryCtxRetain(&primary, cudev) == CUDA_SUCCESS)
            g_cu.primary[d] = primary;
        primary = g_cu.primary[d];
        pthread_mutex_unlock(&g_cu.primary_lock);
    }
    return ctx == primary ? CUH_CTX_PRIMARY : CUH_CTX_OTHER;
}

int cuh_cuda_context_device(void *ctx)
{
    char err[400];
    if (!ctx || cuda_ready(err, sizeof err) != 0)
        return -1;
    if (g_cu.cuCtxPushCurrent_v2((CUcontext)ctx) != CUDA_SUCCESS)
        return -1;
    CUdevice cudev;
    int ordinal = g_cu.cuCtxGetDevice(&cudev) == CUDA_SUCCESS ? cuda_ordinal_of(cudev) : -1;
    CUcontext popped;
    (void)g_cu.cuCtxPopCurrent_v2(&popped);
    return ordinal;
}

int cuh_cuda_device_ordinal(int cudev)
{
    char err[400];
    if (cuda_ready(err, sizeof err) != 0)
        return -1;
    return cuda_ordinal_of(cudev);
}

CUH_EARLY int cuh_cuda_driver_loaded(void)
{
    if (g_cu.lib)
        return 1;
    void *lib = dlopen(CUH_CUDA_LIBRARY, RTLD_LAZY | RTLD_NOLOAD);
    if (!lib)
        return 0;
    dlclose(lib);
    return 1;
}

int cuh_cuda_stream_capturing(const void *stream)
{
    char err[400];
    if (!stream || !cuh_cuda_driver_loaded() || cuda_ready(err, sizeof err) != 0 || !g_cu.cuStreamIsCapturing)
        return 0;   /* the legacy default stream is never captured */
    int status = 0;   /* CU_STREAM_CAPTURE_STATUS_NONE */
    if (g_cu.cuStreamIsCapturing((CUstream)(uintptr_t)stream, &status) != CUDA_SUCCESS)
        return 0;
    return status != 0;   /* ACTIVE, or INVALIDATED: either way the stream is in a capture */
}

uint64_t cuh_cuda_active_devices(void)
{
    if (!cuh_cuda_driver_loaded() || cuda_ready(NULL, 0) != 0)
        return 0;
    uint64_t mask = 0;
    for (int i = 0; i < g_cu.device_count && i < CUH_CUDA_MAX_DEVICES && i < 64; i++) {
        unsigned flags = 0;
        int active = 0;
        if (g_cu.cuDevicePrimaryCtxGetState(g_cu.devices[i], &flags, &active) == CUDA_SUCCESS && active)
            mask |= 1ull << i;
    }
    return mask;
}
