/* test_json_read.c - tests of the JSON reader (src/json_read.c), which
 * cuheap-report uses to read reports back.
 *
 * Good documents come back as the tree they spell (escapes, surrogate pairs,
 * the integer forms of numbers, members in order and found by key); each
 * kind of malformed input is refused with the line and column of the
 * problem and a message that says what was expected; the limits hold. Then
 * thousands of seeded mutations of a real report (written by the heap on a
 * simulated device): each is either refused with a position inside the text
 * and a printable message, or read into a tree whose every string is valid
 * UTF-8 and whose every value has a position inside the text; under
 * AddressSanitizer a read out of bounds anywhere in the reader fails too.
 */
#include "test_util.h"

#include "json_read.h"
#include "cuheap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static cuh_json_doc_t *parse(const char *text, cuh_json_error_t *err)
{
    memset(err, 0, sizeof *err);
    return cuh_json_parse(text, strlen(text), NULL, err);
}

/* `text` must be refused at line:column with a message containing `needle`. */
static void expect_refused(const char *text, uint32_t line, uint32_t column, const char *needle)
{
    cuh_json_error_t err;
    cuh_json_doc_t *doc = parse(text, &err);
    if (doc) {
        cuh_json_free(doc);
        fail_msg("'%s' was read, but should fail with \"%s\"", text, needle);
    }
    if (err.line != line || err.column != column || !strstr(err.message, needle))
        fail_msg("'%s': got %u:%u \"%s\", expected %u:%u \"...%s...\"", text, err.line, err.column, err.message,
                 line, column, needle);
}

static void test_good_document(void **state)
{
    (void)state;
    cuh_json_error_t err;
    cuh_json_doc_t *doc = parse("{\"a\": [1, -2, 3.5, 18446744073709551615, -9223372036854775808, 1e3],\n"
                                " \"s\": \"x\\n\\u00e9\\ud83d\\ude00\\\"\", \"t\": true, \"f\": false, \"n\": null,\n"
                                " \"o\": {}, \"e\": []}",
                                &err);
    if (!doc)
        fail_msg("refused: %u:%u %s", err.line, err.column, err.message);
    const cuh_json_t *root = cuh_json_root(doc);
    assert_int_equal(root->type, CUH_JSON_OBJECT);
    assert_int_equal(cuh_json_count(root), 7);
    assert_string_equal(root->v.object.members[0].key, "a");   /* document order */
    assert_string_equal(root->v.object.members[6].key, "e");

    const cuh_json_t *a = cuh_json_get(root, "a");
    assert_non_null(a);
    assert_int_equal(cuh_json_count(a), 6);
    assert_true(cuh_json_at(a, 0)->v.number.flags & CUH_JSON_INT64);
    assert_int_equal(cuh_json_at(a, 0)->v.number.i, 1);
    assert_int_equal(cuh_json_at(a, 1)->v.number.i, -2);
    assert_false(cuh_json_at(a, 1)->v.number.flags & CUH_JSON_UINT64);
    assert_int_equal(cuh_json_at(a, 2)->v.number.flags, 0);
    assert_true(cuh_json_at(a, 2)->v.number.d == 3.5);
    assert_true(cuh_json_at(a, 3)->v.number.flags & CUH_JSON_UINT64);
    assert_false(cuh_json_at(a, 3)->v.number.flags & CUH_JSON_INT64);
    assert_true(cuh_json_at(a, 3)->v.number.u == UINT64_MAX);
    assert_true(cuh_json_at(a, 4)->v.number.i == INT64_MIN);
    assert_true(cuh_json_at(a, 5)->v.number.d == 1000.0);
    assert_null(cuh_json_at(a, 6));
    assert_string_equal(cuh_json_describe(cuh_json_at(a, 0)), "an integer");

    const cuh_json_t *s = cuh_json_get(root, "s");
    assert_int_equal(s->type, CUH_JSON_STRING);
    assert_string_equal(s->v.string.s, "x\n\xc3\xa9\xf0\x9f\x98\x80\"");
    assert_int_equal(s->v.string.len, 9);
    assert_int_equal(s->line, 2);
    assert_int_equal(s->column, 7);
    assert_int_equal(cuh_json_get(root, "t")->v.boolean, 1);
    assert_int_equal(cuh_json_get(root, "f")->v.boolean, 0);
    assert_int_equal(cuh_json_get(root, "n")->type, CUH_JSON_NULL);
    assert_int_equal(cuh_json_count(cuh_json_get(root, "o")), 0);
    assert_int_equal(cuh_json_get(root, "e")->type, CUH_JSON_ARRAY);
    assert_null(cuh_json_get(root, "missing"));
    assert_null(cuh_json_get(a, "a"));   /* not an object */
    cuh_json_free(doc);
}

