#!/usr/bin/env bash
# install-deps.sh [test|fuzz] - installs the Debian packages cuheap's build
# needs, if they are missing: a C compiler, make, zlib and cmocka (headers and
# libraries), python3, and curl and bzip2 (scripts/build-jemalloc.sh fetches
# and unpacks Debian's jemalloc source); with `test`, also g++ (one test builds a C++ probe),
# chromium (the HTML report is rendered headless), pkg-config (tests/test_install.sh
# builds against the installed cuheap.pc) and, where python3 cannot make a venv with
# pip, python3-venv (tests/test_pip.sh); with `fuzz`, clang with
# its libFuzzer runtime (`make fuzz`). Silent when all is there.
set -euo pipefail

missing=()
have_header() { printf '#include <%s>\n' "$1" | ${CC:-gcc} -E -x c - >/dev/null 2>&1; }
command -v ${CC:-gcc} >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || missing+=(make)
if [ "${1:-}" = test ]; then
    command -v g++ >/dev/null 2>&1 || missing+=(g++)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1 &&
        missing+=(python3-venv)
fi
links_libfuzzer() {
    printf 'int LLVMFuzzerTestOneInput(const char *d, long n);\nint LLVMFuzzerTestOneInput(const char *d, long n) { (void)d; (void)n; return 0; }\n' |
        clang -fsanitize=fuzzer -x c - -o /dev/null >/dev/null 2>&1
}
if [ "${1:-}" = fuzz ]; then
    if ! command -v clang >/dev/null 2>&1; then
        missing+=(clang)
    elif ! links_libfuzzer; then
        missing+=("libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev")
    fi
fi
have_header zlib.h || missing+=(zlib1g-dev)
printf '#include <stdarg.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <setjmp.h>\n#include <cmocka.h>\n' |
    ${CC:-gcc} -E -x c - >/dev/null 2>&1 || missing+=(libcmocka-dev)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v bzip2 >/dev/null 2>&1 || missing+=(bzip2)

[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "install-deps: missing ${missing[*]} and not root: install them with apt-get" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
if [ "${1:-}" = fuzz ] && ! links_libfuzzer; then
    # The libFuzzer runtime is only recommended by Debian's clang.
    $sudo apt-get install -y -qq "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev" >/dev/null
fi
