/* torch_model.c - a model of PyTorch's CUDA caching allocator, replayed over traces.
 *
 * The rules are PyTorch 2.x's (c10/cuda/CUDACachingAllocator.cpp, default
 * settings), restated here; see torch_model.h for what is left out.
 *  - A request is rounded up to 512 bytes. Rounded sizes up to 1 MiB come
 *    from the small pool, larger ones from the large pool; each stream has
 *    its own pair of pools, and a block is reused only on its stream.
 *  - Best fit: the smallest free block of the stream's pool that holds the
 *    request (equal sizes: the lowest address). The block is split when what
 *    is left is at least 512 bytes (small pool, and every pool with
 *    expandable segments) or more than 1 MiB (large pool, native); the
 *    request takes the front. A freed block merges with free neighbours.
 *  - Native: a miss allocates a segment (cudaMalloc) of 2 MiB for small
 *    requests, 20 MiB for requests under 10 MiB, else the request rounded to
 *    2 MiB.
 *  - Expandable segments: each stream's pool owns ranges of virtual address
 *    space (about 1.125 times the device's memory) mapped in pages of 2 MiB
 *    (small pool) or 20 MiB (large pool). A free block just below unmapped
 *    space counts as large as it could grow, so best fit takes it last. A
 *    miss takes the lowest run of free and unmapped blocks with room for the
 *    request and maps the pages it lacks.
 *  - When the device refuses, every cached block is released (native: the
 *    segments that hold nothing; expandable: the whole pages inside free
 *    blocks are unmapped) and the allocation is tried once more; a second
 *    refusal is the out-of-memory PyTorch raises.
 * Blocks live in one array and refer to each other by index; each pool keeps
 * its free mapped blocks in an array sorted by (size, address), and its
 * unmapped blocks sorted by address, as PyTorch's BlockPool does.
 */
#include "torch_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_BLOCK ((uint64_t)512)
#define SMALL_SIZE ((uint64_t)1 << 20)
#define SMALL_BUFFER ((uint64_t)2 << 20)
#define LARGE_BUFFER ((uint64_t)20 << 20)
#define MIN_LARGE_ALLOC ((uint64_t)10 << 20)
#define ROUND_LARGE ((uint64_t)2 << 20)
#define NONE (-1)

typedef struct block_s {
    uint64_t addr;
    uint64_t size;
    uint64_t base;             /* expandable: its segment's first address */
    int32_t prev, next;        /* neighbours in the segment, NONE at the ends */
    uint32_t pool;
    uint8_t allocated;
    uint8_t mapped;
} block_t;

typedef struct index_s {       /* block ids in sorted order */
    int32_t *ids;
    size_t n, cap;
} index_t;

typedef struct pool_s {
    uint64_t stream;
    int small;
    index_t free;              /* free mapped blocks by (size, address) */
    index_t unmapped;          /* expandable: unmapped blocks by address */
} pool_t;

typedef struct model_s {
    cuh_torch_mode_t mode;
    uint64_t capacity;         /* bytes the process may have */
    uint64_t device_total;     /* the device's memory: sizes expandable ranges */
    uint64_t limit;            /* set_per_process_memory_fraction's bytes, or 0 */
    block_t *blocks;
    size_t num_blocks, cap_blocks;
    int32_t spare;             /* deleted block records, linked by next */
    pool_t *pools;
    size_t num_pools, cap_pools;
    uint64_t next_addr;        /* where the next segment or range starts */
    uint64_t reserved;
    int host_oom;
    int broken;                /* the model's own books disagree: an internal error */
    cuh_torch_result_t res;
} model_t;

