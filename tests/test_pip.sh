#!/usr/bin/env bash
# test_pip.sh BUILD_DIR - `pip install .`: in a fresh venv with nothing but
# pip, `pip install --no-build-isolation --no-index .` builds the wheel
# offline (scripts/cuheap_wheel.py runs make lib), and then, in a clean
# environment (no PYTHONPATH, no CUHEAP_LIB): `import cuheap` finds the
# libcuheap.so inside the package and serves allocations from it against the
# fake driver; CUHEAP_TORCH=1 alone makes cuheap a stand-in torch's allocator
# (the package's .pth), and without it nothing of cuheap is imported;
# `python -m cuheap` says what it would load and runs a script installed; the
# old name `cuheap_torch` is not installed (it lives in scripts/ only); and
# `pip uninstall` leaves nothing behind.
set -uo pipefail
build=${1:-build}
. "$(dirname "$0")/harness.sh"
root=$(pwd)
fake=$(realpath build/fake)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

python3 -m venv "$TMP/venv" >"$TMP/venv.log" 2>&1
py=$TMP/venv/bin/python
check "a fresh venv with pip (got: $(tail -c 300 "$TMP/venv.log"))" '"$py" -m pip --version >/dev/null 2>&1'
"$py" -m pip install --no-build-isolation --no-index --no-cache-dir "$root" >"$TMP/pip.log" 2>&1
rc=$?
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
check "pip install --no-build-isolation --no-index . builds and installs offline (rc $rc: $(tail -c 400 "$TMP/pip.log"))" \
    '[ $rc -eq 0 ] && [ -e "$site/cuheap/__init__.py" ] && [ -e "$site/cuheap/libcuheap.so" ] && [ -e "$site/cuheap-activate.pth" ]'
check "the wheel's libcuheap.so is the one make lib built" 'cmp -s "$site/cuheap/libcuheap.so" build/libcuheap.so'

# clean PROGRAM ARGS...: runs the venv's Python with only PATH, HOME, the fake
# driver on LD_LIBRARY_PATH, and the given variables, from a folder outside
# the repository.
clean() { (cd "$TMP" && env -i PATH=/usr/bin:/bin HOME="$TMP" LD_LIBRARY_PATH="$fake" "$@"); }

out=$(clean "$py" -c '
import ctypes, json, os, sys
import cuheap
assert "PYTHONPATH" not in os.environ and "CUHEAP_LIB" not in os.environ
lib = cuheap._load()
assert cuheap.library_path() == os.path.join(os.path.dirname(cuheap.__file__), "libcuheap.so"), cuheap.library_path()
p = ctypes.c_void_p()
rc = lib.cuheap_malloc(ctypes.byref(p), ctypes.c_size_t(3 << 20), 0, None)
assert rc == 0 and p.value, (rc, cuheap.last_error())
stats = cuheap.memory_stats(0)
assert stats["allocated_bytes.all.current"] == 3 << 20, stats["allocated_bytes.all.current"]
cuheap.dump_report("r.json")
assert json.load(open("r.json"))["devices"][0]["stats"]["num_allocs"] == 1
print("ok", cuheap.library_path())' 2>&1)
check "clean environment: import cuheap loads the bundled libcuheap.so and allocates on the fake driver (got: $out)" \
    '[ "$out" = "ok $site/cuheap/libcuheap.so" ]'

stand_in_torch "$site"
out=$(clean CUHEAP_TORCH=1 "$py" -c 'import torch, sys; print(sys.modules["cuheap"].installed(), *torch.cuda.memory.CURRENT)' 2>&1)
check "CUHEAP_TORCH=1 alone, no PYTHONPATH: cuheap is torch's allocator at import torch (got: $out)" \
    '[ "$out" = "True $site/cuheap/libcuheap.so" ]'
out=$(clean CUHEAP_TORCH=1 "$py" -c 'import torch, sys; print(sys.modules["cuheap_torch"] is sys.modules["cuheap"])' 2>&1)
check "turned on, it answers to the old name too, sys.modules[\"cuheap_torch\"] (got: $out)" '[ "$out" = True ]'
out=$(clean "$py" -c 'import sys, torch; print("cuheap" in sys.modules, torch.cuda.memory.CURRENT)' 2>&1)
check "without CUHEAP_TORCH nothing of cuheap is imported (got: $out)" '[ "$out" = "False []" ]'
out=$(clean CUHEAP_TORCH=0 "$py" -c 'import sys, torch; print("cuheap" in sys.modules)' 2>&1)
check "CUHEAP_TORCH=0: nothing imported (got: $out)" '[ "$out" = False ]'

out=$(clean "$py" -m cuheap 2>&1); rc=$?
check "python -m cuheap says which library it loads, and that it loads (rc $rc: $out)" \
    '[ $rc -eq 0 ] && echo "$out" | grep -qx "library: $site/cuheap/libcuheap.so" && echo "$out" | grep -qx "library loads: yes"'
out=$(clean CUHEAP_LIB="$TMP/none.so" "$py" -m cuheap 2>&1); rc=$?
check "python -m cuheap with a missing library says so, status 1 (rc $rc: $out)" \
    '[ $rc -eq 1 ] && echo "$out" | grep -q "library loads: no (cuheap: libcuheap.so not found (CUHEAP_LIB=$TMP/none.so)"'
echo 'import sys, torch; print(sys.modules["cuheap"].installed(), sys.argv[1:])' >"$TMP/train.py"
out=$(clean "$py" -m cuheap "$TMP/train.py" --lr 3 2>&1)
check "python -m cuheap script.py args runs it with cuheap installed (got: $out)" "[ \"\$out\" = \"True ['--lr', '3']\" ]"
out=$(clean "$py" -m cuheap --bogus 2>&1); rc=$?
check "python -m cuheap --bogus is a usage error (rc $rc)" '[ $rc -eq 2 ] && echo "$out" | grep -q "^usage: python -m cuheap"'
out=$(clean "$py" -c 'import cuheap_torch' 2>&1)
check "the old name cuheap_torch is not installed by pip (got: $(echo "$out" | tail -1))" 'echo "$out" | grep -q ModuleNotFoundError'

rm -rf "$site/torch"
"$py" -m pip uninstall -y cuheap >"$TMP/uninstall.log" 2>&1
left=$(ls "$site" | grep -i cuheap)
check "pip uninstall cuheap removes the package, the .pth and the dist-info (left: $left)" '[ -z "$left" ]'
finish test_pip
