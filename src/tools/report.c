/* report.c - cuheap-report: renders a JSON report again, compares two, or
 * merges many (one per rank of a distributed job).
 *
 * A JSON report (include/cuheap_report.schema.json, version 1) carries every
 * field of the heap snapshots it was rendered from. cuheap-report reads one
 * back into cuh_heap_snapshot_t, field by field, and renders it with the
 * library's own renderers and the report's own pid and time, so the text or
 * HTML it prints is the one the program would have written at that moment,
 * and --json reproduces the file itself. --compare reads two reports and
 * sets them side by side per device (matched by device number): the byte
 * statistics, the counters, the fragmentation figures and the cause of any
 * out-of-memory, with the difference and the ratio B/A, as text or JSON.
 * --merge reads any number of reports (report:/tmp/r-%p.json under torchrun:
 * one per rank) and sets every (report, device) in one table: peak live,
 * peak reserved and their ratio, reserved now, out-of-memory count and
 * cause, with the sums, the rank that reserved most and every
 * out-of-memory named.
 *
 * The optional "pinned_host" (the pinned host memory cache's statistics,
 * present when the process used it) and "callers" (device memory by the
 * library that asked for it, under LD_PRELOAD) are read back too and
 * rendered after the devices; --compare and --merge look at the devices
 * only.
 *
 * Every field the schema requires must be there with the right type: a
 * missing or wrong one is named by its JSON path
 * ("devices[0].stats.reserved.peak: missing").
 *
 * Exit status: 0 done; 1 unreadable file, malformed JSON (file:line:column),
 * not a cuheap report, missing or wrong field, output not written; 2 usage
 * error.
 *
 * This file holds the command line; the tool's other parts, over
 * report_tool.h: report_read.c (reading), report_check.c (checking),
 * report_render.c (rendering).
 */
#include "report_tool.h"

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef enum { FORMAT_TEXT, FORMAT_HTML, FORMAT_JSON } format_t;

typedef struct options_s {
    format_t format;
    const char *format_option;    /* the option that chose it; NULL for the default */
    int compare;
    int merge;
    const char *output;           /* -o; NULL = standard output */
    const char **files;           /* room for argc names */
    int num_files;
} options_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--text|--html|--json] REPORT.json [-o OUT]\n"
            "       " PROG " --compare [--json] A.json B.json [-o OUT]\n"
            "       " PROG " --merge [--json] R1.json R2.json... [-o OUT]\n"
            "\n"
            "Reads a cuheap JSON report (report:PATH.json, cuheap_dump_report with\n"
            "CUHEAP_REPORT_JSON, cuheap-replay --report PATH.json) and renders it again\n"
            "as text (the default), as one self-contained HTML page or as JSON: the\n"
            "same report cuheap would have written, with the original pid and time.\n"
            "With --compare, sets two reports side by side per device: current and\n"
            "peak bytes, counters, fragmentation, peak reserved / peak live and the\n"
            "out-of-memory cause, with B - A and B / A.\n"
            "\n"
            "options:\n"
            "  --text             text, like the report:PATH.txt form (default)\n"
            "  --html             one HTML page: no network, no other file\n"
            "  --json             JSON (with --compare: the comparison as one object)\n"
            "  --compare          compare two reports, A then B\n"
            "  --merge            one table of many reports (one per rank or\n"
            "                     process): peaks, ratio, out-of-memory, sums\n"
            "  -o, --output OUT   write to OUT instead of standard output\n"
            "  -h, --help         this text\n"
            "\n"
            "REPORT may be - for standard input.\n"
            "\n"
            "exit status: 0 done, 1 unreadable or invalid report (the message names\n"
            "file:line:column or the field's JSON path), 2 usage error\n");
}

static void set_format(options_t *o, format_t format, const char *option)
{
    if (o->format_option && o->format != format)
        usage_error("%s and %s cannot be used together", o->format_option, option);
    o->format = format;
    o->format_option = option;
}

