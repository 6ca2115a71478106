/* test_config.c - tests of the CUHEAP_CONF parser (src/config.c).
 *
 * Proves the exact value each accepted setting produces over the defaults
 * (sizes with K/M/G/T, optional "i" and "B" in either case, fractions of a
 * size, the 2 MiB rounding of workspace and segment_min, limits as bytes, as
 * fractions and as percentages), that every bad key or value is an error
 * whose message names it (and, for an unknown key, lists every valid key),
 * that a failed parse leaves the config untouched byte for byte, that
 * whitespace and empty items are tolerated, that cuh_config_limit turns a
 * limit into bytes for a device size, and that cuh_config_format writes
 * every value (and reads back to the same config); thousands of seeded
 * edits of a full setting string are each refused cleanly or accepted in
 * range and written back exactly.
 */
#include "test_util.h"

#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define assert_contains(hay, needle)                                                   \
    do {                                                                               \
        if (!strstr((hay), (needle)))                                                  \
            fail_msg("message \"%s\" does not contain \"%s\"", (hay), (needle));       \
    } while (0)

/* Parses `text` over the defaults; fails the test on error. */
static cuh_config_t parse_ok(const char *text)
{
    cuh_config_t cfg;
    char err[512] = "";
    cuh_config_defaults(&cfg);
    if (cuh_config_parse(text, &cfg, err, sizeof err) != 0)
        fail_msg("'%s' was refused: %s", text, err);
    return cfg;
}

/* Parses `text` over a config of non-default values; asserts -1, that the
 * config did not change, that the message contains `needle`, and returns. */
static void parse_fails(const char *text, const char *needle)
{
    cuh_config_t cfg, before;
    cuh_config_defaults(&cfg);
    cfg.workspace = 6 * MiB;
    cfg.limit_bytes = 0;
    cfg.limit_fraction = 0.25;
    cfg.small_max = 4096;
    cfg.segment_min = 8 * MiB;
    cfg.grow_fraction = 0.125;
    before = cfg;
    char err[512];
    memset(err, 0, sizeof err);
    int rc = cuh_config_parse(text, &cfg, err, sizeof err);
    if (rc != -1)
        fail_msg("'%s' was accepted (rc %d)", text, rc);
    if (memcmp(&cfg, &before, sizeof cfg) != 0)
        fail_msg("failed parse of '%s' changed the config", text);
    assert_true(strlen(err) > 0);
    if (needle)
        assert_contains(err, needle);
}

static size_t small_max_of(const char *value)
{
    char text[128];
    snprintf(text, sizeof text, "small_max:%s", value);
    return parse_ok(text).small_max;
}

static void test_defaults(void **state)
{
    (void)state;
    cuh_config_t cfg;
    memset(&cfg, 0xff, sizeof cfg);
    cuh_config_defaults(&cfg);
    assert_int_equal(cfg.workspace, 0);
    assert_int_equal(cfg.limit_bytes, 0);
    assert_true(cfg.limit_fraction == 0.0);
    assert_int_equal(cfg.small_max, 65536);
    assert_int_equal(cfg.segment_min, 2097152);
    assert_true(cfg.grow_fraction == 0.0625);
}

static void test_empty_and_null_text_change_nothing(void **state)
{
    (void)state;
    cuh_config_t def, cfg;
    cuh_config_defaults(&def);
    const char *texts[] = {"", ",", ",,,", "   ", " , \t, "};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        cfg = parse_ok(texts[i]);
        assert_memory_equal(&cfg, &def, sizeof cfg);
    }
    cfg = def;
    char err[64] = "";
    assert_int_equal(cuh_config_parse(NULL, &cfg, err, sizeof err), 0);
    assert_memory_equal(&cfg, &def, sizeof cfg);
}

