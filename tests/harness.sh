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
#   stand_in_torch DIR     writes DIR/torch, the least of torch that cuheap's
#                          install() needs; torch.cuda.memory.CURRENT lists
#                          the libraries made PyTorch's allocator
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

stand_in_torch() {
    mkdir -p "$1/torch/cuda"
    echo 'from . import cuda' >"$1/torch/__init__.py"
    printf 'from . import memory\ndef current_device():\n    return 0\n' >"$1/torch/cuda/__init__.py"
    cat >"$1/torch/cuda/memory.py" <<'PY'
import ctypes
CURRENT = []
class _Backend:
    def __getattr__(self, name):
        return lambda address: None
class CUDAPluggableAllocator:
    def __init__(self, path, alloc, free):
        self.path, self.alloc = path, getattr(ctypes.CDLL(path), alloc)
    def allocator(self):
        return _Backend()
def change_current_allocator(allocator):
    CURRENT.append(allocator.path)
PY
}
