/* config.c - every CUHEAP_CONF key in one table, and the one parser that
 * validates them.
 *
 * "key:value,key:value" as in PYTORCH_CUDA_ALLOC_CONF. Sizes are bytes with an
 * optional K, M, G or T (binary: 1K = 1024), like "512M" or "1.5G"; a limit
 * may also be a fraction of the device's memory ("0.9" or "90%"). Each key's
 * bounds are checked here, so the heap can trust what it is given.
 */
#include "config.h"

#include "common.h"
#include "sizeclass.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KIND_SIZE, KIND_LIMIT, KIND_FRACTION, KIND_BOOL, KIND_PATH } value_kind_t;

typedef struct option_s {
    const char *name;
    value_kind_t kind;
    size_t offset;            /* of the field in cuh_config_t (size_t, or double for fractions) */
    const char *default_text;
    const char *meaning;
} option_t;

static const option_t options[] = {
    {"workspace", KIND_SIZE, offsetof(cuh_config_t, workspace), "0",
     "Device memory preallocated at first use as one segment, used first for large blocks "
     "and never released (rounded up to 2 MiB). Best fit inside it fragments as elsewhere: "
     "sized to their live peak, every bundled trace reserved more with it than without "
     "(GPT-2 1.24x its live peak against 1.11x); check a size with cuheap-replay first."},
    {"limit", KIND_LIMIT, offsetof(cuh_config_t, limit_bytes), "none",
     "Most bytes cuheap may reserve on a device: a size (\"40G\") or a fraction of the "
     "device's memory (\"0.9\" or \"90%\"). The workspace counts toward it."},
    {"small_max", KIND_SIZE, offsetof(cuh_config_t, small_max), "64K",
     "Requests up to this size come from size-class slabs; larger ones from the best-fit "
     "arena. 0 sends everything to the arena; at most 1M."},
    {"segment_min", KIND_SIZE, offsetof(cuh_config_t, segment_min), "2M",
     "Smallest segment asked of the device when the heap grows (a multiple of 2 MiB). "
     "Larger values mean fewer, slower device allocations and more cached bytes."},
    {"grow_fraction", KIND_FRACTION, offsetof(cuh_config_t, grow_fraction), "0.0625",
     "A new segment is at least this fraction of the bytes already reserved (up to 1 GiB): "
     "geometric growth means few device calls and larger contiguous ranges for best fit. "
     "0 sizes every segment to its request. Between 0 and 1."},
    {"vmm", KIND_BOOL, offsetof(cuh_config_t, vmm), "1",
     "1: large and small blocks live in one range of CUDA virtual memory; physical pages are "
     "mapped behind it on demand and taken from free blocks elsewhere before the device is "
     "asked for more, so free memory is never too scattered to use. 0: plain segments. A "
     "device without virtual memory management gets plain segments, said once on stderr."},
    {"vmm_margin", KIND_FRACTION, offsetof(cuh_config_t, vmm_margin), "0.1",
     "With vmm:1: new pages come from the device while the heap holds at most (1 + vmm_margin) "
     "times the most bytes the program has had live; beyond that, or when the device or the "
     "limit refuses, free pages are moved instead (a map each, and an unmap once their old "
     "range is needed again). A block size that needed moved pages in half of its last 8 "
     "mappings gets new pages anyway while the heap holds at most (1 + 3 x vmm_margin) times "
     "that and the limit has room: moving the same pages every step costs more than new pages "
     "once. Smaller values usually hold less memory and move pages more often. Between 0 and 1."},
    {"vmm_page", KIND_SIZE, offsetof(cuh_config_t, vmm_page), "2M",
     "With vmm:1: the unit of physical memory that is created, mapped and moved (rounded up "
     "to a multiple of the device's granularity, 2 MiB on an H200). A move costs about the "
     "same whatever the page's size, so larger pages move memory in fewer calls, but a page "
     "moves only when it is wholly free: memory can then stay stranded in partly used pages. "
     "Between 2M and 1G."},
    {"vmm_unit", KIND_SIZE, offsetof(cuh_config_t, vmm_unit), "2M",
     "With vmm:1: the most bytes one physical allocation (a unit) holds: the pages a block "
     "lacks are created as units of up to this size, one per run of missing pages, and each "
     "unit is mapped, moved and unmapped as one piece. The driver charges per call, not per "
     "byte, so long units move memory in few calls, but a unit moves only when it lies wholly "
     "in free memory and fits where a block lacks pages (the driver maps only whole "
     "allocations, so a unit cannot be split), and one a live block still partly covers "
     "strands the rest: the smallest device a job fits in grows. 2M (the default) makes every "
     "unit a page: the most a nearly full device can hold, at a driver allocation per page. "
     "auto: a unit holds up to 1/1024 of the smaller of what the heap holds and what the "
     "device has free, at least a page, so units grow with the heap while the device has "
     "room and come down to a page as it fills: about half the map calls, for a smallest "
     "device up to 2.2% larger (docs/design.md, \"Choosing vmm\"). When the device or the limit refuses, free "
     "units whose work is done go back and units of the needed length are made instead. "
     "A size is rounded up to whole pages (vmm_page); between 2M and 1G."},
    {"step_plan", KIND_BOOL, offsetof(cuh_config_t, step_plan), "0",
     "With vmm:1: 1 lays out the blocks of a step that repeated the one before in a window "
     "of the reservation, as if the whole step had been known in advance, and places the "
     "same requests there in the steps after, until a step asks for something else. A job "
     "that repeats its steps then moves no page once the window is filled. A step ends where "
     "the program marks one (cuheap's PyTorch package marks every optimizer step); in a "
     "program that marks none (LD_PRELOAD, the C API) steps are found in its block "
     "allocations. Experimental: off by default; blocks of other lanes than the step's "
     "busiest (a lane: a stream, or cudaMalloc's blocks) or allocated in a graph capture are "
     "placed as always, no plan is made without the window's size free on the device, and "
     "thread caches hold no large block (the heap parks one while no plan is in force)."},
    {"thread_cache", KIND_SIZE, offsetof(cuh_config_t, thread_cache), "4M",
     "Most bytes of small objects (small_max and below) each thread keeps for itself, per "
     "device, beside the last large block it freed: what a thread frees on a stream it "
     "allocates again on that stream without taking the heap's lock, so threads do not queue "
     "behind each other. Peaks of requested and allocated bytes may then overstate by up to "
     "this much per thread, and while threads contend for the heap by the large block each "
     "holds (the heap counts what thread caches hold as allocated); current values are exact. "
     "Given back on empty_cache, before the heap grows (large blocks) or reports an "
     "out-of-memory error, and when the thread exits. While threads contend, a thread's cache "
     "also cuts its large blocks from chunks of the heap's free memory lent to it (more "
     "memory, for throughput that scales with threads; docs/design.md, \"A thread's "
     "chunks\"). 0 turns thread caches off, and chunks with them."},
    {"wait_before_grow", KIND_BOOL, offsetof(cuh_config_t, wait_before_grow), "1",
     "1: blocks freed by cudaFree that still wait for the GPU are taken back for a cudaMalloc "
     "(device-wide allocation) instead of reserving more: the work issued from then on, on "
     "every stream, waits on the GPU for the work issued before those frees; the CPU does not "
     "wait. With device_fences they are taken back before any search; without, while the "
     "default stream is the only one known too, and with other streams known, those the GPU "
     "has passed are, and the rest only before growing. 0: reserve more."},
    {"device_fences", KIND_BOOL, offsetof(cuh_config_t, device_fences), "1",
     "1: what cudaFree frees waits for the GPU behind one event over every stream of the "
     "device and one device-wide wait (cuCtxRecordEvent, cuCtxWaitEvent; CUDA 12.5 and later), "
     "which cover streams cuheap never heard of and cost the same for 1 stream or 160. Not "
     "while a CUDA graph capture is underway (the driver would invalidate it): then, with 0, "
     "and with an older driver, an event and a wait per stream cuheap knows, at most one "
     "take-back per N allocations with N streams known."},
    {"reuse_across_streams", KIND_BOOL, offsetof(cuh_config_t, reuse_across_streams), "0",
     "1: before the heap reserves more, memory streams freed in order (cudaFreeAsync, the "
     "plugin's frees) whose work may still run serves other streams, ordered on the GPU "
     "(cuStreamWaitEvent): an allocation on a stream makes its stream wait for that work, as "
     "cudaMallocAsync's pools do by default; a device-wide one (cudaMalloc) makes every stream "
     "wait. Less memory for programs that free on many streams, for orderings between streams "
     "the program did not ask for; the CPU does not wait. 0: memory freed on a stream serves "
     "another only once an event recorded after the free has completed. Under LD_PRELOAD "
     "(cuheap in place of CUDA's own calls) the default is 1, the ordering of the calls it "
     "replaces; as PyTorch's allocator and through the C API it is 0."},
    {"ipc_safe", KIND_BOOL, offsetof(cuh_config_t, ipc_safe), "0",
     "1: every block gets a segment of its own that it starts (a free one at most a quarter "
     "larger, or a new one sized to it), so cudaIpcGetMemHandle works on any block. Costs a "
     "device allocation per new block size and up to 2 MiB of rounding per block. Brings vmm:0 "
     "with it (said beside vmm:1, an error), and not with a workspace. 0: blocks share segments; "
     "IPC handles are refused for blocks that do not start a plain segment."},
    {"ipc_callers", KIND_PATH, offsetof(cuh_config_t, ipc_callers), "libnccl",
     "Under LD_PRELOAD: a cudaMalloc or cuMemAlloc called from a shared library whose file "
     "name contains this text gets a segment of its own that it starts, as with ipc_safe:1, "
     "so that the library can share the block with other processes through "
     "cudaIpcGetMemHandle. NCCL does so with its buffers when they come from cudaMalloc "
     "(NCCL_CUMEM_ENABLE=0, and NCCL versions that do not use cuMem by default); refused, it "
     "falls back to a slower transport. none: no library. With vmm:1 (the default) such a "
     "block gets a plain segment of its own beside the virtual memory reservation, which legacy "
     "IPC cannot share."},
    {"meminfo_cached", KIND_BOOL, offsetof(cuh_config_t, meminfo_cached), "1",
     "Under LD_PRELOAD: 1 makes cudaMemGetInfo and cuMemGetInfo count cuheap's cached bytes "
     "that are ready for reuse as free, so programs that size themselves from free memory "
     "see what they can still allocate. 0 reports what the device says."},
    {"pinned", KIND_BOOL, offsetof(cuh_config_t, pinned), "1",
     "Under LD_PRELOAD: 1 serves cudaHostAlloc, cudaMallocHost, cuMemHostAlloc and "
     "cuMemAllocHost from cuheap's pinned cache (jemalloc arenas over page-locked chunks, see "
     "pinned_chunk), and their frees without cudaFreeHost's wait; write-combined requests go "
     "to CUDA. 0: all pinned memory comes from CUDA."},
    {"pinned_chunk", KIND_SIZE, offsetof(cuh_config_t, pinned_chunk), "32M",
     "Page-locked memory is taken from CUDA in chunks of this size (a larger request gets a "
     "chunk of its own), once, and kept until the process exits. Between 2M and 1G, rounded "
     "up to 2 MiB."},
    {"report", KIND_PATH, offsetof(cuh_config_t, report), "none",
     "Write a report here at every out-of-memory (at most one a second), at exit, and on "
     "SIGUSR1: JSON if the name ends in .json, HTML if in .html, else text. After an "
     "out-of-memory the exit leaves the report as it is (the heap at the failure). A folder "
     "that cannot be written is said at the first allocation. %p becomes the process id. A "
     "path may not contain ','."},
    {"trace", KIND_PATH, offsetof(cuh_config_t, trace), "none",
     "Record every allocation and free to this file in the trace format of bench/traces, to "
     "replay the job with cuheap-replay. %p becomes the process id. Memory stays bounded (a "
     "64 KiB buffer and an entry per live block)."},
};
#define NUM_OPTIONS (sizeof options / sizeof options[0])