static void test_workspace_sizes_round_up_to_2mib(void **state)
{
    (void)state;
    assert_int_equal(parse_ok("workspace:1G").workspace, (size_t)1 << 30);
    assert_int_equal(parse_ok("workspace:1.5G").workspace, (size_t)1610612736);
    assert_int_equal(parse_ok("workspace:100M").workspace, (size_t)104857600);   /* 50 x 2 MiB already */
    assert_int_equal(parse_ok("workspace:101M").workspace, (size_t)102 << 20);
    assert_int_equal(parse_ok("workspace:1").workspace, (size_t)2 << 20);
    assert_int_equal(parse_ok("workspace:2M").workspace, (size_t)2 << 20);
    assert_int_equal(parse_ok("workspace:2097153").workspace, (size_t)4 << 20);
    assert_int_equal(parse_ok("workspace:0").workspace, 0);
    assert_int_equal(parse_ok("workspace:2mb").workspace, (size_t)2 << 20);
    assert_int_equal(parse_ok("workspace:3MiB").workspace, (size_t)4 << 20);
    assert_int_equal(parse_ok("workspace:1T").workspace, (size_t)1 << 40);
    /* Every workspace value is a multiple of 2 MiB, whatever was written. */
    for (unsigned k = 1; k < 300; k += 7) {
        char text[64];
        snprintf(text, sizeof text, "workspace:%uK", k * 333);
        size_t w = parse_ok(text).workspace;
        size_t want = ((size_t)k * 333 * 1024 + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
        assert_int_equal(w, want);
    }
}

static void test_size_suffixes_accepted_exactly(void **state)
{
    (void)state;
    /* small_max is stored as written (no rounding), so it shows parse_size. */
    assert_int_equal(small_max_of("512"), 512);
    assert_int_equal(small_max_of("0"), 0);
    assert_int_equal(small_max_of("512B"), 512);
    assert_int_equal(small_max_of("512b"), 512);
    assert_int_equal(small_max_of("64K"), 65536);
    assert_int_equal(small_max_of("64k"), 65536);
    assert_int_equal(small_max_of("64KiB"), 65536);
    assert_int_equal(small_max_of("64kib"), 65536);
    assert_int_equal(small_max_of("64KIB"), 65536);
    assert_int_equal(small_max_of("64Ki"), 65536);
    assert_int_equal(small_max_of("64KB"), 65536);
    assert_int_equal(small_max_of("64kb"), 65536);
    assert_int_equal(small_max_of("1M"), 1048576);
    assert_int_equal(small_max_of("1m"), 1048576);
    assert_int_equal(small_max_of("1mb"), 1048576);
    assert_int_equal(small_max_of("1MiB"), 1048576);
    assert_int_equal(small_max_of("0.5M"), 524288);
    assert_int_equal(small_max_of(".5K"), 512);
    assert_int_equal(small_max_of("1.25K"), 1280);
    assert_int_equal(small_max_of("  64K  "), 65536);   /* value is trimmed */
    /* G and T scale by 2^30 and 2^40 (seen through limit, which allows them). */
    assert_int_equal(parse_ok("limit:2G").limit_bytes, (size_t)2 << 30);
    assert_int_equal(parse_ok("limit:2g").limit_bytes, (size_t)2 << 30);
    assert_int_equal(parse_ok("limit:2GiB").limit_bytes, (size_t)2 << 30);
    assert_int_equal(parse_ok("limit:1T").limit_bytes, (size_t)1 << 40);
    assert_int_equal(parse_ok("limit:1tb").limit_bytes, (size_t)1 << 40);
}

static void test_bad_sizes_are_errors_naming_the_key(void **state)
{
    (void)state;
    const char *bad[] = {"abc", "-1", "+1", "1X", "64KX", "64KiBB", "64 K", "1iB", "K", "1.5", "0.3K",
                         "1..5K", "1KK", "B", "-0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[64];
        snprintf(text, sizeof text, "workspace:%s", bad[i]);
        parse_fails(text, "workspace");
        parse_fails(text, bad[i]);
        snprintf(text, sizeof text, "small_max:%s", bad[i]);
        parse_fails(text, "small_max");
        snprintf(text, sizeof text, "segment_min:%s", bad[i]);
        parse_fails(text, "segment_min");
    }
    /* Beyond the 64-bit range. */
    parse_fails("workspace:20000000T", "workspace");
}

static void test_limit_bytes_fraction_and_percent(void **state)
{
    (void)state;
    cuh_config_t c = parse_ok("limit:40G");
    assert_int_equal(c.limit_bytes, (size_t)40 << 30);
    assert_true(c.limit_fraction == 0.0);
    c = parse_ok("limit:0.9");
    assert_int_equal(c.limit_bytes, 0);
    assert_true(c.limit_fraction == 0.9);
    c = parse_ok("limit:90%");
    assert_int_equal(c.limit_bytes, 0);
    assert_true(c.limit_fraction == 0.9);
    c = parse_ok("limit:.5");
    assert_true(c.limit_fraction == 0.5);
    c = parse_ok("limit:1.0");
    assert_true(c.limit_fraction == 1.0);
    c = parse_ok("limit:100%");
    assert_true(c.limit_fraction == 1.0);
    c = parse_ok("limit:1.5G");   /* a '.' followed by a suffix is a size */
    assert_int_equal(c.limit_bytes, (size_t)1610612736);
    assert_true(c.limit_fraction == 0.0);
    c = parse_ok("limit:2M");     /* the smallest size allowed: one segment */
    assert_int_equal(c.limit_bytes, (size_t)2 << 20);
    /* The later limit replaces the earlier, whichever kind each is. */
    c = parse_ok("limit:0.9,limit:40G");
    assert_int_equal(c.limit_bytes, (size_t)40 << 30);
    assert_true(c.limit_fraction == 0.0);
    c = parse_ok("limit:40G,limit:50%");
    assert_int_equal(c.limit_bytes, 0);
    assert_true(c.limit_fraction == 0.5);
    c = parse_ok("limit:40G,limit:none");
    assert_int_equal(c.limit_bytes, 0);
    assert_true(c.limit_fraction == 0.0);
    c = parse_ok("limit:0.5,limit:0");
    assert_int_equal(c.limit_bytes, 0);
    assert_true(c.limit_fraction == 0.0);
}

static void test_bad_limits_are_errors(void **state)
{
    (void)state;
    parse_fails("limit:1", "limit");          /* 1 byte: less than a segment */
    parse_fails("limit:2097151", "limit");
    parse_fails("limit:1.5", "limit");        /* a fraction above 1 */
    parse_fails("limit:150%", "limit");
    parse_fails("limit:0.0", "limit");        /* fraction must be > 0 */
    parse_fails("limit:0%", "limit");
    parse_fails("limit:abc", "limit");
    parse_fails("limit:abc%", "limit");
    parse_fails("limit:90%%", "limit");
    parse_fails("limit:9x0%", "limit");
    parse_fails("limit:-0.5", "limit");
    parse_fails("limit:0.5.5", "limit");
    parse_fails("limit:40Q", "limit");
}

static void test_small_max_segment_min_grow_fraction_bounds(void **state)
{
    (void)state;
    assert_int_equal(parse_ok("small_max:1M").small_max, (size_t)1 << 20);
    parse_fails("small_max:2M", "small_max");
    parse_fails("small_max:1048577", "small_max");
    assert_int_equal(parse_ok("segment_min:3M").segment_min, (size_t)4 << 20);
    assert_int_equal(parse_ok("segment_min:2M").segment_min, (size_t)2 << 20);
    assert_int_equal(parse_ok("segment_min:1").segment_min, (size_t)2 << 20);
    assert_int_equal(parse_ok("segment_min:1G").segment_min, (size_t)1 << 30);
    assert_int_equal(parse_ok("segment_min:33M").segment_min, (size_t)34 << 20);
    parse_fails("segment_min:0", "segment_min");
    parse_fails("segment_min:1025M", "segment_min");
    assert_true(parse_ok("grow_fraction:0.5").grow_fraction == 0.5);
    assert_true(parse_ok("grow_fraction:0").grow_fraction == 0.0);
    assert_true(parse_ok("grow_fraction:1").grow_fraction == 1.0);
    assert_true(parse_ok("grow_fraction:0.25").grow_fraction == 0.25);
    parse_fails("grow_fraction:2", "grow_fraction");
    parse_fails("grow_fraction:1.0001", "grow_fraction");
    parse_fails("grow_fraction:-0.1", "grow_fraction");
    parse_fails("grow_fraction:abc", "grow_fraction");
    parse_fails("grow_fraction:0.5x", "grow_fraction");
    parse_fails("grow_fraction:nan", "grow_fraction");
}

static void test_whitespace_trailing_comma_and_several_keys(void **state)
{
    (void)state;
    cuh_config_t c = parse_ok("  workspace : 1G ,\tlimit:\t40G , small_max : 4K,segment_min:8M, grow_fraction :0.5 ,");
    assert_int_equal(c.workspace, (size_t)1 << 30);
    assert_int_equal(c.limit_bytes, (size_t)40 << 30);
    assert_int_equal(c.small_max, 4096);
    assert_int_equal(c.segment_min, (size_t)8 << 20);
    assert_true(c.grow_fraction == 0.5);
    /* Empty items between commas are skipped; the later of two equal keys wins. */
    c = parse_ok("workspace:1G,,workspace:2G,");
    assert_int_equal(c.workspace, (size_t)2 << 30);
    /* Parsing is over the values passed in: other keys keep theirs. */
    cuh_config_t base;
    cuh_config_defaults(&base);
    base.workspace = 4 * MiB;
    base.grow_fraction = 0.75;
    char err[256] = "";
    assert_int_equal(cuh_config_parse("limit:40G", &base, err, sizeof err), 0);
    assert_int_equal(base.workspace, 4 * MiB);
    assert_true(base.grow_fraction == 0.75);
    assert_int_equal(base.limit_bytes, (size_t)40 << 30);
    assert_int_equal(base.small_max, 65536);
}

static void test_unknown_key_names_it_and_lists_valid_keys(void **state)
{
    (void)state;
    const char *texts[] = {"workspce:1G", "limit:40G,workspce:1G", "  workspce  :  1G  "};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        parse_fails(texts[i], "'workspce'");
        parse_fails(texts[i], "workspace");
        parse_fails(texts[i], "limit");
        parse_fails(texts[i], "small_max");
        parse_fails(texts[i], "segment_min");
        parse_fails(texts[i], "grow_fraction");
    }
    parse_fails("Workspace:1G", "'Workspace'");   /* keys are case-sensitive */
    parse_fails(":1G", "grow_fraction");           /* empty key is unknown */
}

