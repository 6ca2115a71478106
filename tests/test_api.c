/* test_api.c - the public C API (include/cuheap.h) on simulated devices:
 * configuration errors, allocation and free per device, the errors a caller
 * can make (wrong device, foreign pointer, double free, NULL out-pointer),
 * device-wide allocation and free (cudaMalloc's and cudaFree's promises),
 * statistics, release, reports in every format (with the pinned host memory
 * section exactly when pinned memory was used, and read back by
 * cuheap-report), and a bad CUHEAP_CONF stopping the program with a message
 * that names the key.
 */
#include "test_util.h"

#include "common.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void test_configure_rejects_unknown_keys_and_lists_valid_ones(void **state)
{
    (void)state;
    assert_int_equal(cuheap_configure("workspce:1G"), CUHEAP_ERR_CONFIG);
    const char *msg = cuheap_last_error();
    assert_non_null(strstr(msg, "workspce"));
    assert_non_null(strstr(msg, "workspace"));
    assert_non_null(strstr(msg, "limit"));
    assert_int_equal(cuheap_configure("limit:2"), CUHEAP_ERR_CONFIG);
    assert_int_equal(cuheap_configure("workspace:64M, limit:0.5"), CUHEAP_OK);
    void *p;
    assert_int_equal(cuheap_malloc(&p, 1 * MiB, 0, NULL), CUHEAP_OK);
    cuheap_stats_t s;
    assert_int_equal(cuheap_get_stats(0, &s), CUHEAP_OK);
    assert_int_equal(s.workspace, 64 * MiB);
    assert_int_equal(s.limit, 2 * GiB);
    /* Too late once a heap is in use. */
    assert_int_equal(cuheap_configure("workspace:0"), CUHEAP_ERR_CONFIG);
    assert_non_null(strstr(cuheap_last_error(), "before the first allocation"));
    assert_int_equal(cuheap_free(p, 0, NULL), CUHEAP_OK);
}

static void test_malloc_and_free_on_two_devices(void **state)
{
    (void)state;
    void *a, *b;
    assert_int_equal(cuheap_malloc(&a, 3 * MiB, 0, NULL), CUHEAP_OK);
    assert_int_equal(cuheap_malloc(&b, 3 * MiB, 1, NULL), CUHEAP_OK);
    assert_true(((uintptr_t)a & 511) == 0 && ((uintptr_t)b & 511) == 0);
    assert_true(a != b);
    /* Freed with the wrong device: refused, and the message says whose it is. */
    assert_int_equal(cuheap_free(a, 1, NULL), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(cuheap_last_error(), "device 0"));
    assert_int_equal(cuheap_free(a, 0, NULL), CUHEAP_OK);
    assert_int_equal(cuheap_free(b, 1, NULL), CUHEAP_OK);
    assert_int_equal(cuheap_free(a, 0, NULL), CUHEAP_ERR_DOUBLE_FREE);
    cuheap_stats_t s;
    cuheap_get_stats(1, &s);
    assert_int_equal(s.num_allocs, 1);
    assert_int_equal(s.num_frees, 1);
}

