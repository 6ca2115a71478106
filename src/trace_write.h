/* trace_write.h - records a live program's allocations and frees in the
 * trace format of bench/traces (version 1), so any job can be replayed with
 * cuheap-replay. Memory stays bounded: a fixed write buffer and one entry per
 * live allocation. Thread-safe.
 */
#ifndef CUH_TRACE_WRITE_H
#define CUH_TRACE_WRITE_H

#include <stddef.h>
#include <stdint.h>

typedef struct cuh_trace_writer_s cuh_trace_writer_t;

/* Creates PATH ("%p" = process id) and writes the header. NULL with a
 * message in err on failure. */
cuh_trace_writer_t *cuh_trace_writer_open(const char *path, char *err, size_t errlen);
void cuh_trace_writer_alloc(cuh_trace_writer_t *w, uintptr_t ptr, size_t size, uintptr_t stream);
/* A free of a pointer the writer never saw allocated is ignored. */
void cuh_trace_writer_free(cuh_trace_writer_t *w, uintptr_t ptr);
/* Writes "# mark <t_us> <label>": a point the program named (a training
 * step's start), at its place among the events. `label` is one line of
 * printable text (the caller checks). */
void cuh_trace_writer_mark(cuh_trace_writer_t *w, const char *label);
/* Writes the closing line and the buffer, only in the process that opened
 * it (a forked child writes nothing), and closes the file; later calls on
 * the writer do nothing. For process exit: the writer is not freed, since
 * another thread may still hold it. */
void cuh_trace_writer_finish(cuh_trace_writer_t *w);
/* Finishes and frees the writer (no other thread may use it any more). */
void cuh_trace_writer_close(cuh_trace_writer_t *w);

#endif /* CUH_TRACE_WRITE_H */
