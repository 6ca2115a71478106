/* test_trace_read.c - tests of the trace reader (src/trace_read.c).
 *
 * Each test writes small trace files into a temporary directory (mkdtemp,
 * removed at the end) and loads them: good traces, plain and gzip-compressed,
 * an RMM logging-adaptor CSV, every kind of malformed input (the message must
 * name the file, the line and the problem), the peak of live bytes on a
 * hand-made trace, the traces bundled in bench/traces, whose counts are
 * checked against their own "# end allocs=... frees=..." line, and thousands
 * of randomly mutated traces (refused with a message, or loaded consistent).
 * Run from the repository root.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "trace_read.h"

#include <dirent.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char g_dir[64];

#define assert_contains(hay, needle)                                                   \
    do {                                                                               \
        if (!strstr((hay), (needle))) {                                                \
            print_error("message \"%s\" does not contain \"%s\"\n", (hay), (needle)); \
            fail();                                                                    \
        }                                                                              \
    } while (0)

static int group_setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/cuh_test_trace_read.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(g_dir);
    return 0;
}

static void path_of(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", g_dir, name);
}

static void write_plain(char *path, size_t len, const char *name, const char *text)
{
    path_of(path, len, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static void write_gz(char *path, size_t len, const char *name, const char *text)
{
    path_of(path, len, name);
    gzFile g = gzopen(path, "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, text, (unsigned)strlen(text)), (int)strlen(text));
    assert_int_equal(gzclose(g), Z_OK);
}

/* Loads `text` (a plain file) and expects an error on `line` containing
 * `needle`; the message must start with "path:line: ". */
static void expect_error_text(const char *name, const char *text, size_t line, const char *needle)
{
    char path[512], err[1024], prefix[600];
    cuh_trace_t t;
    write_plain(path, sizeof path, name, text);
    int rc = cuh_trace_load(path, &t, err, sizeof err);
    if (rc != -1)
        print_error("%s loaded but should have failed with \"%s\"\n", name, needle);
    assert_int_equal(rc, -1);
    snprintf(prefix, sizeof prefix, "%s:%zu: ", path, line);
    if (strncmp(err, prefix, strlen(prefix)) != 0) {
        print_error("message \"%s\" does not start with \"%s\"\n", err, prefix);
        fail();
    }
    assert_contains(err, needle);
    /* Nothing is kept of a trace that failed. */
    assert_null(t.events);
    assert_null(t.path);
    assert_int_equal(t.num_events, 0);
    cuh_trace_free(&t);
}

/* ---- good traces --------------------------------------------------------- */

static const char good_text[] =
    "# trace v1 source=unit-test model=tiny\n"
    "a 0 1 1000 0\n"
    "a 5 2 3000 7\n"
    "\n"
    "f 9 1\r\n"          /* CRLF line endings are accepted */
    "a 9 3 512 0\n"      /* same time as the previous event: fine */
    "# a comment in the middle\n"
    "f 12 2\n"
    "# end allocs=3 frees=2 live_at_end=1 pytorch_peak_reserved=8192";  /* no final newline */

static void check_good(const cuh_trace_t *t, const char *path, int compressed)
{
    assert_string_equal(t->path, path);
    assert_int_equal(t->format, CUH_TRACE_FORMAT_V1);
    assert_int_equal(t->compressed, compressed);
    assert_string_equal(t->description, "trace v1 source=unit-test model=tiny");
    assert_int_equal(t->num_events, 5);
    assert_int_equal(t->num_allocs, 3);
    assert_int_equal(t->num_frees, 2);
    assert_int_equal(t->live_at_end, 1);
    assert_int_equal(t->num_skipped, 0);
    assert_int_equal(t->pytorch_peak_reserved, 8192);
    assert_int_equal(t->peak_live, 4000);
    assert_int_equal(t->peak_live_event, 1);

    const cuh_trace_event_t *e = t->events;
    assert_int_equal(e[0].kind, CUH_TRACE_ALLOC);
    assert_int_equal(e[0].t_us, 0);
    assert_int_equal(e[0].id, 1);
    assert_int_equal(e[0].size, 1000);
    assert_int_equal(e[0].stream, 0);
    assert_int_equal(e[0].match, 2);
    assert_int_equal(e[0].line, 2);

    assert_int_equal(e[1].kind, CUH_TRACE_ALLOC);
    assert_int_equal(e[1].stream, 7);
    assert_int_equal(e[1].match, 4);

    assert_int_equal(e[2].kind, CUH_TRACE_FREE);
    assert_int_equal(e[2].t_us, 9);
    assert_int_equal(e[2].id, 1);
    assert_int_equal(e[2].match, 0);
    assert_int_equal(e[2].size, 1000);
    assert_int_equal(e[2].line, 5);

    assert_int_equal(e[3].kind, CUH_TRACE_ALLOC);
    assert_int_equal(e[3].match, CUH_TRACE_NO_MATCH);

    assert_int_equal(e[4].kind, CUH_TRACE_FREE);
    assert_int_equal(e[4].match, 1);
    assert_int_equal(e[4].stream, 7);   /* a free takes its allocation's stream */
    assert_int_equal(e[4].size, 3000);
    assert_int_equal(e[4].line, 8);
}