void cuh_config_defaults(cuh_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    /* Every way in runs on virtual memory (docs/design.md, "Choosing vmm"):
     * fragmentation is what programs run out of memory on, and a page's
     * move costs a map where a plain segment would have had to grow. */
    cfg->vmm = 1;
    cfg->small_max = 64 * CUH_KiB;
    cfg->thread_cache = 4 * CUH_MiB;
    cfg->segment_min = 2 * CUH_MiB;
    cfg->grow_fraction = 0.0625;
    cfg->vmm_margin = 0.1;
    cfg->vmm_page = 2 * CUH_MiB;
    cfg->vmm_unit = 2 * CUH_MiB;
    cfg->meminfo_cached = 1;
    cfg->wait_before_grow = 1;
    cfg->device_fences = 1;
    cfg->pinned = 1;
    cfg->pinned_chunk = 32 * CUH_MiB;
    snprintf(cfg->ipc_callers, sizeof cfg->ipc_callers, "libnccl");
}

void cuh_config_defaults_for(cuh_config_t *cfg, unsigned ways)
{
    cuh_config_defaults(cfg);
    /* In place of CUDA's own allocation calls (LD_PRELOAD) the heap orders
     * streams as the calls it replaces do: CUDA's stream-ordered pools hand
     * memory freed on one stream to another at once and make the new user
     * wait on the GPU (cudaMemPoolReuseAllowInternalDependencies, on by
     * default), and a real cudaFree waits for the whole device. Without it a
     * program that frees on many streams while the GPU runs behind holds
     * many times its live bytes (docs/preload.md). */
    if (ways & CUH_WAY_INTERPOSER)
        cfg->reuse_across_streams = 1;
}

