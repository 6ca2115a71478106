# cuheap - build menu. Out-of-tree build in build/ (sanitized copies in build/san/
# and build/tsan/).
#
#   make            library (build/libcuheap.so, build/libcuheap.a), tools and the
#                   launcher (build/cuheap)
#   make demo       install what is missing, build, replay the bundled traces
#   make test       every test, again under AddressSanitizer + UBSan, and the unit
#                   tests under ThreadSanitizer
#   make bench      heap and replay benchmarks on the simulated device (no GPU)
#   make corpus     every job of the corpus replayed in each way in, beside PyTorch (no GPU)
#   make gpu-check  on a machine with a GPU: build the real device and test it
#   make gpu-bench  on a machine with a GPU: allocation latency, event costs, training jobs
#                   (BENCH_PARTS=pertensor: one tensor through PyTorch in each mode, beside the floor)
#   make floor      the floor: allocators that only hand out memory, the per-tensor yardstick
#   make settings-doc  write docs/settings.md from the code's option table
#   make install    PREFIX=/usr/local (and DESTDIR): libraries, header, pkg-config file,
#                   tools, launcher, PyTorch module; make uninstall removes them
#   make clean

CC      ?= gcc
BUILD   ?= build
OPT     ?= -O2 -g
# Link-time optimization of libcuheap.so: a cudaMalloc under LD_PRELOAD
# crosses the hooks, the API and the heap, a dozen files, and inlined across
# them a pair costs about 170 fewer instructions (bench/HISTORY-speed.md,
# "What a block's pair pays for"). Only where the compiler links that way (some
# installs lack GCC's lto-wrapper), and only for the .so, from objects of its
# own: libcuheap.a keeps plain objects that any linker takes. LTO= builds
# without.
ifeq ($(origin LTO),undefined)
LTO := $(shell printf 'int main(void) { return 0; }\n' | \
         $(CC) -flto=auto -x c - -o /dev/null >/dev/null 2>&1 && echo -flto=auto)
endif
# Thread-locals through TLS descriptors where the target has the choice
# (x86-64): a block's pair under LD_PRELOAD reads four, and the default model
# of a shared library calls __tls_get_addr for each (about 15 instructions);
# a descriptor of a library loaded at start-up returns its offset at once. A
# library dlopen'ed later (the PyTorch plugin) keeps working as before: the
# initial-exec model would have asked glibc for static room for all 5 KB of
# the library's thread-locals there, which it need not have.
ifeq ($(origin TLS_DIALECT),undefined)
TLS_DIALECT := $(shell printf '_Thread_local int x; int main(void) { return x; }\n' | \
                 $(CC) -mtls-dialect=gnu2 -fPIC -x c - -o /dev/null >/dev/null 2>&1 && echo -mtls-dialect=gnu2)
endif
WARN    := -Wall -Wextra -Wshadow -Wconversion -Wstrict-prototypes -Wmissing-prototypes -Werror
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE $(WARN) -fPIC -fvisibility=hidden -Iinclude -Isrc -pthread
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
TSAN    := -fsanitize=thread -fno-omit-frame-pointer

# The library proper: what libcuheap.so is made of. No CUDA library and no
# zlib are linked; the driver is loaded with dlopen at run time.
LIB_SRCS := src/log.c src/callers.c src/config.c src/sizeclass.c src/freebins.c src/ptrmap.c \
            src/arena.c src/slab.c src/lock.c src/tcache.c src/chunk.c src/page_plan.c \
            src/heap.c src/heap_streams.c src/heap_small.c src/heap_tcache.c src/heap_chunks.c src/heap_place.c src/heap_segments.c \
            src/heap_pages.c src/heap_devicewide.c src/heap_holds.c src/heap_oom.c src/heap_stats.c \
            src/pinned.c src/report.c src/report_html.c src/device_sim.c \
            src/device_cuda.c src/api.c src/hook_torch.c src/trace_write.c src/step_plan.c src/step_detect.c src/heap_plan.c
