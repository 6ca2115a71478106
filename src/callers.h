/* callers.h - device memory by the shared library that asked for it.
 *
 * Under LD_PRELOAD cuheap serves every cudaMalloc of the process: the
 * framework's tensors, but also the workspaces and state that cuBLAS, cuDNN
 * or NCCL take for themselves, which the framework never counts. The hooks
 * know who called (the return address, named by dladdr); this module keeps,
 * per library, the bytes live now, the most ever live at once and the
 * number of allocations, so that a report can say where memory went. The C
 * API and the PyTorch plugin have no caller to name and record nothing.
 *
 * A block cudaMalloc serves carries its library's label in the heap's
 * record (cuh_heap_malloc_labelled), and its free says whose bytes went
 * (cuh_callers_count_alloc/_free). Blocks of the stream-ordered calls,
 * which a thread's cache serves without labels, are found again at free by
 * address in 64 maps, each under its own lock, so threads that free
 * different blocks rarely meet; such a record is one word: its size, its
 * device and its library's number. At most CUH_CALLERS_MAX libraries are
 * named; later ones count under the last name, "other libraries".
 */
#ifndef CUH_CALLERS_H
#define CUH_CALLERS_H

#include <stddef.h>
#include <stdint.h>

#define CUH_CALLERS_MAX 32
#define CUH_CALLER_NAME_MAX 64

typedef struct cuh_caller_stat_s {
    char library[CUH_CALLER_NAME_MAX];   /* the file name, without its directory */
    uint64_t live;                       /* bytes asked for, live now */
    uint64_t peak;                       /* the most bytes live at once */
    uint64_t allocs;                     /* allocations served */
} cuh_caller_stat_t;

/* The number for `library` (its file name, any directory is cut off),
 * given the first time it is seen; -1 for NULL or an empty name. */
int cuh_callers_id(const char *library);
/* The heap's label for library `id`'s blocks (cuh_heap_malloc_labelled). */
static inline unsigned cuh_callers_label(int id) { return (unsigned)id + 1; }
/* A labelled block of `size` bytes asked for by library `id` / freed. */
void cuh_callers_count_alloc(int id, size_t size);
void cuh_callers_count_free(int id, size_t size);
/* The labelled blocks of a device that is gone: by_label[k] bytes of label k
 * (cuh_heap_live_by_label) no longer count as live. */
void cuh_callers_forget_labelled(const uint64_t by_label[256]);
/* A block of `size` bytes at ptr on `device`, asked for by library `id`,
 * recorded by address. A block recorded at ptr already (its free was not
 * seen) is replaced. */
void cuh_callers_alloc(uintptr_t ptr, size_t size, int device, int id);
/* The block at ptr is freed; nothing if it was not recorded. */
void cuh_callers_free(uintptr_t ptr);
/* Up to `max` libraries, most bytes live first (ties: the higher peak, then
 * the name); returns how many. */
size_t cuh_callers_snapshot(cuh_caller_stat_t *out, size_t max);
/* Room for cuh_callers_live_summary's text. */
#define CUH_CALLERS_SUMMARY_MAX (3 * (CUH_CALLER_NAME_MAX + 24) + 128)
/* For an out-of-memory message: "device memory live by calling library
 * (every device): A 1.00 GiB, B 64.00 MiB, C 1.00 KiB and 2 more (a
 * report:PATH names each)", the three with the most bytes live; returns its
 * length, 0 (and an empty string) when no library holds any. */
size_t cuh_callers_live_summary(char *out, size_t len);
/* The blocks of `device` are gone with it (a device reset): their bytes no
 * longer count as live. */
void cuh_callers_forget_device(int device);
/* Forgets every library and block (the runtime's reset, for the tests). */
void cuh_callers_reset(void);

#endif