static void list_keys(char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NUM_OPTIONS && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", options[i].name);
}

/* Parses "12", "1.5G", "512MiB" into bytes. Returns 0 or -1. */
static int parse_size(const char *text, size_t *out)
{
    errno = 0;
    char *end;
    if (!isdigit((unsigned char)text[0]) && text[0] != '.')
        return -1;
    double number = strtod(text, &end);
    if (errno || end == text)
        return -1;
    double scale = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': scale = 1024.0; end++; break;
    case 'M': scale = 1024.0 * 1024; end++; break;
    case 'G': scale = 1024.0 * 1024 * 1024; end++; break;
    case 'T': scale = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (scale > 1 && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return -1;
    double bytes = number * scale;
    if (!(bytes >= 0) || bytes > 1.8e19 || bytes != floor(bytes))
        return -1;
    *out = (size_t)bytes;
    return 0;
}

static int set_value(const option_t *opt, const char *value, cuh_config_t *cfg, char *err, size_t errlen)
{
    size_t bytes;
    if (opt->kind == KIND_PATH) {
        char *dst = (char *)cfg + opt->offset;
        /* Every text field is char[512], like report. */
        if (strlen(value) >= sizeof cfg->report) {
            snprintf(err, errlen, "%s: the value is longer than %zu characters", opt->name, sizeof cfg->report - 1);
            return -1;
        }
        snprintf(dst, sizeof cfg->report, "%s", strcmp(value, "none") ? value : "");
        return 0;
    }
    if (opt->kind == KIND_BOOL) {
        size_t on;
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "on"))
            on = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "off"))
            on = 0;
        else {
            snprintf(err, errlen, "%s:%s is not 0 or 1", opt->name, value);
            return -1;
        }
        *(size_t *)(void *)((char *)cfg + opt->offset) = on;
        return 0;
    }
    if (opt->kind == KIND_FRACTION) {
        char *end;
        errno = 0;
        double f = strtod(value, &end);
        if (errno || end == value || *end != '\0' || !(f >= 0.0 && f <= 1.0)) {
            snprintf(err, errlen, "%s:%s is not a number between 0 and 1", opt->name, value);
            return -1;
        }
        *(double *)(void *)((char *)cfg + opt->offset) = f;
        return 0;
    }
    if (opt->kind == KIND_LIMIT) {
        size_t n = strlen(value);
        if (strcmp(value, "none") == 0 || strcmp(value, "0") == 0) {
            cfg->limit_bytes = 0;
            cfg->limit_fraction = 0;
            return 0;
        }
        int percent = n > 0 && value[n - 1] == '%';
        if (percent || (strchr(value, '.') && !isalpha((unsigned char)value[n - 1]))) {
            char *end;
            errno = 0;
            double f = strtod(value, &end);
            if (errno || end == value || (percent ? *end != '%' || end[1] : *end != '\0')) {
                snprintf(err, errlen, "limit:%s is not a number; give a size like 40G or a fraction like 0.9", value);
                return -1;
            }
            if (percent)
                f /= 100.0;
            if (!(f > 0.0 && f <= 1.0)) {
                snprintf(err, errlen, "limit:%s is not a fraction of the device in (0, 1]", value);
                return -1;
            }
            if (f < 1e-30) {
                snprintf(err, errlen, "limit:%s is a fraction too small to mean anything (below 1e-30 of the device)",
                         value);
                return -1;
            }
            cfg->limit_fraction = f;
            cfg->limit_bytes = 0;
            return 0;
        }
        if (parse_size(value, &bytes)) {
            snprintf(err, errlen, "limit:%s is neither a size (like 40G) nor a fraction (like 0.9 or 90%%)", value);
            return -1;
        }
        if (bytes < CUH_SEGMENT_GRAIN) {
            snprintf(err, errlen,
                     "limit:%s is %zu bytes, less than one 2 MiB segment; write a size like 40G, "
                     "or 1.0 for the whole device",
                     value, bytes);
            return -1;
        }
        cfg->limit_bytes = bytes;
        cfg->limit_fraction = 0;
        return 0;
    }
    if (strcmp(opt->name, "vmm_unit") == 0 && strcmp(value, "auto") == 0) {
        cfg->vmm_unit = 0;
        return 0;
    }
    if (parse_size(value, &bytes)) {
        snprintf(err, errlen, "%s:%s is not a size; sizes are bytes with an optional K, M, G or T (like 512M)%s",
                 opt->name, value, strcmp(opt->name, "vmm_unit") == 0 ? ", or auto" : "");
        return -1;
    }
    if (strcmp(opt->name, "small_max") == 0 && bytes > CUH_SMALL_MAX_LIMIT) {
        snprintf(err, errlen, "small_max:%s is above the largest size class, 1M", value);
        return -1;
    }
    /* Sizes of device or pinned memory taken at a time: whole 2 MiB grains,
     * at most 1 GiB. */
    if (strcmp(opt->name, "segment_min") == 0 || strcmp(opt->name, "vmm_page") == 0 ||
        strcmp(opt->name, "vmm_unit") == 0 ||
        strcmp(opt->name, "pinned_chunk") == 0) {
        if (bytes == 0 || bytes > CUH_GiB) {
            snprintf(err, errlen, "%s:%s must be between 2M and 1G", opt->name, value);
            return -1;
        }
        bytes = cuh_align_up(bytes, CUH_SEGMENT_GRAIN);
    }
    if (strcmp(opt->name, "workspace") == 0)
        bytes = cuh_align_up(bytes, CUH_SEGMENT_GRAIN);
    *(size_t *)(void *)((char *)cfg + opt->offset) = bytes;
    return 0;
}