static void test_missing_colon_or_value_is_an_error(void **state)
{
    (void)state;
    parse_fails("workspace", "workspace");
    parse_fails("workspace", "':'");
    parse_fails("workspace 1G", "workspace");
    parse_fails("limit:40G,workspace", "workspace");
    parse_fails("workspace:", "workspace");
    parse_fails("workspace:   ", "workspace");
    parse_fails("workspace:,limit:40G", "workspace");
    parse_fails("grow_fraction:", "grow_fraction");
}

static void test_failed_parse_leaves_config_unchanged(void **state)
{
    (void)state;
    /* A bad item after good ones: none of the good ones may be applied. */
    parse_fails("workspace:1G,limit:40G,small_max:2M", "small_max");
    parse_fails("workspace:1G,segment_min:8M,grow_fraction:3", "grow_fraction");
    parse_fails("limit:0.5,bogus:1", "bogus");
    parse_fails("small_max:1K,limit:1", "limit");
    /* An item longer than the parser's buffer is refused, not truncated. */
    char longtext[700];
    memset(longtext, ' ', sizeof longtext);
    memcpy(longtext, "workspace:1G", 12);
    longtext[sizeof longtext - 1] = '\0';
    parse_fails(longtext, "too long");
    /* A message is cut to the buffer given, and still terminated. */
    cuh_config_t cfg;
    cuh_config_defaults(&cfg);
    char err[16];
    memset(err, 'x', sizeof err);
    assert_int_equal(cuh_config_parse("workspce:1G", &cfg, err, sizeof err), -1);
    assert_true(memchr(err, '\0', sizeof err) != NULL);
    assert_int_equal(strlen(err), sizeof err - 1);
}

