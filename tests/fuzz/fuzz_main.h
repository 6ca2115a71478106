/* fuzz_main.h - a main() for a fuzz target built without libFuzzer: runs
 * LLVMFuzzerTestOneInput on every file named on the command line, and on
 * every file of every folder named there (a corpus). Included at the end of
 * a target when FUZZ_MAIN is defined; `make test` replays tests/fuzz/corpus
 * this way, under the sanitizers, without needing clang. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static int fuzz_run_file(const char *path)
{
    fprintf(stderr, "input %s\n", path);   /* the last one named before a failure broke the rule */
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int bad = 0, runs = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "%s: no such file or folder\n", argv[a]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad |= fuzz_run_file(argv[a]);
            runs++;
            continue;
        }
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            bad |= fuzz_run_file(path);
            runs++;
        }
        if (d)
            closedir(d);
    }
    printf("%s: %d inputs run\n", argv[0], runs);
    return bad;
}
