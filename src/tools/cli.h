/* cli.h - what the command-line tools share: a usage error prints the
 * problem and a pointer to --help, and exits with status 2. A tool defines
 * PROG (its name) before including this header.
 */
#ifndef CUH_TOOLS_CLI_H
#define CUH_TOOLS_CLI_H

#ifndef PROG
#error "define PROG (the tool's name) before including cli.h"
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((format(printf, 1, 2), noreturn))
static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '" PROG " --help'.\n");
    exit(2);
}

#endif /* CUH_TOOLS_CLI_H */
