/* fuzz_file.h - for fuzz targets whose code under test reads a file: writes
 * the input to a file of this process's own and returns its name (the same
 * name each time, so no file is left behind but the last). */
#ifndef CUH_FUZZ_FILE_H
#define CUH_FUZZ_FILE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char *fuzz_input_file(const uint8_t *data, size_t size, const char *name)
{
    static char path[128];
    snprintf(path, sizeof path, "/tmp/cuheap-fuzz-%s.%d", name, (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    return path;
}
#endif