# The CUDA entry points for LD_PRELOAD: in libcuheap.so only. A program that
# links libcuheap.a keeps its own CUDA runtime.
HOOK_SRCS := src/hook_cuda.c src/hook_runtime.c src/hook_driver.c
# Tool-side code (reads gzip traces, so it links zlib); never in the .so.
TOOL_SRCS := src/trace_read.c src/json_read.c src/torch_model.c src/device_fault.c src/step_plan_trace.c
# cuheap-report: the command line, reading, checking and rendering.
REPORT_SRCS := src/tools/report.c src/tools/report_read.c src/tools/report_check.c src/tools/report_render.c

# jemalloc, for the pinned host memory cache: Debian's 5.3.0 source built by
# scripts/build-jemalloc.sh with its symbols renamed (cuh_je_*) and
# global-dynamic TLS, so that it loads by dlopen. Built once per build folder
# (no prerequisites: a GPU machine without network uses a carried copy).
JEMALLOC := $(BUILD)/jemalloc-5.3.0
JE_LIB   := $(JEMALLOC)/lib/libjemalloc_pic.a

TESTS := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))

LIB_OBJS      := $(LIB_SRCS:src/%.c=$(BUILD)/obj/%.o)
HOOK_OBJS     := $(HOOK_SRCS:src/%.c=$(BUILD)/obj/%.o)
TOOL_OBJS     := $(TOOL_SRCS:src/%.c=$(BUILD)/obj/%.o)
# The .so's objects: compiled for link-time optimization where LTO is on.
SO_OBJ_DIR    := $(if $(LTO),$(BUILD)/lto/obj,$(BUILD)/obj)
SO_OBJS       := $(LIB_SRCS:src/%.c=$(SO_OBJ_DIR)/%.o) $(HOOK_SRCS:src/%.c=$(SO_OBJ_DIR)/%.o)
SAN_LIB_OBJS  := $(LIB_SRCS:src/%.c=$(BUILD)/san/obj/%.o)
SAN_HOOK_OBJS := $(HOOK_SRCS:src/%.c=$(BUILD)/san/obj/%.o)
SAN_TOOL_OBJS := $(TOOL_SRCS:src/%.c=$(BUILD)/san/obj/%.o)
TSAN_LIB_OBJS := $(LIB_SRCS:src/%.c=$(BUILD)/tsan/obj/%.o)
TSAN_TOOL_OBJS := $(TOOL_SRCS:src/%.c=$(BUILD)/tsan/obj/%.o)

.PHONY: all lib tools settings-doc install uninstall demo corpus test test-plain test-san test-tsan preload-tests floor bench fuzz gpu-check gpu-bench deps deps-test clean
all: lib tools

lib: $(BUILD)/libcuheap.so $(BUILD)/libcuheap.a
tools: $(BUILD)/cuheap-replay $(BUILD)/cuheap-report $(BUILD)/cuheap-corpus $(BUILD)/cuheap

deps:
	@scripts/install-deps.sh

# After deps: under make -j the two would run apt-get at once, and one
# would fail on apt's lock.
deps-test: deps
	@scripts/install-deps.sh test

$(JE_LIB):
	@scripts/install-deps.sh
	@scripts/build-jemalloc.sh $(JEMALLOC)

PINNED_OBJS := $(BUILD)/obj/pinned.o $(BUILD)/lto/obj/pinned.o $(BUILD)/san/obj/pinned.o $(BUILD)/tsan/obj/pinned.o
$(PINNED_OBJS): | $(JE_LIB)
$(PINNED_OBJS): CFLAGS_BASE += -isystem $(JEMALLOC)/include

