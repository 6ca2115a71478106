/* launch.c - `cuheap`, the launcher: runs any command with cuheap in it.
 *
 *   cuheap [--conf KEY:VALUE,...] [--report PATH] [--torch] -- COMMAND [ARGS...]
 *
 * Without --torch the command runs with libcuheap.so first in LD_PRELOAD, so
 * cuheap serves its CUDA allocations; with --torch cuheap becomes PyTorch's
 * allocator by environment alone (CUHEAP_TORCH=1, CUHEAP_LIB, and the Python
 * helper's folder, whose sitecustomize installs it when torch is imported).
 * Everything passes through the environment, so children inherit it: under
 * `torchrun` every rank gets cuheap.
 *
 * The library is found beside the launcher: ../lib/libcuheap.so where `make
 * install` put both, else libcuheap.so in the same folder (the build tree);
 * CUHEAP_LIB overrides. Settings are checked here by the library's own parser
 * (src/config.c), so a bad one stops before the command starts, with the
 * message the library would give; a bad command line, a missing library or
 * helper exits with status 2, a command that cannot be run with 127 (not
 * found) or 126, as env(1) does.
 */
#define PROG "cuheap"
#include "cli.h"
#include "common.h"
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(void)
{
    printf("usage: cuheap [--conf KEY:VALUE,...] [--report PATH] [--torch] -- COMMAND [ARGS...]\n"
           "\n"
           "Runs COMMAND with cuheap serving its CUDA device memory.\n"
           "\n"
           "  --conf STRING   settings, CUHEAP_CONF syntax (key:value,...); added after any\n"
           "                  CUHEAP_CONF already set, so a key given twice takes the last value.\n"
           "                  A bad setting is refused before COMMAND starts. May be repeated.\n"
           "  --report PATH   write a report at every out-of-memory, at exit and on SIGUSR1\n"
           "                  (report:PATH; .json or .html for those forms, %%p = process id)\n"
           "  --torch         make cuheap PyTorch's CUDA allocator (CUHEAP_TORCH=1 and the\n"
           "                  Python helper on PYTHONPATH) instead of preloading it\n"
           "  --help          print this and exit\n"
           "\n"
           "Without --torch, libcuheap.so goes first in LD_PRELOAD. The library is the one\n"
           "beside this program (../lib/libcuheap.so, or libcuheap.so in its own folder), or\n"
           "CUHEAP_LIB. Children inherit all of it: `cuheap --torch -- torchrun ...` reaches\n"
           "every rank.\n"
           "\n"
           "Exit status: COMMAND's; 2 for a bad command line, setting or missing library;\n"
           "127 if COMMAND is not found, 126 if it cannot be run.\n");
}

/* ---- where things are ------------------------------------------------------ */

/* The folder of this executable, from /proc/self/exe. */
static void own_folder(char *out, size_t len)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, PROG ": cannot read /proc/self/exe (%s): set CUHEAP_LIB to libcuheap.so\n", strerror(errno));
        exit(2);
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    *slash = '\0';
    snprintf(out, len, "%s", exe);
}

/* The first of `candidates` (relative to `folder`) that exists, made
 * absolute into out; 0 if none does, with the ones tried in `tried`. */
static int find_beside(const char *folder, const char *const *candidates, char *out, char *tried, size_t len)
{
    tried[0] = '\0';
    for (size_t i = 0; candidates[i]; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/%s", folder, candidates[i]);
        if (realpath(path, out))
            return 1;
        size_t used = strlen(tried);
        snprintf(tried + used, len - used, "%s%s", used ? " or " : "", path);
    }
    return 0;
}

static void find_library(const char *folder, char *out)
{
    const char *env = getenv("CUHEAP_LIB");
    if (env && *env) {
        if (!realpath(env, out)) {
            fprintf(stderr, PROG ": CUHEAP_LIB=%s: %s\n", env, strerror(errno));
            exit(2);
        }
        return;
    }
    static const char *const candidates[] = {"../lib/libcuheap.so", "libcuheap.so", NULL};
    char tried[2 * PATH_MAX + 128];
    if (!find_beside(folder, candidates, out, tried, sizeof tried)) {
        fprintf(stderr, PROG ": libcuheap.so not found (looked for %s); build it with make, or set CUHEAP_LIB\n", tried);
        exit(2);
    }
}

/* The folder of the Python helper (sitecustomize.py, the cuheap package):
 * where `make install` puts it, or scripts/ of the source tree. */
