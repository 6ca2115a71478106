#!/usr/bin/env bash
# test_launcher.sh BUILD_DIR - the `cuheap` launcher (src/tools/launch.c)
# without a GPU: `cuheap -- CMD` runs CMD with libcuheap.so first in
# LD_PRELOAD and --conf/--report in CUHEAP_CONF, and a preload test program
# run through it (against the fake CUDA libraries) is served by cuheap and
# writes its report at exit; --torch passes CUHEAP_TORCH=1, CUHEAP_LIB and
# the Python helper on PYTHONPATH instead, and a stand-in torch imported under
# it gets cuheap installed, in a child's child too (as under torchrun); the
# library is found beside the launcher (../lib, or its own folder) or from
# CUHEAP_LIB; a bad setting is refused with the library's own message, and
# every bad command line names its problem, with env(1)'s exit statuses.
# The launcher is the plain build's in the sanitized run too (it only
# prepares an environment and execs).
set -uo pipefail
build=${1:-build}
. "$(dirname "$0")/harness.sh"
launcher=$(realpath "${build%/san}/cuheap")
lib=$(realpath "${build%/san}/libcuheap.so")
root=$(pwd)
fake=$(realpath build/fake)
programs=$(realpath build/tests/preload)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
unset CUHEAP_CONF CUHEAP_LIB CUHEAP_TORCH LD_PRELOAD

# launch NAME ARGS...: runs the launcher; status in $rc, output in
# $TMP/NAME.out and $TMP/NAME.err.
launch() {
    local name=$1
    shift
    "$launcher" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    rc=$?
}
var() { sed -n "s/^$1=//p" "$TMP/$2.out"; }

launch plain -- env
check "cuheap -- env: libcuheap.so is LD_PRELOAD, nothing else set (got: $(var LD_PRELOAD plain); CUHEAP_CONF=$(var CUHEAP_CONF plain))" \
    '[ $rc -eq 0 ] && [ "$(var LD_PRELOAD plain)" = "$lib" ] && ! grep -q "^CUHEAP_" "$TMP/plain.out"'
launch conf --conf vmm:1,limit:40G --conf thread_cache:0 --report "$TMP/r-%p.json" -- env
check "--conf (twice) and --report become CUHEAP_CONF (got: $(var CUHEAP_CONF conf))" \
    '[ "$(var CUHEAP_CONF conf)" = "vmm:1,limit:40G,thread_cache:0,report:$TMP/r-%p.json" ]'
CUHEAP_CONF=vmm:0,limit:1G LD_PRELOAD=$programs/libprobe_first.so launch keep --conf=limit:2G -- env
check "an existing CUHEAP_CONF comes first, --conf after it; an existing LD_PRELOAD stays after cuheap (got: $(var CUHEAP_CONF keep); $(var LD_PRELOAD keep))" \
    '[ "$(var CUHEAP_CONF keep)" = "vmm:0,limit:1G,limit:2G" ] && [ "$(var LD_PRELOAD keep)" = "$lib:$programs/libprobe_first.so" ]'

# A CUDA program through the launcher: the threads check passes only when
# cuheap serves its cudaMalloc (without the preload it fails, see
# tests/test_preload.sh), and the report lands at exit.
launch served --report "$TMP/served-%p.json" -- env LD_LIBRARY_PATH="$fake" "$programs/runtime_shared" threads
reports=$(ls "$TMP"/served-*.json 2>/dev/null)
check "a preload test program run by the launcher gets cuheap: 'ok threads' (rc $rc; $(head -c 300 "$TMP/served.err"))" \
    '[ $rc -eq 0 ] && grep -qx "ok threads" "$TMP/served.out"'
check "--report: the program wrote its report at exit (got: $reports)" \
    '[ -n "$reports" ] && grep -q "\"schema\":\"cuheap-report\"" $reports'
launch exit -- sh -c 'exit 7'
check "the launcher exits with the command's status (got $rc)" '[ $rc -eq 7 ]'

# --torch: the environment activation, checked by a stand-in torch that
# records the allocator PyTorch is given.
stand_in_torch "$TMP/fake"
PYTHONPATH="$TMP/fake" launch torchenv --torch -- env
check "--torch: CUHEAP_TORCH=1, CUHEAP_LIB, the helper first on PYTHONPATH, no LD_PRELOAD (got: $(grep -E '^(CUHEAP_|PYTHONPATH|LD_PRELOAD)' "$TMP/torchenv.out" | tr '\n' ' '))" \
    '[ "$(var CUHEAP_TORCH torchenv)" = 1 ] && [ "$(var CUHEAP_LIB torchenv)" = "$lib" ] &&
     [ "$(var PYTHONPATH torchenv)" = "$root/scripts:$TMP/fake" ] && [ -z "$(var LD_PRELOAD torchenv)" ]'
PYTHONPATH="$TMP/fake" launch torch --torch --conf vmm:0 -- sh -c \
    'python3 -c "import torch; print(*torch.cuda.memory.CURRENT)"'