static void test_limit_in_bytes_for_a_device(void **state)
{
    (void)state;
    cuh_config_t c;
    cuh_config_defaults(&c);
    assert_int_equal(cuh_config_limit(&c, 80 * GiB), 0);   /* none */
    c = parse_ok("limit:40G");
    assert_int_equal(cuh_config_limit(&c, 80 * GiB), 40 * GiB);
    assert_int_equal(cuh_config_limit(&c, 0), 40 * GiB);
    c = parse_ok("limit:0.5");
    assert_int_equal(cuh_config_limit(&c, 1000 * MiB), 500 * MiB);
    c = parse_ok("limit:90%");
    assert_int_equal(cuh_config_limit(&c, 10 * GiB), 9 * GiB);
    c = parse_ok("limit:0.9");
    assert_int_equal(cuh_config_limit(&c, 10 * GiB), 9 * GiB);
    c = parse_ok("limit:25%");
    assert_int_equal(cuh_config_limit(&c, 80 * GiB), 20 * GiB);
    c = parse_ok("limit:1.0");
    assert_int_equal(cuh_config_limit(&c, 80 * GiB), 80 * GiB);
    /* Bytes take precedence if both fields are set by hand. */
    c.limit_bytes = 3 * GiB;
    c.limit_fraction = 0.5;
    assert_int_equal(cuh_config_limit(&c, 80 * GiB), 3 * GiB);
}

