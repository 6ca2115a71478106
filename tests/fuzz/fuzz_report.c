/* fuzz_report.c - any bytes as a JSON report given to cuheap-report: read,
 * checked, and rendered as text, HTML and JSON, compared with itself and
 * merged with itself; it must render or refuse with a message, never crash
 * or read out of bounds. The tool's own sources are compiled in, its main()
 * renamed. Built with clang's -fsanitize=fuzzer by `make fuzz`; with
 * FUZZ_MAIN it replays files and folders (tests/fuzz/corpus/report). */
int cuheap_report_main(int argc, char **argv);
#define main cuheap_report_main
#include "../../src/tools/report.c"
#undef main
#include "../../src/tools/report_check.c"
#include "../../src/tools/report_read.c"
#include "../../src/tools/report_render.c"

#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *path = fuzz_input_file(data, size, "report");
    char *runs[][7] = {
        {"cuheap-report", "--text", path, "-o", "/dev/null", NULL, NULL},
        {"cuheap-report", "--html", path, "-o", "/dev/null", NULL, NULL},
        {"cuheap-report", "--json", path, "-o", "/dev/null", NULL, NULL},
        {"cuheap-report", "--compare", path, path, "-o", "/dev/null", NULL},
        {"cuheap-report", "--merge", path, path, "-o", "/dev/null", NULL},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int argc = 0;
        while (runs[i][argc])
            argc++;
        int rc = cuheap_report_main(argc, runs[i]);
        if (rc != 0 && rc != 1)
            abort();   /* 0 written, 1 refused with a message */
    }
    unlink(path);
    return 0;
}

#ifdef FUZZ_MAIN
#include "fuzz_main.h"
#endif