$(BUILD)/obj/%.o: src/%.c $(wildcard src/*.h) include/cuheap.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) $(TLS_DIALECT) -c $< -o $@

$(BUILD)/lto/obj/%.o: src/%.c $(wildcard src/*.h) include/cuheap.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) $(TLS_DIALECT) $(LTO) -c $< -o $@

$(BUILD)/san/obj/%.o: src/%.c $(wildcard src/*.h) include/cuheap.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -c $< -o $@

$(BUILD)/tsan/obj/%.o: src/%.c $(wildcard src/*.h) include/cuheap.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(TSAN) -c $< -o $@

$(BUILD)/libcuheap.so: $(SO_OBJS) src/exports.map $(JE_LIB)
	$(CC) $(OPT) $(TLS_DIALECT) $(LTO) -shared -Wl,--version-script=src/exports.map -Wl,--exclude-libs,ALL -Wl,-z,defs \
	    -Wl,-z,nodelete -pthread -o $@ $(SO_OBJS) $(JE_LIB) -ldl

# The static library carries jemalloc's objects too: linking it needs nothing else.
define static_library
	@rm -f $@
	@{ echo "create $@"; echo "addlib $(JE_LIB)"; for o in $^; do case $$o in *.o) echo "addmod $$o";; esac; done; \
	   echo save; echo end; } | ar -M
	ranlib $@
endef

$(BUILD)/libcuheap.a: $(LIB_OBJS) $(JE_LIB)
	$(static_library)

# The sanitized shared object, preloaded (after libasan) by the sanitized
# run of tests/test_preload.sh; named apart so that no other test loads it.
$(BUILD)/san/libcuheap-asan.so: $(SAN_LIB_OBJS) $(SAN_HOOK_OBJS) src/exports.map $(JE_LIB)
	$(CC) -shared -Wl,--version-script=src/exports.map -Wl,--exclude-libs,ALL -pthread $(SAN) \
	    -o $@ $(SAN_LIB_OBJS) $(SAN_HOOK_OBJS) $(JE_LIB) -ldl

$(BUILD)/san/libcuheap.a: $(SAN_LIB_OBJS) $(JE_LIB)
	$(static_library)

$(BUILD)/tsan/libcuheap.a: $(TSAN_LIB_OBJS) $(JE_LIB)
	$(static_library)

$(BUILD)/cuheap-replay: src/tools/replay.c src/tools/cli.h $(TOOL_OBJS) $(BUILD)/libcuheap.a
	$(CC) $(CFLAGS_BASE) $(OPT) -o $@ $< $(TOOL_OBJS) $(BUILD)/libcuheap.a -lz -ldl -lm

$(BUILD)/san/cuheap-replay: src/tools/replay.c src/tools/cli.h $(SAN_TOOL_OBJS) $(BUILD)/san/libcuheap.a
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -o $@ $< $(SAN_TOOL_OBJS) $(BUILD)/san/libcuheap.a -lz -ldl -lm

$(BUILD)/cuheap-corpus: src/tools/corpus.c src/tools/cli.h $(BUILD)/obj/json_read.o
	$(CC) $(CFLAGS_BASE) $(OPT) -o $@ $< $(BUILD)/obj/json_read.o -lm

$(BUILD)/san/cuheap-corpus: src/tools/corpus.c src/tools/cli.h $(BUILD)/san/obj/json_read.o
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -o $@ $< $(BUILD)/san/obj/json_read.o -lm

$(BUILD)/cuheap-report: $(REPORT_SRCS) src/tools/report_tool.h src/tools/cli.h $(TOOL_OBJS) $(BUILD)/libcuheap.a
	$(CC) $(CFLAGS_BASE) $(OPT) -o $@ $(REPORT_SRCS) $(TOOL_OBJS) $(BUILD)/libcuheap.a -lz -ldl -lm

$(BUILD)/san/cuheap-report: $(REPORT_SRCS) src/tools/report_tool.h src/tools/cli.h $(SAN_TOOL_OBJS) \
                            $(BUILD)/san/libcuheap.a
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -o $@ $(REPORT_SRCS) $(SAN_TOOL_OBJS) $(BUILD)/san/libcuheap.a -lz -ldl -lm

# The launcher: it checks --conf with the library's own parser (config.o and
# the message helpers, from the static library), and finds libcuheap.so beside it.
$(BUILD)/cuheap: src/tools/launch.c src/tools/cli.h $(BUILD)/libcuheap.a
	$(CC) $(CFLAGS_BASE) $(OPT) -o $@ $< $(BUILD)/libcuheap.a -ldl -lm

# Tools and tests need zlib and cmocka; the library itself needs neither.
$(TOOL_OBJS) $(SAN_TOOL_OBJS) $(TSAN_TOOL_OBJS): | deps
# Kept between runs (as intermediate files make would delete them).
.SECONDARY: $(TSAN_TOOL_OBJS)

# ---- tests ---------------------------------------------------------------
$(BUILD)/tests/%: tests/%.c tests/test_util.h tests/heap_model.h tests/heap_test.h $(TOOL_OBJS) $(BUILD)/libcuheap.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) -Wno-missing-prototypes -o $@ $< $(TOOL_OBJS) $(BUILD)/libcuheap.a -lcmocka -lz -ldl -lm

$(BUILD)/san/tests/%: tests/%.c tests/test_util.h tests/heap_model.h tests/heap_test.h $(SAN_TOOL_OBJS) \
                      $(BUILD)/san/libcuheap.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -Wno-missing-prototypes -o $@ $< $(SAN_TOOL_OBJS) $(BUILD)/san/libcuheap.a -lcmocka -lz -ldl -lm

$(BUILD)/tsan/tests/%: tests/%.c tests/test_util.h tests/heap_model.h tests/heap_test.h $(TSAN_TOOL_OBJS) \
                       $(BUILD)/tsan/libcuheap.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(TSAN) -Wno-missing-prototypes -o $@ $< $(TSAN_TOOL_OBJS) $(BUILD)/tsan/libcuheap.a -lcmocka -lz -ldl -lm

# The fuzz targets of tests/fuzz, built without libFuzzer (FUZZ_MAIN): `make
# test` replays their corpora (tests/test_fuzz_corpus.sh), plain and under the
# sanitizers; `make fuzz` builds them with clang's libFuzzer and searches.
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_main.h tests/heap_model.h $(TOOL_OBJS) $(BUILD)/libcuheap.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) -DFUZZ_MAIN -Itests/fuzz -o $@ $< $(TOOL_OBJS) $(BUILD)/libcuheap.a -lz -ldl -lm

# fuzz_faults is fuzz_heap under fault plans: it includes fuzz_heap.c.
$(BUILD)/fuzz/fuzz_faults $(BUILD)/san/fuzz/fuzz_faults: tests/fuzz/fuzz_heap.c

$(BUILD)/san/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_main.h tests/heap_model.h $(SAN_TOOL_OBJS) $(BUILD)/san/libcuheap.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -DFUZZ_MAIN -Itests/fuzz -o $@ $< $(SAN_TOOL_OBJS) $(BUILD)/san/libcuheap.a \
	    -lz -ldl -lm

# fuzz_report compiles cuheap-report's own sources in.
$(BUILD)/fuzz/fuzz_report $(BUILD)/san/fuzz/fuzz_report: $(REPORT_SRCS) src/tools/report_tool.h src/tools/cli.h

fuzz: all
	@FUZZ_SOURCES="$(LIB_SRCS) $(TOOL_SRCS)" scripts/fuzz.sh $(BUILD)

# The real driver path runs in CI against a fake libcuda.so.1 (host memory for
# device memory), found through the test binary's run path.
# -Bsymbolic: the fake's own references (its cuGetProcAddress table) name its
# own functions, as the real driver's do, never a preloaded library's.
FAKE_CUDA := $(BUILD)/fake/libcuda.so.1
FAKE_CUDA_SRCS := tests/fake/fake_cuda.c tests/fake/fake_vm.c tests/fake/fake_faults.c
$(FAKE_CUDA): $(FAKE_CUDA_SRCS) tests/fake/fake_cuda.h tests/fake/fake_internal.h
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -std=c11 -O1 -g -Wall -Wextra -Werror -fvisibility=hidden -Wl,-Bsymbolic \
	    -Wl,-soname,libcuda.so.1 -o $@ $(FAKE_CUDA_SRCS) -lpthread

FAKE_RPATH = -Wl,-rpath,$(abspath $(BUILD)/fake) -Wl,--disable-new-dtags
$(BUILD)/tests/test_device_cuda: tests/test_device_cuda.c tests/test_util.h $(TOOL_OBJS) $(BUILD)/libcuheap.a $(FAKE_CUDA)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) -Wno-missing-prototypes -o $@ $< $(TOOL_OBJS) $(BUILD)/libcuheap.a -lcmocka -lz -ldl -lm $(FAKE_RPATH)

$(BUILD)/san/tests/test_device_cuda: tests/test_device_cuda.c tests/test_util.h $(SAN_TOOL_OBJS) $(BUILD)/san/libcuheap.a $(FAKE_CUDA)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -Wno-missing-prototypes -o $@ $< $(SAN_TOOL_OBJS) $(BUILD)/san/libcuheap.a -lcmocka -lz -ldl -lm $(FAKE_RPATH)

$(BUILD)/tsan/tests/test_device_cuda: tests/test_device_cuda.c tests/test_util.h $(TSAN_TOOL_OBJS) $(BUILD)/tsan/libcuheap.a $(FAKE_CUDA)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(TSAN) -Wno-missing-prototypes -o $@ $< $(TSAN_TOOL_OBJS) $(BUILD)/tsan/libcuheap.a -lcmocka -lz -ldl -lm $(FAKE_RPATH)

# ---- LD_PRELOAD tests (tests/test_preload.sh) ------------------------------
# A fake CUDA runtime that reaches the fake driver as the real one does, built
# as a shared library and compiled into a program (the static runtime), and
# programs that run under LD_PRELOAD=libcuheap.so. The programs are plain
# builds; test-san runs the same script, which preloads the plain library (a
# sanitized one cannot be preloaded: see tests/test_preload.sh).
FAKE_CUDART := $(BUILD)/fake/libcudart.so.13
FAKE_DEV_LINKS := $(BUILD)/fake/libcudart.so $(BUILD)/fake/libcuda.so
PRELOAD_DIR := $(BUILD)/tests/preload
PRELOAD_PROGRAMS := $(PRELOAD_DIR)/fault_checks $(PRELOAD_DIR)/runtime_shared $(PRELOAD_DIR)/runtime_static $(PRELOAD_DIR)/driver_checks \
                    $(PRELOAD_DIR)/no_cuda $(PRELOAD_DIR)/rtld_next $(PRELOAD_DIR)/libnccl_fake.so \
                    $(PRELOAD_DIR)/floor_checks
PRELOAD_CFLAGS := -std=c11 -O1 -g -Wall -Wextra -Werror -Iinclude -Itests/fake -Itests/preload -pthread
PRELOAD_SUPPORT := tests/preload/support.c tests/preload/support.h tests/fake/fake_cuda.h include/cuheap.h tests/plan_report.h

$(FAKE_CUDART): tests/fake/fake_cudart.c tests/fake/fake_cudart.h
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -std=c11 -O1 -g -Wall -Wextra -Werror -fvisibility=hidden -Wl,-Bsymbolic \
	    -Wl,-soname,libcudart.so.13 -o $@ $< -ldl -lpthread

$(BUILD)/fake/libcudart.so: $(FAKE_CUDART)
	ln -sf libcudart.so.13 $@

$(BUILD)/fake/libcuda.so: $(FAKE_CUDA)
	ln -sf libcuda.so.1 $@

$(PRELOAD_DIR)/runtime_shared: tests/preload/runtime_checks.c tests/fake/fake_cudart.h $(PRELOAD_SUPPORT) \
                               $(FAKE_CUDART) $(FAKE_DEV_LINKS)
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -o $@ $< tests/preload/support.c -L$(BUILD)/fake -lcudart -ldl $(FAKE_RPATH)

$(PRELOAD_DIR)/fault_checks: tests/preload/fault_checks.c tests/fake/fake_cudart.h $(PRELOAD_SUPPORT) \
                             $(FAKE_CUDART) $(FAKE_DEV_LINKS)
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -o $@ $< tests/preload/support.c -L$(BUILD)/fake -lcudart -ldl $(FAKE_RPATH)

$(PRELOAD_DIR)/runtime_static: tests/preload/runtime_checks.c tests/fake/fake_cudart.c tests/fake/fake_cudart.h \
                               $(PRELOAD_SUPPORT) $(FAKE_CUDA)
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -fvisibility=hidden -DFAKE_CUDART_STATIC -o $@ $< tests/preload/support.c \
	    tests/fake/fake_cudart.c -ldl $(FAKE_RPATH)

# A library with the runtime compiled in, as NCCL has it (see nccl_fake.c).
$(PRELOAD_DIR)/libnccl_fake.so: tests/preload/nccl_fake.c tests/fake/fake_cudart.c tests/fake/fake_cudart.h
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -shared -fPIC -fvisibility=hidden -DFAKE_CUDART_STATIC -o $@ $< tests/fake/fake_cudart.c -ldl

$(PRELOAD_DIR)/driver_checks: tests/preload/driver_checks.c $(PRELOAD_SUPPORT) $(FAKE_CUDA) $(FAKE_DEV_LINKS)
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -o $@ $< tests/preload/support.c -L$(BUILD)/fake -lcuda -ldl $(FAKE_RPATH)

$(PRELOAD_DIR)/no_cuda: tests/preload/no_cuda.c
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -o $@ $< -ldl

$(PRELOAD_DIR)/libprobe_first.so: tests/preload/rtld_next.c
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -shared -fPIC -DPROBE_VALUE=1 -o $@ $< -ldl

$(PRELOAD_DIR)/libprobe_second.so: tests/preload/rtld_next.c
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -shared -fPIC -DPROBE_VALUE=2 -o $@ $< -ldl

$(PRELOAD_DIR)/rtld_next: tests/preload/rtld_next.c $(PRELOAD_DIR)/libprobe_first.so $(PRELOAD_DIR)/libprobe_second.so
	$(CC) $(PRELOAD_CFLAGS) -o $@ $< -L$(PRELOAD_DIR) -Wl,--no-as-needed -lprobe_first -lprobe_second -Wl,--as-needed -ldl \
	    -Wl,-rpath,$(abspath $(PRELOAD_DIR)) -Wl,--disable-new-dtags

# The floor's checks (tests/test_floor.sh): its libraries on the fake driver.
$(PRELOAD_DIR)/floor_checks: tests/preload/floor_checks.c tests/fake/fake_cudart.h $(PRELOAD_SUPPORT) \
                             $(FAKE_CUDART) $(FAKE_DEV_LINKS)
	@mkdir -p $(dir $@)
	$(CC) $(PRELOAD_CFLAGS) -o $@ $< tests/preload/support.c -L$(BUILD)/fake -lcudart -ldl $(FAKE_RPATH)

preload-tests: $(PRELOAD_PROGRAMS) $(FAKE_CUDA) $(FAKE_CUDART) $(BUILD)/libcuheap.so floor

test: test-plain test-san test-tsan

test-plain: deps-test $(TESTS:%=$(BUILD)/tests/%) $(BUILD)/cuheap-replay $(BUILD)/cuheap-report $(BUILD)/cuheap-corpus \
            $(BUILD)/cuheap $(BUILD)/libcuheap.so \
            preload-tests $(BUILD)/bench_heap $(BUILD)/bench_preload $(BUILD)/bench_per_tensor \
            $(BUILD)/bench_per_tensor_sim $(FUZZ_NAMES:%=$(BUILD)/fuzz/fuzz_%)
	@MUTANT_TOOL_OBJS="$(TOOL_OBJS)" scripts/run-tests.sh $(BUILD) plain $(TESTS)

test-san: deps-test $(TESTS:%=$(BUILD)/san/tests/%) $(BUILD)/san/cuheap-replay $(BUILD)/san/cuheap-report \
          $(BUILD)/san/cuheap-corpus \
          $(BUILD)/san/libcuheap-asan.so $(FUZZ_NAMES:%=$(BUILD)/san/fuzz/fuzz_%) \
          preload-tests $(BUILD)/cuheap $(BUILD)/bench_per_tensor $(BUILD)/bench_per_tensor_sim
	@scripts/run-tests.sh $(BUILD)/san sanitized $(TESTS)

# The unit tests again under ThreadSanitizer (the threads of the heap, its
# thread caches, the pinned cache and the report writer): a data race fails
# the run. The command-line tests run the tools, single-threaded, above.
test-tsan: deps-test $(TESTS:%=$(BUILD)/tsan/tests/%)
	@TSAN_OPTIONS="halt_on_error=1 exitcode=66 $${TSAN_OPTIONS:-}" UNIT_ONLY=1 scripts/run-tests.sh $(BUILD)/tsan threads $(TESTS)

# ---- the floor -------------------------------------------------------------
# What a tensor costs through PyTorch's plugin interface or LD_PRELOAD with an
# allocator that only hands out memory taken once (bench/torch/floor.h): the
# yardstick of `BENCH_PARTS=pertensor make gpu-bench`. No CUDA library is
# linked; the driver and the runtime are found at run time.
FLOOR_LIBS := $(BUILD)/floor/libfloor_plugin.so $(BUILD)/floor/libfloor_preload.so
$(BUILD)/floor/libfloor_%.so: bench/torch/floor_%.c bench/torch/floor.c bench/torch/floor.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) -fPIC -fvisibility=hidden -pthread $(OPT) -shared -Wl,-z,defs \
	    -o $@ $< bench/torch/floor.c -ldl

floor: $(FLOOR_LIBS)

# ---- install ---------------------------------------------------------------
# PREFIX is where cuheap will live (cuheap.pc names it); DESTDIR, if set, is
# prepended to every path written (a staging folder for packagers). The
# launcher finds ../lib/libcuheap.so and ../share/cuheap/python beside itself;
# the Python package finds the library through its link libcuheap.so.
PREFIX  ?= /usr/local
VERSION := $(shell sed -n 's/^\#define CUHEAP_VERSION "\(.*\)"/\1/p' include/cuheap.h)
I_BIN   := $(DESTDIR)$(PREFIX)/bin
I_LIB   := $(DESTDIR)$(PREFIX)/lib
I_INC   := $(DESTDIR)$(PREFIX)/include
I_SHARE := $(DESTDIR)$(PREFIX)/share/cuheap
I_PY    := $(I_SHARE)/python
INSTALL_TOOLS := cuheap cuheap-replay cuheap-report
INSTALL_PY    := cuheap/__init__.py cuheap/__main__.py cuheap_torch.py sitecustomize.py

install: lib tools
	install -d $(I_BIN) $(I_LIB)/pkgconfig $(I_INC) $(I_PY)/cuheap
	install -m 755 $(BUILD)/libcuheap.so $(I_LIB)/libcuheap.so
	install -m 644 $(BUILD)/libcuheap.a $(I_LIB)/libcuheap.a
	sed 's|@PREFIX@|$(PREFIX)|; s|@VERSION@|$(VERSION)|' src/cuheap.pc.in > $(I_LIB)/pkgconfig/cuheap.pc
	install -m 644 include/cuheap.h $(I_INC)/cuheap.h
	install -m 644 include/cuheap_report.schema.json $(I_SHARE)/cuheap_report.schema.json
	install -m 755 $(INSTALL_TOOLS:%=$(BUILD)/%) $(I_BIN)
	for f in $(INSTALL_PY); do install -m 644 scripts/$$f $(I_PY)/$$f || exit 1; done
	ln -sfn ../../../../lib/libcuheap.so $(I_PY)/cuheap/libcuheap.so

# Everything install wrote, and share/cuheap whole (Python may have left its
# byte-code there); the folders bin, lib, include stay.
uninstall:
	rm -f $(I_LIB)/libcuheap.so $(I_LIB)/libcuheap.a $(I_LIB)/pkgconfig/cuheap.pc $(I_INC)/cuheap.h \
	    $(INSTALL_TOOLS:%=$(I_BIN)/%)
	rm -rf $(I_SHARE)

# ---- demo, benchmarks, GPU -----------------------------------------------
demo: all
	@scripts/demo.sh $(BUILD)

corpus: all
	@$(BUILD)/cuheap-corpus

bench: all $(BUILD)/bench_heap $(BUILD)/bench_preload $(BUILD)/bench_per_tensor $(BUILD)/bench_per_tensor_sim floor \
       $(FAKE_CUDA) $(FAKE_CUDART)
	@scripts/bench.sh $(BUILD)

$(BUILD)/bench_heap: bench/bench_heap.c $(BUILD)/libcuheap.a
	$(CC) $(CFLAGS_BASE) -O2 -g -Wno-missing-prototypes -o $@ $< $(BUILD)/libcuheap.a -ldl -lm

# cudaMalloc/cudaFree through the fake runtime, alone or under the preload.
# It links no heap code (under LD_PRELOAD it finds cuheap by name), only the
# trace reader, the message helpers of log.o that the reader's errors use and
# the step layout (step_plan.o) the tool-side objects call.
$(BUILD)/bench_preload: bench/bench_preload.c $(TOOL_OBJS) $(BUILD)/obj/log.o $(BUILD)/obj/step_plan.o $(FAKE_CUDART) \
                        $(FAKE_DEV_LINKS)
	$(CC) $(CFLAGS_BASE) -O2 -g -Wno-missing-prototypes -Itests/fake -o $@ $< $(TOOL_OBJS) $(BUILD)/obj/log.o $(BUILD)/obj/step_plan.o \
	    -L$(BUILD)/fake -lcudart -lz -ldl $(FAKE_RPATH)

# What one tensor costs the CPU on each way in, with the driver calls it makes
# (bench/bench_per_tensor.c): on the fake driver and runtime, and on the
# simulated device (the same source with libcuheap.a).
$(BUILD)/bench_per_tensor: bench/bench_per_tensor.c $(FAKE_CUDART) $(FAKE_DEV_LINKS) tests/fake/fake_cuda.h
	$(CC) $(CFLAGS_BASE) -O2 -g -Wno-missing-prototypes -Itests/fake -o $@ $< -L$(BUILD)/fake -lcudart -ldl $(FAKE_RPATH)

$(BUILD)/bench_per_tensor_sim: bench/bench_per_tensor.c $(BUILD)/libcuheap.a
	$(CC) $(CFLAGS_BASE) -O2 -g -Wno-missing-prototypes -DPER_TENSOR_SIM -o $@ $< $(BUILD)/libcuheap.a -ldl -lm

# The settings page is generated, so that it cannot drift from src/config.c's
# table (tests/test_readme.sh checks it is current).
settings-doc: $(BUILD)/cuheap-replay
	@scripts/settings-doc.sh $(BUILD) > docs/settings.md

gpu-check:
	@scripts/gpu-check.sh $(BUILD)

gpu-bench:
	@scripts/gpu-bench.sh $(BUILD)

clean:
	rm -rf $(BUILD)