/* Every way in runs on virtual memory unless told otherwise; ipc_safe:1
 * (a plain segment for every block) brings plain segments with it, and said
 * beside vmm:1, in either order, it is the heap's error to name. */
static void test_vmm_is_every_ways_default_and_ipc_safe_brings_plain_segments(void **state)
{
    (void)state;
    char err[256];
    for (unsigned ways = 0; ways <= (CUH_WAY_PLUGIN | CUH_WAY_INTERPOSER); ways++) {
        cuh_config_t c;
        cuh_config_defaults_for(&c, ways);
        assert_int_equal(c.vmm, 1);
        assert_int_equal(cuh_config_parse("ipc_safe:1", &c, err, sizeof err), 0);
        assert_int_equal(c.vmm, 0);
        assert_int_equal(c.ipc_safe, 1);
    }
    const char *both[] = {"ipc_safe:1,vmm:1", "vmm:1,ipc_safe:1"};
    for (int i = 0; i < 2; i++) {
        cuh_config_t c;
        cuh_config_defaults(&c);
        assert_int_equal(cuh_config_parse(both[i], &c, err, sizeof err), 0);
        assert_int_equal(c.vmm, 1);
        assert_int_equal(c.ipc_safe, 1);
    }
    cuh_config_t c;
    cuh_config_defaults(&c);
    assert_int_equal(cuh_config_parse("ipc_safe:0", &c, err, sizeof err), 0);
    assert_int_equal(c.vmm, 1);
}