static void trim(char **begin, char **end)
{
    while (*begin < *end && isspace((unsigned char)**begin))
        (*begin)++;
    while (*end > *begin && isspace((unsigned char)(*end)[-1]))
        (*end)--;
}

static int parse_settings(const char *text, cuh_config_t *cfg, char *err, size_t errlen)
{
    cuh_config_t parsed = *cfg;
    char keys[256];
    list_keys(keys, sizeof keys);
    const char *item = text;
    int vmm_said = 0;
    while (*item) {
        const char *comma = strchr(item, ',');
        size_t n = comma ? (size_t)(comma - item) : strlen(item);
        char entry[512];
        if (n >= sizeof entry) {
            snprintf(err, errlen, "setting '%.40s...' is too long", item);
            return -1;
        }
        memcpy(entry, item, n);
        entry[n] = '\0';
        item += n + (comma ? 1 : 0);
        char *begin = entry, *end = entry + n;
        trim(&begin, &end);
        *end = '\0';
        if (begin == end)
            continue;   /* "a:1,,b:2" and a trailing comma are harmless */
        char *colon = strchr(begin, ':');
        if (!colon) {
            snprintf(err, errlen, "setting '%s' has no ':' (write key:value); valid keys: %s", begin, keys);
            return -1;
        }
        char *key_end = colon, *value = colon + 1, *value_end = end;
        trim(&begin, &key_end);
        *key_end = '\0';
        trim(&value, &value_end);
        *value_end = '\0';
        const option_t *opt = NULL;
        for (size_t i = 0; i < NUM_OPTIONS; i++)
            if (strcmp(options[i].name, begin) == 0)
                opt = &options[i];
        if (!opt) {
            snprintf(err, errlen, "unknown key '%s'; valid keys: %s", begin, keys);
            return -1;
        }
        if (!*value) {
            snprintf(err, errlen, "key '%s' has no value (write %s:VALUE)", begin, begin);
            return -1;
        }
        if (set_value(opt, value, &parsed, err, errlen))
            return -1;
        if (opt->offset == offsetof(cuh_config_t, vmm))
            vmm_said = 1;
    }
    /* ipc_safe:1 gives every block a plain segment of its own, so it brings
     * plain segments with it; said beside vmm:1 it stays an error the heap
     * names when it starts. */
    if (parsed.ipc_safe && !vmm_said)
        parsed.vmm = 0;
    *cfg = parsed;
    return 0;
}

