# frugal build. Targets: all (library + examples), test, demo, bench, asan,
# fuzz, fixtures, install, uninstall, check-install, clean, bench-build (the
# bench programs without running them), print-cuda-config. CUDA is built when
# nvcc is found; CUDA=0 forces it off. BUILD selects the output folder so
# sanitizer and CUDA builds never mix. docs/INSTALL.md describes install.
# WERROR=0 turns warnings back into warnings (a newer compiler than CI's gcc
# 12 / clang 14 may warn where they do not: scripts/device-check.sh retries
# with it once); LINEINFO=1 gives the CUDA kernels source lines for
# compute-sanitizer; TEST_TIMEOUT is each test program's limit in seconds in
# `make test` (tests/run_tests.sh, FR_TEST_TIMEOUT, default 600).

BUILD ?= build
CC ?= cc
NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= /usr/local/cuda
VERSION := 0.1.0
VERSION_MAJOR := $(firstword $(subst ., ,$(VERSION)))
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include

ifeq ($(CUDA),0)
  HAVE_CUDA :=
else ifneq ($(NVCC),)
  HAVE_CUDA := 1
else ifeq ($(CUDA),1)
  $(error CUDA=1 but nvcc was not found (looked on PATH and in /usr/local/cuda/bin))
endif

# Portable code by default (what make install ships; cpu/cast.c picks its
# AVX2 loops at run time). NATIVE=1 tunes for this machine's CPU with
# -march=native, when the compiler accepts it: a local option, the objects
# then run only on CPUs like this one. The reference path never uses
# -ffast-math (results must match PyTorch).
ifeq ($(NATIVE),1)
  MARCH := $(shell $(CC) -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native)
endif
OPT ?= -O2 $(MARCH)
# -fPIC: the same objects make libfrugal.a and libfrugal.so.
WERROR_FLAG := $(if $(filter 0,$(WERROR)),,-Werror)
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra $(WERROR_FLAG) -fopenmp -fPIC -MMD -MP -I. \
  -I$(BUILD)/include/frugal -I$(BUILD)/include $(OPT)
LDLIBS := -lm -lpthread -lz -lpng16 -lturbojpeg -fopenmp -ldl
# Programs linked with libfrugal.a export its symbols, which the CUDA backend
# (opened at run time) calls back into (cuda/fr_cuda.h).
PROG_LDFLAGS := -rdynamic

# OpenBLAS for CPU GEMM when its cblas header is present; else the built-in GEMM.
CBLAS_INC := $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h /usr/include/openblas/cblas.h /usr/include/cblas.h /usr/include/x86_64-linux-gnu/cblas.h))
ifneq ($(CBLAS_INC),)
  CFLAGS_BASE += -DFR_HAVE_CBLAS -I$(dir $(CBLAS_INC))
  LDLIBS += -lopenblas
endif

# oneDNN (libdnnl-dev) for CPU convolutions when its header is present,
# unless DNNL=0; without it the im2col + GEMM reference runs.
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

comma := ,
NVCCFLAGS := -O3 -std=c++17 -I. --expt-relaxed-constexpr \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80 \
  -Xcompiler -Wall,-Wextra$(if $(WERROR_FLAG),$(comma)-Werror),-fPIC -Xcudafe --diag_suppress=177 \
  $(if $(filter 1,$(LINEINFO)),-lineinfo)