static void test_format_writes_every_value(void **state)
{
    (void)state;
    char buf[512];
    cuh_config_t c;
    cuh_config_defaults(&c);
    cuh_config_format(&c, buf, sizeof buf);
    assert_string_equal(buf, "workspace:0,limit:none,small_max:65536,segment_min:2097152,grow_fraction:0.0625,"
                             "vmm:1,vmm_margin:0.1,vmm_page:2097152,vmm_unit:2097152,step_plan:0,thread_cache:4194304,wait_before_grow:1,device_fences:1,reuse_across_streams:0,"
                             "ipc_safe:0,ipc_callers:libnccl,"
                             "meminfo_cached:1,pinned:1,pinned_chunk:33554432");

    c = parse_ok("workspace:1G,limit:40G,small_max:4K,segment_min:3M,grow_fraction:0.5,vmm:1,vmm_margin:0.25,"
                 "vmm_page:16M,vmm_unit:64M,step_plan:1,thread_cache:0,device_fences:0,reuse_across_streams:1,pinned:0,pinned_chunk:5M");
    cuh_config_format(&c, buf, sizeof buf);
    assert_string_equal(buf, "workspace:1073741824,limit:42949672960,small_max:4096,segment_min:4194304,"
                             "grow_fraction:0.5,vmm:1,vmm_margin:0.25,vmm_page:16777216,vmm_unit:67108864,step_plan:1,thread_cache:0,wait_before_grow:1,"
                             "device_fences:0,reuse_across_streams:1,ipc_safe:0,"
                             "ipc_callers:libnccl,meminfo_cached:1,pinned:0,pinned_chunk:6291456");

    c = parse_ok("ipc_callers:none");
    assert_string_equal(c.ipc_callers, "");
    cuh_config_format(&c, buf, sizeof buf);
    assert_contains(buf, ",ipc_callers:none,");
    c = parse_ok("ipc_callers:libmpi");
    assert_string_equal(c.ipc_callers, "libmpi");
    parse_fails("vmm:2", "vmm");
    parse_fails("vmm:yes please", "vmm");
    parse_fails("vmm_margin:1.5", "vmm_margin");
    assert_int_equal(parse_ok("").vmm_page, (size_t)2 << 20);
    assert_int_equal(parse_ok("vmm_page:8M").vmm_page, (size_t)8 << 20);
    assert_int_equal(parse_ok("vmm_page:3M").vmm_page, (size_t)4 << 20);
    assert_int_equal(parse_ok("vmm_page:1G").vmm_page, (size_t)1 << 30);
    parse_fails("vmm_page:0", "vmm_page:0 must be between 2M and 1G");
    parse_fails("vmm_page:2G", "vmm_page");
    parse_fails("vmm_page:big", "vmm_page");
    assert_int_equal(parse_ok("").vmm_unit, (size_t)2 << 20);   /* a unit a page */
    assert_int_equal(parse_ok("vmm_unit:64M,vmm_unit:auto").vmm_unit, 0);   /* units grow with the heap */
    c = parse_ok("vmm_unit:auto");
    cuh_config_format(&c, buf, sizeof buf);
    assert_contains(buf, ",vmm_unit:auto,");
    assert_int_equal(parse_ok("vmm_unit:64M").vmm_unit, (size_t)64 << 20);
    parse_fails("vmm_unit:automatic", "vmm_unit:automatic is not a size; sizes are bytes with an optional K, M, G or T "
                                      "(like 512M), or auto");
    assert_int_equal(parse_ok("vmm_unit:5M").vmm_unit, (size_t)6 << 20);
    parse_fails("vmm_unit:0", "vmm_unit:0 must be between 2M and 1G");
    parse_fails("vmm_unit:4G", "vmm_unit");

    c = parse_ok("limit:90%");
    cuh_config_format(&c, buf, sizeof buf);
    assert_contains(buf, "limit:0.9,");
    assert_contains(buf, "workspace:0,");

    /* What format writes parses back to the same config. */
    const char *confs[] = {"", "workspace:1.5G,limit:0.9", "limit:40G,small_max:0,grow_fraction:0",
                           "segment_min:1G,grow_fraction:1,limit:25%", "ipc_callers:none", "ipc_callers:libucc"};
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
        cuh_config_t a = parse_ok(confs[i]);
        cuh_config_format(&a, buf, sizeof buf);
        cuh_config_t b = parse_ok(buf);
        if (memcmp(&a, &b, sizeof a) != 0)
            fail_msg("'%s' formats as '%s', which parses to another config", confs[i], buf);
    }

    /* A short buffer is cut and terminated. */
    char small[20];
    memset(small, 'x', sizeof small);
    cuh_config_defaults(&c);
    cuh_config_format(&c, small, sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_memory_equal(small, "workspace:0,limit:n", sizeof small);
}