int cuh_config_parse(const char *text, cuh_config_t *cfg, char *err, size_t errlen)
{
    if (!text)
        return 0;
    if (parse_settings(text, cfg, err, errlen) == 0)
        return 0;
    if (err && errlen) {
        /* The message quotes the setting: bytes a terminal would act on are escaped. */
        char raw[1024];
        snprintf(raw, sizeof raw, "%s", err);
        cuh_escape_unprintable(raw, err, errlen);
    }
    return -1;
}

size_t cuh_config_limit(const cuh_config_t *cfg, size_t device_total)
{
    if (cfg->limit_bytes)
        return cfg->limit_bytes;
    if (cfg->limit_fraction > 0) {
        /* A fraction so small it rounds below one segment still means "tiny",
         * never "unlimited" (0). */
        size_t bytes = (size_t)((double)device_total * cfg->limit_fraction);
        return bytes < CUH_SEGMENT_GRAIN ? CUH_SEGMENT_GRAIN : bytes;
    }
    return 0;
}

void cuh_config_print_table(void *file)
{
    FILE *out = file;
    fprintf(out, "| key | default | meaning |\n|---|---|---|\n");
    for (size_t i = 0; i < NUM_OPTIONS; i++)
        fprintf(out, "| `%s` | %s | %s |\n", options[i].name, options[i].default_text, options[i].meaning);
}

