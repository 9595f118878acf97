# gpurun: one non-recursive Makefile (docs/design.md, section 9, rule 13). Objects live under build/ (or
# build/asan/ for the sanitizer build); quiet unless V=1.

CC       ?= cc
CLANG    ?= clang
PKG      ?= pkg-config
BUILD    ?= build
# One spelling of each target: a BUILD given as an absolute path inside the tree (as the
# install and bundle tests give it) is made relative, so that the dependency files the
# compiler writes (-MMD, named by target) apply to every later make of the tree.
override BUILD := $(patsubst $(CURDIR)/%,%,$(BUILD))
PREFIX   ?= /usr/local
NVCC     ?= $(firstword $(wildcard $(shell command -v nvcc 2>/dev/null) /usr/local/cuda/bin/nvcc))

LIBS_PC  := libuv jansson libcrypto inih
CPPFLAGS += -Ilib -Ilib/rank -D_GNU_SOURCE $(shell $(PKG) --cflags $(LIBS_PC) 2>/dev/null)
CFLAGS   ?= -O2 -g
override CFLAGS += -std=c11 -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wno-missing-field-initializers -fno-strict-aliasing -MMD -MP
LDLIBS   += $(shell $(PKG) --libs $(LIBS_PC) 2>/dev/null) -lm
# libslurm (no pkg-config file): gpurun submits through it. Without its header gpurun still
# builds, and says so when asked for Slurm.
SLURM_H    := $(wildcard /usr/include/slurm/slurm.h)
SLURM_LIBS := $(if $(SLURM_H),-lslurm)
ifeq ($(SLURM_H),)
CPPFLAGS += -DGPURUN_NO_LIBSLURM
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# --- sources -------------------------------------------------------------------------------
LIB_SRC    := $(wildcard lib/*.c)
GR_SRC     := lib/rank/gr.c lib/rank/gr_pmix.c lib/frame.c lib/proto.c lib/log.c lib/auth.c \
              lib/fsutil.c lib/errmsg.c lib/monotime.c lib/utf8.c lib/jtext.c
DAEMON_SRC := $(wildcard daemon/*.c)
CLIENT_SRC := $(wildcard client/*.c)
TEST_SRC   := $(wildcard tests/test_*.c)

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))

LIB_A      := $(BUILD)/libgpurun.a
GR_A       := $(BUILD)/libgr.a
# The rank library's ABI: the soname's number and lib/rank/libgr.map's version node (LIBGR_1)
# go up together, when a program built for the old library cannot run on the new one (1:
# struct gr_progress gained its size; lib/rank/gr.h says why).
GR_SONAME  := libgr.so.1
GR_SO      := $(BUILD)/$(GR_SONAME)
RENDEZVOUSD:= $(BUILD)/rendezvousd
# The rank shim (daemon/shim.h) as a program of its own, with libc alone: the agent runs one
# per rank, and rendezvousd itself (libuv, jansson, libcrypto in it) takes longer to start.
# The agent falls back to rendezvousd --exec-rank where it is not beside it.
SHIM       := $(BUILD)/gpurun-shim
SHIM_SRC   := daemon/shim/main.c daemon/shim.c daemon/cgroup.c daemon/stall.c lib/jobmark.c \
              lib/monotime.c lib/fsutil.c lib/errmsg.c
GPURUN     := $(BUILD)/gpurun
RUNNER     := $(BUILD)/tests/runner
GR_EXAMPLE := $(BUILD)/tests/gr_example
LOADGEN    := $(BUILD)/bench/loadgen
COLL_RANK  := $(BUILD)/tests/coll_rank
BENCH_AR   := $(BUILD)/bench/allreduce
MPICC      ?= $(shell command -v mpicc 2>/dev/null)
BENCH_MPI  := $(if $(MPICC),$(BUILD)/bench/mpi_allreduce)
MPI_HELLO  := $(if $(MPICC),$(BUILD)/tests/mpi_hello)
# A rank started by srun --mpi=pmix without rendezvousd takes its place, store and barriers
# from PMIx (lib/rank/gr_pmix.h): built in where libpmix is, and then every program with the rank
# library links it.
HAVE_PMIX  := $(shell $(PKG) --exists pmix 2>/dev/null && echo 1)
GR_LIBS    := $(if $(HAVE_PMIX),$(shell $(PKG) --libs pmix))
GR_PMIX_CHECK := $(if $(HAVE_PMIX),$(BUILD)/tests/gr_pmix_check)
BENCH_STEP := $(BUILD)/bench/train_step
BENCH_HANDOFF := $(BUILD)/bench/handoff
TRAIN      := $(if $(wildcard kernels/train.c),$(BUILD)/gpurun-train)
FAKE_NVML  := $(BUILD)/tests/fakenvml/libnvidia-ml.so.1
PROGS      := $(RENDEZVOUSD) $(SHIM) $(GPURUN) $(GR_SO) $(GR_EXAMPLE) $(RUNNER) $(LOADGEN) $(TRAIN) $(COLL_RANK) \
              $(MPI_HELLO) $(GR_PMIX_CHECK) $(FAKE_NVML) \
              $(BENCH_AR) $(BENCH_MPI) $(BENCH_STEP) $(BENCH_HANDOFF)

.PHONY: all run test test-gpu bench fuzz fuzz-build asan memcheck install uninstall clean deps format \
        format-check sim cudasim-seeds

all: $(PROGS)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(LIB_A): $(call obj,$(LIB_SRC))
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(call obj,lib/rank/gr.c lib/rank/gr_pmix.c tests/test_gr.c): CPPFLAGS += $(if $(HAVE_PMIX),-DHAVE_PMIX $(shell $(PKG) --cflags pmix))
$(GR_EXAMPLE) $(GR_PMIX_CHECK) $(RUNNER) $(COLL_RANK) $(BENCH_AR) $(TRAIN): LDLIBS += $(GR_LIBS)

$(GR_A): $(call obj,$(sort $(GR_SRC)))
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

# The rank library as a shared library (installed as libgr.so): libgr.a's sources compiled
# position-independent under $(BUILD)/pic/, exporting gr.h's functions and nothing else
# (lib/rank/libgr.map: frame_*, proto_*, log_* stay inside), linked with what those sources need
# (jansson, libcrypto, libpmix where it is built in) and no more; --no-undefined proves that
# list complete.
pic = $(patsubst %.c,$(BUILD)/pic/%.o,$(1))
GR_SO_LIBS := $(shell $(PKG) --libs jansson libcrypto 2>/dev/null) $(GR_LIBS)
$(BUILD)/pic/%.o: %.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $< (PIC)")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -fPIC -c -o $@ $<
$(call pic,lib/rank/gr.c lib/rank/gr_pmix.c): CPPFLAGS += $(if $(HAVE_PMIX),-DHAVE_PMIX $(shell $(PKG) --cflags pmix))
$(GR_SO): $(call pic,$(sort $(GR_SRC))) lib/rank/libgr.map
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(GR_SONAME) \
	    -Wl,--version-script=lib/rank/libgr.map -Wl,--no-undefined -o $@ $(filter %.o,$^) $(GR_SO_LIBS)

# rendezvousd takes libuv, jansson and libcrypto (its SHA-256 and constant-time helpers, the
# only parts it uses: about 300 KiB in all) from Debian's static archives where they are
# installed (libuv1-dev, libjansson-dev, libssl-dev): the loader's mapping and relocating of
# the three shared libraries, libcrypto's 4.5 MB above all, was half a millisecond of every
# daemon's start, on the path of a job's first rank. Shared where an archive is missing.
RDV_STATIC_A := $(foreach a,libuv_a.a libjansson.a libcrypto.a,$(filter /%,$(shell $(CC) -print-file-name=$(a))))
ifeq ($(words $(RDV_STATIC_A)),3)
RDV_LDLIBS := -Wl,-Bstatic -luv_a -ljansson -lcrypto -Wl,-Bdynamic \
              $(filter-out -luv -ljansson -lcrypto,$(LDLIBS))
else
RDV_LDLIBS := $(LDLIBS)
endif

$(RENDEZVOUSD): $(call obj,$(DAEMON_SRC)) $(LIB_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(RDV_LDLIBS)

$(SHIM): $(call obj,$(SHIM_SRC))
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^

$(GPURUN): $(call obj,$(CLIENT_SRC)) $(LIB_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SLURM_LIBS)

$(GR_EXAMPLE): $(call obj,tests/helpers/gr_example.c) $(GR_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/gr_pmix_check: $(call obj,tests/helpers/gr_pmix_check.c) $(GR_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The tests' fake NVML (tests/helpers/fake_nvml.c): GPUs and their memory from files, found by
# rendezvousd's dlopen where its directory comes first in LD_LIBRARY_PATH.
$(FAKE_NVML): $(call pic,tests/helpers/fake_nvml.c)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,libnvidia-ml.so.1 -Wl,--no-undefined \
	    -o $@ $^

# The unit tests link the daemon's and client's modules (without their main()) so that each
# module's test reaches its static-free API.
DAEMON_MODS := $(filter-out daemon/main.c,$(DAEMON_SRC))
CLIENT_MODS := $(filter-out client/main.c,$(CLIENT_SRC))
# The collectives (kernels/coll/): the interface and its backends (tcp with its shared-memory
# links, nccl).
COLL_SRC    := $(wildcard kernels/coll/*.c)
# The training core, the collectives with it: plain C with OpenMP; kernels/train.c holds
# gpurun-train's main().
KERNEL_SRC  := $(wildcard kernels/*.c) $(COLL_SRC)
KERNEL_MODS := $(filter-out kernels/train.c,$(KERNEL_SRC))
# The CPU model: GPT-2, its ops and their GEMM engine, AdamW (what the step benchmarks link).
MODEL_SRC   := kernels/gpt2.c kernels/ops.c kernels/gemm.c kernels/optim.c
$(BUILD)/kernels/%.o: CFLAGS += -fopenmp
$(call obj,tests/test_data.c tests/test_ckpt.c tests/test_backend.c): CPPFLAGS += -Ikernels
# The model's tests set OpenMP team sizes (results must not depend on them).
$(call obj,tests/test_ops.c tests/test_gpt2.c tests/test_optim.c): CPPFLAGS += -Ikernels
$(call obj,tests/test_ops.c tests/test_gpt2.c tests/test_optim.c): CFLAGS += -fopenmp
$(BUILD)/gpurun-train: $(call obj,$(KERNEL_SRC)) $(GR_A) $(LIB_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The CUDA backend (kernels/cuda/*.cu, docs/design.md, section 9, rule 12): built where nvcc is found, unless
# CUDA=0 (the sanitizer build leaves it out). Hopper machine code (sm_90) plus compute_90 PTX
# that the driver compiles for later GPUs. gpurun-train and the unit-test runner link it with
# cudart and cuBLASLt from the toolkit (found at run time through the rpath); without nvcc
# they build without it and kernels/cuda/cuda_ops.h answers "no CUDA device available".
CUDA        ?= $(if $(NVCC),1,0)
ifeq ($(CUDA),1)
CUDA_HOME   ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(addsuffix /libcudart.so,\
               $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib $(CUDA_HOME)/targets/x86_64-linux/lib)))))
NVCCFLAGS   ?= -O3 -g -lineinfo
override NVCCFLAGS += -std=c++17 -gencode arch=compute_90,code=sm_90 \
               -gencode arch=compute_90,code=compute_90 -Werror all-warnings \
               -Xcompiler -Wall,-Wextra,-Werror -Ilib -Ilib/rank -DGPURUN_CUDA -MMD -MP
CUDA_OBJS   := $(patsubst kernels/cuda/%.cu,$(BUILD)/cuda/%.o,$(wildcard kernels/cuda/*.cu))
CUDA_LIBS   := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublasLt -lcudart -lstdc++ -ldl
CPPFLAGS    += -DGPURUN_CUDA
# cuDNN's fused attention (kernels/cuda/attention_cudnn.cpp): where cudnn.h is in the toolkit
# and the cuDNN frontend's headers are installed (scripts/deps.sh), host C++ by $(CXX);
# libcudnn.so.9 is loaded at run time, so the programs start without it. The cudasim build
# leaves it out (its attention is attention_tc.cu's).
CUDNN_FE_INC := $(patsubst %/cudnn_frontend.h,%,$(firstword $(wildcard \
                $(CUDNN_FE_PREFIX)/include/cudnn_frontend.h /usr/local/include/cudnn_frontend.h \
                /usr/include/cudnn_frontend.h)))
ifneq ($(and $(CUDNN_FE_INC),$(wildcard $(CUDA_HOME)/include/cudnn.h)),)
CUDA_OBJS   += $(BUILD)/cuda/attention_cudnn.o
override NVCCFLAGS += -DGPURUN_CUDNN
$(BUILD)/cuda/attention_cudnn.o: kernels/cuda/attention_cudnn.cpp
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -MMD -MP -DGPURUN_CUDNN \
	    -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING -isystem $(CUDA_HOME)/include \
	    -isystem $(CUDNN_FE_INC) -c -o $@ $<
endif
$(BUILD)/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCCFLAGS) -c -o $@ $<
# The backend's plain C (the GPU model over the launchers): $(CC), no CUDA headers.
CUDA_C_OBJS := $(patsubst kernels/cuda/%.c,$(BUILD)/cuda/%.o,$(wildcard kernels/cuda/*.c))
$(CUDA_C_OBJS): $(BUILD)/cuda/%.o: kernels/cuda/%.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -DGPURUN_CUDA -c -o $@ $<
$(TRAIN) $(RUNNER): $(CUDA_OBJS) $(CUDA_C_OBJS)
$(TRAIN) $(RUNNER): LDLIBS += $(CUDA_LIBS)
$(call obj,tests/test_cuda_ops.c tests/test_cuda_model.c): CPPFLAGS += -Ikernels
else
TEST_SRC    := $(filter-out tests/test_cuda_ops.c tests/test_cuda_model.c,$(TEST_SRC))
endif

# The nccl collectives backend (kernels/coll/coll_nccl.c, plain C on the CUDA runtime and NCCL):
# built with NCCL where CUDA=1 and nccl.h is in the toolkit or the system, and then every
# program that links the collectives (gpurun-train, the test runner, coll_rank, the allreduce
# benchmark) links libnccl and cudart through the rpath. Elsewhere the same file builds as a
# backend that answers "nccl: built without NCCL", so those programs link the same objects
# either way. The toolkit's headers are a system directory: nccl.h's old-style prototypes
# must not trip -Wstrict-prototypes. NCCL_CPPFLAGS is what a C file that calls NCCL needs.
ifeq ($(CUDA),1)
NCCL_H      := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
endif
ifneq ($(NCCL_H),)
NCCL_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(CUDA_LIBDIR)/libnccl.so \
               /usr/lib/x86_64-linux-gnu/libnccl.so /usr/lib64/libnccl.so) $(CUDA_LIBDIR)/)))
NCCL_CPPFLAGS := -DGPURUN_NCCL -isystem $(CUDA_HOME)/include
NCCL_LIBS   := -L$(NCCL_LIBDIR) -Wl,-rpath,$(NCCL_LIBDIR) -lnccl \
               -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcudart
$(call obj,kernels/coll/coll_nccl.c tests/helpers/coll_rank.c tests/test_coll_nccl.c): CPPFLAGS += $(NCCL_CPPFLAGS)
$(TRAIN) $(RUNNER) $(COLL_RANK) $(BENCH_AR): LDLIBS += $(NCCL_LIBS)
endif

RUNNER_OBJS := $(call obj,tests/runner.c tests/helpers/wire.c $(TEST_SRC) $(DAEMON_MODS) $(CLIENT_MODS) $(KERNEL_MODS) $(wildcard lib/rank/gr.c lib/rank/gr_pmix.c)) $(LIB_A)
$(RUNNER): $(RUNNER_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SLURM_LIBS)

# cudasim (tests/cudasim/README.md): the CUDA backend on the CPU, so that its tests and a cuda
# training run work in CI without a GPU. Where CUDA=1, `make sim` (and make test) builds
# $(SIM)/: each .cu of kernels/cuda, and tests/cudasim/selftest.cu, rewritten by
# tests/cudasim/rewrite (launches become calls) into $(SIM)/src/ and compiled by g++ with
# tests/cudasim/sim.h force-included; libcudasim.a (fibers and launches, the runtime, cuBLASLt
# and NCCL) in place of cudart, cuBLASLt and NCCL; and, linked with them, the real build's
# objects as they are: gpurun-train, tests/runner (the real runner's tests plus the sim's
# own), tests/coll_rank and bench/train_gpu. The other programs a test may start are links to
# the real ones.
ifeq ($(CUDA),1)
SIM          := $(BUILD)/sim
SIM_CUDA_INC := $(CUDA_HOME)/include
SIM_CU       := $(wildcard kernels/cuda/*.cu tests/cudasim/*.cu)
SIM_GEN_CUH  := $(patsubst kernels/cuda/%,$(SIM)/src/%,$(wildcard kernels/cuda/*.cuh))
SIM_CU_OBJS  := $(patsubst %.cu,$(SIM)/cu/%.o,$(notdir $(SIM_CU)))
SIM_SELFTEST := $(SIM)/cu/selftest.o
SIM_LIB      := $(SIM)/libcudasim.a
SIM_LIB_OBJS := $(patsubst tests/cudasim/%.cc,$(SIM)/lib/%.o,$(wildcard tests/cudasim/*.cc))
SIM_TRAIN    := $(SIM)/gpurun-train
SIM_RUNNER   := $(SIM)/tests/runner
SIM_COLL_RANK:= $(SIM)/tests/coll_rank
SIM_LINKS    := $(SIM)/rendezvousd $(SIM)/gpurun
# The kernels at -O1 with the CUDA qualifiers as plain C++; NVIDIA's headers as system
# headers; quoted includes of a .cu resolve in its directory (the rewritten headers first).
# The rewritten sources are kept (compiler messages point at the .cu, a debugger at them).
SIM_CXXFLAGS := -std=c++17 -O1 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -MMD -MP \
                -include tests/cudasim/sim.h -DGPURUN_CUDA -DGPURUN_CUDASIM \
                -isystem $(SIM_CUDA_INC) -Ilib -Ilib/rank -iquote kernels/cuda -iquote tests/cudasim
SIM_LIBFLAGS := -std=c++17 -O2 -g -Wall -Wextra -Werror -MMD -MP -isystem $(SIM_CUDA_INC) -Ilib -Ilib/rank
$(SIM)/src/%.cc: kernels/cuda/%.cu tests/cudasim/rewrite
	@mkdir -p $(@D)
	@$(if $(Q),echo "  REWRITE $<")
	$(Q)tests/cudasim/rewrite $< $@
$(SIM)/src/%.cc: tests/cudasim/%.cu tests/cudasim/rewrite
	@mkdir -p $(@D)
	@$(if $(Q),echo "  REWRITE $<")
	$(Q)tests/cudasim/rewrite $< $@
$(SIM)/src/%.cuh: kernels/cuda/%.cuh tests/cudasim/rewrite
	@mkdir -p $(@D)
	@$(if $(Q),echo "  REWRITE $<")
	$(Q)tests/cudasim/rewrite $< $@
.SECONDARY: $(patsubst %.cu,$(SIM)/src/%.cc,$(notdir $(SIM_CU))) $(SIM_GEN_CUH)
$(SIM)/cu/%.o: $(SIM)/src/%.cc tests/cudasim/sim.h $(SIM_GEN_CUH)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(CXX) $(SIM_CXXFLAGS) -c -o $@ $<
$(SIM)/lib/%.o: tests/cudasim/%.cc
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(CXX) $(SIM_LIBFLAGS) -c -o $@ $<
$(SIM_LIB): $(SIM_LIB_OBJS)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^
$(SIM_TRAIN) $(SIM_RUNNER) $(SIM_COLL_RANK): LDLIBS += $(GR_LIBS) -lstdc++ -lpthread
$(call obj,tests/cudasim/test_cudasim.c): CPPFLAGS += -isystem $(SIM_CUDA_INC)
$(SIM_TRAIN): $(call obj,$(KERNEL_SRC)) $(CUDA_C_OBJS) $(filter-out $(SIM_SELFTEST),$(SIM_CU_OBJS)) $(GR_A) $(LIB_A) $(SIM_LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(SIM_RUNNER): $(RUNNER_OBJS) $(call obj,tests/cudasim/test_cudasim.c) $(CUDA_C_OBJS) $(SIM_CU_OBJS) $(SIM_LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SLURM_LIBS)
$(SIM_COLL_RANK): $(call obj,tests/helpers/coll_rank.c $(COLL_SRC)) $(GR_A) $(SIM_LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS)
# The CUDA training step benchmark's smoke mode (bench/train_gpu.c --smoke) runs here too.
SIM_BENCH_GPU:= $(SIM)/bench/train_gpu
$(SIM_BENCH_GPU): LDLIBS += -lstdc++ -lpthread
$(SIM_BENCH_GPU): $(call obj,bench/train_gpu.c $(MODEL_SRC)) $(CUDA_C_OBJS) $(filter-out $(SIM_SELFTEST),$(SIM_CU_OBJS)) $(LIB_A) $(SIM_LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(SIM_LINKS): $(SIM)/%: $(BUILD)/%
	@mkdir -p $(@D)
	$(Q)ln -sfn ../$* $@
sim: $(SIM_TRAIN) $(SIM_RUNNER) $(SIM_COLL_RANK) $(SIM_BENCH_GPU) $(SIM_LINKS)
# The randomized CUDA tests under cudasim once per seed 1..SEEDS (make test uses one fixed
# seed): their tolerances hold for other inputs too. run-gpu-checks.sh's seeds step does the
# same on a GPU.
SEEDS ?= 50
cudasim-seeds: $(SIM_RUNNER)
	$(Q)tests/seeds.sh $(SIM_RUNNER) $(SEEDS) cuda_ops cuda_model
else
sim cudasim-seeds:
	@echo "cudasim: not built (CUDA=0: no CUDA toolkit headers)"
endif

$(LOADGEN): $(call obj,bench/loadgen.c) $(LIB_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)
# What a cache line costs between two CPUs (printed with the allreduce table).
$(BENCH_HANDOFF): $(call obj,bench/handoff.c) $(LIB_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) -pthread

# The collectives' rank programs: the multi-rank tests and the allreduce benchmark, on the
# rank library and kernels/coll/ alone; the benchmark's anchor is built with OpenMPI's mpicc
# where one is installed.
$(call obj,tests/helpers/coll_rank.c bench/allreduce.c tests/test_coll.c tests/test_coll_nccl.c): CPPFLAGS += -Ikernels
$(COLL_RANK): $(call obj,tests/helpers/coll_rank.c $(COLL_SRC)) $(GR_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BENCH_AR): $(call obj,bench/allreduce.c $(COLL_SRC)) $(GR_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS)
# The CPU training step benchmark: the model, its ops and AdamW.
$(call obj,bench/train_step.c): CPPFLAGS += -Ikernels
# The model's maths never reads errno: without it sqrtf is one instruction and vectorises.
$(call obj,$(MODEL_SRC)): CFLAGS += -fno-math-errno
$(call obj,bench/train_step.c): CFLAGS += -fopenmp
$(BENCH_STEP): $(call obj,bench/train_step.c $(MODEL_SRC)) $(LIB_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/bench/mpi_allreduce: bench/mpi_allreduce.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  MPICC   $@")
	$(Q)$(MPICC) -O2 -Wall -Wextra -Werror -Ilib -Ilib/rank -o $@ $<
# The MPI program of the Slurm tests (srun --mpi=pmix across the test cluster's nodes).
$(MPI_HELLO): tests/helpers/mpi_hello.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  MPICC   $@")
	$(Q)$(MPICC) -O2 -g -std=c11 -Wall -Wextra -Werror -Ilib -Ilib/rank -o $@ $<

# --- set-up, demo and tests ----------------------------------------------------------------
deps:
	$(Q)scripts/deps.sh

# `make run` and `make test` build with a job per CPU unless the make that runs them was given
# -j (then its job server is shared).
JOBS_FLAG = $(if $(filter -j%,$(MAKEFLAGS))$(findstring j,$(firstword $(filter-out -%,$(MAKEFLAGS)))),,-j$(shell nproc 2>/dev/null || echo 2))

run: deps
	$(Q)$(MAKE) --no-print-directory $(JOBS_FLAG) all
	$(Q)scripts/demo.sh

FORMAT_SRC = $(shell git ls-files '*.c' '*.h' '*.cc' '*.cu' '*.cuh' 2>/dev/null || find lib daemon client kernels tests bench -name '*.[ch]' -o -name '*.cc')
format:
	$(Q)clang-format -i $(FORMAT_SRC)
format-check:
	$(Q)clang-format --dry-run -Werror $(FORMAT_SRC)

# The sanitizer build: the same sources under build/asan with ASan and UBSan, every UB report
# fatal.
asan:
	$(Q)$(MAKE) --no-print-directory BUILD=$(BUILD)/asan CUDA=0 \
	    CFLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all" \
	    LDFLAGS="-fsanitize=address,undefined" all

# Everything make test runs is reported by tests/run as TAP with one summary line; `tests/run
# NAME` runs one test again.
test: deps
	$(Q)$(MAKE) --no-print-directory $(JOBS_FLAG) all asan fuzz-build $(if $(filter 1,$(CUDA)),sim)
	$(Q)BUILD=$(BUILD) tests/run

# --- fuzzing (libFuzzer, clang) --------------------------------------------------------------
# The harness writes its own seed corpus (FUZZ_FRAME_WRITE_SEEDS): valid frames of every
# message type, plain and sealed, so that the fuzzer starts past the checks it must probe.
FUZZ := $(BUILD)/fuzz/fuzz_frame
FUZZ_SRC := tests/fuzz_frame.c lib/frame.c lib/proto.c lib/jtext.c lib/auth.c lib/fsutil.c lib/errmsg.c
FUZZ_CFLAGS := -std=c11 -Wall -Wextra -Werror -g -O1 \
               -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
fuzz-build: $(FUZZ)
$(FUZZ): $(FUZZ_SRC) $(wildcard lib/*.h)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  FUZZ    $@")
	$(Q)$(CLANG) $(CPPFLAGS) $(FUZZ_CFLAGS) -o $@ $(FUZZ_SRC) $(LDLIBS)
FUZZ_SECONDS ?= 60
fuzz: $(FUZZ)
	$(Q)mkdir -p $(BUILD)/fuzz/corpus
	$(Q)FUZZ_FRAME_WRITE_SEEDS=$(BUILD)/fuzz/corpus $(FUZZ)
	$(Q)$(FUZZ) -max_total_time=$(FUZZ_SECONDS) -max_len=4096 $(BUILD)/fuzz/corpus

memcheck: all
	$(Q)MEMCHECK=1 tests/run

bench: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)bench/run

# The CUDA backend's tests alone (the kernels, the model, the nccl collectives' unit tests,
# integ/coll_nccl and the cuda training runs of integ/train_cuda_*, through tests/run): each
# one SKIPs on a machine without a device; TRAIN_CUDA_FLAVOUR=cuda keeps cudasim out.
ifeq ($(CUDA),1)
test-gpu: $(RUNNER) $(COLL_RANK) $(GPURUN) $(RENDEZVOUSD) $(TRAIN)
	$(Q)BUILD=$(BUILD) TRAIN_CUDA_FLAVOUR=cuda tests/run cuda_ops cuda_model coll_nccl 'train_cuda_*'
else
test-gpu:
	@echo "ok 1 - cuda_ops # SKIP built without the CUDA backend (nvcc not found)"
	@echo "ok 2 - cuda_model # SKIP built without the CUDA backend (nvcc not found)"
	@echo "ok 3 - coll_nccl # SKIP built without the CUDA backend (nvcc not found)"
	@echo "ok 4 - train_cuda # SKIP built without the CUDA backend (nvcc not found)"
endif

# The CUDA training step benchmark (bench/README.md section 7): tokens/s and MFU of one GPU
# for jobs/gpt2-124m.cfg's model; it prints a SKIP line where there is no device.
.PHONY: bench-gpu
ifeq ($(CUDA),1)
BENCH_GPU := $(BUILD)/bench/train_gpu
$(call obj,bench/train_gpu.c): CPPFLAGS += -Ikernels -I$(CUDA_HOME)/include
$(BENCH_GPU): $(call obj,bench/train_gpu.c $(MODEL_SRC)) \
              $(CUDA_OBJS) $(CUDA_C_OBJS) $(LIB_A)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -fopenmp $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)
all: $(BENCH_GPU)
bench-gpu: $(BENCH_GPU)
	$(Q)$(BENCH_GPU)
else
bench-gpu:
	@echo "SKIP train_gpu: built without the CUDA backend (nvcc not found)"
endif

# The GPU bundle (README.md, "Checks on a GPU node without build tools"): what
# scripts/run-gpu-checks.sh needs on a GPU node that has the driver and CUDA's libraries but no
# build tools and none of Debian's packages. scripts/gpu-bundle.sh copies the programs of
# make test-gpu and make bench-gpu (bin/, laid out as a build folder), every library they load
# but glibc's, the C++ runtime's and CUDA's (lib/, found through an $ORIGIN RUNPATH), the test
# scripts, jobs/ and run-gpu-checks.sh, in under 60 MiB. GPU_BUNDLE_FLAVOUR=sim bundles the
# cudasim build instead (build/gpu-bundle-sim), whose checks run here without a GPU.
.PHONY: gpu-bundle
GPU_BUNDLE_FLAVOUR ?= cuda
ifeq ($(CUDA),1)
ifeq ($(GPU_BUNDLE_FLAVOUR),sim)
GPU_BUNDLE_DIR   ?= $(BUILD)/gpu-bundle-sim
GPU_BUNDLE_PROGS := $(SIM_TRAIN) $(SIM_RUNNER) $(SIM_COLL_RANK) $(SIM_BENCH_GPU)
else
GPU_BUNDLE_DIR   ?= $(BUILD)/gpu-bundle
GPU_BUNDLE_PROGS := $(TRAIN) $(RUNNER) $(COLL_RANK) $(BENCH_GPU)
endif
gpu-bundle: $(GPURUN) $(RENDEZVOUSD) $(GPU_BUNDLE_PROGS)
	$(Q)scripts/gpu-bundle.sh $(GPU_BUNDLE_FLAVOUR) $(GPU_BUNDLE_DIR) $(GPURUN) $(RENDEZVOUSD) \
	    $(GPU_BUNDLE_PROGS)
else
gpu-bundle:
	@echo "gpu-bundle: needs the CUDA backend (nvcc not found, or CUDA=0)" >&2
	@exit 1
endif

# cudasim's cuBLASLt and NCCL on their own (tests/cudasim/libs_test.c, run by
# tests/integ/cudasim_libs.sh): plain host code against the toolkit's headers, part of `make
# sim`. The toolkit's headers are system headers (old-style prototypes in nccl.h, cublasLt.h).
ifeq ($(CUDA),1)
SIM_LIBS_TEST := $(BUILD)/sim/libs_test
SIM_LIBS_DIR  := $(BUILD)/sim/libs_test.objs
$(SIM_LIBS_DIR)/%.o: tests/cudasim/%.cc
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(CXX) -std=c++17 -O2 -g -Wall -Wextra -Werror -MMD -MP -isystem $(CUDA_HOME)/include \
	    -Ilib -Ilib/rank -c -o $@ $<
$(SIM_LIBS_DIR)/libs_test.o: tests/cudasim/libs_test.c
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -isystem $(CUDA_HOME)/include -c -o $@ $<
$(SIM_LIBS_TEST): $(addprefix $(SIM_LIBS_DIR)/,libs_test.o cublaslt.o nccl.o)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CXX) $(LDFLAGS) -o $@ $^ -lm -lpthread
sim: $(SIM_LIBS_TEST)
endif

# What a node needs (scripts/install.sh has a row per file): gpurun, rendezvousd and
# gpurun-train (gpurun finds it and rendezvousd beside itself, else on PATH); the rank library
# for C (gr.h, libgr.a, libgr.so with its soname, and the pkg-config file gr.pc) and for Python
# (the gpurun package, in lib/gpurun/python where rendezvousd finds it and puts it on every
# rank's PYTHONPATH; `pip install lib/rank/python` is the other way in); the man pages of
# docs/man; bash's completion of gpurun. It builds what it installs, nothing else; DESTDIR is
# honoured. make uninstall, with the same PREFIX and DESTDIR, removes those files and the
# directories install made.
GR_VERSION = $(shell sed -n 's/^\#define GPURUN_VERSION "\(.*\)"$$/\1/p' client/version.h)
install: $(GPURUN) $(RENDEZVOUSD) $(SHIM) $(BUILD)/gpurun-train $(GR_A) $(GR_SO)
	$(Q)PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" BUILD="$(BUILD)" GR_VERSION="$(GR_VERSION)" \
	    GR_LIBS_PRIVATE="$(strip $(GR_SO_LIBS))" scripts/install.sh install
uninstall:
	$(Q)PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" scripts/install.sh uninstall

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
