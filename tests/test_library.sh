#!/usr/bin/env bash
# test_library.sh BUILD_DIR - libcuheap.so is self-contained: it exports only
# the cuheap_* entry points, needs no CUDA library, zlib or cmocka at link
# time, and loads into a process that has no GPU (the driver is dlopen'ed only
# when a device is first used, and its absence is a clear error).
set -uo pipefail
build=${1:-build}
lib=$build/libcuheap.so
. "$(dirname "$0")/harness.sh"

# Sanitized builds have no shared library; the plain build's is checked.
[ -e "$lib" ] || lib=build/libcuheap.so
exports=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ {print $3}')
check "exports only cuheap_* (got: $(echo $exports | tr '\n' ' '))" '! echo "$exports" | grep -v "^cuheap_" | grep -q .'
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