static void test_many_members_found_by_key(void **state)
{
    (void)state;
    char text[40000];
    size_t n = 0;
    text[n++] = '{';
    for (int i = 0; i < 2000; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s\"k%d\":%d", i ? "," : "", 1999 - i, i);
    text[n++] = '}';
    text[n] = '\0';
    cuh_json_error_t err;
    cuh_json_doc_t *doc = parse(text, &err);
    assert_non_null(doc);
    const cuh_json_t *root = cuh_json_root(doc);
    for (int i = 0; i < 2000; i += 7) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        const cuh_json_t *v = cuh_json_get(root, key);
        assert_non_null(v);
        assert_int_equal(v->v.number.i, 1999 - i);
    }
    assert_null(cuh_json_get(root, "k2000"));
    cuh_json_free(doc);
}

static void test_malformed_documents(void **state)
{
    (void)state;
    expect_refused("", 1, 1, "the end of the input");
    expect_refused("[1,]", 1, 4, "found ']'");
    expect_refused("{\"a\":1,}", 1, 8, "found '}'");
    expect_refused("[01]", 1, 2, "leading zero");
    expect_refused("{\"a\":1,\n \"a\":2}", 2, 2, "duplicate");
    expect_refused("[1] 2", 1, 5, "after");
    expect_refused("\"\\ud800\"", 1, 2, "lone high surrogate");
    expect_refused("\"\\udc00\"", 1, 2, "lone low surrogate");
    expect_refused("\"a\tb\"", 1, 3, "control character");
    expect_refused("\"\xc3\"", 1, 2, "UTF-8");
    expect_refused("[1 // comment\n]", 1, 4, "found '/'");
    expect_refused("[tru]", 1, 2, "true");
    expect_refused("[1e]", 1, 4, "exponent");
}

static void test_limits(void **state)
{
    (void)state;
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    cuh_json_error_t err;
    cuh_json_limits_t limits = {.max_depth = 99};
    assert_null(cuh_json_parse(deep, sizeof deep, &limits, &err));
    assert_non_null(strstr(err.message, "deep"));
    limits.max_depth = 100;
    cuh_json_doc_t *doc = cuh_json_parse(deep, sizeof deep, &limits, &err);
    assert_non_null(doc);
    cuh_json_free(doc);
    limits = (cuh_json_limits_t){.max_size = 10};
    assert_null(cuh_json_parse("[1,2,3,4,5,6]", 13, &limits, &err));
    assert_int_equal(err.line, 0);
    assert_non_null(strstr(err.message, "10"));
}

/* ---- mutated documents ----------------------------------------------------- */

/* 1 if s[0..len) is valid UTF-8 (NULs allowed: \u0000 decodes to one). */
static int valid_utf8(const unsigned char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!n || i + n > len)
            return 0;
        for (size_t k = 1; k < n; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        if (n == 2 && c < 0xC2)
            return 0;
        i += n;
    }
    return 1;
}

/* Every value of the tree: a known type, a position inside the text,
 * strings valid UTF-8 and NUL-terminated; returns how many values. */
