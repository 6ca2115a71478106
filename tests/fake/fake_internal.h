/* fake_internal.h - what the fake driver's files share (fake_cuda.c, fake_vm.c):
 * the driver's types and codes as the fake knows them, the one lock over its
 * tables, the device memory each device has given out, and the counting and
 * fault checking at the top of every entry point. Not for tests: they use
 * fake_cuda.h.
 */
#ifndef FAKE_INTERNAL_H
#define FAKE_INTERNAL_H

#include "fake_cuda.h"

#include <pthread.h>
#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
enum {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    NOT_READY = 600,
    NOT_SUPPORTED = 801,
    STREAM_CAPTURE_UNSUPPORTED = 900,
    STREAM_CAPTURE_INVALIDATED = 901,
    STREAM_CAPTURE_UNMATCHED = 902,
    ILLEGAL_STATE = 401
};

#define API __attribute__((visibility("default")))
#define PAGE ((size_t)2 << 20)
#define ALLOCATION_ALIGNMENT ((size_t)4096)
#define PITCH_ALIGNMENT ((size_t)512)
#define IPC_HANDLE_BYTES 64
#define STREAM_NON_BLOCKING 0x1u
#define GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2ull
#define SYMBOL_FOUND 0
#define SYMBOL_NOT_FOUND 1
#define MAX_CONTEXT_DEPTH 32
#define MAX_DEVICES 4

/* One lock guards every table of the fake (allocations, streams, events,
 * work, mappings). */
extern pthread_mutex_t fake_lock;
extern int fake_num_devices;          /* FAKE_CUDA_DEVICES, 1 to MAX_DEVICES */
extern fake_cuda_calls_t fake_calls;  /* guarded by fake_lock */

/* Counts `size` bytes against `device`'s capacity; 0 when they do not fit. */
int fake_take(int device, size_t size);
/* Gives back what fake_take counted. */
void fake_give(int device, size_t size);

/* ---- calls by function ------------------------------------------------------ *
 * Every driver entry point counts its calls under its own name (CALLED() at
 * its top), so that a test or a benchmark can say which driver calls a path
 * makes and how many (fake_cuda_count, fake_cuda_count_list). A form that
 * only forwards (the _ptsz forms, cuGetProcAddress) counts as the function it
 * forwards to. Slots are taken at a function's first call and never freed. */

#define MAX_COUNTED 96
typedef struct fake_counted_s {
    const char *name;
    unsigned long n;
} fake_counted_t;
extern fake_counted_t fake_counted[MAX_COUNTED];
/* The slot counting function `name`'s calls, taken at its first call; -1
 * when all are taken. */
int fake_count_slot(const char *name);

/* Counts the call of the function it stands in; n_ gets its number. */
#define COUNT_CALL(n_)                                                                   \
    do {                                                                                 \
        static int slot_ = -2;                                                           \
        int s_ = __atomic_load_n(&slot_, __ATOMIC_ACQUIRE);                              \
        if (s_ == -2)                                                                    \
            __atomic_store_n(&slot_, s_ = fake_count_slot(__func__), __ATOMIC_RELEASE);      \
        (n_) = s_ >= 0 ? __atomic_add_fetch(&fake_counted[s_].n, 1, __ATOMIC_RELAXED) : 0;    \
    } while (0)

/* At the top of every driver function: counted, and failed at once when
 * the fault plan says so (fake_faults.c). */
#define CALLED()                                                                         \
    do {                                                                                 \
        unsigned long n_;                                                                \
        COUNT_CALL(n_);                                                                  \
        int f_ = fake_fault_planned(__func__, n_);                                       \
        if (f_)                                                                          \
            return f_;                                                                   \
    } while (0)

/* The same for the few that never fail, as a real driver answers them even
 * after a sticky error. */
#define CALLED_NEVER_FAILS()                                                             \
    do {                                                                                 \
        unsigned long n_;                                                                \
        COUNT_CALL(n_);                                                                  \
        (void)n_;                                                                        \
    } while (0)

/* The virtual memory calls (fake_vm.c), for cuGetProcAddress's table. */
API CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option);
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f);
API CUresult cuMemAddressFree(CUdeviceptr p, size_t size);
API CUresult cuMemCreate(unsigned long long *handle, size_t size, const void *prop, unsigned long long f);
API CUresult cuMemRelease(unsigned long long handle);
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, unsigned long long handle, unsigned long long f);
API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const void *desc, size_t count);
API CUresult cuMemUnmap(CUdeviceptr p, size_t size);
API void fake_cuda_counters(unsigned long out[5]);

#endif /* FAKE_INTERNAL_H */
