#!/usr/bin/env bash
# test_torch_throw.sh BUILD_DIR - in a C++ process (as PyTorch is), a failed
# cuheap_torch_alloc throws std::runtime_error naming the cause after
# printing cuheap's reason (also when, as under Python, the C++ runtime is not
# in the global scope), instead of returning the NULL that PyTorch would turn
# into a tensor with a null data pointer; PyTorch makes it a RuntimeError with
# that message. An out-of-memory says "CUDA out of memory.", as PyTorch's own
# does and as tools that retry with a smaller batch look for. Without a
# driver every allocation fails; on the fake driver, a limit makes the
# out-of-memory.
set -uo pipefail
build=${1:-build}
[ -e "$build/libcuheap.so" ] || build=build
lib=$(cd "$build" && pwd)/libcuheap.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/throw.cpp" <<'CPP'
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <stdexcept>
#include <sys/types.h>
int main(int argc, char **argv) {
    ssize_t size = argc > 2 ? std::atol(argv[2]) : 1 << 20;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { std::printf("dlopen failed: %s\n", dlerror()); return 1; }
    auto alloc = reinterpret_cast<void *(*)(ssize_t, int, void *)>(dlsym(lib, "cuheap_torch_alloc"));
    try {
        void *p = alloc(size, 0, nullptr);
        std::printf("returned %p\n", p);
    } catch (const std::runtime_error &e) {
        std::printf("caught std::runtime_error: %s\n", e.what());
    }
    return 0;
}
CPP
. "$(dirname "$0")/harness.sh"
if ! g++ -O1 -o "$tmp/throw" "$tmp/throw.cpp" -ldl 2>"$tmp/cc.log"; then
    not_ok "cannot build the C++ probe" "$(cat "$tmp/cc.log")"
else
    out=$("$tmp/throw" "$lib" 2>"$tmp/err"); err=$(cat "$tmp/err")
    check "a failed allocation throws std::runtime_error naming the cause (got '$out')" \
        'echo "$out" | grep -q "^caught std::runtime_error: cuheap could not allocate 1.00 MiB (1048576 bytes) on device 0: .*libcuda.so.1"'
    check "the failure is explained on stderr (got '$err')" 'echo "$err" | grep -q "cuheap: allocation failed: .*libcuda.so.1"'
    out=$(LD_LIBRARY_PATH="$(dirname "$lib")/fake" CUHEAP_CONF=limit:4M "$tmp/throw" "$lib" $((64 << 20)) 2>"$tmp/err")
    check "an out-of-memory says 'CUDA out of memory.' and why (got '$out')" \
        'echo "$out" | grep -q "^caught std::runtime_error: CUDA out of memory. Tried to allocate 64.00 MiB (67108864 bytes) on device 0; cuheap, .*limit"'
fi
# As under Python: a C program loads PyTorch-like C++ code with RTLD_LOCAL, so
# the C++ runtime is outside the global scope.
cat > "$tmp/shim.cpp" <<'CPP'
#include <stdexcept>
#include <sys/types.h>
extern "C" const char *call_alloc(void *(*alloc)(ssize_t, int, void *)) {
    try {
        alloc(1 << 20, 0, nullptr);
        return "returned";
    } catch (const std::runtime_error &) {
        return "caught std::runtime_error";
    }
}
CPP
cat > "$tmp/host.c" <<'C'
#include <dlfcn.h>
#include <stdio.h>
#include <sys/types.h>
int main(int argc, char **argv) {
    (void)argc;
    void *shim = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    void *lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!shim || !lib) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    const char *(*call)(void *) = (const char *(*)(void *))dlsym(shim, "call_alloc");
    printf("%s\n", call(dlsym(lib, "cuheap_torch_alloc")));
    return 0;
}
C
if g++ -shared -fPIC -O1 -o "$tmp/shim.so" "$tmp/shim.cpp" && ${CC:-cc} -O1 -o "$tmp/host" "$tmp/host.c" -ldl; then
    out=$("$tmp/host" "$tmp/shim.so" "$lib" 2>/dev/null)
    check "with a locally loaded C++ runtime it throws too (got '$out')" '[ "$out" = "caught std::runtime_error" ]'
else
    not_ok "cannot build the RTLD_LOCAL probe"
fi
finish test_torch_throw
