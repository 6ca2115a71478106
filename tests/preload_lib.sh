# preload_lib.sh - what the LD_PRELOAD tests share: which cuheap library to
# preload for BUILD_DIR ($build), and where the test programs are. Source it
# from a test script after setting build:
#   lib           the library: BUILD_DIR's libcuheap-asan.so in the sanitized
#                 run, else its libcuheap.so (the plain build's if none)
#   preload_list  LD_PRELOAD's value: the sanitized library needs the
#                 sanitizer's runtime first in the list
#   san_env       environment for it: leaks are not checked (the heaps live
#                 until the process exits)
#   programs      BUILD_DIR/tests/preload, or the plain build's (the test
#                 programs are plain builds in every run)
lib=$build/libcuheap.so
[ -e "$build/libcuheap-asan.so" ] && lib=$build/libcuheap-asan.so
[ -e "$lib" ] || lib=build/libcuheap.so
lib=$(realpath "$lib")
preload_list=$lib
san_env=()
if [[ "$(nm -D "$lib" 2>/dev/null)" == *__asan_init* ]]; then
    preload_list="$(gcc -print-file-name=libasan.so) $lib"
    san_env=(ASAN_OPTIONS=detect_leaks=0)
fi
programs=$build/tests/preload
[ -x "$programs/runtime_shared" ] || programs=build/tests/preload
