/* json_read.h - a small, strict JSON reader (RFC 8259) for cuheap's tools.
 *
 * cuh_json_parse reads a whole document into a tree that lives in one block
 * of memory owned by the returned document: objects (members in document
 * order, found by key), arrays, strings (escapes decoded, \uXXXX and
 * surrogate pairs to UTF-8), numbers (always as a double, and also as an
 * int64/uint64 when the number is an integer that fits), true, false and
 * null. It is strict: no comments, no trailing commas, no leading zeros, no
 * lone surrogates, no invalid UTF-8, no duplicate keys, nothing after the
 * top-level value. An error gives the line and column (from 1; the column
 * counts bytes) and says what was expected and what was found. Time is linear
 * in the size of the input (n log n for objects of many members), nesting is
 * limited (64 by default) and so is the size of the input (1 GiB by default).
 *
 * Tool-side only: not part of libcuheap.so.
 */
#ifndef CUH_JSON_READ_H
#define CUH_JSON_READ_H

#include <stddef.h>
#include <stdint.h>

#define CUH_JSON_MAX_DEPTH 64
#define CUH_JSON_MAX_SIZE ((size_t)1 << 30)

typedef enum cuh_json_type_e {
    CUH_JSON_NULL = 0,
    CUH_JSON_BOOL,
    CUH_JSON_NUMBER,
    CUH_JSON_STRING,
    CUH_JSON_ARRAY,
    CUH_JSON_OBJECT
} cuh_json_type_t;

/* Flags of a number: which of its integer forms hold its exact value. */
#define CUH_JSON_INT64 1u    /* an integer in the range of int64_t: number.i */
#define CUH_JSON_UINT64 2u   /* an integer in the range of uint64_t: number.u */

typedef struct cuh_json_s cuh_json_t;
typedef struct cuh_json_member_s cuh_json_member_t;

struct cuh_json_s {
    cuh_json_type_t type;
    uint32_t line, column;    /* where the value begins */
    union {
        int boolean;          /* 0 or 1 */
        struct {
            double d;         /* always set (rounded for large integers) */
            int64_t i;        /* with CUH_JSON_INT64 */
            uint64_t u;       /* with CUH_JSON_UINT64 */
            unsigned flags;
        } number;
        struct {
            const char *s;    /* UTF-8, NUL-terminated; may hold a NUL of its own (\u0000) */
            size_t len;       /* bytes, without the terminating NUL */
        } string;
        struct {
            const cuh_json_t *items;
            size_t n;
        } array;
        struct {
            const cuh_json_member_t *members;   /* in document order */
            size_t n;
            const cuh_json_member_t *const *sorted;   /* by key; NULL for small objects */
        } object;
    } v;
};

struct cuh_json_member_s {
    const char *key;          /* as string.s */
    size_t key_len;
    uint32_t key_line, key_column;
    cuh_json_t value;
};

typedef struct cuh_json_doc_s cuh_json_doc_t;

typedef struct cuh_json_limits_s {
    size_t max_size;          /* bytes of input; 0 = CUH_JSON_MAX_SIZE */
    unsigned max_depth;       /* nested arrays and objects; 0 = CUH_JSON_MAX_DEPTH */
} cuh_json_limits_t;

typedef struct cuh_json_error_s {
    uint32_t line, column;    /* 0, 0: not at a place in the text (a read error, a size limit) */
    size_t offset;            /* bytes from the start */
    char message[256];        /* "expected ',' or ']' after an array element, found 'x'" */
} cuh_json_error_t;

/* Parses text[0..len) (no NUL needed). NULL on error, with *err filled
 * (err may be NULL). limits may be NULL for the defaults. */
cuh_json_doc_t *cuh_json_parse(const char *text, size_t len, const cuh_json_limits_t *limits,
                               cuh_json_error_t *err);
/* Reads and parses a file ("-" is standard input). On a read error the
 * message holds the system's reason and line is 0. */
cuh_json_doc_t *cuh_json_parse_file(const char *path, const cuh_json_limits_t *limits, cuh_json_error_t *err);
void cuh_json_free(cuh_json_doc_t *doc);

const cuh_json_t *cuh_json_root(const cuh_json_doc_t *doc);

/* The value of `key` in `object`; NULL when object is not an object or has
 * no such key. */
const cuh_json_t *cuh_json_get(const cuh_json_t *object, const char *key);
/* Element i of an array; NULL when not an array or i is out of range. */
const cuh_json_t *cuh_json_at(const cuh_json_t *array, size_t i);
/* Elements of an array or members of an object; 0 for anything else. */
size_t cuh_json_count(const cuh_json_t *value);

/* "null", "a boolean", "a number", "a string", "an array", "an object". */
const char *cuh_json_type_name(cuh_json_type_t type);
/* Like cuh_json_type_name, but "an integer" for an integral number, "true"
 * and "false" for booleans: for messages ("expected X, found Y"). */
const char *cuh_json_describe(const cuh_json_t *value);

#endif /* CUH_JSON_READ_H */
