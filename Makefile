# baton: flat Makefile (CONVENTIONS.md: build).
#   make                 build build/baton and build/libbaton.a
#   make test            build and run the test suite (last line: N passed, N failed)
#   make test-faults     network-fault campaigns between namespace hosts (root, minutes)
#   make run             install missing packages, build, run the default job
#   make SAN=address,undefined test    sanitizer build in build/san-address,undefined
#   make fuzz            libFuzzer targets (clang) in build/fuzz
#   make fuzz-run        every fuzz target for FUZZ_RUNS executions (1M), one at a time
#   make deps            install Debian packages (needs root)

CC      ?= cc
SAN     ?=
O       ?= 2
ifeq ($(SAN),)
BUILD   ?= build
else
BUILD   ?= build/san-$(SAN)
endif

PKGS    := libev-dev libmsgpack-dev libucx-dev ucx-utils libyaml-dev libjansson-dev \
           libopenblas-dev libxxhash-dev libssl-dev libpng-dev libcairo2-dev pkg-config clang \
           libclang-rt-14-dev python3 python3-venv openssh-server openssh-client iproute2 \
           slurm-wlm munge nftables
HAVE_UCX  := $(shell pkg-config --exists ucx 2>/dev/null && echo 1)
HAVE_NVCC := $(shell command -v nvcc >/dev/null 2>&1 && echo 1)

WARN    := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wstrict-prototypes
CFLAGS  += -std=c11 -D_GNU_SOURCE -O$(O) -g $(WARN) -I. -MMD -MP -pthread
LDLIBS  := -lev -lmsgpackc -ljansson -lyaml -lopenblas -lxxhash -lcrypto -lpng -lm -lpthread -ldl
# cairo draws the run's pictures (launch/plot.c); its flags from pkg-config
# once the package is installed (make deps)
CFLAGS  += $(shell pkg-config --cflags cairo 2>/dev/null)
LDLIBS  += $(shell pkg-config --libs cairo 2>/dev/null || echo -lcairo)
ifeq ($(HAVE_UCX),1)
CFLAGS  += -DBT_HAVE_UCX=1 $(shell pkg-config --cflags ucx)
LDLIBS  += $(shell pkg-config --libs ucx)
endif
ifneq ($(SAN),)
CFLAGS  += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SAN)
endif

