# frugal build. Targets: all (library + examples), test, demo, bench, asan,
# fixtures, clean. CUDA is built when nvcc is found; CUDA=0 forces it off.
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

# oneDNN (libdnnl-dev) for CPU convolutions and matrix products when its
# header is present, unless DNNL=0; without it the im2col + GEMM reference runs.
DNNL_INC := $(if $(filter 0,$(DNNL)),,$(wildcard /usr/include/dnnl.h))
ifneq ($(DNNL_INC),)
  CFLAGS_BASE += -DFR_HAVE_DNNL
  LDLIBS += -ldnnl
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
CFLAGS := $(CFLAGS_BASE) $(EXTRA_CFLAGS)

LIB_SRC := $(wildcard tensor/*.c cpu/*.c autograd/*.c nn/*.c data/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
LIB := $(BUILD)/libfrugal.a

TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TESTLIB_OBJ := $(BUILD)/tests/testlib.o
EXAMPLE_SRC := $(wildcard examples/*.c)
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all lib tests test test-only demo bench asan fixtures deps clean examples
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

# Regenerates the committed PyTorch fixtures (needs Debian's python3-torch).
fixtures:
	@for g in tests/fixtures/gen_*.py; do echo "$$g"; /usr/bin/python3 $$g || exit 1; done

clean:
	rm -rf build build-asan build-cuda

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