check "--torch: a child's child importing torch gets cuheap as its allocator (got: $(cat "$TMP/torch.out" "$TMP/torch.err" | head -c 300))" \
    '[ $rc -eq 0 ] && [ "$(cat "$TMP/torch.out")" = "$lib" ]'

# Where the library is found: ../lib beside an installed launcher, its own
# folder in a build tree, CUHEAP_LIB over both; none is an error.
mkdir -p "$TMP/prefix/bin" "$TMP/prefix/lib" "$TMP/tree" "$TMP/alone"
cp "$launcher" "$TMP/prefix/bin/cuheap"; cp "$lib" "$TMP/prefix/lib/libcuheap.so"
cp "$launcher" "$TMP/tree/cuheap"; cp "$lib" "$TMP/tree/libcuheap.so"
cp "$launcher" "$TMP/alone/cuheap"
out=$("$TMP/prefix/bin/cuheap" -- env | sed -n 's/^LD_PRELOAD=//p')
check "installed: ../lib/libcuheap.so beside bin/ (got: $out)" '[ "$out" = "$TMP/prefix/lib/libcuheap.so" ]'
out=$("$TMP/tree/cuheap" -- env | sed -n 's/^LD_PRELOAD=//p')
check "build tree: libcuheap.so in the launcher's folder (got: $out)" '[ "$out" = "$TMP/tree/libcuheap.so" ]'
out=$(CUHEAP_LIB="$lib" "$TMP/alone/cuheap" -- env | sed -n 's/^LD_PRELOAD=//p')
check "CUHEAP_LIB names the library (got: $out)" '[ "$out" = "$lib" ]'
err=$("$TMP/alone/cuheap" -- true 2>&1); rc=$?
check "no library: status 2, naming the places looked at (got $rc: $err)" \
    '[ $rc -eq 2 ] && echo "$err" | grep -q "libcuheap.so not found" && echo "$err" | grep -q "$TMP/alone/../lib/libcuheap.so"'
err=$(CUHEAP_LIB=$TMP/none.so "$launcher" -- true 2>&1); rc=$?
check "CUHEAP_LIB naming no file: status 2, naming it (got $rc: $err)" '[ $rc -eq 2 ] && echo "$err" | grep -q "CUHEAP_LIB=$TMP/none.so"'
err=$(CUHEAP_LIB="$lib" "$TMP/alone/cuheap" --torch -- true 2>&1); rc=$?
check "--torch without the Python helper beside it: status 2, saying so (got $rc: $err)" \
    '[ $rc -eq 2 ] && echo "$err" | grep -q "Python helper is not installed"'

# A bad setting stops before the command, in the library's own words.
launch badconf --conf vmm:1,bogus:3 -- touch "$TMP/ran"
CUHEAP_CONF=vmm:1,bogus:3 LD_PRELOAD=$lib LD_LIBRARY_PATH="$fake" "$programs/runtime_shared" threads >/dev/null 2>"$TMP/lib.err"
check "a bad --conf: status 2, the command not run, the library's own message (got: $(cat "$TMP/badconf.err"); library: $(grep CUHEAP_CONF "$TMP/lib.err"))" \
    '[ $rc -eq 2 ] && [ ! -e "$TMP/ran" ] && grep -q "unknown key .bogus." "$TMP/badconf.err" &&
     [ "$(cat "$TMP/badconf.err")" = "$(grep "^cuheap: CUHEAP_CONF=" "$TMP/lib.err")" ]'
CUHEAP_CONF=limit:lots launch badenv -- true
check "a bad CUHEAP_CONF already set is refused too (got: $(cat "$TMP/badenv.err"))" \
    '[ $rc -eq 2 ] && grep -q "CUHEAP_CONF=\"limit:lots\"" "$TMP/badenv.err"'

# bad_input NAME STATUS PATTERN ARGS...: the launcher refuses ARGS with
# STATUS and a message matching PATTERN.
bad_input() {
    local name=$1 status=$2 pattern=$3
    shift 3
    launch "$name" "$@"
    check "$name: status $status, '$pattern' (got $rc: $(head -c 200 "$TMP/$name.err"))" \
        '[ $rc -eq $status ] && grep -q -- "$pattern" "$TMP/$name.err" && [ ! -s "$TMP/$name.out" ]'
}
bad_input no-dashes 2 "no '--' before the command 'env'" env
bad_input no-command 2 "no command after '--'" --conf vmm:1 --
bad_input nothing 2 "no command" --torch
bad_input unknown-option 2 "unknown option '--frobnicate'" --frobnicate -- env
bad_input conf-no-value 2 "\-\-conf needs a value" --conf
bad_input report-no-value 2 "\-\-report needs a value" --report -- env
bad_input report-comma 2 "may not contain ','" --report /tmp/a,b.json -- env
bad_input not-found 127 "no-such-command-here: No such file" -- no-such-command-here
bad_input not-runnable 126 "Permission denied" -- "$TMP/fake/torch/__init__.py"
launch help --help
check "--help: the usage on stdout, status 0" '[ $rc -eq 0 ] && grep -q "^usage: cuheap \[--conf" "$TMP/help.out"'

finish test_launcher