static size_t walk(const cuh_json_t *v, uint32_t lines, int depth)
{
    assert_true(depth <= CUH_JSON_MAX_DEPTH + 1);
    assert_true(v->line >= 1 && v->line <= lines && v->column >= 1);
    size_t n = 1;
    switch (v->type) {
    case CUH_JSON_STRING:
        assert_true(valid_utf8((const unsigned char *)v->v.string.s, v->v.string.len));
        assert_int_equal(v->v.string.s[v->v.string.len], '\0');
        break;
    case CUH_JSON_ARRAY:
        for (size_t i = 0; i < v->v.array.n; i++)
            n += walk(&v->v.array.items[i], lines, depth + 1);
        break;
    case CUH_JSON_OBJECT:
        for (size_t i = 0; i < v->v.object.n; i++) {
            const cuh_json_member_t *m = &v->v.object.members[i];
            assert_true(valid_utf8((const unsigned char *)m->key, m->key_len));
            if (strlen(m->key) == m->key_len)   /* a key with a NUL of its own is not found by name */
                assert_ptr_equal(cuh_json_get(v, m->key), &m->value);
            n += walk(&m->value, lines, depth + 1);
        }
        break;
    case CUH_JSON_NUMBER:
        if (v->v.number.flags & CUH_JSON_INT64)
            assert_true((double)v->v.number.i == v->v.number.d);
        if (v->v.number.flags & CUH_JSON_UINT64)
            assert_true((double)v->v.number.u == v->v.number.d);
        break;
    case CUH_JSON_NULL:
    case CUH_JSON_BOOL:
        break;
    default:
        fail_msg("value of unknown type %d", (int)v->type);
    }
    return n;
}

/* A real report: the heap on a simulated device after a few allocations. */
static char *report_text(size_t *len)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/cuh_test_json_read.%d.json", (int)getpid());
    cuh_runtime_reset();
    cuh_runtime_use_sim((size_t)8 << 30);
    void *p[6];
    for (int i = 0; i < 6; i++)
        assert_int_equal(cuheap_malloc(&p[i], (size_t)(i + 1) << (10 + 2 * i), 0, NULL), CUHEAP_OK);
    cuheap_free(p[2], 0, NULL);
    assert_int_equal(cuheap_dump_report(path, CUHEAP_REPORT_JSON), CUHEAP_OK);
    for (int i = 0; i < 6; i++)
        if (i != 2)
            cuheap_free(p[i], 0, NULL);
    cuh_runtime_reset();
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    *len = fread(buf, 1, sizeof buf - 1, f);
    assert_true(*len > 1000 && *len < sizeof buf - 1);
    fclose(f);
    unlink(path);
    return buf;
}

static void test_mutated_documents(void **state)
{
    (void)state;
    static const char alphabet[] = "{}[],:\"\\ 0123456789.eE+-ntrufals\n\t\x01\xc3\xa9\xff";
    size_t base_len;
    const char *base = report_text(&base_len);
    {
        cuh_json_error_t err;
        cuh_json_doc_t *doc = cuh_json_parse(base, base_len, NULL, &err);
        if (!doc)
            fail_msg("the report itself is refused: %u:%u %s", err.line, err.column, err.message);
        cuh_json_free(doc);
    }
    static char buf[1 << 16];
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    size_t read = 0, refused = 0;
    for (int r = 0; r < 4000; r++) {
        size_t len = base_len;
        memcpy(buf, base, len);
        buf[len] = '\0';
        for (int k = 1 + (int)(test_rand(&seed) % 3); k > 0; k--)
            test_mutate_once(buf, &len, sizeof buf, alphabet, &seed);
        uint32_t lines = 1;
        for (size_t i = 0; i < len; i++)
            lines += buf[i] == '\n';
        cuh_json_error_t err;
        memset(&err, 0, sizeof err);
        cuh_json_doc_t *doc = cuh_json_parse(buf, len, NULL, &err);
        if (doc) {
            assert_true(walk(cuh_json_root(doc), lines, 0) > 0);
            cuh_json_free(doc);
            read++;
            continue;
        }
        refused++;
        if (err.line < 1 || err.line > lines || err.column < 1 || err.offset > len || strlen(err.message) < 10)
            fail_msg("round %d: error at %u:%u (offset %zu of %zu): \"%s\"", r, err.line, err.column, err.offset, len,
                     err.message);
        for (const unsigned char *c = (const unsigned char *)err.message; *c; c++)
            if (*c < 0x20 || *c >= 0x7f)
                fail_msg("round %d: message \"%s\" holds byte 0x%02x", r, err.message, *c);
    }
    assert_true(read > 0);
    assert_true(refused > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_document),
        cmocka_unit_test(test_many_members_found_by_key),
        cmocka_unit_test(test_malformed_documents),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_mutated_documents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
