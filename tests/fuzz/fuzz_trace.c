/* fuzz_trace.c - any bytes as a trace file: cuh_trace_load must load them or
 * refuse them with a message, never crash, leak or read out of bounds
 * (cuheap's trace format, plain or gzip, and RMM's CSV are all tried, by
 * their first bytes). Built with clang's -fsanitize=fuzzer by `make fuzz`;
 * with FUZZ_MAIN it replays files and folders (tests/fuzz/corpus/trace). */
#include "fuzz_file.h"
#include "trace_read.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_input_file(data, size, "trace");
    cuh_trace_t trace;
    char err[512];
    if (cuh_trace_load(path, &trace, err, sizeof err) == 0) {
        /* Loaded: every free matches its allocation, both ways. */
        for (size_t i = 0; i < trace.num_events; i++) {
            const cuh_trace_event_t *e = &trace.events[i];
            if (e->match == CUH_TRACE_NO_MATCH)
                continue;
            if (e->match >= trace.num_events || trace.events[e->match].match != i ||
                trace.events[e->match].kind == e->kind)
                abort();
        }
    }
    cuh_trace_free(&trace);
    unlink(path);
    return 0;
}

#ifdef FUZZ_MAIN
#include "fuzz_main.h"
#endif
