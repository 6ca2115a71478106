#!/usr/bin/env bash
# test_library.sh BUILD_DIR - libcuheap.so is self-contained: it exports the
# cuheap_* entry points and exactly the CUDA entry points and dlsym that
# src/exports.map names for LD_PRELOAD (nothing else), needs no CUDA library,
# zlib or cmocka at link time, and loads into a process that has no GPU (the
# driver is dlopen'ed only when a device is first used, and its absence is a
# clear error).
set -uo pipefail
build=${1:-build}
# The library users get is the plain build's; the sanitized run (build/san)
# checks it too (the sanitized one needs libasan loaded first).
lib=${build%/san}/libcuheap.so
. "$(dirname "$0")/harness.sh"
exports=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ {print $3}')
# The names listed in exports.map's global section, wildcards (cuheap_*) aside.
hooks=$(sed -n '/global:/,/local:/p' src/exports.map | sed 's#/\*.*\*/##' | tr ';' '\n' |
        sed 's/^[[:space:]]*//; s/[[:space:]]*$//' | grep -E '^[A-Za-z_][A-Za-z0-9_]*$' | grep -v '^global$' | sort -u)
extra=$(echo "$exports" | grep -v "^cuheap_" | sort -u | comm -23 - <(echo "$hooks"))
missing=$(comm -13 <(echo "$exports" | sort -u) <(echo "$hooks"))
check "exports.map names the CUDA entry points and dlsym (got: $(echo $hooks | wc -w) names)" \
    'echo "$hooks" | grep -qx cudaMalloc && echo "$hooks" | grep -qx cuMemAlloc_v2 && echo "$hooks" | grep -qx dlsym'
check "exports nothing but cuheap_* and exports.map's names (extra: $(echo $extra))" '[ -z "$extra" ]'
check "exports every name exports.map lists (missing: $(echo $missing))" '[ -z "$missing" ]'
check "exports cuheap_malloc and cuheap_free" 'echo "$exports" | grep -qx cuheap_malloc && echo "$exports" | grep -qx cuheap_free'
# Every setting is a CUHEAP_CONF key, in the settings table: the library reads
# no other variable (an experiment's switch left behind would be one). The
# tools in src/tools are not the library (the launcher reads CUHEAP_LIB).
envs=$(grep -rhoE '(secure_)?getenv *\([^)]*\)' --exclude-dir=tools src/ | sort -u | tr '\n' ' ')
check "the library reads one environment variable, CUHEAP_CONF (reads: $envs)" '[ "$envs" = "getenv(\"CUHEAP_CONF\") " ]'
needed=$(readelf -d "$lib" | awk '/NEEDED/ {print $5}')
check "links no CUDA, zlib or cmocka (needs: $(echo $needed))" '! echo "$needed" | grep -Eq "cuda|cudart|libz|cmocka"'
out=$(python3 - "$lib" <<'PY'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.cuheap_status_string.restype = ctypes.c_char_p
lib.cuheap_last_error.restype = ctypes.c_char_p
print(lib.cuheap_status_string(7).decode())
p = ctypes.c_void_p()
rc = lib.cuheap_malloc(ctypes.byref(p), ctypes.c_size_t(1024), 0, None)
print(rc, lib.cuheap_last_error().decode())
PY
)
# The first line, by expansion: `echo | head -1` under pipefail fails whenever
# head exits before echo has written everything (seen once in a full run).
check "loads and answers without a GPU (got: $out)" '[[ "${out%%$'"'"'\n'"'"'*}" == *libcuda.so.1* ]]'
if ! ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 >/dev/null 2>&1; then
    check "no driver: cuheap_malloc says libcuda.so.1 is missing" 'echo "$out" | tail -1 | grep -q "^7 .*libcuda.so.1"'
fi

# ---- the jemalloc inside (pinned host memory cache) -------------------------
check "jemalloc is linked in, under its cuh_je_ names" '[ "$(nm "$lib" | grep -c " cuh_je_")" -gt 100 ]'
check "nothing of jemalloc is exported (malloc, free, mallocx, cuh_je_*)" \
    '! echo "$exports" | grep -Eqx "malloc|free|calloc|realloc|mallocx|dallocx|mallctl|cuh_je_.*"'
flags=$(readelf -d "$lib" | grep -E "FLAGS" | tr -s ' ')
check "no initial-exec TLS: loadable by dlopen after start-up (flags: $flags)" '! echo "$flags" | grep -q STATIC_TLS'
fake=$(realpath build/fake 2>/dev/null || true)
if [ -e "$fake/libcuda.so.1" ]; then
    out=$(LD_LIBRARY_PATH="$fake" python3 - "$lib" <<'PY' 2>&1
import ctypes, sys, threading, time
stop = threading.Event()
workers = [threading.Thread(target=stop.wait) for _ in range(4)]
for w in workers:
    w.start()
libc = ctypes.CDLL("libc.so.6")
before = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
lib = ctypes.CDLL(sys.argv[1])   # dlopen after start-up, threads running
after = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
glibc = ctypes.cast(libc.malloc, ctypes.c_void_p).value
lib.cuheap_last_error.restype = ctypes.c_char_p
p = ctypes.c_void_p()
rc = lib.cuheap_host_alloc(ctypes.byref(p), ctypes.c_size_t(1 << 20), 0)
if rc == 0:
    ctypes.memset(p, 0x5A, 1 << 20)
    ok = ctypes.string_at(p.value + 12345, 1) == b"\x5a"
    rc = lib.cuheap_host_free(p)
else:
    ok = False
stop.set()
print("malloc", "glibc" if before == after == glibc else "replaced", "pinned", rc, ok, lib.cuheap_last_error().decode())
PY
)
    check "dlopen'ed into python3 with threads running, pinned memory is served (got: $out)" \
        'echo "$out" | grep -q "pinned 0 True"'
    check "the process's malloc stays glibc's after loading it (got: $out)" 'echo "$out" | grep -q "malloc glibc"'
    out=$(LD_PRELOAD="$(realpath "$lib")" LD_LIBRARY_PATH="$fake" python3 -c '
import ctypes
print("glibc" if ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value ==
      ctypes.cast(ctypes.CDLL("libc.so.6").malloc, ctypes.c_void_p).value else "replaced")' 2>&1)
    check "under LD_PRELOAD the program's malloc stays glibc's (got: $out)" '[ "$out" = glibc ]'
fi
finish test_library