# The CUDA backend (kernels/cuda/): built when nvcc is on PATH, into its own
# shared object $(BUILD)/libbaton_cuda.so that kernels/device.c loads the
# first time a CUDA device is asked for, so that processes that never use a
# GPU do not map cudart and cuBLASLt (about 150 MB resident each). The .cu
# files (kernels behind extern "C" launchers) go through nvcc for sm_90, the
# .c files (backend table, cuBLASLt) through cc; all position-independent,
# warnings as errors. The executables are linked -rdynamic: the object calls
# back into them. Without nvcc nothing below changes the CPU build.
CU_SRC   := $(wildcard kernels/cuda/*.cu)
CUDA_C_SRC := $(wildcard kernels/cuda/*.c)
LDFLAGS  += -rdynamic
ifeq ($(HAVE_NVCC),1)
ifneq ($(CU_SRC),)
HAVE_CUDA := 1
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v nvcc))
NVCCFLAGS ?= -O3 -std=c++17 -arch=sm_90 -I. -Werror all-warnings \
             -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter,-fPIC -MMD -MP
CUDA_OBJ := $(CU_SRC:%.cu=$(BUILD)/obj/%.o) $(CUDA_C_SRC:%.c=$(BUILD)/obj/%.o)
CUDA_LIB := $(BUILD)/libbaton_cuda.so
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++ -ldl
$(CUDA_C_SRC:%.c=$(BUILD)/obj/%.o): CFLAGS += -DBT_HAVE_CUDA=1 -fPIC -isystem $(CUDA_HOME)/include
DEVICE_BIN := $(BUILD)/device/test_cuda_ops
# cuDNN attention (kernels/cuda/dnn.cu) with the cuDNN frontend's headers,
# which make deps fetches (tools/fetch-cudnn-frontend.sh); without them the
# file builds to a stub that declines every call. cuDNN itself is opened at
# run time (dlopen), never linked.
CUDNN_FE := $(wildcard third_party/cudnn-frontend/include/cudnn_frontend.h)
$(BUILD)/obj/kernels/cuda/dnn.o: NVCCFLAGS += -isystem $(CUDA_HOME)/include \
    $(if $(CUDNN_FE),-DBT_HAVE_CUDNN_FE=1 -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING \
    -DCUDNN_FRONTEND_SKIP_JSON_LIB -isystem third_party/cudnn-frontend/include)
# The nccl collective backend (coll/nccl/): its own shared object beside the
# CUDA one, loaded by coll/backend.c on first use for the same reason, built
# where NCCL's header sits next to nvcc's (or in /usr/include).
NCCL_INC := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
ifneq ($(NCCL_INC),)
NCCL_SRC := $(wildcard coll/nccl/*.c)
NCCL_OBJ := $(NCCL_SRC:%.c=$(BUILD)/obj/%.o)
NCCL_LIB := $(BUILD)/libbaton_nccl.so
$(NCCL_OBJ): CFLAGS += -fPIC -isystem $(CUDA_HOME)/include
DEVICE_BIN += $(BUILD)/device/test_nccl
endif
endif
endif

LIB_DIRS := base transport wire trace actors coll kernels kernels/cpu kernels/fenced data model train ckpt launch bench
LIB_SRC  := $(filter-out launch/main.c,$(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c)))
ifneq ($(HAVE_UCX),1)
LIB_SRC  := $(filter-out transport/ucx.c,$(LIB_SRC))
endif
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)

TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_HELPER_SRC := $(wildcard tests/helpers/*.c)
TEST_HELPER_OBJ := $(TEST_HELPER_SRC:%.c=$(BUILD)/obj/%.o)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
# Every fuzz target also links, with the ordinary compiler, against a main()
# that replays files (tests/fuzz/replay_main.c): make test runs each over its
# committed corpus tests/fuzz/corpus_X without needing libFuzzer.
FUZZ_REPLAY_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz-replay/%)

.PHONY: all test test-reference test-faults run deps fuzz fuzz-run clean bench device
.SECONDARY:
all: $(BUILD)/baton $(BUILD)/libbaton.a $(TEST_BIN) $(FUZZ_REPLAY_BIN) $(CUDA_LIB) $(NCCL_LIB) $(DEVICE_BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# The source revision `baton --version` prints and every run directory
# records (launch/version.c): git's commit, "-dirty" with uncommitted
# changes. The stamp file changes only when the revision does, so that only
# version.o is rebuilt then.
REVISION := $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
$(BUILD)/revision: FORCE
	@mkdir -p $(BUILD)
	@echo '$(REVISION)' | cmp -s - $@ || echo '$(REVISION)' > $@
$(BUILD)/obj/launch/version.o: $(BUILD)/revision
$(BUILD)/obj/launch/version.o: CFLAGS += -DBATON_REVISION='"$(REVISION)"'
.PHONY: FORCE
FORCE:

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	nvcc $(NVCCFLAGS) -c $< -o $@

$(BUILD)/libbaton.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/baton: $(BUILD)/obj/launch/main.o $(BUILD)/libbaton.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_HELPER_OBJ) $(BUILD)/libbaton.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/fuzz-replay/%: $(BUILD)/obj/tests/fuzz/%.o $(BUILD)/obj/tests/fuzz/replay_main.o $(BUILD)/libbaton.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# Device tests (tests/device/*.c): built with CUDA, never run by `make test`
# (no GPU here); tools/device-check.sh runs them on a GPU machine.
device: $(DEVICE_BIN)
$(BUILD)/device/%: $(BUILD)/obj/tests/device/%.o $(BUILD)/libbaton.a $(CUDA_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o %.a,$^) -o $@ -L$(BUILD) -lbaton_cuda -Wl,-rpath,'$$ORIGIN/..' \
	    $(LDLIBS) $(CUDA_LIBS)

$(CUDA_LIB): $(CUDA_OBJ)
	$(CC) -shared $(LDFLAGS) $^ -o $@ $(CUDA_LIBS)

$(NCCL_LIB): $(NCCL_OBJ)
	$(CC) -shared $(LDFLAGS) $^ -o $@ -L$(CUDA_HOME)/lib64 -lnccl -lcudart

# the NCCL device test loads libbaton_nccl.so at run time, like baton does
$(BUILD)/device/test_nccl: $(NCCL_LIB)

# test and run install what is missing first and then build in a fresh make,
# so that a first `make test` on a new machine finds the packages (HAVE_UCX
# and the flags above are computed when make starts).
test: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) SAN=$(SAN) tests/run.sh $(T)

# The reference case's full layout (tests/test_reference.c): 16 processes,
# TP=2 PP=2 CP=2 DP=2 with EP=4 EDP=2, and its checkpoint round trips; CI
# runs it after make test.
test-reference: deps
	@$(MAKE) --no-print-directory all
	@BATON_TEST_REFERENCE=16 BUILD=$(BUILD) SAN=$(SAN) tests/run.sh test_reference

# network-fault campaigns between namespace hosts (root; minutes; tests/faults/)
test-faults: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) tests/faults/run.sh

deps:
	@tools/install-deps.sh $(PKGS)
	@tools/fetch-cudnn-frontend.sh

run: deps
	@$(MAKE) --no-print-directory $(BUILD)/baton
	@tools/run-default-job.sh $(BUILD)

# libFuzzer: every tests/fuzz/fuzz_X.c becomes build/fuzz/fuzz_X, linked
# against the library sources built with clang and the fuzzer sanitizers.
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -I. -MMD -MP -fsanitize=fuzzer-no-link,address,undefined \
               $(if $(filter 1,$(HAVE_UCX)),-DBT_HAVE_UCX=1) $(shell pkg-config --cflags cairo 2>/dev/null)
fuzz: $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)
build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -c $< -o $@
build/fuzz/%: build/fuzz/obj/tests/fuzz/%.o $(patsubst %.c,build/fuzz/obj/%.o,$(LIB_SRC))
	clang -fsanitize=fuzzer,address,undefined $^ -o $@ $(LDLIBS)

# The recorded campaigns (docs: "Fuzzing" in WIRE.md, MODELS.md, GGUF.md,
# TRACING.md, JOBS.md, DATA.md; numbers in bench/RESULTS.md): each target
# from a copy of its committed seeds for FUZZ_RUNS executions, one target at
# a time on one core (-jobs=1), niced. Summary: build/fuzz/run/summary.txt.
# Not part of make test (a campaign takes minutes per target).
FUZZ_RUNS    ?= 1000000
FUZZ_TARGETS ?= $(FUZZ_SRC:tests/fuzz/%.c=%)
fuzz-run: fuzz
	@tools/fuzz_run.sh $(FUZZ_RUNS) $(FUZZ_TARGETS)

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
-include $(shell find build/fuzz/obj -name '*.d' 2>/dev/null)