static void test_device_wide_malloc_and_free_keep_cudas_promises(void **state)
{
    (void)state;
    cuheap_stream_t side = (cuheap_stream_t)0x5000;
    /* Events stay held here: reserve more rather than wait for them. */
    assert_int_equal(cuheap_configure("wait_before_grow:0"), CUHEAP_OK);
    assert_int_equal(cuheap_stream_register(0, side), CUHEAP_OK);
    cuh_device_t *dev = cuh_runtime_device(0);
    assert_non_null(dev);
    cuh_sim_hold_events(dev, 1);   /* work on the GPU never finishes on its own */
    /* The free's batch closes at once, under one device-wide event (a
     * device without those would close one at most once per two
     * allocations with the side stream known: a's is the second). */
    void *warm;
    assert_int_equal(cuheap_malloc(&warm, 100, 0, NULL), CUHEAP_OK);
    cuh_sim_counters_t c0, c1;
    cuh_sim_counters(dev, &c0);
    void *a, *b;
    assert_int_equal(cuheap_malloc_device_wide(&a, 3 * MiB, 0), CUHEAP_OK);
    assert_true(((uintptr_t)a & 511) == 0);
    assert_int_equal(cuheap_free_device_wide(a, 0), CUHEAP_OK);
    cuh_sim_counters(dev, &c1);
    assert_int_equal(c1.events_recorded - c0.events_recorded, 1);   /* one over every stream */
    assert_int_equal(c1.events_recorded_all - c0.events_recorded_all, 1);
    assert_int_equal(c1.event_waits, c0.event_waits);
    assert_int_equal(cuheap_free_device_wide(a, 0), CUHEAP_ERR_DOUBLE_FREE);
    assert_int_equal(cuheap_free(a, 0, NULL), CUHEAP_ERR_DOUBLE_FREE);
    /* The side stream may still read a: nobody gets it yet. */
    assert_int_equal(cuheap_malloc_device_wide(&b, 3 * MiB, 0), CUHEAP_OK);
    assert_true(b != a);
    assert_int_equal(cuheap_free_device_wide(b, 1), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(cuheap_last_error(), "device 0"));
    int on_stack;
    assert_int_equal(cuheap_free_device_wide(&on_stack, 0), CUHEAP_ERR_NOT_OWNED);
    assert_non_null(strstr(cuheap_last_error(), "cuheap_free_device_wide"));
    assert_int_equal(cuheap_free_device_wide(NULL, 0), CUHEAP_OK);
    assert_int_equal(cuheap_malloc_device_wide(NULL, 10, 0), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_int_equal(cuheap_free(b, 0, side), CUHEAP_OK);
    assert_int_equal(cuheap_free(warm, 0, NULL), CUHEAP_OK);
    cuheap_stats_t s;
    cuheap_get_stats(0, &s);
    assert_true(s.pending.current >= 3 * MiB);
    cuh_sim_complete_all(dev);
    assert_int_equal(cuheap_release_cached(0), CUHEAP_OK);
    cuheap_get_stats(0, &s);
    assert_int_equal(s.pending.current, 0);
    assert_int_equal(s.allocated.current, 0);
    assert_int_equal(s.num_frees, 3);   /* a, b and warm */
}

static void test_caller_errors_are_reported(void **state)
{
    (void)state;
    assert_int_equal(cuheap_malloc(NULL, 10, 0, NULL), CUHEAP_ERR_INVALID_ARGUMENT);
    int on_stack;
    assert_int_equal(cuheap_free(&on_stack, 0, NULL), CUHEAP_ERR_NOT_OWNED);
    assert_non_null(strstr(cuheap_last_error(), "not allocated by cuheap"));
    assert_int_equal(cuheap_free(NULL, 0, NULL), CUHEAP_OK);
    void *p = (void *)1;
    assert_int_equal(cuheap_malloc(&p, 0, 0, NULL), CUHEAP_OK);
    assert_null(p);
    assert_int_equal(cuheap_malloc(&p, 10, CUH_MAX_DEVICES, NULL), CUHEAP_ERR_INVALID_ARGUMENT);
    assert_int_equal(cuheap_malloc(&p, 8 * GiB, 0, NULL), CUHEAP_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(cuheap_last_error(), "cause: capacity"));
    for (int st = CUHEAP_OK; st <= CUHEAP_ERR_IO; st++)
        assert_true(strlen(cuheap_status_string((cuheap_status_t)st)) > 3);
}

static void test_stats_release_and_peaks(void **state)
{
    (void)state;
    cuheap_stats_t s;
    assert_int_equal(cuheap_get_stats(5, &s), CUHEAP_OK);   /* never used: zeros */
    assert_int_equal(s.reserved.current, 0);
    assert_int_equal(cuheap_get_stats(0, NULL), CUHEAP_ERR_INVALID_ARGUMENT);
    void *p[10];
    for (int i = 0; i < 10; i++)
        assert_int_equal(cuheap_malloc(&p[i], (size_t)(i + 1) * MiB, 0, NULL), CUHEAP_OK);
    for (int i = 0; i < 10; i++)
        assert_int_equal(cuheap_free(p[i], 0, NULL), CUHEAP_OK);
    cuheap_get_stats(0, &s);
    assert_true(s.reserved.current > 0);
    assert_int_equal(s.requested.peak, 55 * MiB);
    assert_int_equal(cuheap_release_cached(0), CUHEAP_OK);
    assert_int_equal(cuheap_reset_peaks(0), CUHEAP_OK);
    cuheap_get_stats(0, &s);
    assert_int_equal(s.reserved.current, 0);
    assert_int_equal(s.requested.peak, 0);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_reports_in_text_and_valid_json(void **state)
{
    (void)state;
    char dir[] = "/tmp/cuheap-api-XXXXXX";
    assert_non_null(mkdtemp(dir));
    void *a, *b;
    assert_int_equal(cuheap_malloc(&a, 5 * MiB, 0, NULL), CUHEAP_OK);
    assert_int_equal(cuheap_malloc(&b, 1000, 0, (cuheap_stream_t)0x77), CUHEAP_OK);
    void *big;
    assert_int_equal(cuheap_malloc(&big, 100 * GiB, 0, NULL), CUHEAP_ERR_OUT_OF_MEMORY);
    /* Two steps marked: every form shows them, the first with the heap's
     * first pages. */
    assert_int_equal(cuheap_mark_step(), CUHEAP_OK);
    assert_int_equal(cuheap_mark_step(), CUHEAP_OK);
    char path[256], cmd[1024];
    snprintf(path, sizeof path, "%s/report-%%p.json", dir);
    assert_int_equal(cuheap_dump_report(path, CUHEAP_REPORT_JSON), CUHEAP_OK);
    snprintf(path, sizeof path, "%s/report-%d.json", dir, (int)getpid());
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); d=r[\"devices\"][0]; "
             "assert r[\"schema\"]==\"cuheap-report\" and r[\"version\"]==1; "
             "assert d[\"stats\"][\"requested\"][\"current\"]==5*2**20+1000; "
             "assert d[\"oom\"][\"cause\"]==\"capacity\"; "
             "assert sum(len(s[\"extents\"]) for s in d[\"segments\"])>=2; "
             "assert \"pinned_host\" not in r; "
             "st=d[\"steps\"]; assert st[\"marked\"]==2 and [x[\"index\"] for x in st[\"last\"]]==[1,2]; "
             "assert st[\"last\"][0][\"device_allocs\"]>=1 and st[\"last\"][1][\"device_allocs\"]==0' %s",
             path);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/report.txt", dir);
    assert_int_equal(cuheap_dump_report(path, CUHEAP_REPORT_TEXT), CUHEAP_OK);
    const char *text = slurp(path);
    assert_non_null(strstr(text, "requested (live)"));
    assert_non_null(strstr(text, "fragmentation"));
    assert_non_null(strstr(text, "last out-of-memory"));
    assert_non_null(strstr(text, "cause capacity"));
    assert_null(strstr(text, "pinned host memory"));   /* no pinned memory used: no section */
    assert_non_null(strstr(text, "steps marked: 2"));
    snprintf(path, sizeof path, "%s/report.html", dir);
    assert_int_equal(cuheap_dump_report(path, CUHEAP_REPORT_HTML), CUHEAP_OK);
    const char *page = slurp(path);
    assert_non_null(strstr(page, "</html>"));
    assert_null(strstr(page, "Pinned host memory"));
    assert_non_null(strstr(page, "<h2>Steps</h2>"));
    assert_int_equal(cuheap_dump_report("/nonexistent-dir/r.json", CUHEAP_REPORT_JSON), CUHEAP_ERR_IO);
    assert_non_null(strstr(cuheap_last_error(), "/nonexistent-dir/r.json"));
    /* A regular file is replaced whole (written beside it, then renamed):
     * nothing is left beside it, and writing it again replaces it. */
    assert_int_equal(cuheap_dump_report(path, CUHEAP_REPORT_HTML), CUHEAP_OK);
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 3 && ! ls %s | grep -q tmp", dir, dir);
    assert_int_equal(system(cmd), 0);
    /* A symbolic link stays one: its target gets the report. */
    char target[256], link[256];
    snprintf(target, sizeof target, "%s/target.txt", dir);
    snprintf(link, sizeof link, "%s/link.txt", dir);
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(cuheap_dump_report(link, CUHEAP_REPORT_TEXT), CUHEAP_OK);
    struct stat st;
    assert_int_equal(lstat(link, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_non_null(strstr(slurp(target), "requested (live)"));
    cuheap_free(a, 0, NULL);
    cuheap_free(b, 0, (cuheap_stream_t)0x77);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* "  label  current  peak", as the text report writes a row. */
static void stat_row(char *buf, size_t len, const char *label, const cuheap_stat_t *s)
{
    char a[32], b[32];
    snprintf(buf, len, "  %-22s %14s %14s\n", label, cuh_format_bytes(a, sizeof a, s->current),
             cuh_format_bytes(b, sizeof b, s->peak));
}

/* The text section holds the figures of cuheap_get_host_stats, in order. */
static void assert_text_has_pinned_section(const char *text, const cuheap_host_stats_t *st)
{
    const char *section = strstr(text, "\n== pinned host memory ==\n");
    assert_non_null(section);
    char want[256], size[32];
    snprintf(want, sizeof want, "reserved in %llu chunks of %s or more; %llu taken from CUDA in all\n",
             (unsigned long long)st->num_chunks, cuh_format_bytes(size, sizeof size, st->chunk_size),
             (unsigned long long)st->num_chunk_allocs);
    assert_non_null(strstr(section, want));
    const char *labels[] = {"requested (live)", "allocated", "reserved", "pending"};
    const cuheap_stat_t *stats[] = {&st->requested, &st->allocated, &st->reserved, &st->pending};
    for (size_t i = 0; i < 4; i++) {
        stat_row(want, sizeof want, labels[i], stats[i]);
        const char *row = strstr(section, want);
        if (!row)
            fail_msg("no row \"%s\" in:\n%s", want, section);
        section = row;
    }
    snprintf(want, sizeof want, "  allocations %llu, frees %llu, waits for GPU work %llu, OOMs %llu\n",
             (unsigned long long)st->num_allocs, (unsigned long long)st->num_frees, (unsigned long long)st->num_waits,
             (unsigned long long)st->num_ooms);
    assert_non_null(strstr(section, want));
}

/* The JSON's "pinned_host" equals cuheap_get_host_stats, key by key, and
 * has exactly the keys the schema describes. */
static void assert_json_has_pinned_host(const char *path, const cuheap_host_stats_t *st)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))[\"pinned_host\"]; "
             "s=lambda c,k: {\"current\":c,\"peak\":k}; "
             "want={\"requested\":s(%llu,%llu),\"allocated\":s(%llu,%llu),\"reserved\":s(%llu,%llu),"
             "\"pending\":s(%llu,%llu),\"num_allocs\":%llu,\"num_frees\":%llu,\"num_chunks\":%llu,"
             "\"num_chunk_allocs\":%llu,\"num_waits\":%llu,\"num_ooms\":%llu,\"chunk_size\":%llu}; "
             "assert p==want, (p, want); "
             "k=json.load(open(\"include/cuheap_report.schema.json\"))[\"properties\"][\"pinned_host\"][\"properties\"]; "
             "assert set(p)==set(k), set(p)^set(k)' %s",
             (unsigned long long)st->requested.current, (unsigned long long)st->requested.peak,
             (unsigned long long)st->allocated.current, (unsigned long long)st->allocated.peak,
             (unsigned long long)st->reserved.current, (unsigned long long)st->reserved.peak,
             (unsigned long long)st->pending.current, (unsigned long long)st->pending.peak,
             (unsigned long long)st->num_allocs, (unsigned long long)st->num_frees,
             (unsigned long long)st->num_chunks, (unsigned long long)st->num_chunk_allocs,
             (unsigned long long)st->num_waits, (unsigned long long)st->num_ooms,
             (unsigned long long)st->chunk_size, path);
    assert_int_equal(system(cmd), 0);
}

static void test_reports_show_pinned_host_memory_and_round_trip(void **state)
{
    (void)state;
    char dir[] = "/tmp/cuheap-pinned-report-XXXXXX";
    assert_non_null(mkdtemp(dir));
    void *dev, *host[3];
    static const size_t sizes[] = {5000, 1 * MiB, 3 * MiB};
    assert_int_equal(cuheap_malloc(&dev, 1 * MiB, 0, NULL), CUHEAP_OK);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(cuheap_host_alloc(&host[i], sizes[i], 0), CUHEAP_OK);
    /* The GPU never finishes the work issued before the free: the freed
     * buffer stays pending, and every report below sees the same figures. */
    cuh_sim_hold_events(cuh_runtime_device(0), 1);
    assert_int_equal(cuheap_host_free(host[0]), CUHEAP_OK);
    cuheap_host_stats_t st;
    assert_int_equal(cuheap_get_host_stats(&st), CUHEAP_OK);
    assert_true(st.pending.current >= sizes[0]);
    assert_int_equal(st.num_allocs, 3);
    assert_int_equal(st.num_frees, 1);
    assert_true(st.reserved.current >= st.chunk_size && st.requested.current == 4 * MiB);

    char json[256], txt[256], html[256], cmd[2048];
    snprintf(json, sizeof json, "%s/r.json", dir);
    snprintf(txt, sizeof txt, "%s/r.txt", dir);
    snprintf(html, sizeof html, "%s/r.html", dir);
    assert_int_equal(cuheap_dump_report(json, CUHEAP_REPORT_JSON), CUHEAP_OK);
    assert_int_equal(cuheap_dump_report(txt, CUHEAP_REPORT_TEXT), CUHEAP_OK);
    assert_int_equal(cuheap_dump_report(html, CUHEAP_REPORT_HTML), CUHEAP_OK);
    assert_json_has_pinned_host(json, &st);
    const char *text = slurp(txt);
    assert_non_null(strstr(text, "== device 0 (sim) =="));
    assert_true(strstr(text, "== device 0 (sim) ==") < strstr(text, "== pinned host memory =="));
    assert_text_has_pinned_section(text, &st);
    const char *page = slurp(html);
    const char *card = strstr(page, "<section class=card id=pinned><h2>Pinned host memory</h2>");
    assert_non_null(card);
    assert_true(strstr(page, "<h2>Device 0 (sim)</h2>") < card);
    char row[256], a[32], b[32];
    snprintf(row, sizeof row, "<tr><td>reserved</td><td>%s</td><td>%s</td></tr>",
             cuh_format_bytes(a, sizeof a, st.reserved.current), cuh_format_bytes(b, sizeof b, st.reserved.peak));
    assert_non_null(strstr(card, row));

    /* cuheap-report reads it back: the same JSON byte for byte, the same text
     * but for the header (the JSON's pid and time), the same pinned card. */
    snprintf(cmd, sizeof cmd,
             "cd %s && R=$OLDPWD/build/cuheap-report && $R --json r.json | cmp - r.json && "
             "$R --text r.json -o again.txt && tail -n +2 again.txt >a && tail -n +2 r.txt >b && cmp a b && "
             "$R --html r.json -o again.html && sed -n \"/id=pinned/,/<\\/section>/p\" again.html >a && "
             "sed -n \"/id=pinned/,/<\\/section>/p\" r.html >b && [ -s a ] && cmp a b",
             dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(cuheap_host_free(host[1]), CUHEAP_OK);
    assert_int_equal(cuheap_host_free(host[2]), CUHEAP_OK);
    assert_int_equal(cuheap_free(dev, 0, NULL), CUHEAP_OK);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Which calls reach cuheap decides two defaults: in place of CUDA's own
 * calls (LD_PRELOAD) streams reuse each other's freed memory with a wait on
 * the GPU, as CUDA's pools do; the C API and PyTorch's plugin keep it off,
 * as PyTorch's allocator does. CUHEAP_CONF wins either way. */
static void test_reuse_across_streams_follows_the_way_in(void **state)
{
    (void)state;
    void *p;
    assert_int_equal(cuheap_malloc(&p, MiB, 0, NULL), CUHEAP_OK);
    assert_int_equal(cuh_runtime_config()->reuse_across_streams, 0);
    assert_int_equal(cuheap_free(p, 0, NULL), CUHEAP_OK);

    cuh_runtime_reset();
    assert_int_equal(cuh_runtime_use_sim(GiB), 0);
    cuh_runtime_as_interposer();
    assert_int_equal(cuh_runtime_config()->reuse_across_streams, 1);

    /* cuheap_configure starts from the way's defaults too. */
    assert_int_equal(cuheap_configure("limit:1G"), CUHEAP_OK);
    assert_int_equal(cuh_runtime_config()->reuse_across_streams, 1);

    cuh_runtime_reset();
    assert_int_equal(cuh_runtime_use_sim(GiB), 0);
    setenv("CUHEAP_CONF", "reuse_across_streams:0", 1);
    cuh_runtime_as_interposer();
    assert_int_equal(cuh_runtime_config()->reuse_across_streams, 0);
    unsetenv("CUHEAP_CONF");

    /* A reset forgets the way in. */
    cuh_runtime_reset();
    assert_int_equal(cuh_runtime_use_sim(GiB), 0);
    assert_int_equal(cuh_runtime_config()->reuse_across_streams, 0);
}

static void test_bad_cuheap_conf_stops_the_program_naming_the_key(void **state)
{
    (void)state;
    char log[] = "/tmp/cuheap-conf-XXXXXX";
    int fd = mkstemp(log);
    assert_true(fd >= 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        cuh_runtime_reset();
        cuh_runtime_use_sim(GiB);
        setenv("CUHEAP_CONF", "workspace:1G,bogus_key:3", 1);
        void *p;
        cuheap_malloc(&p, 100, 0, NULL);
        _exit(0);   /* reaching here means the bad setting was ignored */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    close(fd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 2);
    const char *msg = slurp(log);
    assert_non_null(strstr(msg, "bogus_key"));
    assert_non_null(strstr(msg, "valid keys"));
    unlink(log);
}

static int wait_for_file(const char *path, int tenths)
{
    for (int i = 0; i < tenths; i++) {
        if (access(path, R_OK) == 0)
            return 1;
        usleep(100000);
    }
    return access(path, R_OK) == 0;
}

static void test_report_path_writes_on_oom_on_sigusr1_and_at_exit(void **state)
{
    (void)state;
    char dir[] = "/tmp/cuheap-report-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char conf[256], path[256], cmd[1024];
    snprintf(conf, sizeof conf, "report:%s/r-%%p.json", dir);
    snprintf(path, sizeof path, "%s/r-%d.json", dir, (int)getpid());
    assert_int_equal(cuheap_configure(conf), CUHEAP_OK);
    void *p;
    assert_int_equal(cuheap_malloc(&p, 1 * MiB, 0, NULL), CUHEAP_OK);
    assert_int_equal(access(path, F_OK), -1);   /* nothing yet */
    /* An out-of-memory writes the report, with its cause. */
    void *big;
    assert_int_equal(cuheap_malloc(&big, 8 * GiB, 0, NULL), CUHEAP_ERR_OUT_OF_MEMORY);
    assert_true(wait_for_file(path, 1));
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[\"devices\"][0]; "
             "assert d[\"oom\"][\"cause\"]==\"capacity\"' %s", path);
    assert_int_equal(system(cmd), 0);
    /* SIGUSR1: written by cuheap's thread, not in the handler. */
    unlink(path);
    raise(SIGUSR1);
    assert_true(wait_for_file(path, 30));
    /* A forked child that never touches cuheap writes nothing at its exit. */
    pid_t child = fork();
    if (child == 0)
        exit(0);
    int status;
    waitpid(child, &status, 0);
    char child_path[256];
    snprintf(child_path, sizeof child_path, "%s/r-%d.json", dir, (int)child);
    assert_int_equal(access(child_path, F_OK), -1);
    /* A process that armed the report writes it at exit. */
    child = fork();
    if (child == 0) {
        cuh_runtime_reset();
        cuh_runtime_use_sim(GiB);
        cuheap_configure(conf);
        void *q;
        cuheap_malloc(&q, 4096, 0, NULL);
        exit(0);
    }
    waitpid(child, &status, 0);
    snprintf(child_path, sizeof child_path, "%s/r-%d.json", dir, (int)child);
    assert_true(wait_for_file(child_path, 1));
    /* After an out-of-memory the report keeps the heap at the failure: the
     * exit does not write over it (4 KiB live then, 3 MiB at exit). */
    child = fork();
    if (child == 0) {
        cuh_runtime_reset();
        cuh_runtime_use_sim(GiB);
        cuheap_configure(conf);
        void *q, *r, *huge;
        cuheap_malloc(&q, 4096, 0, NULL);
        if (cuheap_malloc(&huge, 4 * GiB, 0, NULL) != CUHEAP_ERR_OUT_OF_MEMORY)
            exit(3);
        cuheap_free(q, 0, NULL);
        cuheap_malloc(&r, 3 * MiB, 0, NULL);
        exit(0);
    }
    waitpid(child, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    snprintf(child_path, sizeof child_path, "%s/r-%d.json", dir, (int)child);
    assert_true(wait_for_file(child_path, 1));
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[\"devices\"][0]; "
             "assert d[\"oom\"][\"cause\"]==\"capacity\" and d[\"stats\"][\"requested\"][\"current\"]==4096, "
             "d[\"stats\"][\"requested\"]' %s", child_path);
    assert_int_equal(system(cmd), 0);
    cuheap_free(p, 0, NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_trace_records_a_job_that_cuheap_replay_replays(void **state)
{
    (void)state;
    char dir[] = "/tmp/cuheap-trace-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char conf[256], path[256];
    snprintf(conf, sizeof conf, "trace:%s/job-%%p.trace", dir);
    snprintf(path, sizeof path, "%s/job-%d.trace", dir, (int)getpid());
    char cmd[2048];
    assert_int_equal(cuheap_trace_mark("too early"), CUHEAP_ERR_CONFIG);   /* no trace open yet */
    assert_non_null(strstr(cuheap_last_error(), "set trace:PATH"));
    assert_int_equal(cuheap_configure(conf), CUHEAP_OK);
    assert_int_equal(cuheap_trace_mark("too early"), CUHEAP_ERR_CONFIG);
    assert_non_null(strstr(cuheap_last_error(), "no allocation has opened it yet"));
    /* 30 blocks on two streams, every third freed: live peak known. */
    void *p[30];
    size_t live = 0, peak = 0;
    for (int i = 0; i < 30; i++) {
        size_t size = (size_t)(i + 1) * 100000 + 7;
        if (i == 1) {   /* a mark between the first and the second allocation */
            assert_int_equal(cuheap_trace_mark("step 1"), CUHEAP_OK);
            assert_int_equal(cuheap_trace_mark(NULL), CUHEAP_ERR_INVALID_ARGUMENT);
            assert_int_equal(cuheap_trace_mark(""), CUHEAP_ERR_INVALID_ARGUMENT);
            assert_int_equal(cuheap_trace_mark("two\nlines"), CUHEAP_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(cuheap_last_error(), "control character at byte 3"));
            char longer[202];
            memset(longer, 'x', sizeof longer - 1);
            longer[sizeof longer - 1] = '\0';
            assert_int_equal(cuheap_trace_mark(longer), CUHEAP_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(cuheap_last_error(), "1 to 200 characters (it has 201)"));
        }
        assert_int_equal(cuheap_malloc(&p[i], size, 0, i % 2 ? (cuheap_stream_t)0x77 : NULL), CUHEAP_OK);
        live += size;
        peak = live > peak ? live : peak;
        if (i % 3 == 2) {
            assert_int_equal(cuheap_free(p[i - 1], 0, (i - 1) % 2 ? (cuheap_stream_t)0x77 : NULL), CUHEAP_OK);
            live -= (size_t)i * 100000 + 7;
            p[i - 1] = NULL;
        }
    }
    int on_stack;
    assert_int_equal(cuheap_free(&on_stack, 0, NULL), CUHEAP_ERR_NOT_OWNED);   /* not recorded */
    cuh_runtime_reset();   /* closes the trace, as exit would */
    snprintf(cmd, sizeof cmd,
             "build/cuheap-replay --json %s | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); "
             "assert (r[\"allocs\"], r[\"frees\"], r[\"peak_live\"]) == (30, 10, %zu), r; "
             "assert r[\"oom\"] is None and r[\"unfinished\"] is False and r[\"marks\"] == 1, r' && "
             "grep -q \"^# end allocs=30 frees=10 live_at_end=20\" %s && grep -q \"^a [0-9]* 1 200007 1$\" %s && "
             "sed -n 3p %s | grep -q \"^# mark [0-9]* step 1$\" && [ $(grep -c \"^# mark\" %s) = 1 ]",
             path, peak, path, path, path, path);
    assert_int_equal(system(cmd), 0);
    /* A program killed while recording leaves a trace without its closing
     * line: it still replays, and says it is unfinished. */
    pid_t child = fork();
    if (child == 0) {
        cuh_runtime_reset();
        cuh_runtime_use_sim(GiB);
        cuheap_configure(conf);
        for (int i = 0; i < 5000; i++) {   /* more than the writer's 64 KiB buffer */
            void *q;
            cuheap_malloc(&q, 4096 + (size_t)i, 0, NULL);
            cuheap_free(q, 0, NULL);
        }
        raise(SIGKILL);
    }
    int status;
    waitpid(child, &status, 0);
    assert_true(WIFSIGNALED(status));
    snprintf(path, sizeof path, "%s/job-%d.trace", dir, (int)child);
    snprintf(cmd, sizeof cmd,
             "build/cuheap-replay --json %s | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); "
             "assert r[\"unfinished\"] is True and 0 < r[\"allocs\"] < 5000, r' && ! grep -q \"^# end\" %s && "
             "build/cuheap-replay %s | grep -q \"killed or crashed\"",
             path, path, path);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_report_key_takes_a_path_and_none(void **state)
{
    (void)state;
    assert_int_equal(cuheap_configure("report:none"), CUHEAP_OK);
    char longpath[700];
    memset(longpath, 'x', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = '\0';
    char conf[800];
    snprintf(conf, sizeof conf, "report:/tmp/%s", longpath);
    assert_int_equal(cuheap_configure(conf), CUHEAP_ERR_CONFIG);
    assert_non_null(strstr(cuheap_last_error(), "report"));
}


/* What a failing device can make cuheap say at every call goes out at most
 * a line a second, and the next line counts what was held back: after a
 * line that flushes what this process held back before, a burst of 1,000
 * lines and one more a second later leave one or two lines (two if the
 * burst crossed a second) that account for all 1,001. */
static void test_repeated_messages_come_out_a_line_a_second(void **state)
{
    (void)state;
    char err_path[] = "/tmp/cuheap-rate-XXXXXX";
    int fd = mkstemp(err_path);
    assert_true(fd >= 0);
    pid_t child = fork();
    if (child == 0) {
        dup2(fd, 2);
        const struct timespec pause = {1, 100000000};
        nanosleep(&pause, NULL);
        cuh_log_rate_limited("flush");
        for (int i = 0; i < 1000; i++)
            cuh_log_rate_limited("device 0: returning a free page: refused (%d)", i);
        nanosleep(&pause, NULL);
        cuh_log_rate_limited("device 0: returning a free page: refused (last)");
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    close(fd);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *said = slurp(err_path);
    unlink(err_path);
    char *line = strstr(said, "cuheap: flush");
    assert_non_null(line);
    line = strchr(line, '\n') + 1;
    unsigned long lines = 0, held = 0;
    while (*line) {
        char *end = strchr(line, '\n');
        assert_non_null(end);
        *end = '\0';
        assert_non_null(strstr(line, "cuheap: device 0: returning a free page: refused ("));
        const char *n = strstr(line, ") (");
        if (n)
            held += strtoul(n + 3, NULL, 10);
        lines++;
        line = end + 1;
    }
    assert_true(lines == 1 || lines == 2);
    assert_int_equal(lines + held, 1001);
    assert_non_null(strstr(said, "similar messages in the last second not shown"));
}

/* A report path whose folder cannot be written is said when reports are
 * armed (the first allocation), not first at the out-of-memory. */
static void test_unwritable_report_folder_is_said_at_once(void **state)
{
    (void)state;
    char err_path[] = "/tmp/cuheap-report-err-XXXXXX";
    int fd = mkstemp(err_path);
    assert_true(fd >= 0);
    const char *confs[] = {"report:/nonexistent-cuheap-dir/r-%p.json", "report:/tmp/cuheap-ok-%p.txt"};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(ftruncate(fd, 0), 0);
        pid_t child = fork();
        if (child == 0) {
            dup2(fd, 2);
            cuh_runtime_reset();
            cuh_runtime_use_sim(GiB);
            cuheap_configure(confs[k]);
            void *q;
            cuheap_malloc(&q, 4096, 0, NULL);
            fprintf(stderr, "after the first allocation\n");
            _exit(0);   /* no exit report: only what the first allocation said */
        }
        int status;
        waitpid(child, &status, 0);
        const char *said = slurp(err_path);
        const char *where = strstr(said, "cannot write into /nonexistent-cuheap-dir (No such file or directory)");
        if (k == 0 && (!where || where > strstr(said, "after the first allocation")))
            fail_msg("not said at the first allocation: %s", said);
        if (k == 1 && strstr(said, "cannot write into"))
            fail_msg("said for a folder that can be written: %s", said);
    }
    close(fd);
    unlink(err_path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_configure_rejects_unknown_keys_and_lists_valid_ones, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_malloc_and_free_on_two_devices, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_caller_errors_are_reported, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_device_wide_malloc_and_free_keep_cudas_promises, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_stats_release_and_peaks, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_reports_in_text_and_valid_json, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_reports_show_pinned_host_memory_and_round_trip, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_reuse_across_streams_follows_the_way_in, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_bad_cuheap_conf_stops_the_program_naming_the_key, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_report_path_writes_on_oom_on_sigusr1_and_at_exit, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_report_key_takes_a_path_and_none, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test_setup_teardown(test_unwritable_report_folder_is_said_at_once, runtime_on_sim_setup, runtime_teardown),
        cmocka_unit_test(test_repeated_messages_come_out_a_line_a_second),
        cmocka_unit_test_setup_teardown(test_trace_records_a_job_that_cuheap_replay_replays, runtime_on_sim_setup, runtime_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
