#!/usr/bin/env bash
# test_torch_throw.sh BUILD_DIR - in a C++ process (as PyTorch is), a failed
# cuheap_torch_alloc throws std::bad_alloc after printing cuheap's reason,
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
passed=0; failed=0
if ! g++ -O1 -o "$tmp/throw" "$tmp/throw.cpp" -ldl 2>"$tmp/cc.log"; then
    echo "FAIL: cannot build the C++ probe: $(cat "$tmp/cc.log")"; failed=1
else
    out=$("$tmp/throw" "$lib" 2>"$tmp/err"); err=$(cat "$tmp/err")
    if [ "$out" = "caught std::bad_alloc" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: got '$out'"; fi
    if echo "$err" | grep -q "cuheap: allocation failed: .*libcuda.so.1"; then passed=$((passed + 1)); else
        failed=$((failed + 1)); echo "FAIL: no explanation on stderr (got '$err')"; fi
fi
echo "test_torch_throw: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