# The CUDA kernels build into their own shared object, which the core opens
# at run time (tensor/cuda_backend.c): no program or libfrugal.so links CUDA.
CUDA_BACKEND_FILE := libfrugal_cuda.so.$(VERSION_MAJOR)
ifeq ($(HAVE_CUDA),1)
  CU_SRC := $(wildcard cuda/*.cu)
  CUDA_LIB := $(BUILD)/$(CUDA_BACKEND_FILE)
  # CUDA_EXTRA_LDFLAGS: more -L / -Wl,-rpath for libraries outside the
  # toolkit (cuDNN or cuBLAS from Python wheels: scripts/device-check.sh).
  CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(CUDA_EXTRA_LDFLAGS) \
    -lcudnn -lcublas -lcudart
  # NCCL (data parallelism on GPUs, cuda/nccl.cu) joins the backend when its
  # header and its library are found, in the first of: NCCL_HOME (include/,
  # lib/), the toolkit, /usr, and python3's nvidia-nccl wheel
  # (site-packages/nvidia/nccl/{include,lib}, where a PyTorch image keeps
  # it, as libnccl.so.2 only); NCCL=0 leaves it out. Without it the backend
  # lacks the fr_cuda_nccl_* entry points and the core says so
  # (docs/DISTRIBUTED.md); a header without its library is a warning here,
  # not a failed link. Tests also get a copy of the backend linked without
  # nccl.o, to check that message.
  nccl_lib_in = $(firstword $(wildcard $(1)/libnccl.so $(1)/libnccl.so.[0-9]*))
  nccl_pair = $(if $(wildcard $(1)/nccl.h),$(if $(call nccl_lib_in,$(2)),$(1):$(call nccl_lib_in,$(2)),$(eval NCCL_NOLIB += $(1))))
  ifneq ($(NCCL),0)
    NCCL_FOUND := $(if $(NCCL_HOME),$(call nccl_pair,$(NCCL_HOME)/include,$(NCCL_HOME)/lib))
    NCCL_FOUND := $(or $(NCCL_FOUND),$(call nccl_pair,$(CUDA_HOME)/include,$(CUDA_HOME)/lib64))
    NCCL_FOUND := $(or $(NCCL_FOUND),$(call nccl_pair,/usr/include,/usr/lib/x86_64-linux-gnu))
    ifeq ($(NCCL_FOUND),)
      NCCL_WHEEL := $(shell python3 -c 'import glob, os, site; print(" ".join(os.path.dirname(os.path.dirname(h)) for b in site.getsitepackages() for h in sorted(glob.glob(b + "/nvidia/*/include/nccl.h"))))' 2>/dev/null)
      NCCL_FOUND := $(if $(NCCL_WHEEL),$(call nccl_pair,$(firstword $(NCCL_WHEEL))/include,$(firstword $(NCCL_WHEEL))/lib))
    endif
  endif
  ifneq ($(NCCL_FOUND),)
    HAVE_NCCL := 1
    NCCL_INC := $(firstword $(subst :, ,$(NCCL_FOUND)))
    NCCL_LIB := $(lastword $(subst :, ,$(NCCL_FOUND)))
    NVCCFLAGS += $(if $(filter /usr/include $(CUDA_HOME)/include,$(NCCL_INC)),,-I$(NCCL_INC))
    NCCL_LIBDIR := $(patsubst %/,%,$(dir $(NCCL_LIB)))
    CUDA_LDLIBS += -L$(NCCL_LIBDIR) -Wl,-rpath,$(NCCL_LIBDIR) -l:$(notdir $(NCCL_LIB))
    NO_NCCL_LIB := $(BUILD)/tests/no-nccl/$(CUDA_BACKEND_FILE)
  else
    CU_SRC := $(filter-out cuda/nccl.cu,$(CU_SRC))
    ifneq ($(NCCL_NOLIB),)
      $(warning nccl.h found in $(NCCL_NOLIB) but no libnccl.so beside it: the CUDA backend is built without NCCL)
    endif
  endif
endif
# MPI for data parallelism (dist/) when Open MPI's mpicc is found, like
# OpenBLAS above; MPI=0 forces it off. Without it dist/none.c answers that
# distributed training was not built in. NCCL is in the CUDA backend (above).
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
  DIST_SRC := dist/comm.c dist/ddp.c dist/launch.c dist/watchdog.c
else
  DIST_SRC := dist/none.c dist/launch.c
endif
CFLAGS := $(CFLAGS_BASE) $(EXTRA_CFLAGS)

LIB_SRC := $(wildcard tensor/*.c cpu/*.c autograd/*.c nn/*.c io/*.c models/*.c planner/*.c train/*.c \
  data/*.c) $(DIST_SRC)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
# The programs and their flag parsing (programs/) are a small static library
# of their own on top of libfrugal, so the library proper holds no CLI; what
# links the programs, a test or an example links both (PROGRAMS_LIB first).
PROGRAMS_SRC := $(wildcard programs/*.c)
PROGRAMS_OBJ := $(PROGRAMS_SRC:%.c=$(BUILD)/%.o)
PROGRAMS_LIB := $(BUILD)/libfrugal_programs.a
CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
LIB := $(BUILD)/libfrugal.a
SHLIB := $(BUILD)/libfrugal.so.$(VERSION)
CONFIG_H := $(BUILD)/include/frugal/config.h

# What `make install` puts under include/frugal/ (sub-folders kept): two
# tiers. PUBLIC_HEADERS, for programs, is frugal.h and what it includes;
# EXT_HEADERS, for op authors, is ext.h and what it adds (the node API and
# the tape-free ops). Everything else (tensor/kernels.h, kernels.def,
# staging.h, cuda/, io/json.h, nn/layers.h, nn/seg_split.h,
# programs/cli_impl.h, ...) is internal; scripts/check-headers.sh refuses a
# tier that includes a header below it or a list that is not what the
# umbrella headers reach.
PUBLIC_HEADERS := frugal.h tensor/fr_base.h tensor/shapes.h tensor/tensor.h tensor/memory.h \
  tensor/cuda.h tensor/rng.h autograd/autograd.h autograd/functions.h \
  nn/build.h nn/init.h nn/model.h nn/params.h \
  models/densenet.h models/registry.h models/resnet.h planner/planner.h \
  train/amp.h train/state.h train/optim.h train/schedule.h train/train.h \
  io/outfile.h io/safetensors.h programs/cli.h programs/programs.h dist/dist.h \
  data/augment.h data/dataset.h data/loader.h data/rng.h
EXT_HEADERS := ext.h autograd/node.h tensor/ops.h
# The programs, installed as frugal-train, frugal-validate, frugal-memreport
# and linked against libfrugal.so (docs/INSTALL.md says why three programs).
PROGRAMS := train validate memreport
INSTALL_BIN := $(PROGRAMS:%=$(BUILD)/bin/frugal-%)

TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TESTLIB_OBJ := $(BUILD)/tests/testlib.o
EXAMPLE_SRC := $(wildcard examples/*.c)
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
BENCH_SRC := $(filter-out bench/peak_alloc.c,$(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%) $(BUILD)/bench/peak_alloc.so

.PHONY: all lib tests test test-only test-multihost demo bench bench-build print-cuda-config asan fuzz fuzz-build fuzz-seeds fixtures deps clean examples \
  install uninstall check-install check-headers check-docs check-includes FORCE
all: lib examples
lib: $(LIB) $(SHLIB) $(PROGRAMS_LIB) $(CUDA_LIB)
examples: $(EXAMPLE_BIN)
tests: $(TEST_BIN) $(CUDA_LIB) $(NO_NCCL_LIB)

$(CONFIG_H): FORCE
	@bash scripts/gen-config.sh $@ $(VERSION) $(if $(HAVE_CUDA),1,0) \
	  $(if $(findstring -lopenblas,$(LDLIBS)),1,0) $(if $(findstring -ldnnl,$(LDLIBS)),1,0) \
	  $(if $(findstring -march=native,$(CFLAGS)),1,0) $(CUDA_BACKEND_FILE) $(if $(HAVE_NCCL),1,0)
	@ln -sfn $(CURDIR)/frugal.h $(dir $@)frugal.h  # <frugal/frugal.h> in the tree, as installed
	@ln -sfn $(CURDIR)/ext.h $(dir $@)ext.h

# Every object depends on config.h, which changes with the options (NATIVE,
# CUDA, BLAS): switching one rebuilds everything.
$(BUILD)/%.o: %.c $(CONFIG_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(PROGRAMS_LIB): $(PROGRAMS_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# RUNPATH $ORIGIN: the core finds the CUDA backend beside itself.
$(SHLIB): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,libfrugal.so.$(VERSION_MAJOR) -Wl,-rpath,'$$ORIGIN' $^ $(LDLIBS) -o $@
	ln -sf $(notdir $@) $(BUILD)/libfrugal.so.$(VERSION_MAJOR)
	ln -sf libfrugal.so.$(VERSION_MAJOR) $(BUILD)/libfrugal.so

# -Bsymbolic: the backend's own calls to its fr_cuda_* stay inside it (the
# core has forwarders of the same names); cuda/exports.map exports only those.
$(CUDA_LIB): $(CU_OBJ) cuda/exports.map
	$(CXX) -shared -Wl,-soname,$(CUDA_BACKEND_FILE) -Wl,-Bsymbolic -Wl,--version-script,cuda/exports.map \
	  $(CU_OBJ) $(CUDA_LDLIBS) -o $@

$(NO_NCCL_LIB): $(CU_OBJ) cuda/exports.map
	@mkdir -p $(dir $@)
	$(CXX) -shared -Wl,-soname,$(CUDA_BACKEND_FILE) -Wl,-Bsymbolic -Wl,--version-script,cuda/exports.map \
	  $(filter-out $(BUILD)/cuda/nccl.cu.o,$(CU_OBJ)) $(filter-out -l:libnccl%,$(CUDA_LDLIBS)) -o $@

$(BUILD)/tests/%: tests/%.c $(TESTLIB_OBJ) $(PROGRAMS_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(TESTLIB_OBJ) $(PROGRAMS_LIB) $(LIB) $(LDLIBS) $(PROG_LDFLAGS) -o $@

$(BUILD)/tests/testlib.o: tests/testlib.c | $(CONFIG_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/examples/%: examples/%.c $(PROGRAMS_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(PROGRAMS_LIB) $(LIB) $(LDLIBS) $(PROG_LDFLAGS) -o $@

$(BUILD)/bench/%: bench/%.c $(PROGRAMS_LIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(PROGRAMS_LIB) $(LIB) $(LDLIBS) $(PROG_LDFLAGS) -o $@

# The heap-peak shim PyTorch's side of the planner bench runs under
# (LD_PRELOAD): its own flags, never the sanitizers of SAN=1.
$(BUILD)/bench/peak_alloc.so: bench/peak_alloc.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror $< -o $@

# The installed programs: against libfrugal.so, found in ../lib when
# installed and in .. inside the build folder.
$(BUILD)/bin/frugal-%: examples/%.c $(PROGRAMS_LIB) $(SHLIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(PROGRAMS_LIB) -L$(BUILD) -lfrugal -lm -Wl,-rpath,'$$ORIGIN/../lib:$$ORIGIN/..' -o $@

$(BUILD)/frugal.pc: FORCE
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	  'Name: frugal' 'Description: memory-frugal deep learning in C (tensors, autograd, nn, data)' \
	  'Version: $(VERSION)' 'Cflags: -I$${includedir}' \
	  'Libs: -L$${libdir} -Wl,-rpath,$${libdir} -lfrugal_programs -lfrugal -lm' \
	  'Libs.private: $(LDLIBS) $(PROG_LDFLAGS)' >$@

check-headers:
	@bash scripts/check-headers.sh $(PUBLIC_HEADERS) -- $(EXT_HEADERS)

# Every repository path and fr_/FR_ name the docs and comments cite exists.
check-docs:
	@python3 scripts/check-docs.py

# The one-way include arrows between folders (docs/ARCHITECTURE.md's map).
check-includes:
	@python3 scripts/check-includes.py

INSTALLED_LIBS := libfrugal.a libfrugal_programs.a libfrugal.so libfrugal.so.$(VERSION_MAJOR) libfrugal.so.$(VERSION) \
  $(CUDA_BACKEND_FILE)
install: check-headers all $(INSTALL_BIN) $(BUILD)/frugal.pc
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)/frugal
	for h in $(PUBLIC_HEADERS) $(EXT_HEADERS); do install -D -m 644 $$h $(DESTDIR)$(INCLUDEDIR)/frugal/$$h || exit 1; done
	install -m 644 $(CONFIG_H) $(DESTDIR)$(INCLUDEDIR)/frugal/config.h
	install -m 644 $(LIB) $(DESTDIR)$(LIBDIR)/libfrugal.a
	install -m 644 $(PROGRAMS_LIB) $(DESTDIR)$(LIBDIR)/libfrugal_programs.a
	install -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/
	ln -sf libfrugal.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libfrugal.so.$(VERSION_MAJOR)
	ln -sf libfrugal.so.$(VERSION_MAJOR) $(DESTDIR)$(LIBDIR)/libfrugal.so
	$(if $(CUDA_LIB),install -m 755 $(CUDA_LIB) $(DESTDIR)$(LIBDIR)/)
	install -m 644 $(BUILD)/frugal.pc $(DESTDIR)$(LIBDIR)/pkgconfig/frugal.pc
	install -m 755 $(INSTALL_BIN) $(DESTDIR)$(BINDIR)/

uninstall:
	rm -f $(PROGRAMS:%=$(DESTDIR)$(BINDIR)/frugal-%) $(INSTALLED_LIBS:%=$(DESTDIR)$(LIBDIR)/%) \
	  $(DESTDIR)$(LIBDIR)/pkgconfig/frugal.pc
	rm -rf $(DESTDIR)$(INCLUDEDIR)/frugal

# Installs into a temporary prefix and builds, trains and validates a
# program of its own from there with pkg-config alone (tests/install_test.sh).
check-install:
	@bash tests/install_test.sh $(BUILD) $(if $(CUDA),CUDA=$(CUDA))

# Each of test, demo, bench and fuzz installs its own set of Debian packages
# first (scripts/install-deps.sh has the table), then builds in a sub-make
# that sees what was installed; deps installs every set.
deps:
	@bash scripts/install-deps.sh all

# The README's test command: installs what is missing, builds, runs every
# test program, and ends with "N passed, N failed[, N skipped]".
test:
	@bash scripts/install-deps.sh test
	@$(MAKE) --no-print-directory test-only

test-only: all tests check-docs check-includes
	@FR_TEST_TIMEOUT=$(or $(TEST_TIMEOUT),$(FR_TEST_TIMEOUT),600) bash tests/run_tests.sh $(BUILD)/tests

# Data parallel across network namespaces as hosts, over TCP (root only;
# skips otherwise): tests/multihost.sh.
test-multihost: all tests
	@bash tests/multihost.sh $(BUILD)

asan:
	@ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 $(MAKE) --no-print-directory BUILD=build-asan CUDA=0 SAN=1 test-only

demo:
	@bash scripts/install-deps.sh demo
	@$(MAKE) --no-print-directory all
	@bash scripts/demo.sh $(BUILD)

# The bench's programs (peak_alloc.c is the LD_PRELOAD shim peak_alloc.so,
# not a program), built without running anything.
bench-build: all $(BENCH_BIN)

bench:
	@bash scripts/install-deps.sh bench
	@$(MAKE) --no-print-directory bench-build
	@bash bench/run.sh $(BUILD)

# What the CUDA part of the build found (scripts/device-check.sh logs it).
print-cuda-config:
	@echo "nvcc: $(or $(NVCC),none)$(if $(HAVE_CUDA),, (CUDA off))"
	@echo "nccl: $(if $(HAVE_NCCL),header $(NCCL_INC)/nccl.h library $(NCCL_LIB),none$(if $(NCCL_NOLIB), (nccl.h in $(NCCL_NOLIB) without its library)))"
	@echo "cuda libraries: $(CUDA_LDLIBS)"
	@echo "nvcc flags: $(NVCCFLAGS)"

# libFuzzer harnesses (tests/fuzz/fuzz_*.c): the library rebuilt by clang 14
# with coverage, ASan and UBSan in build-fuzz, each harness then run for
# FUZZ_SECONDS on a copy of its committed seed corpus (tests/fuzz/run.sh;
# seven harnesses, so the default is about fourteen minutes in all). Crashes, leaks
# and hangs (an input over 10 s) fail the target and are kept under
# build-fuzz/artifacts.
FUZZ_CC ?= clang-14
FUZZ_SECONDS ?= 120
FUZZ_DIR := build-fuzz
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -fopenmp -MMD -MP -I. -I$(BUILD)/include/frugal -g -O1 \
  -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  $(if $(CBLAS_INC),-DFR_HAVE_CBLAS -I$(dir $(CBLAS_INC))) \
  $(if $(MPI_LIBS),-DFR_HAVE_MPI $(MPI_CFLAGS))
FUZZ_LIBS := -lm -lpthread -lz -lpng16 -lturbojpeg -ldl $(if $(CBLAS_INC),-lopenblas) $(MPI_LIBS)
FUZZ_OBJ := $(LIB_SRC:%.c=$(FUZZ_DIR)/%.o) $(PROGRAMS_SRC:%.c=$(FUZZ_DIR)/%.o)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/%,$(wildcard tests/fuzz/fuzz_*.c))

$(FUZZ_DIR)/%.o: %.c $(CONFIG_H)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_OBJ) $(FUZZ_LIBS) -o $@

# the objects are kept between runs (make would delete them as intermediates)
.SECONDARY: $(FUZZ_OBJ)
fuzz-build: $(FUZZ_BIN)

fuzz:
	@bash scripts/install-deps.sh fuzz
	@$(MAKE) --no-print-directory fuzz-build
	@bash tests/fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

# Rewrites the committed seed corpora (tests/fuzz/corpus) from gen_seeds.c.
fuzz-seeds: lib
	$(CC) $(CFLAGS) tests/fuzz/gen_seeds.c $(PROGRAMS_LIB) $(LIB) $(LDLIBS) -o $(BUILD)/gen_seeds
	$(BUILD)/gen_seeds

# Regenerates the committed PyTorch fixtures (needs Debian's python3-torch).
fixtures:
	@for g in tests/fixtures/gen_*.py; do echo "$$g"; /usr/bin/python3 $$g || exit 1; done

clean:
	rm -rf build build-asan build-cuda build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
-include $(shell find $(FUZZ_DIR) -name '*.d' 2>/dev/null)