static void test_plain_good(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_plain(path, sizeof path, "good.trace", good_text);
    int rc = cuh_trace_load(path, &t, err, sizeof err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    check_good(&t, path, 0);
    cuh_trace_free(&t);
    assert_null(t.events);
    assert_null(t.path);
    cuh_trace_free(&t);   /* twice is harmless */
}

static void test_gzip_good(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_gz(path, sizeof path, "good.trace.gz", good_text);
    int rc = cuh_trace_load(path, &t, err, sizeof err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    check_good(&t, path, 1);
    cuh_trace_free(&t);
}

static void test_gzip_detected_by_magic(void **state)
{
    (void)state;
    /* A gzip file without .gz and a plain file with .gz both load. */
    char path[512], err[1024];
    cuh_trace_t t;
    write_gz(path, sizeof path, "compressed.txt", good_text);
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    assert_int_equal(t.compressed, 1);
    assert_int_equal(t.num_events, 5);
    cuh_trace_free(&t);
    write_plain(path, sizeof path, "plain.trace.gz", good_text);
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    assert_int_equal(t.compressed, 0);
    assert_int_equal(t.num_events, 5);
    cuh_trace_free(&t);
}

static void test_pytorch_peak_only_from_last_comment(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_plain(path, sizeof path, "noppr.trace", "# first\na 1 1 10 0\n# end allocs=1 frees=0\n");
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    assert_int_equal(t.pytorch_peak_reserved, 0);
    assert_string_equal(t.description, "first");
    cuh_trace_free(&t);

    write_plain(path, sizeof path, "earlyppr.trace",
                "# first pytorch_peak_reserved=100\na 1 1 10 0\n# end allocs=1\n");
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    assert_int_equal(t.pytorch_peak_reserved, 0);
    cuh_trace_free(&t);

    write_plain(path, sizeof path, "nocomment.trace", "a 1 1 10 0\n");
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    assert_string_equal(t.description, "");
    assert_int_equal(t.pytorch_peak_reserved, 0);
    cuh_trace_free(&t);

    write_plain(path, sizeof path, "empty.trace", "");
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    assert_int_equal(t.num_events, 0);
    assert_int_equal(t.peak_live, 0);
    cuh_trace_free(&t);

    expect_error_text("badppr.trace", "# x\na 1 1 10 0\n# end pytorch_peak_reserved=12x\n", 3,
                      "bad pytorch_peak_reserved value '12x'");
}

/* The corpus's header lines (bench/corpus/record.py): which job and way,
 * PyTorch's three modes as measured when the trace was recorded, the marks
 * cuheap_trace_mark wrote; a malformed one names the line and the field. */
static void test_corpus_header_lines(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_plain(path, sizeof path, "corpus.trace",
                "# trace v1 source=cuheap-0.1.0 pid=1\n"
                "# corpus job=tiny_job way=preload pytorch_cache=off steps=2 seed=0\n"
                "# about a tiny job\n"
                "# pytorch mode=native peak_reserved=4096 peak_allocated=2048 total_ms=12.50 warm_up=yes steps_ms=1,2\n"
                "# pytorch mode=async peak_reserved=3072 peak_allocated=2000 total_ms=0\n"
                "a 1 0 1000 0\n# mark 2 step 0\nf 3 0\n# mark 4 step 1\n# mark 5 end\n"
                "# end allocs=1 frees=1 live_at_end=0\n");
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    assert_string_equal(t.job, "tiny_job");
    assert_string_equal(t.way, "preload");
    assert_int_equal(t.pytorch_cache, 0);
    assert_int_equal(t.num_marks, 3);
    assert_true(t.measured[CUH_TRACE_MODE_NATIVE].present);
    assert_int_equal(t.measured[CUH_TRACE_MODE_NATIVE].peak_reserved, 4096);
    assert_int_equal(t.measured[CUH_TRACE_MODE_NATIVE].peak_allocated, 2048);
    assert_float_equal(t.measured[CUH_TRACE_MODE_NATIVE].total_ms, 12.5, 1e-9);
    assert_false(t.measured[CUH_TRACE_MODE_EXPANDABLE].present);
    assert_int_equal(t.measured[CUH_TRACE_MODE_ASYNC].peak_reserved, 3072);
    assert_string_equal(cuh_trace_mode_name(CUH_TRACE_MODE_EXPANDABLE), "expandable");
    cuh_trace_free(&t);

    /* A trace from elsewhere says nothing of a job. */
    write_plain(path, sizeof path, "plain.trace", "a 1 0 10 0\n");
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), 0);
    assert_string_equal(t.job, "");
    assert_int_equal(t.pytorch_cache, -1);
    assert_int_equal(t.num_marks, 0);
    assert_false(t.measured[CUH_TRACE_MODE_NATIVE].present);
    cuh_trace_free(&t);

    expect_error_text("mode.trace", "# x\n# pytorch mode=fast peak_reserved=1 peak_allocated=1 total_ms=1\n", 2,
                      "without a known mode=");
    expect_error_text("twice.trace",
                      "# x\n# pytorch mode=async peak_reserved=1 peak_allocated=1 total_ms=1\n"
                      "# pytorch mode=async peak_reserved=2 peak_allocated=1 total_ms=1\n", 3,
                      "a second '# pytorch' line for mode async");
    expect_error_text("bytes.trace", "# x\na 1 0 10 0\n# pytorch mode=native peak_reserved=12G peak_allocated=1 total_ms=1\n",
                      3, "peak_reserved must be a number of bytes, not '12G'");
    expect_error_text("noalloc.trace", "# pytorch mode=native peak_reserved=1 total_ms=1\n", 1,
                      "peak_allocated must be a number of bytes, not ''");
    expect_error_text("ms.trace", "# pytorch mode=native peak_reserved=1 peak_allocated=1 total_ms=-3\n", 1,
                      "total_ms must be a number of milliseconds, not '-3'");
    expect_error_text("ms2.trace", "# pytorch mode=native peak_reserved=1 peak_allocated=1 total_ms=1.5x\n", 1,
                      "total_ms must be a number of milliseconds, not '1.5x'");
    expect_error_text("job.trace", "# corpus way=plugin\n", 1, "'# corpus' line needs job=NAME");
    expect_error_text("cache.trace", "# corpus job=j way=preload pytorch_cache=maybe\n", 1,
                      "pytorch_cache must be on or off, not 'maybe'");
}

