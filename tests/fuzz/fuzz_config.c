/* fuzz_config.c - any bytes as CUHEAP_CONF: cuh_config_parse must take them
 * or refuse them with a message naming the problem, never crash; settings it
 * takes are written back out and parse again to the same values. Built with
 * clang's -fsanitize=fuzzer by `make fuzz`; with FUZZ_MAIN it replays files
 * and folders (tests/fuzz/corpus/config). */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        abort();
    memcpy(text, data, size);
    text[size] = '\0';
    cuh_config_t cfg, again;
    char err[512] = "", out[4096];
    cuh_config_defaults(&cfg);
    if (cuh_config_parse(text, &cfg, err, sizeof err) == 0) {
        (void)cuh_config_limit(&cfg, (size_t)80 << 30);
        cuh_config_format(&cfg, out, sizeof out);
        cuh_config_defaults(&again);
        char out2[4096];
        if (cuh_config_parse(out, &again, err, sizeof err) != 0)
            abort();   /* what it writes, it reads */
        cuh_config_format(&again, out2, sizeof out2);
        if (strcmp(out, out2) != 0)
            abort();
    } else if (!err[0]) {
        abort();   /* a refusal always says why */
    }
    free(text);
    return 0;
}

#ifdef FUZZ_MAIN
#include "fuzz_main.h"
#endif