static void test_print_table_lists_every_key(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    cuh_config_print_table(f);
    fclose(f);
    assert_non_null(text);
    assert_contains(text, "| key | default | meaning |");
    assert_contains(text, "| `workspace` | 0 |");
    assert_contains(text, "| `limit` | none |");
    assert_contains(text, "| `small_max` | 64K |");
    assert_contains(text, "| `segment_min` | 2M |");
    assert_contains(text, "| `grow_fraction` | 0.0625 |");
    assert_contains(text, "| `vmm_page` | 2M |");
    free(text);
}

static void test_formatted_settings_parse_back_to_the_same_values(void **state)
{
    (void)state;
    /* limit:7e-6% once formatted as limit:7e-08, which reads as no number
     * (found by tests/fuzz/fuzz_config.c). */
    const char *inputs[] = {"limit:100%",          "limit:1.0",      "limit:0.5",
                            "limit:40G,workspace:2G", "grow_fraction:0", "limit:7e-6%",
                            "limit:0.123456789012345", "limit:1e-27%", "limit:0.3%"};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        cuh_config_t a, b;
        char err[256], text[512];
        cuh_config_defaults(&a);
        assert_int_equal(cuh_config_parse(inputs[i], &a, err, sizeof err), 0);
        cuh_config_format(&a, text, sizeof text);
        cuh_config_defaults(&b);
        if (cuh_config_parse(text, &b, err, sizeof err))
            fail_msg("'%s' formatted as '%s' does not parse back: %s", inputs[i], text, err);
        assert_int_equal(a.limit_bytes, b.limit_bytes);
        assert_true(a.limit_fraction == b.limit_fraction);
        assert_int_equal(a.workspace, b.workspace);
    }
}

static void test_a_tiny_limit_fraction_is_never_unlimited(void **state)
{
    (void)state;
    cuh_config_t c;
    char err[256];
    cuh_config_defaults(&c);
    assert_int_equal(cuh_config_parse("limit:0.0000000001", &c, err, sizeof err), 0);
    assert_int_equal(cuh_config_limit(&c, (size_t)1 << 30), 2 * MiB);
}

/* Seeded edits of a string that sets every key (bytes changed, deleted,
 * inserted, the string cut): each is refused, leaving the config as it was
 * with a printable message, or accepted with every value inside its
 * documented range, and then cuh_config_format writes text that parses
 * back to the same settings. */
static void check_ranges(const cuh_config_t *c, const char *text)
{
    int ok = c->workspace % (2 * MiB) == 0 && c->segment_min % (2 * MiB) == 0 && c->segment_min >= 2 * MiB &&
             c->small_max <= MiB && c->grow_fraction >= 0 && c->grow_fraction <= 1 && c->vmm <= 1 &&
             c->vmm_margin >= 0 && c->vmm_margin <= 1 && c->wait_before_grow <= 1 && c->reuse_across_streams <= 1 &&
             c->ipc_safe <= 1 && c->meminfo_cached <= 1 && c->pinned <= 1 && c->pinned_chunk >= 2 * MiB &&
             c->pinned_chunk <= GiB && c->pinned_chunk % (2 * MiB) == 0 && c->limit_fraction >= 0 &&
             c->limit_fraction <= 1 && !(c->limit_bytes && c->limit_fraction > 0) && !strchr(c->report, ',') &&
             !strchr(c->trace, ',');
    if (!ok)
        fail_msg("'%s' was accepted with a value out of range", text);
}

