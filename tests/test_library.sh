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
check "loads and answers without a GPU (got: $out)" 'echo "$out" | head -1 | grep -q "libcuda.so.1"'
if ! ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 >/dev/null 2>&1; then
    check "no driver: cuheap_malloc says libcuda.so.1 is missing" 'echo "$out" | tail -1 | grep -q "^7 .*libcuda.so.1"'
fi
finish test_library
