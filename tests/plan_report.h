/* plan_report.h - what cuheap's text report says of step plans, for the
 * programs that run under LD_PRELOAD and cannot see the heap
 * (tests/preload/runtime_checks.c on the fake CUDA libraries,
 * tests/gpu/preload_stress.cu on a GPU): the report is dumped through the
 * preloaded cuheap_dump_report and its "step plans" and "steps found" lines
 * read back. Plain C that nvcc's C++ compiles too.
 */
#ifndef CUH_TEST_PLAN_REPORT_H
#define CUH_TEST_PLAN_REPORT_H

#include <cuheap.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Plans made and blocks placed by them (*made, *placed), and whether the
 * steps were found in the allocations (*found): 0, or -1 when no report
 * could be written or it has no step plans line (step_plan:1 not set). */
static inline int plan_report_figures(long *made, long *placed, int *found)
{
    cuheap_status_t (*dump)(const char *, cuheap_report_format_t) =
        (cuheap_status_t (*)(const char *, cuheap_report_format_t))dlsym(RTLD_DEFAULT, "cuheap_dump_report");
    char path[] = "/tmp/cuheap_plan_report_XXXXXX";
    int fd = dump ? mkstemp(path) : -1, rc = -1;
    *made = *placed = 0;
    *found = 0;
    if (fd < 0)
        return -1;
    close(fd);
    FILE *f = dump(path, CUHEAP_REPORT_TEXT) == CUHEAP_OK ? fopen(path, "r") : NULL;
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "step plans (step_plan:1): "), *semi = at ? strstr(at, "; ") : NULL;
        if (at && semi && sscanf(at, "step plans (step_plan:1): %ld made", made) == 1 &&
            sscanf(semi, "; %ld blocks placed", placed) == 1)
            rc = 0;
        *found |= strstr(line, "steps found in the allocations") != NULL;
    }
    if (f)
        fclose(f);
    unlink(path);
    return rc;
}

#endif