static void parse_options(int argc, char **argv, options_t *o)
{
    memset(o, 0, sizeof *o);
    o->format = FORMAT_TEXT;
    o->files = calloc((size_t)argc, sizeof *o->files);
    if (!o->files) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    int only_files = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_files || a[0] != '-' || a[1] == '\0') {
            o->files[o->num_files++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_files = 1;
        } else if (strcmp(a, "--text") == 0) {
            set_format(o, FORMAT_TEXT, "--text");
        } else if (strcmp(a, "--html") == 0) {
            set_format(o, FORMAT_HTML, "--html");
        } else if (strcmp(a, "--json") == 0) {
            set_format(o, FORMAT_JSON, "--json");
        } else if (strcmp(a, "--compare") == 0) {
            o->compare = 1;
        } else if (strcmp(a, "--merge") == 0) {
            o->merge = 1;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            if (i + 1 >= argc)
                usage_error("option '%s' needs a value (a file name)", a);
            o->output = argv[++i];
        } else if (strncmp(a, "--output=", 9) == 0) {
            o->output = a + 9;
        } else if (strncmp(a, "-o", 2) == 0) {
            o->output = a + 2;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else {
            const char *eq = strchr(a, '=');
            if (eq && a[1] == '-') {
                size_t n = (size_t)(eq - a);
                static const char *const flags[] = {"--text", "--html", "--json", "--compare", "--merge", "--help"};
                for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
                    if (strlen(flags[k]) == n && strncmp(a, flags[k], n) == 0)
                        usage_error("option '%s' takes no value", flags[k]);
            }
            usage_error("unknown option '%s'", a);
        }
    }
    if (o->output && !o->output[0])
        usage_error("-o needs a file name");
    if (o->compare && o->merge)
        usage_error("--compare and --merge: one or the other");
    if (o->merge) {
        if (o->format == FORMAT_HTML)
            usage_error("--merge writes text, or JSON with --json: not --html");
        if (o->num_files < 2)
            usage_error("--merge needs two reports or more (%d given)", o->num_files);
        int stdin_files = 0;
        for (int i = 0; i < o->num_files; i++)
            stdin_files += strcmp(o->files[i], "-") == 0;
        if (stdin_files > 1)
            usage_error("only one of the reports can be standard input");
    } else if (o->compare) {
        if (o->format == FORMAT_HTML)
            usage_error("--compare writes text, or JSON with --json: not --html");
        if (o->num_files != 2)
            usage_error("--compare needs two reports, A.json and B.json (%d given)", o->num_files);
    } else {
        if (o->num_files == 0)
            usage_error("no report given");
        if (o->num_files > 1)
            usage_error("one report at a time ('%s' and '%s'); --compare compares two, --merge many", o->files[0],
                        o->files[1]);
    }
}

int main(int argc, char **argv)
{
    options_t o;
    parse_options(argc, argv, &o);
    if (o.compare && strcmp(o.files[0], "-") == 0 && strcmp(o.files[1], "-") == 0)
        usage_error("only one of the two reports can be standard input");

    report_t *reps = calloc((size_t)(o.num_files ? o.num_files : 1), sizeof *reps);
    if (!reps) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    int loaded = 0, rc = 0;
    for (int i = 0; i < o.num_files && rc == 0; i++) {
        if (report_load(o.files[i], &reps[i]) != 0)
            rc = 1;
        loaded = i + 1;
    }
    if (rc == 0 && o.compare && (check_unique_devices(&reps[0]) != 0 || check_unique_devices(&reps[1]) != 0))
        rc = 1;
    size_t num_devices = 0;
    int *devices = NULL;
    if (rc == 0 && o.compare && !(devices = device_union(&reps[0], &reps[1], &num_devices))) {
        fprintf(stderr, PROG ": out of memory\n");
        rc = 1;
    }
    FILE *out = rc == 0 ? open_output(o.output) : NULL;
    if (rc == 0 && !out)
        rc = 1;
    if (out) {
        const cuh_report_extra_t extra = report_extra(&reps[0]);
        if (o.merge && o.format == FORMAT_JSON)
            merge_json(out, reps, o.num_files);
        else if (o.merge)
            merge_text(out, reps, o.num_files);
        else if (o.compare && o.format == FORMAT_JSON)
            compare_json(out, &reps[0], &reps[1], devices, num_devices);
        else if (o.compare)
            compare_text(out, &reps[0], &reps[1], devices, num_devices);
        else if (o.format == FORMAT_JSON)
            cuh_report_json(out, reps[0].origin, reps[0].snaps, reps[0].num_snaps, &extra);
        else if (o.format == FORMAT_HTML)
            cuh_report_html(out, reps[0].origin, reps[0].snaps, reps[0].num_snaps, &extra);
        else
            cuh_report_text(out, reps[0].origin, reps[0].snaps, reps[0].num_snaps, &extra);
        if (close_output(out, o.output) != 0)
            rc = 1;
    }
    free(devices);
    for (int i = 0; i < loaded; i++)
        report_free(&reps[i]);
    free(reps);
    free(o.files);
    return rc;
}