static void test_mutated_settings(void **state)
{
    (void)state;
    static const char base[] =
        "workspace:64M,limit:0.9,small_max:32K,segment_min:4M,grow_fraction:0.125,vmm:1,vmm_margin:0.05,"
        "vmm_page:4M,thread_cache:2M,wait_before_grow:0,reuse_across_streams:1,ipc_safe:0,ipc_callers:libnccl,"
        "meminfo_cached:1,pinned:1,pinned_chunk:64M,report:/tmp/r-%p.json,trace:/tmp/t.trace";
    static const char alphabet[] = "0123456789.,:%-+ eEkKmMgGtTiIbB\t\x01\xff_az";
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int accepted = 0, refused = 0;
    for (int r = 0; r < 5000; r++) {
        char text[512];
        size_t len = strlen(base);
        memcpy(text, base, len + 1);
        for (int k = 1 + (int)(test_rand(&seed) % 3); k > 0; k--)
            test_mutate_once(text, &len, sizeof text, alphabet, &seed);
        cuh_config_t cfg, before;
        cuh_config_defaults(&cfg);
        before = cfg;
        char err[1024] = "";
        if (cuh_config_parse(text, &cfg, err, sizeof err) != 0) {
            refused++;
            if (memcmp(&cfg, &before, sizeof cfg) != 0)
                fail_msg("refused '%s' changed the config", text);
            if (strlen(err) < 10)
                fail_msg("refused '%s' with the message '%s'", text, err);
            for (const unsigned char *c = (const unsigned char *)err; *c; c++)
                if (*c < 0x20 || *c >= 0x7f)
                    fail_msg("refused '%s' with a message holding byte 0x%02x: %s", text, *c, err);
            continue;
        }
        accepted++;
        check_ranges(&cfg, text);
        char formatted[2048];
        cuh_config_format(&cfg, formatted, sizeof formatted);
        cuh_config_t again;
        cuh_config_defaults(&again);
        if (cuh_config_parse(formatted, &again, err, sizeof err) != 0)
            fail_msg("'%s' formatted as '%s' does not parse back: %s", text, formatted, err);
        /* Fractions are written with %g: six significant digits. */
        if (fabs(again.grow_fraction - cfg.grow_fraction) > 1e-6 * cfg.grow_fraction + 1e-12 ||
            fabs(again.vmm_margin - cfg.vmm_margin) > 1e-6 * cfg.vmm_margin + 1e-12 ||
            fabs(again.limit_fraction - cfg.limit_fraction) > 1e-6 * cfg.limit_fraction + 1e-12)
            fail_msg("'%s': a fraction changed in '%s'", text, formatted);
        again.grow_fraction = cfg.grow_fraction;
        again.vmm_margin = cfg.vmm_margin;
        again.limit_fraction = cfg.limit_fraction;
        if (memcmp(&again, &cfg, sizeof cfg) != 0)
            fail_msg("'%s' formatted as '%s' reads back as other settings", text, formatted);
    }
    assert_true(accepted > 100);
    assert_true(refused > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_empty_and_null_text_change_nothing),
        cmocka_unit_test(test_workspace_sizes_round_up_to_2mib),
        cmocka_unit_test(test_size_suffixes_accepted_exactly),
        cmocka_unit_test(test_bad_sizes_are_errors_naming_the_key),
        cmocka_unit_test(test_limit_bytes_fraction_and_percent),
        cmocka_unit_test(test_bad_limits_are_errors),
        cmocka_unit_test(test_small_max_segment_min_grow_fraction_bounds),
        cmocka_unit_test(test_whitespace_trailing_comma_and_several_keys),
        cmocka_unit_test(test_unknown_key_names_it_and_lists_valid_keys),
        cmocka_unit_test(test_missing_colon_or_value_is_an_error),
        cmocka_unit_test(test_failed_parse_leaves_config_unchanged),
        cmocka_unit_test(test_limit_in_bytes_for_a_device),
        cmocka_unit_test(test_vmm_is_every_ways_default_and_ipc_safe_brings_plain_segments),
        cmocka_unit_test(test_format_writes_every_value),
        cmocka_unit_test(test_print_table_lists_every_key),
        cmocka_unit_test(test_formatted_settings_parse_back_to_the_same_values),
        cmocka_unit_test(test_a_tiny_limit_fraction_is_never_unlimited),
        cmocka_unit_test(test_mutated_settings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
