/* fuzz_json.c - any bytes as JSON: cuh_json_parse must parse them or refuse
 * them with a message and a place, never crash or read out of bounds; a
 * parsed document is walked whole. Built with clang's -fsanitize=fuzzer by
 * `make fuzz`; with FUZZ_MAIN it replays files and folders
 * (tests/fuzz/corpus/json). */
#include "json_read.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Visits every value below v. */
static size_t walk(const cuh_json_t *v, unsigned depth)
{
    size_t n = 1;
    if (!v || depth > 1000)
        abort();
    (void)cuh_json_describe(v);
    if (v->type == CUH_JSON_ARRAY)
        for (size_t i = 0; i < cuh_json_count(v); i++)
            n += walk(cuh_json_at(v, i), depth + 1);
    if (v->type == CUH_JSON_OBJECT)
        for (size_t i = 0; i < v->v.object.n; i++) {
            const cuh_json_member_t *m = &v->v.object.members[i];
            /* Every key is found again (one without a NUL of its own). */
            if (strlen(m->key) == m->key_len && !cuh_json_get(v, m->key))
                abort();
            n += walk(&m->value, depth + 1);
        }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cuh_json_error_t err;
    memset(&err, 0, sizeof err);
    cuh_json_doc_t *doc = cuh_json_parse((const char *)data, size, NULL, &err);
    if (!doc) {
        if (!err.message[0])
            abort();   /* a refusal always says why */
        return 0;
    }
    (void)walk(cuh_json_root(doc), 0);
    cuh_json_free(doc);
    return 0;
}

#ifdef FUZZ_MAIN
#include "fuzz_main.h"
#endif