const char *cuh_torch_mode_name(cuh_torch_mode_t mode)
{
    return mode == CUH_TORCH_EXPANDABLE ? "expandable" : "native";
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- block records ---------------------------------------------------------- */

static int32_t block_new(model_t *m, uint64_t addr, uint64_t size, uint64_t base, uint32_t pool, int mapped)
{
    int32_t id;
    if (m->spare != NONE) {
        id = m->spare;
        m->spare = m->blocks[id].next;
    } else {
        if (m->num_blocks == m->cap_blocks) {
            size_t cap = m->cap_blocks ? 2 * m->cap_blocks : 1024;
            if (cap > (size_t)INT32_MAX) {
                m->host_oom = 1;
                return NONE;
            }
            block_t *b = realloc(m->blocks, cap * sizeof *b);
            if (!b) {
                m->host_oom = 1;
                return NONE;
            }
            m->blocks = b;
            m->cap_blocks = cap;
        }
        id = (int32_t)m->num_blocks++;
    }
    m->blocks[id] = (block_t){.addr = addr, .size = size, .base = base, .prev = NONE, .next = NONE, .pool = pool,
                              .mapped = (uint8_t)mapped};
    return id;
}

static void block_delete(model_t *m, int32_t id)
{
    m->blocks[id].next = m->spare;
    m->spare = id;
}

/* ---- sorted indexes ------------------------------------------------------------ */

/* Whether block a orders before block b: by (size, address) in a free index,
 * by address in an unmapped one. */
static int before(const model_t *m, const index_t *ix, const pool_t *p, int32_t a, int32_t b)
{
    const block_t *x = &m->blocks[a], *y = &m->blocks[b];
    if (ix == &p->free && x->size != y->size)
        return x->size < y->size;
    return x->addr < y->addr;
}

/* Where block `id` is, or belongs, in ix: the first entry not before it. */
static size_t index_position(const model_t *m, const index_t *ix, int32_t id)
{
    const pool_t *p = &m->pools[m->blocks[id].pool];
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (before(m, ix, p, ix->ids[mid], id))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int index_insert(model_t *m, index_t *ix, int32_t id)
{
    if (ix->n == ix->cap) {
        size_t cap = ix->cap ? 2 * ix->cap : 64;
        int32_t *ids = realloc(ix->ids, cap * sizeof *ids);
        if (!ids) {
            m->host_oom = 1;
            return -1;
        }
        ix->ids = ids;
        ix->cap = cap;
    }
    size_t lo = index_position(m, ix, id);
    memmove(ix->ids + lo + 1, ix->ids + lo, (ix->n - lo) * sizeof *ix->ids);
    ix->ids[lo] = id;
    ix->n++;
    return 0;
}

static void index_remove_at(index_t *ix, size_t pos)
{
    memmove(ix->ids + pos, ix->ids + pos + 1, (ix->n - pos - 1) * sizeof *ix->ids);
    ix->n--;
}

static void index_remove(model_t *m, index_t *ix, int32_t id)
{
    size_t lo = index_position(m, ix, id);
    /* Keys are unique (no two blocks share an address), so lo holds id. */
    if (lo < ix->n && ix->ids[lo] == id)
        index_remove_at(ix, lo);
    else
        m->broken = 1;
}

/* The index block `id` belongs in while it is free. */
static index_t *home_index(model_t *m, int32_t id)
{
    pool_t *p = &m->pools[m->blocks[id].pool];
    return m->blocks[id].mapped ? &p->free : &p->unmapped;
}

/* ---- pools ---------------------------------------------------------------------- */

static uint32_t pool_of(model_t *m, uint64_t stream, int small)
{
    for (size_t i = 0; i < m->num_pools; i++)
        if (m->pools[i].stream == stream && m->pools[i].small == small)
            return (uint32_t)i;
    if (m->num_pools == m->cap_pools) {
        size_t cap = m->cap_pools ? 2 * m->cap_pools : 8;
        pool_t *p = realloc(m->pools, cap * sizeof *p);
        if (!p) {
            m->host_oom = 1;
            return 0;
        }
        m->pools = p;
        m->cap_pools = cap;
    }
    m->pools[m->num_pools] = (pool_t){.stream = stream, .small = small};
    return (uint32_t)m->num_pools++;
}

static uint64_t round_size(uint64_t size)
{
    return size < MIN_BLOCK ? MIN_BLOCK : (size + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

static uint64_t native_segment_size(uint64_t size)
{
    if (size <= SMALL_SIZE)
        return SMALL_BUFFER;
    if (size < MIN_LARGE_ALLOC)
        return LARGE_BUFFER;
    return (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

static uint64_t page_size(const model_t *m, uint32_t pool)
{
    return m->pools[pool].small ? SMALL_BUFFER : LARGE_BUFFER;
}

static void reserve(model_t *m, uint64_t bytes)
{
    m->reserved += bytes;
    if (m->reserved > m->res.peak_reserved)
        m->res.peak_reserved = m->reserved;
}

/* ---- merging and splitting ----------------------------------------------------- */

/* Joins free neighbour src into dst (neither in an index as it changes). */
static void try_merge(model_t *m, int32_t dst, int32_t src)
{
    if (src == NONE)
        return;
    block_t *s = &m->blocks[src], *d = &m->blocks[dst];
    if (s->allocated || s->mapped != d->mapped)
        return;
    index_remove(m, home_index(m, src), src);
    if (d->prev == src) {
        d->addr = s->addr;
        d->prev = s->prev;
        if (s->prev != NONE)
            m->blocks[s->prev].next = dst;
    } else {
        d->next = s->next;
        if (s->next != NONE)
            m->blocks[s->next].prev = dst;
    }
    d->size += s->size;
    block_delete(m, src);
}

/* Links new block n right after block b. */
static void link_after(model_t *m, int32_t b, int32_t n)
{
    m->blocks[n].prev = b;
    m->blocks[n].next = m->blocks[b].next;
    if (m->blocks[b].next != NONE)
        m->blocks[m->blocks[b].next].prev = n;
    m->blocks[b].next = n;
}

/* Links new block n right before block b. */
static void link_before(model_t *m, int32_t b, int32_t n)
{
    m->blocks[n].next = b;
    m->blocks[n].prev = m->blocks[b].prev;
    if (m->blocks[b].prev != NONE)
        m->blocks[m->blocks[b].prev].next = n;
    m->blocks[b].prev = n;
}

/* Hands out block b (out of every index) for a request of `size` bytes:
 * the front, with the rest split off as a free block where PyTorch would. */
static int alloc_found(model_t *m, int32_t b, uint64_t size)
{
    uint64_t rest = m->blocks[b].size - size;
    int split = m->pools[m->blocks[b].pool].small || m->mode == CUH_TORCH_EXPANDABLE ? rest >= MIN_BLOCK
                                                                                     : rest > SMALL_SIZE;
    if (split) {
        int32_t n = block_new(m, m->blocks[b].addr + size, rest, m->blocks[b].base, m->blocks[b].pool, 1);
        if (n == NONE)
            return -1;
        link_after(m, b, n);
        m->blocks[b].size = size;
        if (index_insert(m, &m->pools[m->blocks[n].pool].free, n) != 0)
            return -1;
    }
    m->blocks[b].allocated = 1;
    return 0;
}

static int free_block(model_t *m, int32_t b)
{
    m->blocks[b].allocated = 0;
    try_merge(m, b, m->blocks[b].prev);
    try_merge(m, b, m->blocks[b].next);
    return index_insert(m, &m->pools[m->blocks[b].pool].free, b);
}

/* ---- finding a block ----------------------------------------------------------- */

/* What a free block could hold: itself and the unmapped space after it. */
static uint64_t expandable_size(const model_t *m, int32_t b)
{
    int32_t n = m->blocks[b].next;
    return m->blocks[b].size + (n != NONE && !m->blocks[n].mapped ? m->blocks[n].size : 0);
}

/* Best fit among the pool's free mapped blocks, taken out of the index. */
static int32_t get_free_block(model_t *m, uint32_t pool, uint64_t size)
{
    index_t *ix = &m->pools[pool].free;
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->blocks[ix->ids[mid]].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == ix->n)
        return NONE;
    if (m->mode == CUH_TORCH_EXPANDABLE)
        while (lo + 1 < ix->n && expandable_size(m, ix->ids[lo + 1]) < expandable_size(m, ix->ids[lo]))
            lo++;
    int32_t b = ix->ids[lo];
    index_remove_at(ix, lo);
    return b;
}

/* ---- native segments ------------------------------------------------------------ */

static int32_t native_alloc_segment(model_t *m, uint32_t pool, uint64_t size)
{
    uint64_t seg = native_segment_size(size);
    if (m->reserved + seg > m->capacity)
        return NONE;   /* cudaMalloc refuses */
    int32_t b = block_new(m, m->next_addr, seg, m->next_addr, pool, 1);
    if (b == NONE)
        return NONE;
    m->next_addr += seg;
    reserve(m, seg);
    m->res.device_allocs++;
    return b;
}

/* release_cached_blocks, native: every segment that holds no block goes back. */
static void native_release(model_t *m)
{
    for (size_t p = 0; p < m->num_pools; p++) {
        index_t *ix = &m->pools[p].free;
        size_t kept = 0;
        for (size_t i = 0; i < ix->n; i++) {
            int32_t b = ix->ids[i];
            if (m->blocks[b].prev == NONE && m->blocks[b].next == NONE) {
                m->reserved -= m->blocks[b].size;
                block_delete(m, b);
            } else {
                ix->ids[kept++] = b;
            }
        }
        ix->n = kept;
    }
}

/* ---- expandable segments ------------------------------------------------------ */

/* Maps the pages under the first `size` bytes of unmapped block b (out of
 * the unmapped index on success); the mapped part merges with its free
 * neighbours and goes into the free index. Returns the block that holds
 * it, or NONE when the device refuses a page (nothing is mapped then). */
static int32_t map_block(model_t *m, int32_t b, uint64_t size)
{
    uint64_t page = page_size(m, m->blocks[b].pool);
    uint64_t off = m->blocks[b].addr - m->blocks[b].base;
    uint64_t first = off / page, end = (off + size + page - 1) / page;
    uint64_t bytes = (end - first) * page;
    if (m->reserved + bytes > m->capacity)
        return NONE;   /* cuMemCreate refuses; PyTorch gives back what it made */
    reserve(m, bytes);
    m->res.device_allocs += end - first;
    index_remove(m, &m->pools[m->blocks[b].pool].unmapped, b);
    m->blocks[b].mapped = 1;
    if (bytes < m->blocks[b].size) {
        int32_t rest = block_new(m, m->blocks[b].addr + bytes, m->blocks[b].size - bytes, m->blocks[b].base,
                                 m->blocks[b].pool, 0);
        if (rest == NONE)
            return NONE;
        link_after(m, b, rest);
        m->blocks[b].size = bytes;
        if (index_insert(m, &m->pools[m->blocks[b].pool].unmapped, rest) != 0)
            return NONE;
    }
    try_merge(m, b, m->blocks[b].prev);
    try_merge(m, b, m->blocks[b].next);
    if (index_insert(m, &m->pools[m->blocks[b].pool].free, b) != 0)
        return NONE;
    return b;
}

/* Whether the free and unmapped blocks from b on hold `size` bytes. */
static int room_from(const model_t *m, int32_t b, uint64_t size)
{
    uint64_t bytes = 0;
    while (bytes < size && b != NONE && !m->blocks[b].allocated) {
        bytes += m->blocks[b].size;
        b = m->blocks[b].next;
    }
    return bytes >= size;
}

/* find_expandable_block: the lowest unmapped block (with the free block
 * before it) that starts a run of free and unmapped blocks holding `size`
 * bytes, or a new range of address space. */
static int32_t find_expandable_block(model_t *m, uint32_t pool, uint64_t size)
{
    index_t *ix = &m->pools[pool].unmapped;
    for (size_t i = 0; i < ix->n; i++) {
        int32_t c = ix->ids[i];
        int32_t prev = m->blocks[c].prev;
        if (prev != NONE && !m->blocks[prev].allocated)
            c = prev;
        if (room_from(m, c, size))
            return c;
    }
    uint64_t page = page_size(m, pool);
    uint64_t span = m->device_total + m->device_total / 8;
    uint64_t va = (span + page - 1) / page * page;
    if (va < size)
        va = (size + page - 1) / page * page;
    int32_t c = block_new(m, m->next_addr, va, m->next_addr, pool, 0);
    if (c == NONE || index_insert(m, ix, c) != 0)
        return NONE;
    m->next_addr += va;
    return c;
}

/* try_allocate_expandable_block: a mapped block of at least `size` bytes,
 * out of every index, or NONE when the device refuses a page. */
static int32_t expandable_alloc(model_t *m, uint32_t pool, uint64_t size)
{
    int32_t c = find_expandable_block(m, pool, size);
    if (c == NONE)
        return NONE;
    if (!m->blocks[c].mapped) {
        uint64_t want = m->blocks[c].size < size ? m->blocks[c].size : size;
        if ((c = map_block(m, c, want)) == NONE)
            return NONE;
    }
    while (m->blocks[c].size < size) {
        uint64_t missing = size - m->blocks[c].size;
        int32_t next = m->blocks[c].next;
        if (next == NONE) {
            m->broken = 1;   /* find_expandable_block promised the room */
            return NONE;
        }
        uint64_t want = m->blocks[next].size < missing ? m->blocks[next].size : missing;
        if ((c = map_block(m, next, want)) == NONE)
            return NONE;
    }
    index_remove(m, &m->pools[pool].free, c);
    return c;
}

/* unmap_block: unmaps the whole pages inside free block b; what lies before
 * and after them stays mapped as free blocks of their own. */
static int unmap_block(model_t *m, int32_t b)
{
    uint64_t page = page_size(m, m->blocks[b].pool);
    uint64_t off = m->blocks[b].addr - m->blocks[b].base;
    uint64_t first = (off + page - 1) / page, end = (off + m->blocks[b].size) / page;
    if (end <= first)
        return 0;
    uint32_t pool = m->blocks[b].pool;
    index_remove(m, &m->pools[pool].free, b);
    uint64_t lo = m->blocks[b].base + first * page, hi = m->blocks[b].base + end * page;
    uint64_t head = lo - m->blocks[b].addr, tail = m->blocks[b].addr + m->blocks[b].size - hi;
    if (head) {
        int32_t n = block_new(m, m->blocks[b].addr, head, m->blocks[b].base, pool, 1);
        if (n == NONE)
            return -1;
        link_before(m, b, n);
        if (index_insert(m, &m->pools[pool].free, n) != 0)
            return -1;
    }
    if (tail) {
        int32_t n = block_new(m, hi, tail, m->blocks[b].base, pool, 1);
        if (n == NONE)
            return -1;
        link_after(m, b, n);
        if (index_insert(m, &m->pools[pool].free, n) != 0)
            return -1;
    }
    m->blocks[b].addr = lo;
    m->blocks[b].size = hi - lo;
    m->blocks[b].mapped = 0;
    m->reserved -= hi - lo;
    try_merge(m, b, m->blocks[b].prev);
    try_merge(m, b, m->blocks[b].next);
    return index_insert(m, &m->pools[pool].unmapped, b);
}

/* release_cached_blocks with expandable segments: every free block gives
 * back its whole pages; a range left wholly unmapped is given back too. */
static int expandable_release(model_t *m)
{
    for (size_t p = 0; p < m->num_pools; p++) {
        index_t *ix = &m->pools[p].free;
        size_t n = ix->n;
        if (!n)
            continue;
        int32_t *todo = malloc(n * sizeof *todo);
        if (!todo) {
            m->host_oom = 1;
            return -1;
        }
        memcpy(todo, ix->ids, n * sizeof *todo);
        for (size_t i = 0; i < n; i++) {
            int32_t b = todo[i];
            if (unmap_block(m, b) != 0) {
                free(todo);
                return -1;
            }
            if (!m->blocks[b].mapped && m->blocks[b].prev == NONE && m->blocks[b].next == NONE) {
                index_remove(m, &m->pools[p].unmapped, b);
                block_delete(m, b);
            }
        }
        free(todo);
    }
    return 0;
}

/* ---- the replay -------------------------------------------------------------- */

static int32_t alloc_block(model_t *m, uint32_t pool, uint64_t size)
{
    /* A memory fraction refuses by the size of a native segment, whatever
     * an expandable range would map. */
    if (m->limit && m->reserved + native_segment_size(size) > m->limit)
        return NONE;
    return m->mode == CUH_TORCH_EXPANDABLE ? expandable_alloc(m, pool, size) : native_alloc_segment(m, pool, size);
}

/* One allocation: the cache, then the device, then a release and one more
 * try. NONE with m->res.oom set, or on host out-of-memory. */
static int32_t model_malloc(model_t *m, uint64_t stream, uint64_t request)
{
    uint64_t size = round_size(request);
    uint32_t pool = pool_of(m, stream, size <= SMALL_SIZE);
    if (m->host_oom)
        return NONE;
    int32_t b = get_free_block(m, pool, size);
    if (b == NONE && !m->host_oom)
        b = alloc_block(m, pool, size);
    if (b == NONE && !m->host_oom) {
        m->res.releases++;
        if ((m->mode == CUH_TORCH_EXPANDABLE ? expandable_release(m) : (native_release(m), 0)) == 0)
            b = alloc_block(m, pool, size);
    }
    if (b == NONE || m->host_oom)
        return NONE;
    return alloc_found(m, b, size) == 0 ? b : NONE;
}

static void model_destroy(model_t *m)
{
    for (size_t p = 0; p < m->num_pools; p++) {
        free(m->pools[p].free.ids);
        free(m->pools[p].unmapped.ids);
    }
    free(m->pools);
    free(m->blocks);
}

int cuh_torch_model_run(const cuh_trace_t *t, cuh_torch_mode_t mode, const cuh_torch_device_t *d,
                        cuh_torch_result_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    model_t m = {.mode = mode, .capacity = d->capacity > d->external ? d->capacity - d->external : 0,
                 .device_total = d->capacity, .limit = d->limit, .spare = NONE, .next_addr = (uint64_t)1 << 40};
    int32_t *held = malloc((t->num_events ? t->num_events : 1) * sizeof *held);
    if (!held) {
        set_err(err, errlen, "out of host memory for %zu events", t->num_events);
        return -1;
    }
    uint64_t live = 0;
    for (size_t i = 0; i < t->num_events; i++) {
        const cuh_trace_event_t *e = &t->events[i];
        if (e->kind == CUH_TRACE_ALLOC) {
            held[i] = NONE;
            if (e->size == 0)
                continue;   /* PyTorch hands out no memory for zero bytes */
            held[i] = model_malloc(&m, e->stream, e->size);
            if (held[i] == NONE) {
                if (m.host_oom || m.broken)
                    break;
                m.res.oom = 1;
                m.res.oom_event = i;
                m.res.oom_request = e->size;
                m.res.oom_reserved = m.reserved;
                m.res.oom_live = live;
                break;
            }
            live += e->size;
        } else if (held[e->match] != NONE) {
            live -= e->size;
            if (free_block(&m, held[e->match]) != 0)
                break;
        }
        if (m.broken)
            break;
    }
    int rc = 0;
    if (m.host_oom) {
        set_err(err, errlen, "out of host memory while modelling PyTorch's %s allocator", cuh_torch_mode_name(mode));
        rc = -1;
    } else if (m.broken) {
        set_err(err, errlen, "internal error in the model of PyTorch's %s allocator (its block books disagree)",
                cuh_torch_mode_name(mode));
        rc = -1;
    } else {
        *out = m.res;
    }
    free(held);
    model_destroy(&m);
    return rc;
}

int cuh_torch_model_min_capacity(const cuh_trace_t *t, cuh_torch_mode_t mode, const cuh_torch_device_t *d,
                                 const cuh_torch_result_t *top, uint64_t grain, uint64_t *result, int *found,
                                 char *err, size_t errlen)
{
    cuh_torch_result_t r;
    *found = 0;
    if (top->oom)
        return 0;
    cuh_torch_device_t probe = *d;
    uint64_t hi = d->capacity, lo = (t->peak_live + d->external) / grain * grain;
    if (lo == t->peak_live + d->external && lo >= grain)
        lo -= grain;   /* exactly on the grain: lo itself might run */
    if (lo >= hi)
        lo = 0;
    while (hi - lo > grain) {
        uint64_t mid = lo + (hi - lo) / 2 / grain * grain;
        if (mid <= lo)
            mid = lo + grain;
        probe.capacity = mid;
        if (cuh_torch_model_run(t, mode, &probe, &r, err, errlen) != 0)
            return -1;
        if (r.oom)
            lo = mid;
        else
            hi = mid;
    }
    *result = hi;
    *found = 1;
    return 0;
}