static void find_python_helper(const char *folder, char *out)
{
    static const char *const candidates[] = {"../share/cuheap/python/sitecustomize.py", "../scripts/sitecustomize.py",
                                             NULL};
    char tried[2 * PATH_MAX + 128];
    if (!find_beside(folder, candidates, out, tried, sizeof tried)) {
        fprintf(stderr, PROG ": --torch: the Python helper is not installed (looked for %s)\n", tried);
        exit(2);
    }
    *strrchr(out, '/') = '\0';
}

/* ---- the environment -------------------------------------------------------- */

/* Sets NAME to FIRST, followed by SEPARATOR and NAME's current value if it
 * has one. */
static void prepend(const char *name, const char *first, char separator)
{
    const char *old = getenv(name);
    size_t len = strlen(first) + (old ? strlen(old) : 0) + 2;
    char *value = malloc(len);
    if (!value) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(2);
    }
    if (old && *old)
        snprintf(value, len, "%s%c%s", first, separator, old);
    else
        snprintf(value, len, "%s", first);
    setenv(name, value, 1);
    free(value);
}

/* Appends ",piece" (or "piece") to the malloc'ed string *text. */
static void append_setting(char **text, const char *piece)
{
    size_t old = *text ? strlen(*text) : 0;
    char *grown = realloc(*text, old + strlen(piece) + 2);
    if (!grown) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(2);
    }
    snprintf(grown + old, strlen(piece) + 2, "%s%s", old ? "," : "", piece);
    *text = grown;
}

/* ---- the command line ------------------------------------------------------- */

/* The value of option `name` at argv[*i]: "--name=VALUE" or "--name VALUE". */
static const char *option_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (*i + 1 >= argc || !strcmp(argv[*i + 1], "--"))
        usage_error("%s needs a value", name);
    return argv[++*i];
}

static int is_option(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return !strncmp(arg, name, n) && (arg[n] == '\0' || arg[n] == '=');
}

int main(int argc, char **argv)
{
    char *conf = NULL;
    const char *env_conf = getenv("CUHEAP_CONF");
    if (env_conf && *env_conf)
        append_setting(&conf, env_conf);
    int torch = 0, command = 0;
    for (int i = 1; i < argc && !command; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--")) {
            command = i + 1;
            if (command >= argc)
                usage_error("no command after '--'");
        } else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage();
            return 0;
        } else if (!strcmp(arg, "--torch")) {
            torch = 1;
        } else if (is_option(arg, "--conf")) {
            const char *value = option_value(argc, argv, &i, "--conf");
            if (*value)
                append_setting(&conf, value);
        } else if (is_option(arg, "--report")) {
            const char *path = option_value(argc, argv, &i, "--report");
            if (!*path)
                usage_error("--report needs a path");
            if (strchr(path, ','))
                usage_error("--report %s: a report path may not contain ',' (it separates CUHEAP_CONF settings)", path);
            char setting[PATH_MAX + 16];
            if ((size_t)snprintf(setting, sizeof setting, "report:%s", path) >= sizeof setting)
                usage_error("--report: the path is too long");
            append_setting(&conf, setting);
        } else if (arg[0] == '-') {
            usage_error("unknown option '%s'", arg);
        } else {
            usage_error("no '--' before the command '%s' (cuheap [OPTIONS] -- COMMAND [ARGS...])", arg);
        }
    }
    if (!command)
        usage_error("no command (cuheap [OPTIONS] -- COMMAND [ARGS...])");

    /* The library's own check, with its own words: the program would stop
     * with this message at its first allocation. */
    if (conf) {
        cuh_config_t cfg;
        char err[1024];
        cuh_config_defaults(&cfg);
        int bad = cuh_config_parse(conf, &cfg, err, sizeof err);
        if (bad)
            cuh_log("CUHEAP_CONF=\"%s\": %s", conf, err);
        else
            setenv("CUHEAP_CONF", conf, 1);
        free(conf);
        if (bad)
            return 2;
    }

    char folder[PATH_MAX], lib[PATH_MAX];
    own_folder(folder, sizeof folder);
    find_library(folder, lib);
    if (torch) {
        char helper[PATH_MAX];
        find_python_helper(folder, helper);
        setenv("CUHEAP_TORCH", "1", 1);
        setenv("CUHEAP_LIB", lib, 1);
        prepend("PYTHONPATH", helper, ':');
    } else {
        prepend("LD_PRELOAD", lib, ':');
    }

    execvp(argv[command], argv + command);
    int e = errno;
    fprintf(stderr, PROG ": %s: %s\n", argv[command], strerror(e));
    return e == ENOENT || e == ENOTDIR ? 127 : 126;
}