void cuh_config_format(const cuh_config_t *cfg, char *buf, size_t len)
{
    char limit[64];
    if (cfg->limit_bytes)
        snprintf(limit, sizeof limit, "%zu", cfg->limit_bytes);
    else if (cfg->limit_fraction > 0)
    {
        /* Always with a decimal point and never an exponent ("limit:1" would
         * read back as 1 byte, "7e-08" as no number at all): the fewest
         * decimals that read back as the same fraction. */
        for (int digits = 1; digits <= 60; digits++) {   /* 1e-30, the least, needs 47 */
            snprintf(limit, sizeof limit, "%.*f", digits, cfg->limit_fraction);
            if (strtod(limit, NULL) == cfg->limit_fraction)
                break;
        }
    }
    else
        snprintf(limit, sizeof limit, "none");
    char unit[32] = "auto";
    if (cfg->vmm_unit)
        snprintf(unit, sizeof unit, "%zu", cfg->vmm_unit);
    int n = snprintf(buf, len, "workspace:%zu,limit:%s,small_max:%zu,segment_min:%zu,grow_fraction:%g,vmm:%zu,vmm_margin:%g,"
                     "vmm_page:%zu,vmm_unit:%s,step_plan:%zu,thread_cache:%zu,wait_before_grow:%zu,device_fences:%zu,reuse_across_streams:%zu,ipc_safe:%zu,ipc_callers:%s,meminfo_cached:%zu,pinned:%zu,pinned_chunk:%zu",
                     cfg->workspace, limit, cfg->small_max, cfg->segment_min, cfg->grow_fraction, cfg->vmm, cfg->vmm_margin,
                     cfg->vmm_page, unit, cfg->step_plan, cfg->thread_cache, cfg->wait_before_grow, cfg->device_fences, cfg->reuse_across_streams, cfg->ipc_safe, cfg->ipc_callers[0] ? cfg->ipc_callers : "none",
                     cfg->meminfo_cached, cfg->pinned, cfg->pinned_chunk);
    if (cfg->report[0] && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ",report:%s", cfg->report);
    if (cfg->trace[0] && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ",trace:%s", cfg->trace);
}