static void test_peak_live(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_plain(path, sizeof path, "peak.trace",
                "# peak\n"
                "a 0 10 100 0\n"    /* 100 */
                "a 1 11 200 0\n"    /* 300 */
                "f 2 10\n"          /* 200 */
                "a 3 12 50 0\n"     /* 250 */
                "a 4 13 400 1\n"    /* 650: the peak, event 4 */
                "f 5 11\n"          /* 450 */
                "f 6 13\n"          /* 50 */
                "a 7 14 599 0\n"    /* 649: just under */
                "f 8 14\n"          /* 50 */
                "a 9 10 300 0\n");  /* id 10 again after its free: 350 */
    int rc = cuh_trace_load(path, &t, err, sizeof err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(t.peak_live, 650);
    assert_int_equal(t.peak_live_event, 4);
    assert_int_equal(t.num_allocs, 6);
    assert_int_equal(t.num_frees, 4);
    assert_int_equal(t.live_at_end, 2);
    /* The reused id pairs with nothing yet; the first id 10 with event 2. */
    assert_int_equal(t.events[0].match, 2);
    assert_int_equal(t.events[9].match, CUH_TRACE_NO_MATCH);
    cuh_trace_free(&t);
}

static void test_long_lines_and_crlf_csv(void **state)
{
    (void)state;
    /* A comment far longer than the reader's buffer, then records. */
    size_t n = 300000;
    char *text = malloc(n + 64);
    assert_non_null(text);
    text[0] = '#';
    memset(text + 1, 'x', n - 1);
    snprintf(text + n, 64, "\na 1 1 10 0\nf 2 1\n");
    char path[512], err[1024];
    cuh_trace_t t;
    write_gz(path, sizeof path, "long.trace.gz", text);
    free(text);
    int rc = cuh_trace_load(path, &t, err, sizeof err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(strlen(t.description), n - 1);
    assert_int_equal(t.num_events, 2);
    assert_int_equal(t.events[1].line, 3);
    cuh_trace_free(&t);

    /* An RMM log written on Windows: byte order mark and CRLF. */
    write_plain(path, sizeof path, "crlf.csv",
                "\xef\xbb\xbfThread,Time,Action,Pointer,Size,Stream\r\n"
                "1,10:00:00.000000,allocate,0x200,64,0x0\r\n"
                "1,10:00:00.000010,free,0x200,64,0x0\r\n");
    rc = cuh_trace_load(path, &t, err, sizeof err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(t.format, CUH_TRACE_FORMAT_RMM_CSV);
    assert_int_equal(t.num_events, 2);
    assert_int_equal(t.events[1].t_us, 10);
    cuh_trace_free(&t);
}

/* ---- malformed v1 ------------------------------------------------------- */

static void test_error_unknown_kind(void **state)
{
    (void)state;
    expect_error_text("kind.trace", "# x\na 1 1 10 0\nx 2 1\n", 3, "unknown record kind 'x'");
    expect_error_text("kind2.trace", "alloc 1 1 10 0\n", 1, "unknown record kind 'alloc'");
}

static void test_error_missing_field(void **state)
{
    (void)state;
    expect_error_text("miss1.trace", "# x\na 1 1 10\n", 2, "missing stream field in allocation record");
    expect_error_text("miss2.trace", "a 1 1 10 0\nf 2\n", 2, "missing id field in free record");
    expect_error_text("miss3.trace", "a\n", 1, "missing t_us field");
}

static void test_error_not_numeric(void **state)
{
    (void)state;
    expect_error_text("num1.trace", "a 1 abc 10 0\n", 1, "id field 'abc' is not a non-negative integer");
    expect_error_text("num2.trace", "a 1 1 10 0\nf 1.5 1\n", 2, "t_us field '1.5' is not");
    expect_error_text("num3.trace", "a 1 1 12k 0\n", 1, "size field '12k' is not");
    expect_error_text("num4.trace", "a 1 1 10 -1\n", 1, "stream field '-1' is not");
    expect_error_text("num5.trace", "a 1 1 99999999999999999999 0\n", 1, "size field '99999999999999999999' is out of range");
    /* Bytes a terminal would act on come back escaped. */
    expect_error_text("num6.trace", "a 1 1 1\r0 0\n", 1, "size field '1\\r0' is not");
    expect_error_text("num7.trace", "a 1 1 10 \xff\n", 1, "stream field '\\xff' is not");
}

static void test_error_trailing_garbage(void **state)
{
    (void)state;
    expect_error_text("trail1.trace", "a 1 1 10 0 extra\n", 1, "trailing garbage 'extra' after allocation record");
    expect_error_text("trail2.trace", "a 1 1 10 0\nf 2 1 0\n", 2, "trailing garbage '0' after free record");
}

static void test_error_size(void **state)
{
    (void)state;
    expect_error_text("size0.trace", "# x\n# y\na 1 1 0 0\n", 3, "size 0 is not positive");
    expect_error_text("sizeneg.trace", "a 1 1 -5 0\n", 1, "size -5 is not positive");
}

static void test_error_double_alloc(void **state)
{
    (void)state;
    expect_error_text("dup.trace", "a 1 77 10 0\na 2 78 10 0\na 3 77 20 0\n", 3,
                      "id 77 allocated again while live (allocated on line 1)");
}

static void test_error_bad_free(void **state)
{
    (void)state;
    expect_error_text("never.trace", "a 1 1 10 0\nf 2 77\n", 2, "free of id 77 which is not live");
    expect_error_text("never2.trace", "a 1 1 10 0\nf 2 77\n", 2, "never allocated");
    expect_error_text("twice.trace", "a 1 77 10 0\nf 2 77\na 3 5 10 0\nf 4 77\n", 4,
                      "free of id 77 which is not live (already freed on line 2)");
}

static void test_error_time_backwards(void **state)
{
    (void)state;
    expect_error_text("time.trace", "a 100 1 10 0\na 200 2 10 0\nf 150 1\n", 3,
                      "time goes backwards: 150 us after 200 us on line 2");
}

static void test_error_open(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    path_of(path, sizeof path, "does-not-exist.trace.gz");
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), -1);
    assert_contains(err, path);
    assert_contains(err, "cannot open");
    assert_null(t.events);
}

/* A gzip file of `lines` allocation records. */
static void write_big_gz(char *path, size_t len, const char *name, int lines)
{
    size_t cap = (size_t)lines * 48 + 64, n = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    n += (size_t)snprintf(text + n, cap - n, "# big\n");
    for (int i = 0; i < lines; i++)
        n += (size_t)snprintf(text + n, cap - n, "a %d %d %d 0\n", i * 3, i, 512 + (i * 7919) % 100000);
    write_gz(path, len, name, text);
    free(text);
}

static long file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (long)st.st_size;
}

