# frugal build. Targets: all (library + examples), test, demo, bench, asan,
# fuzz, fixtures, clean. CUDA is built when nvcc is found; CUDA=0 forces it off.
# BUILD selects the output folder so sanitizer and CUDA builds never mix.

BUILD ?= build
CC ?= cc
NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= /usr/local/cuda

ifeq ($(CUDA),0)
  HAVE_CUDA :=
else ifneq ($(NVCC),)
  HAVE_CUDA := 1
else ifeq ($(CUDA),1)
  $(error CUDA=1 but nvcc was not found (looked on PATH and in /usr/local/cuda/bin))
endif

# -march=native only when the compiler accepts it for this machine; the
# reference path never uses -ffast-math (results must match PyTorch).
MARCH := $(shell $(CC) -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native)
OPT ?= -O2 $(MARCH)
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fopenmp -MMD -MP -I. $(OPT)
LDLIBS := -lm -lpthread -lz -fopenmp

# OpenBLAS for CPU GEMM when its cblas header is present; else the built-in GEMM.
CBLAS_INC := $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h /usr/include/openblas/cblas.h /usr/include/cblas.h /usr/include/x86_64-linux-gnu/cblas.h))
ifneq ($(CBLAS_INC),)
  CFLAGS_BASE += -DFR_HAVE_CBLAS -I$(dir $(CBLAS_INC))
  LDLIBS += -lopenblas
endif

ifeq ($(SAN),1)
  CFLAGS_BASE += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g
  LDLIBS += -fsanitize=address,undefined
  OPT := -O1
endif

NVCCFLAGS := -O3 -std=c++17 -I. -DFR_WITH_CUDA --expt-relaxed-constexpr \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80 \
  -Xcompiler -Wall,-Wextra,-Werror,-fPIC -Xcudafe --diag_suppress=177
ifeq ($(HAVE_CUDA),1)
  CFLAGS_BASE += -DFR_WITH_CUDA -I$(CUDA_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudnn -lcublas -lcudart -lstdc++
  CU_SRC := $(wildcard cuda/*.cu)
endif
# MPI for data parallelism (dist/) when Open MPI's mpicc is found, like
# OpenBLAS above; MPI=0 forces it off. Without it dist/none.c answers that
# distributed training was not built in. NCCL joins a CUDA build that has it.
ifneq ($(MPI),0)
  MPICC := $(shell command -v mpicc 2>/dev/null)
  ifneq ($(MPICC),)
    MPI_LIBS := $(shell $(MPICC) --showme:link 2>/dev/null)
    MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null)
  endif
endif
ifneq ($(MPI_LIBS),)
  CFLAGS_BASE += -DFR_HAVE_MPI $(MPI_CFLAGS)
  LDLIBS += $(MPI_LIBS)
  DIST_SRC := dist/comm.c dist/ddp.c dist/launch.c
  ifeq ($(HAVE_CUDA),1)
    ifneq ($(wildcard $(CUDA_HOME)/include/nccl.h),)
      CFLAGS_BASE += -DFR_HAVE_NCCL
      LDLIBS += -lnccl
      DIST_SRC += dist/nccl.c
    endif
  endif
else
  DIST_SRC := dist/none.c dist/launch.c
endif
CFLAGS := $(CFLAGS_BASE) $(EXTRA_CFLAGS)

LIB_SRC := $(wildcard tensor/*.c cpu/*.c autograd/*.c nn/*.c data/*.c) $(DIST_SRC)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
LIB := $(BUILD)/libfrugal.a

TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TESTLIB_OBJ := $(BUILD)/tests/testlib.o
EXAMPLE_SRC := $(wildcard examples/*.c)
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all lib tests test test-only demo bench asan fuzz fuzz-build fuzz-seeds fixtures deps clean examples
all: lib examples
lib: $(LIB)
examples: $(EXAMPLE_BIN)
tests: $(TEST_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/tests/%: tests/%.c $(TESTLIB_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(TESTLIB_OBJ) $(LIB) $(LDLIBS) -o $@

$(BUILD)/tests/testlib.o: tests/testlib.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/examples/%: examples/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) $(LDLIBS) -o $@

$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) $(LDLIBS) -o $@

deps:
	@bash scripts/install-deps.sh

# The README's test command: installs what is missing, builds, runs every
# test program, and ends with "N passed, N failed[, N skipped]".
test: deps
	@$(MAKE) --no-print-directory test-only

test-only: all tests
	@bash tests/run_tests.sh $(BUILD)/tests

asan:
	@ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 $(MAKE) --no-print-directory BUILD=build-asan CUDA=0 SAN=1 test-only

demo: deps
	@$(MAKE) --no-print-directory all
	@bash scripts/demo.sh $(BUILD)

bench: deps
	@$(MAKE) --no-print-directory all $(BENCH_BIN)
	@bash bench/run.sh $(BUILD)

# libFuzzer harnesses (tests/fuzz/fuzz_*.c): the library rebuilt by clang 14
# with coverage, ASan and UBSan in build-fuzz, each harness then run for
# FUZZ_SECONDS on a copy of its committed seed corpus (tests/fuzz/run.sh;
# five harnesses, so the default is about ten minutes in all). Crashes, leaks
# and hangs (an input over 10 s) fail the target and are kept under
# build-fuzz/artifacts.
FUZZ_CC ?= clang-14
FUZZ_SECONDS ?= 120
FUZZ_DIR := build-fuzz
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -fopenmp -MMD -MP -I. -g -O1 -fno-omit-frame-pointer \
  -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  $(if $(CBLAS_INC),-DFR_HAVE_CBLAS -I$(dir $(CBLAS_INC)))
FUZZ_LIBS := -lm -lpthread -lz $(if $(CBLAS_INC),-lopenblas)
FUZZ_OBJ := $(LIB_SRC:%.c=$(FUZZ_DIR)/%.o)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/%,$(wildcard tests/fuzz/fuzz_*.c))

$(FUZZ_DIR)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_OBJ) $(FUZZ_LIBS) -o $@

# the objects are kept between runs (make would delete them as intermediates)
.SECONDARY: $(FUZZ_OBJ)
fuzz-build: $(FUZZ_BIN)

fuzz: fuzz-build
	@bash tests/fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

# Rewrites the committed seed corpora (tests/fuzz/corpus) from gen_seeds.c.
fuzz-seeds: lib
	$(CC) $(CFLAGS) tests/fuzz/gen_seeds.c $(LIB) $(LDLIBS) -o $(BUILD)/gen_seeds
	$(BUILD)/gen_seeds

# Regenerates the committed PyTorch fixtures (needs Debian's python3-torch).
fixtures:
	@for g in tests/fixtures/gen_*.py; do echo "$$g"; /usr/bin/python3 $$g || exit 1; done

clean:
	rm -rf build build-asan build-cuda build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
-include $(shell find $(FUZZ_DIR) -name '*.d' 2>/dev/null)
