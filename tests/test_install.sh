#!/usr/bin/env bash
# test_install.sh BUILD_DIR - `make install PREFIX=...` and `make uninstall`:
# into a temporary prefix, every file lands where it should (libraries,
# header, pkg-config file naming that prefix, report schema, tools, launcher,
# PyTorch module); a tiny C program built with `pkg-config --cflags --libs
# cuheap` links the installed library and allocates through it on the fake
# driver; the installed launcher preloads the installed library and, with
# --torch, gives a stand-in torch cuheap from the installed module; the
# installed module finds the library without CUHEAP_LIB; DESTDIR stages the
# same tree under another folder with the prefix unchanged in cuheap.pc; and
# `make uninstall` leaves no file behind. The plain build is installed in the
# sanitized run too (install copies what `make` built).
set -uo pipefail
build=${1:-build}
. "$(dirname "$0")/harness.sh"
fake=$(realpath build/fake)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
unset CUHEAP_CONF CUHEAP_LIB CUHEAP_TORCH LD_PRELOAD PYTHONPATH
prefix=$TMP/prefix

make -s --no-print-directory install PREFIX="$prefix" >"$TMP/install.log" 2>&1
rc=$?
check "make install PREFIX=... succeeds (rc $rc: $(tail -c 300 "$TMP/install.log"))" '[ $rc -eq 0 ]'
expected="bin/cuheap bin/cuheap-replay bin/cuheap-report include/cuheap.h lib/libcuheap.a lib/libcuheap.so
lib/pkgconfig/cuheap.pc share/cuheap/cuheap_report.schema.json share/cuheap/python/cuheap/__init__.py
share/cuheap/python/cuheap/__main__.py share/cuheap/python/cuheap/libcuheap.so share/cuheap/python/cuheap_torch.py
share/cuheap/python/sitecustomize.py"
got=$(cd "$prefix" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort | tr '\n' ' ')
check "installs exactly the expected files (got: $got)" '[ "$got" = "$(echo $expected | tr " " "\n" | sort | tr "\n" " ")" ]'
check "the installed libraries and header are the built ones" \
    'cmp -s "$prefix/lib/libcuheap.so" build/libcuheap.so && cmp -s "$prefix/lib/libcuheap.a" build/libcuheap.a &&
     cmp -s "$prefix/include/cuheap.h" include/cuheap.h'
check "the tools and the launcher are executable" \
    '[ -x "$prefix/bin/cuheap" ] && [ -x "$prefix/bin/cuheap-replay" ] && [ -x "$prefix/bin/cuheap-report" ]'

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(echo $(pkg-config --cflags --libs cuheap 2>&1))
version=$(sed -n 's/^#define CUHEAP_VERSION "\(.*\)"/\1/p' include/cuheap.h)
check "pkg-config --cflags --libs cuheap names the prefix (got: $flags)" \
    '[ "$flags" = "-I$prefix/include -L$prefix/lib -lcuheap" ]'
check "pkg-config --modversion cuheap is CUHEAP_VERSION ($version)" '[ "$(pkg-config --modversion cuheap)" = "$version" ]'
cat >"$TMP/prog.c" <<'C'
#include <cuheap.h>
#include <stdio.h>
int main(void)
{
    void *p = NULL;
    cuheap_status_t s = cuheap_malloc_device_wide(&p, 3u << 20, 0);
    if (s != CUHEAP_OK) {
        fprintf(stderr, "%s: %s\n", cuheap_status_string(s), cuheap_last_error());
        return 1;
    }
    cuheap_stats_t stats;
    if (cuheap_get_stats(0, &stats) != CUHEAP_OK || cuheap_free_device_wide(p, 0) != CUHEAP_OK)
        return 1;
    printf("ok %llu\n", (unsigned long long)stats.requested.current);
    return 0;
}
C
${CC:-cc} -std=c11 -Wall -Werror -o "$TMP/prog" "$TMP/prog.c" $(pkg-config --cflags --libs cuheap) >"$TMP/cc.log" 2>&1
check "a C program builds with pkg-config --cflags --libs cuheap ($(head -c 300 "$TMP/cc.log"))" '[ -x "$TMP/prog" ]'
out=$(LD_LIBRARY_PATH="$prefix/lib:$fake" "$TMP/prog" 2>&1)
linked=$(LD_LIBRARY_PATH="$prefix/lib:$fake" ldd "$TMP/prog" | awk '/libcuheap/ {print $3}')
check "it runs against the installed library and the fake driver (got: $out; linked: $linked)" \
    '[ "$out" = "ok $((3 << 20))" ] && [ "$linked" = "$prefix/lib/libcuheap.so" ]'

out=$("$prefix/bin/cuheap" -- env | sed -n 's/^LD_PRELOAD=//p')
check "the installed launcher preloads the installed library (got: $out)" '[ "$out" = "$prefix/lib/libcuheap.so" ]'
out=$("$prefix/bin/cuheap" -- env LD_LIBRARY_PATH="$fake" build/tests/preload/runtime_shared threads 2>&1)
check "a CUDA program run by the installed launcher is served by cuheap (got: $(echo "$out" | head -3))" \
    'echo "$out" | grep -qx "ok threads"'
stand_in_torch "$TMP/fake"
out=$(PYTHONPATH="$TMP/fake" "$prefix/bin/cuheap" --torch -- python3 -c \
    'import os, sys, torch; print(os.environ["PYTHONPATH"].split(":")[0], *torch.cuda.memory.CURRENT)' 2>&1)
check "the installed launcher's --torch: the installed module makes cuheap torch's allocator (got: $out)" \
    '[ "$out" = "$prefix/share/cuheap/python $prefix/lib/libcuheap.so" ]'
out=$(PYTHONPATH="$prefix/share/cuheap/python" python3 -c 'import os, cuheap; cuheap._load(); print(os.path.realpath(cuheap.library_path()))' 2>&1)
check "the installed module finds the installed library without CUHEAP_LIB (got: $out)" '[ "$out" = "$prefix/lib/libcuheap.so" ]'
out=$("$prefix/bin/cuheap-replay" --capacity 26G bench/traces/resnet50.trace.gz 2>&1 | grep -c '^resnet50')
check "the installed cuheap-replay replays a trace (got $out rows)" '[ "$out" = 1 ]'

make -s --no-print-directory uninstall PREFIX="$prefix" >"$TMP/uninstall.log" 2>&1
left=$(cd "$prefix" && find . \( -type f -o -type l \) | tr '\n' ' ')
check "make uninstall leaves no file (left: $left; $(tail -c 200 "$TMP/uninstall.log"))" '[ -z "$left" ] && [ ! -e "$prefix/share/cuheap" ]'

make -s --no-print-directory install PREFIX=/opt/cuheap DESTDIR="$TMP/stage" >"$TMP/stage.log" 2>&1
check "DESTDIR: the tree is staged under it, cuheap.pc naming PREFIX alone ($(tail -c 200 "$TMP/stage.log"))" \
    '[ -e "$TMP/stage/opt/cuheap/lib/libcuheap.so" ] && [ -x "$TMP/stage/opt/cuheap/bin/cuheap" ] &&
     grep -qx "prefix=/opt/cuheap" "$TMP/stage/opt/cuheap/lib/pkgconfig/cuheap.pc"'
make -s --no-print-directory uninstall PREFIX=/opt/cuheap DESTDIR="$TMP/stage" >/dev/null 2>&1
left=$(cd "$TMP/stage" && find . \( -type f -o -type l \) | tr '\n' ' ')
check "DESTDIR: make uninstall leaves no file (left: $left)" '[ -z "$left" ]'
finish test_install