/* The line number in "path:N: ..." */
static long line_of(const char *err, const char *path)
{
    size_t pl = strlen(path);
    assert_int_equal(strncmp(err, path, pl), 0);
    assert_int_equal(err[pl], ':');
    return strtol(err + pl + 1, NULL, 10);
}

static void test_error_truncated_gzip(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_big_gz(path, sizeof path, "trunc.trace.gz", 20000);
    long size = file_size(path);
    assert_int_equal(truncate(path, size / 2), 0);
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), -1);
    assert_contains(err, "truncated gzip stream");
    long line = line_of(err, path);
    assert_true(line > 1 && line <= 20001);
    assert_null(t.events);
}

static void test_error_corrupt_gzip(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_big_gz(path, sizeof path, "crc.trace.gz", 5000);
    long size = file_size(path);
    /* Damage the CRC in the trailer: every line decodes, the check fails. */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, size - 8, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, size - 8, SEEK_SET), 0);
    fputc(c ^ 0xff, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(cuh_trace_load(path, &t, err, sizeof err), -1);
    assert_contains(err, "corrupt gzip stream");
    assert_true(line_of(err, path) > 1);
    assert_null(t.events);
}

/* ---- RMM CSV --------------------------------------------------------------- */

static void test_rmm_csv_good(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_plain(path, sizeof path, "rmm.csv",
                "Thread,Time,Action,Pointer,Size,Stream\n"
                "140202046379584,13:30:02.153812,allocate,0x7f1e84000000,1024,0x0\n"          /* 0 */
                "140202046379584,13:30:02.153900,allocate,0x7f1e84000400,4096,0x55d0c0a3e2b0\n" /* 1 */
                "140202046379584,13:30:02.2,allocate failure,0x0,99999999999,0x0\n"
                "140202046379584,13:30:03.000000,free,0x7f1e84000000,1024,0x0\n"               /* 2 */
                "140202046379584,13:30:03.000001,allocate,0x7f1e84000000,2048,0x55d0c0a3e9f0\n" /* 3 */
                "140202046379584,13:30:03.000002,allocate,7f1e84100000,100,55d0c0a3e2b0\n"     /* 4 */
                "140202046379584,13:30:03.5,deallocate,0x7f1e84000400,4096,0x55d0c0a3e2b0\n"    /* 5 */
                "140202046379584,13:30:04.000000,free,0x7f1e84000000,2048,0x55d0c0a3e9f0\n");  /* 6 */
    int rc = cuh_trace_load(path, &t, err, sizeof err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(t.format, CUH_TRACE_FORMAT_RMM_CSV);
    assert_int_equal(t.num_events, 7);
    assert_int_equal(t.num_allocs, 4);
    assert_int_equal(t.num_frees, 3);
    assert_int_equal(t.num_skipped, 1);
    assert_int_equal(t.live_at_end, 1);
    assert_int_equal(t.pytorch_peak_reserved, 0);
    assert_int_equal(t.peak_live, 4096 + 2048 + 100);
    assert_non_null(t.description);

    const cuh_trace_event_t *e = t.events;
    /* Time: microseconds since the first row. */
    assert_int_equal(e[0].t_us, 0);
    assert_int_equal(e[1].t_us, 88);
    assert_int_equal(e[2].t_us, 846188);
    assert_int_equal(e[3].t_us, 846189);
    assert_int_equal(e[5].t_us, 1346188);
    /* Streams renumbered in order of appearance; 0x0 stays 0. */
    assert_int_equal(e[0].stream, 0);
    assert_int_equal(e[1].stream, 1);
    assert_int_equal(e[3].stream, 2);
    assert_int_equal(e[4].stream, 1);
    /* Fresh ids: a reused pointer is a new allocation. */
    assert_int_equal(e[0].id, 0);
    assert_int_equal(e[1].id, 1);
    assert_int_equal(e[3].id, 2);
    assert_int_equal(e[4].id, 3);
    assert_int_equal(e[2].kind, CUH_TRACE_FREE);
    assert_int_equal(e[2].match, 0);
    assert_int_equal(e[2].id, 0);
    assert_int_equal(e[5].match, 1);
    assert_int_equal(e[6].match, 3);
    assert_int_equal(e[6].id, 2);
    assert_int_equal(e[6].size, 2048);
    assert_int_equal(e[4].match, CUH_TRACE_NO_MATCH);
    assert_int_equal(e[6].line, 9);
    cuh_trace_free(&t);
}

static void test_rmm_csv_midnight(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    write_gz(path, sizeof path, "midnight.csv.gz",
             "Thread,Time,Action,Pointer,Size,Stream\n"
             "1,23:59:59.999999,allocate,0x1000,10,0x0\n"
             "1,00:00:00.000001,free,0x1000,10,0x0\n");
    int rc = cuh_trace_load(path, &t, err, sizeof err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(t.compressed, 1);
    assert_int_equal(t.events[1].t_us, 2);
    cuh_trace_free(&t);
}

#define RMM_HDR "Thread,Time,Action,Pointer,Size,Stream\n"

static void test_rmm_csv_errors(void **state)
{
    (void)state;
    expect_error_text("rmm1.csv", RMM_HDR "1,13:30:02.1,allocate,0x10,8,0x0\n1,13:30:02.2,free,0x20,8,0x0\n", 3,
                      "free of pointer 0x20 which is not live");
    expect_error_text("rmm2.csv", RMM_HDR "1,13:30:02.1,reallocate,0x10,8,0x0\n", 2, "unknown action 'reallocate'");
    expect_error_text("rmm3.csv", RMM_HDR "1,13:30:02.1,allocate,0x10,8\n", 2, "missing Stream field");
    expect_error_text("rmm4.csv", RMM_HDR "1,13:30:02.1,allocate,0x10,8,0x0,9\n", 2, "trailing garbage ',9'");
    expect_error_text("rmm5.csv", RMM_HDR "1,13:30:02.1,allocate,0x10,0,0x0\n", 2, "size 0 is not positive");
    expect_error_text("rmm6.csv", RMM_HDR "1,13:30:02.1,allocate,0xzz,8,0x0\n", 2, "Pointer field '0xzz'");
    expect_error_text("rmm7.csv", RMM_HDR "1,13:30:02.1,allocate,0x10,8,0x0\n1,13:30:02.0,allocate,0x20,8,0x0\n", 3,
                      "time goes backwards");
    expect_error_text("rmm8.csv", RMM_HDR "1,13:30:02.1,allocate,0x10,8,0x0\n1,13:30:02.2,allocate,0x10,8,0x0\n", 3,
                      "pointer 0x10 allocated again while live (allocated on line 2)");
    expect_error_text("rmm9.csv", RMM_HDR "1,13:30:02.1,allocate,0x10,8,0x0\n1,13:30:02.2,free,0x10,16,0x0\n", 3,
                      "free of pointer 0x10 with size 16, but it was allocated with size 8 on line 2");
    expect_error_text("rmm10.csv", RMM_HDR "1,noon,allocate,0x10,8,0x0\n", 2, "Time field 'noon'");
    expect_error_text("rmm11.csv", "\nThread,Time,Action\n", 2, "CSV header");
}

/* ---- the bundled traces -------------------------------------------------- */

/* Reads "# end allocs=A frees=F ... pytorch_peak_reserved=P" with zlib alone. */
static void read_end_line(const char *path, long *allocs, long *frees, long long *ppr)
{
    gzFile g = gzopen(path, "rb");
    assert_non_null(g);
    char line[4096];
    int found = 0;
    *ppr = 0;
    while (gzgets(g, line, sizeof line)) {
        if (strncmp(line, "# end ", 6) != 0)
            continue;
        const char *a = strstr(line, "allocs="), *f = strstr(line, "frees="), *p = strstr(line, "pytorch_peak_reserved=");
        assert_non_null(a);
        assert_non_null(f);
        *allocs = strtol(a + 7, NULL, 10);
        *frees = strtol(f + 6, NULL, 10);
        if (p)
            *ppr = strtoll(p + 22, NULL, 10);
        found = 1;
    }
    gzclose(g);
    assert_true(found);
}

static void test_bundled_traces(void **state)
{
    (void)state;
    /* Peak live bytes (GiB) as the traces' README gives them. */
    static const struct { const char *name; double peak_gib; } known[] = {
        {"resnet50.trace.gz", 5.641},
        {"gpt2.trace.gz", 25.171},
        {"bert_varlen.trace.gz", 14.360},
    };
    glob_t g;
    int grc = glob("bench/traces/*.trace.gz", 0, NULL, &g);
    if (grc != 0)
        print_error("no trace in bench/traces (tests run from the repository root)\n");
    assert_int_equal(grc, 0);
    assert_true(g.gl_pathc >= 1);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *path = g.gl_pathv[i];
        char err[1024];
        cuh_trace_t t;
        long allocs = -1, frees = -1;
        long long ppr = -1;
        read_end_line(path, &allocs, &frees, &ppr);
        int rc = cuh_trace_load(path, &t, err, sizeof err);
        if (rc != 0)
            print_error("%s\n", err);
        assert_int_equal(rc, 0);
        assert_int_equal(t.num_allocs, allocs);
        assert_int_equal(t.num_frees, frees);
        assert_int_equal(t.num_events, allocs + frees);
        assert_int_equal(t.pytorch_peak_reserved, ppr);
        assert_int_equal(t.compressed, 1);
        assert_contains(t.description, "trace v1");

        /* Every free and its allocation point at each other; replaying the
         * running sum gives the loader's peak. */
        uint64_t live = 0, peak = 0;
        for (size_t k = 0; k < t.num_events; k++) {
            const cuh_trace_event_t *e = &t.events[k];
            if (e->kind == CUH_TRACE_ALLOC) {
                live += e->size;
                if (live > peak)
                    peak = live;
                if (e->match != CUH_TRACE_NO_MATCH) {
                    assert_true(e->match > k && e->match < t.num_events);
                    assert_int_equal(t.events[e->match].match, k);
                }
            } else {
                assert_true(e->match < k);
                assert_int_equal(t.events[e->match].kind, CUH_TRACE_ALLOC);
                assert_int_equal(t.events[e->match].match, k);
                live -= t.events[e->match].size;
            }
        }
        assert_int_equal(peak, t.peak_live);

        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        for (size_t j = 0; j < sizeof known / sizeof known[0]; j++) {
            if (strcmp(base, known[j].name) == 0) {
                double gib = (double)t.peak_live / (double)(1ull << 30);
                assert_float_equal(gib, known[j].peak_gib, 0.0005);
            }
        }
        cuh_trace_free(&t);
    }
    globfree(&g);
}

/* A trace that trace:PATH wrote but never closed (the program was killed
 * or crashed) says so; one it closed, or one from elsewhere, does not. Its
 * last line, when cut short without a newline, is left out. */
static void test_unfinished_recording(void **state)
{
    (void)state;
    char path[512], err[1024];
    cuh_trace_t t;
    static const char *const cases[][2] = {
        {"# trace v1 source=cuheap-0.1.0 pid=7\na 0 1 100 0\na 1 2 200 0\nf 2 1\n", "1"},
        {"# trace v1 source=cuheap-0.1.0 pid=7\na 0 1 100 0\nf 2 1\n# end allocs=1 frees=1 live_at_end=0\n", "0"},
        {"# trace v1 source=pytorch-2.11.0 model=x\na 0 1 100 0\n", "0"},
        {"a 0 1 100 0\n", "0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_plain(path, sizeof path, "unfinished.trace", cases[i][0]);
        if (cuh_trace_load(path, &t, err, sizeof err) != 0)
            fail_msg("case %zu: %s", i, err);
        if (t.unfinished != (cases[i][1][0] == '1'))
            fail_msg("case %zu: unfinished is %d", i, t.unfinished);
        assert_int_equal(t.cut_line, 0);
        cuh_trace_free(&t);
    }
    /* A last line without its newline was cut as it was written: left out,
     * even when what is left of it would parse ("f 3 1" of "f 3 12"). */
    static const char *const cut[] = {
        "# trace v1 source=cuheap-0.1.0 pid=7\na 0 1 100 0\na 1 12 200 0\na 2 3 50 0\nf 3 1",
        "# trace v1 source=cuheap-0.1.0 pid=7\na 0 1 100 0\na 1 12 200 0\na 2 3 50 0\na 3 4 10",
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
        write_plain(path, sizeof path, "cut.trace", cut[i]);
        if (cuh_trace_load(path, &t, err, sizeof err) != 0)
            fail_msg("cut case %zu: %s", i, err);
        assert_int_equal(t.num_events, 3);
        assert_int_equal(t.num_frees, 0);
        assert_int_equal(t.cut_line, 5);
        assert_true(t.unfinished);
        cuh_trace_free(&t);
    }
    /* A trace from elsewhere keeps its last line, and its errors. */
    expect_error_text("cut_other.trace", "# trace v1 source=pytorch\na 0 1 100 0\na 3 4 10", 3, "missing stream field");
}

/* ---- mutated traces ------------------------------------------------------- */

/* Whatever bytes a trace file holds, the reader either refuses it with
 * "path:line: problem" (or "path: problem" for the file as a whole) or loads
 * a trace whose books agree with themselves: every free matched to a live
 * allocation of its id and size, the counts adding up, time and lines in
 * order, the peak what the events give. Each seeded round mutates a good v1
 * trace and a good RMM CSV (bytes changed, deleted, inserted, lines cut,
 * doubled or swapped, the file truncated) and checks that; under
 * AddressSanitizer a read out of bounds anywhere in the reader fails too. */

/* [*b, *e) is the line of buf[0..len) that holds byte `at`, without its newline. */
static void line_around(const char *buf, size_t len, size_t at, size_t *b, size_t *e)
{
    *b = *e = at;
    while (*b > 0 && buf[*b - 1] != '\n')
        (*b)--;
    while (*e < len && buf[*e] != '\n')
        (*e)++;
}

/* Applies 1-4 random edits to buf (length *len, room for cap bytes). */
static void mutate(char *buf, size_t *len, size_t cap, uint64_t *seed)
{
    static const char alphabet[] = "0123456789 afx#,\n\r-.:+eE\t\xff";
    int edits = 1 + (int)(test_rand(seed) % 4);
    for (int k = 0; k < edits && *len > 0; k++) {
        size_t at = (size_t)(test_rand(seed) % *len);
        switch (test_rand(seed) % 7) {
        case 0:
        case 1:
        case 2:
        case 3:   /* a byte changed, deleted or inserted, or the file cut */
            test_mutate_once(buf, len, cap, alphabet, seed);
            break;
        case 4: { /* double the line that holds `at` */
            size_t b, e;
            line_around(buf, *len, at, &b, &e);
            size_t n = e - b + (e < *len);
            if (*len + n < cap) {
                memmove(buf + b + n, buf + b, *len - b);
                (*len) += n;
            }
            break;
        }
        case 5: { /* a run of digits inserted: numbers out of range */
            static const char huge[] = "99999999999999999999999";
            size_t n = sizeof huge - 1;
            if (*len + n < cap) {
                memmove(buf + at + n, buf + at, *len - at);
                memcpy(buf + at, huge, n);
                (*len) += n;
            }
            break;
        }
        default: { /* swap this line with the next */
            size_t b, e;
            line_around(buf, *len, at, &b, &e);
            if (e >= *len)
                break;
            size_t e2 = e + 1;
            while (e2 < *len && buf[e2] != '\n')
                e2++;
            size_t n1 = e - b + 1, n2 = e2 - (e + 1);
            char tmp[512];
            if (n1 > sizeof tmp)
                break;
            memcpy(tmp, buf + b, n1);
            memmove(buf + b, buf + e + 1, n2);
            buf[b + n2] = '\n';
            memcpy(buf + b + n2 + 1, tmp, n1 - 1);
            break;
        }
        }
    }
}

static void check_consistent(const cuh_trace_t *t)
{
    size_t allocs = 0, frees = 0, never_freed = 0, peak_event = 0;
    uint64_t live = 0, peak = 0;
    for (size_t i = 0; i < t->num_events; i++) {
        const cuh_trace_event_t *e = &t->events[i];
        if (i) {
            assert_true(e->t_us >= t->events[i - 1].t_us);
            assert_true(e->line > t->events[i - 1].line);
        }
        assert_true(e->size > 0);
        if (e->kind == CUH_TRACE_ALLOC) {
            allocs++;
            if (e->match == CUH_TRACE_NO_MATCH) {
                never_freed++;
            } else {
                assert_true(e->match > i && e->match < t->num_events);
                assert_int_equal(t->events[e->match].kind, CUH_TRACE_FREE);
                assert_int_equal(t->events[e->match].match, i);
            }
            live += e->size;
            if (live > peak) {
                peak = live;
                peak_event = i;
            }
        } else {
            assert_int_equal(e->kind, CUH_TRACE_FREE);
            frees++;
            assert_true(e->match < i);
            const cuh_trace_event_t *a = &t->events[e->match];
            assert_int_equal(a->kind, CUH_TRACE_ALLOC);
            assert_int_equal(a->match, i);
            assert_int_equal(a->size, e->size);
            if (t->format == CUH_TRACE_FORMAT_V1)
                assert_int_equal(a->id, e->id);
            assert_true(live >= e->size);
            live -= e->size;
        }
    }
    assert_int_equal(t->num_allocs, allocs);
    assert_int_equal(t->num_frees, frees);
    assert_int_equal(t->num_events, allocs + frees);
    assert_int_equal(t->live_at_end, never_freed);
    assert_int_equal(t->peak_live, peak);
    if (peak)
        assert_int_equal(t->peak_live_event, peak_event);
    assert_non_null(t->path);
    assert_non_null(t->description);
}

static void mutation_rounds(const char *base, const char *name, int gz, int rounds, uint64_t seed)
{
    char buf[4096], path[512], err[1024], prefix[600];
    size_t loaded = 0, refused = 0;
    for (int r = 0; r < rounds; r++) {
        size_t len = strlen(base);
        memcpy(buf, base, len);
        mutate(buf, &len, sizeof buf - 1, &seed);
        buf[len] = '\0';
        path_of(path, sizeof path, name);
        if (gz) {
            gzFile g = gzopen(path, "wb");
            assert_non_null(g);
            assert_int_equal(gzwrite(g, buf, (unsigned)len), (int)len);
            assert_int_equal(gzclose(g), Z_OK);
        } else {
            FILE *f = fopen(path, "wb");
            assert_non_null(f);
            assert_int_equal(fwrite(buf, 1, len, f), len);
            assert_int_equal(fclose(f), 0);
        }
        cuh_trace_t t;
        err[0] = '\0';
        if (cuh_trace_load(path, &t, err, sizeof err) == 0) {
            check_consistent(&t);
            loaded++;
        } else {
            snprintf(prefix, sizeof prefix, "%s:", path);
            if (strncmp(err, prefix, strlen(prefix)) != 0 || strlen(err) < strlen(prefix) + 8) {
                print_error("round %d: message \"%s\" does not name the file and a problem\n", r, err);
                fail();
            }
            /* Quoted pieces of the file come back printable: a raw
             * carriage return would hide the start of the message. */
            for (const unsigned char *c = (const unsigned char *)err + strlen(prefix); *c; c++)
                if (*c < 0x20 || *c >= 0x7f) {
                    print_error("round %d: message \"%s\" holds byte 0x%02x\n", r, err, *c);
                    fail();
                }
            assert_null(t.events);
            refused++;
        }
        cuh_trace_free(&t);
    }
    /* The mutations must exercise both outcomes. */
    assert_true(loaded > 0);
    assert_true(refused > 0);
}

static void test_mutated_traces(void **state)
{
    (void)state;
    static const char v1[] =
        "# trace v1 source=unit-test model=tiny\n"
        "a 0 1 1000 0\n"
        "a 5 2 3000 7\n"
        "a 6 3 70000000 7\n"
        "f 9 1\n"
        "a 9 4 512 0\n"
        "f 10 3\n"
        "a 11 5 1000 140202046379584\n"
        "f 12 2\n"
        "f 13 5\n"
        "# end allocs=5 frees=4 live_at_end=1 pytorch_peak_reserved=8192\n";
    static const char rmm[] =
        "Thread,Time,Action,Pointer,Size,Stream\n"
        "1,13:30:02.153812,allocate,0x7f1e84000000,1024,0x0\n"
        "1,13:30:02.153900,allocate,0x7f1e84000400,4096,0x55d0c0a3e2b0\n"
        "1,13:30:02.2,allocate failure,0x0,99999,0x0\n"
        "1,13:30:03.000000,free,0x7f1e84000000,1024,0x0\n"
        "1,13:30:03.000001,allocate,0x7f1e84000000,2048,0x55d0c0a3e9f0\n"
        "1,13:30:03.5,deallocate,0x7f1e84000400,4096,0x55d0c0a3e2b0\n"
        "1,23:59:59.999999,free,0x7f1e84000000,2048,0x55d0c0a3e9f0\n";
    mutation_rounds(v1, "mut.trace", 0, 3000, 0x9E3779B97F4A7C15ull);
    mutation_rounds(v1, "mut.trace.gz", 1, 300, 0x2545F4914F6CDD1Dull);
    mutation_rounds(rmm, "mut.csv", 0, 3000, 0xD1B54A32D192ED03ull);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_good),
        cmocka_unit_test(test_gzip_good),
        cmocka_unit_test(test_gzip_detected_by_magic),
        cmocka_unit_test(test_pytorch_peak_only_from_last_comment),
        cmocka_unit_test(test_corpus_header_lines),
        cmocka_unit_test(test_peak_live),
        cmocka_unit_test(test_long_lines_and_crlf_csv),
        cmocka_unit_test(test_error_unknown_kind),
        cmocka_unit_test(test_error_missing_field),
        cmocka_unit_test(test_error_not_numeric),
        cmocka_unit_test(test_error_trailing_garbage),
        cmocka_unit_test(test_error_size),
        cmocka_unit_test(test_error_double_alloc),
        cmocka_unit_test(test_error_bad_free),
        cmocka_unit_test(test_error_time_backwards),
        cmocka_unit_test(test_error_open),
        cmocka_unit_test(test_error_truncated_gzip),
        cmocka_unit_test(test_error_corrupt_gzip),
        cmocka_unit_test(test_rmm_csv_good),
        cmocka_unit_test(test_rmm_csv_midnight),
        cmocka_unit_test(test_rmm_csv_errors),
        cmocka_unit_test(test_bundled_traces),
        cmocka_unit_test(test_mutated_traces),
        cmocka_unit_test(test_unfinished_recording),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
