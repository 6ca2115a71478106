# harness.sh - what the shell tests share. Source it from a test script:
#   . "$(dirname "$0")/harness.sh"
#   check NAME EXPR        passes when EXPR (evaluated) succeeds
#   ok NAME                counts a pass and prints it
#   not_ok NAME [DETAIL]   counts a failure and prints it, with the first 20
#                          lines of DETAIL
#   run NAME ARGS...       runs "$BIN" ARGS: status in $rc, output in
#                          $TMP/NAME.out and $TMP/NAME.err (set BIN and TMP)
#   finish NAME            prints "NAME: P passed, F failed" and exits with
#                          status 0 only if nothing failed
passed=0
failed=0

ok() {
    passed=$((passed + 1))
    echo "ok   - $1"
}

not_ok() {
    failed=$((failed + 1))
    echo "FAIL - $1"
    if [ -n "${2:-}" ]; then
        printf '%s\n' "$2" | head -n 20 | sed 's/^/       /'
    fi
}

check() {
    if eval "$2"; then
        passed=$((passed + 1))
    else
        not_ok "$1"
    fi
}

run() {
    local name=$1
    shift
    "$BIN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    rc=$?
}

finish() {
    echo "$1: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}
