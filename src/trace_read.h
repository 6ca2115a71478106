/* trace_read.h - allocation traces loaded into memory for replay.
 *
 * A trace is a program's sequence of allocations and frees, recorded once and
 * replayed against the heap as often as wanted (benchmarks, the search for the
 * smallest device that runs it). Two formats are read: cuheap's own trace
 * format, version 1 (bench/traces/NAME.trace.gz, described in the traces'
 * README), gzip-compressed or plain, and the CSV that RMM's
 * logging_resource_adaptor writes. Everything a replay needs is resolved while
 * loading, in one pass: each free knows the index of its allocation, so a
 * replay keeps an array indexed by event and does no lookups of its own. A
 * malformed trace is refused with a message that names the file, the line and
 * the problem. Tool-side code: it links zlib and is never part of the library.
 */
#ifndef CUH_TRACE_READ_H
#define CUH_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

/* `match` of an allocation that is never freed. */
#define CUH_TRACE_NO_MATCH SIZE_MAX

typedef enum cuh_trace_kind_e {
    CUH_TRACE_ALLOC = 0,
    CUH_TRACE_FREE = 1
} cuh_trace_kind_t;

typedef enum cuh_trace_format_e {
    CUH_TRACE_FORMAT_V1 = 0,      /* "a <t_us> <id> <size> <stream>" / "f <t_us> <id>" */
    CUH_TRACE_FORMAT_RMM_CSV = 1  /* Thread,Time,Action,Pointer,Size,Stream */
} cuh_trace_format_t;

typedef struct cuh_trace_event_s {
    uint64_t t_us;     /* microseconds since the trace began */
    uint64_t id;       /* the allocation's id (RMM: a fresh number per allocation) */
    uint64_t size;     /* bytes requested; for a free, those of its allocation */
    uint64_t stream;   /* stream of the record; a v1 free takes its allocation's.
                        * RMM streams are renumbered: 0 for 0x0, then 1, 2, ... */
    size_t match;      /* free: index of its allocation event; allocation: index
                        * of its free, CUH_TRACE_NO_MATCH when never freed */
    uint32_t line;     /* line of the file the event came from (1-based) */
    uint8_t kind;      /* cuh_trace_kind_t */
} cuh_trace_event_t;

/* What the recording run measured of PyTorch's own allocator modes on the
 * same job ("# pytorch mode=M peak_reserved=B peak_allocated=B total_ms=T":
 * the corpus's traces carry one line per mode, bench/corpus/record.py). */
typedef enum cuh_trace_mode_e {
    CUH_TRACE_MODE_NATIVE = 0,      /* PyTorch's caching allocator, default settings */
    CUH_TRACE_MODE_EXPANDABLE,      /* expandable_segments:True */
    CUH_TRACE_MODE_ASYNC,           /* backend:cudaMallocAsync */
    CUH_TRACE_NUM_MODES
} cuh_trace_mode_t;

typedef struct cuh_trace_measured_s {
    int present;                /* the trace carries this mode's line */
    uint64_t peak_reserved;     /* PyTorch's max_memory_reserved() */
    uint64_t peak_allocated;    /* PyTorch's max_memory_allocated() */
    double total_ms;            /* every step after the first, each synchronized */
} cuh_trace_measured_t;

typedef struct cuh_trace_s {
    char *path;                 /* the file name as given to cuh_trace_load */
    char *description;          /* first comment line without "# " ("" if none) */
    cuh_trace_format_t format;
    int compressed;             /* 1 when the file is gzip-compressed */
    cuh_trace_event_t *events;
    size_t num_events;
    size_t num_allocs;
    size_t num_frees;
    size_t num_skipped;         /* RMM "allocate failure" rows, not replayed */
    size_t live_at_end;         /* allocations never freed */
    uint64_t peak_live;         /* most requested bytes live at once */
    size_t peak_live_event;     /* index of the event that reached it */
    uint64_t pytorch_peak_reserved; /* from the last comment line, 0 if absent */
    int unfinished;             /* written by trace:PATH but without its closing "# end"
                                 * line: the program stopped before it exited normally
                                 * (killed, crashed), so the trace holds only what it
                                 * recorded until then */
    uint32_t cut_line;          /* of such a trace: its last line, cut short without a
                                 * newline and left out (0: none) */
    cuh_trace_measured_t measured[CUH_TRACE_NUM_MODES];
    char job[64];               /* "# corpus job=NAME way=WAY ...": "" if absent */
    char way[16];               /* "plugin" or "preload" */
    int pytorch_cache;          /* "pytorch_cache=on|off" there: 1, 0; -1 when not said */
    size_t num_marks;           /* "# mark T LABEL" lines (cuheap_trace_mark): the steps' starts */
    size_t *mark_events;        /* for each mark, the events before it (num_marks of them) */
} cuh_trace_t;

/* Reads the trace at `path` (format detected from the first non-empty line,
 * gzip detected from the magic bytes). Returns 0, or -1 with a message
 * "path:line: problem" in err and *out left empty (safe to cuh_trace_free). */
int cuh_trace_load(const char *path, cuh_trace_t *out, char *err, size_t errlen);

/* Frees what cuh_trace_load allocated and zeroes *trace. */
void cuh_trace_free(cuh_trace_t *trace);

/* "native", "expandable" or "async". */
const char *cuh_trace_mode_name(cuh_trace_mode_t mode);

/* "alloc" or "free". */
const char *cuh_trace_kind_name(cuh_trace_kind_t kind);

#endif /* CUH_TRACE_READ_H */
