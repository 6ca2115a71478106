#!/usr/bin/env bash
# test_torch_throw.sh BUILD_DIR - in a C++ process (as PyTorch is), a failed
# cuheap_torch_alloc throws std::bad_alloc after printing cuheap's reason
# (also when, as under Python, the C++ runtime is not in the global scope),
# instead of returning the NULL that PyTorch would turn into a tensor with a
# null data pointer. Without a GPU every allocation fails (no driver), which
# is exactly the failure this needs.
set -uo pipefail
build=${1:-build}
[ -e "$build/libcuheap.so" ] || build=build
lib=$(cd "$build" && pwd)/libcuheap.so
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/throw.cpp" <<'CPP'
#include <cstdio>
#include <dlfcn.h>
#include <new>
#include <sys/types.h>
int main(int, char **argv) {
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { std::printf("dlopen failed: %s\n", dlerror()); return 1; }
    auto alloc = reinterpret_cast<void *(*)(ssize_t, int, void *)>(dlsym(lib, "cuheap_torch_alloc"));
    try {
        void *p = alloc(1 << 20, 0, nullptr);
        std::printf("returned %p\n", p);
    } catch (const std::bad_alloc &) {
        std::printf("caught std::bad_alloc\n");
    }
    return 0;
}
CPP
. "$(dirname "$0")/harness.sh"
if ! g++ -O1 -o "$tmp/throw" "$tmp/throw.cpp" -ldl 2>"$tmp/cc.log"; then
    not_ok "cannot build the C++ probe" "$(cat "$tmp/cc.log")"
else
    out=$("$tmp/throw" "$lib" 2>"$tmp/err"); err=$(cat "$tmp/err")
    check "a failed allocation throws std::bad_alloc (got '$out')" '[ "$out" = "caught std::bad_alloc" ]'
    check "the failure is explained on stderr (got '$err')" 'echo "$err" | grep -q "cuheap: allocation failed: .*libcuda.so.1"'
fi
# As under Python: a C program loads PyTorch-like C++ code with RTLD_LOCAL, so
# the C++ runtime is outside the global scope.
cat > "$tmp/shim.cpp" <<'CPP'
#include <new>
#include <sys/types.h>
extern "C" const char *call_alloc(void *(*alloc)(ssize_t, int, void *)) {
    try {
        alloc(1 << 20, 0, nullptr);
        return "returned";
    } catch (const std::bad_alloc &) {
        return "caught std::bad_alloc";
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
    check "with a locally loaded C++ runtime it throws too (got '$out')" '[ "$out" = "caught std::bad_alloc" ]'
else
    not_ok "cannot build the RTLD_LOCAL probe"
fi
finish test_torch_throw
