# multiprocess.mk - included by the Makefile: the MPI transport's tests, example and bench, the
# NCCL header's compile-and-link check, and the grid test. Everything here hooks into `make test`
# through TEST_BINS and extra prerequisites of `test`, so the main Makefile only includes it.

.PHONY: test-mpi run-mpi bench-mpi bench-overlap check-nccl mp-note gpu-nccl gpu-nccl-check test-nccl-gpu

# the grid section of pipeline.h over the threads transport: built four ways like every test
TESTS += test_grid
test: $(B)/test_grid $(B)/clang-test_grid $(B)/asan-test_grid $(B)/tsan-test_grid

# MPI (optional): tests/test_mpi.c under mpirun -np 2, 4 and 8, the multi-process example and
# bench. Skipped, with a message, when mpicc or mpirun is missing. Open MPI needs
# --oversubscribe for 8 processes on 2 cores, --allow-run-as-root as root, and in containers
# without ptrace rights no single-copy (CMA) transfers; override MPIRUN_FLAGS for another MPI.
# MPI_HOME: an MPI of your own (its bin/mpicc and bin/mpirun); by default those on the PATH.
MPICC   ?= $(if $(MPI_HOME),$(MPI_HOME)/bin/mpicc,mpicc)
MPIRUN  ?= $(if $(MPI_HOME),$(MPI_HOME)/bin/mpirun,mpirun)
HAVE_MPI := $(shell command -v $(MPICC) >/dev/null 2>&1 && command -v $(MPIRUN) >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_MPI),1)
MPIRUN_FLAGS ?= $(shell $(MPIRUN) --version 2>/dev/null | grep -q 'Open MPI' && \
  echo --oversubscribe --mca btl_vader_single_copy_mechanism none $$([ "$$(id -u)" = 0 ] && echo --allow-run-as-root))
# Open MPI forwards an environment variable only when asked (-x); MPICH's mpiexec forwards all
MPI_FWD_ASAN := $(shell $(MPIRUN) --version 2>/dev/null | grep -q 'Open MPI' && echo -x ASAN_OPTIONS)
MPI_TESTS = $(B)/mpi-np2 $(B)/mpi-np4 $(B)/mpi-np8 $(B)/mpi-asan-np4 $(B)/mpi-resume $(B)/mpi-trainer $(B)/mpi-tlm $(B)/mpi-overlap-controls
MPI_BINS  = $(B)/test_mpi $(B)/tlm_mpi $(B)/gpt_mpi $(B)/bench_mpi $(B)/bench_overlap_mpi $(B)/clang-test_mpi.o $(B)/mpi-cxx.o
# tests/test_tp_mpi.c (issue 40): the pp x dp x tp grid's splits by MPI_Comm_split, the TP
# collectives over pipeline_mpi.h bit-identical to the sequential sum and to the threads transport,
# boundaries split across the TP group bit-identical to the unsplit run with 1/tp of the bytes
# (its controls: each rank sums every copy itself, its own first, and must fail at tp = 4; the
# split boundaries never gathered)
MPI_TESTS += $(B)/mpi-tp-np4 $(B)/mpi-tp-np8 $(B)/mpi-tp-controls
MPI_BINS  += $(B)/test_tp_mpi
# the GPT with Megatron-style tensor parallelism (gpt_mpi --tp, tests/test_gpt_tp.sh: tp 2 and 4
# within 1e-5 of tp 1, the same bits across runs, kinds and p); its control drops the attention
# projection's row-parallel all-reduce and must fail --check
MPI_TESTS += $(B)/mpi-gpt-tp $(B)/mpi-gpt-tp-controls
else
MPI_TESTS =
MPI_BINS  =
endif

$(B)/test_mpi: tests/test_mpi.c $(TEST_HDRS) $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/tlm_mpi: examples/tlm_mpi.c $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

# the packed-sequence GPT with one process per rank
$(B)/gpt_mpi: examples/gpt_mpi.c $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/bench_mpi: bench/bench_mpi.c tests/harness.h $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

# the data-parallel reduction overlapped with the cool-down, against after the step (make bench-overlap)
$(B)/bench_overlap_mpi: bench/bench_overlap.c tests/harness.h examples/mlp.h $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DBENCH_MPI $(CFLAGS) $< -o $@ $(LDLIBS)

# NCCL (optional): pipeline_nccl.h compiles and links against NCCL and the CUDA runtime, as C99
# (gcc, clang), C++ and under nvcc; test_nccl runs its CPU part (schedule order proofs) in make
# test, and its one-rank GPU part where a GPU exists. CUDA headers are not -pedantic clean:
# they come in as system headers.
# NCCL_HOME: an NCCL of your own (include/ and lib/, e.g. one built by tools/build_nccl.sh); by
# default the toolkit's under CUDA_HOME. Its headers come before the toolkit's, which may carry an
# older nccl.h.
CUDA_HOME ?= /usr/local/cuda
NCCL_HOME ?= $(CUDA_HOME)
NCCL_LIBDIR := $(firstword $(wildcard $(NCCL_HOME)/lib/libnccl.so $(NCCL_HOME)/lib64/libnccl.so))
NCCL_LIBDIR := $(if $(NCCL_LIBDIR),$(patsubst %/,%,$(dir $(NCCL_LIBDIR))),$(NCCL_HOME)/lib64)
HAVE_NCCL := $(shell test -f $(NCCL_HOME)/include/nccl.h && test -f $(CUDA_HOME)/lib64/libcudart.so && echo 1)
NCCL_FLAGS = -isystem $(NCCL_HOME)/include $(if $(filter-out $(CUDA_HOME),$(NCCL_HOME)),-isystem $(CUDA_HOME)/include)
NCCL_LIBS  = -L$(NCCL_LIBDIR) $(if $(filter-out $(CUDA_HOME),$(NCCL_HOME)),-L$(CUDA_HOME)/lib64) -lnccl -lcudart \
             -Wl,-rpath,$(NCCL_LIBDIR) -Wl,-rpath,$(CUDA_HOME)/lib64
NVCC_NCCL  = $(if $(filter-out $(CUDA_HOME),$(NCCL_HOME)),-I$(NCCL_HOME)/include)
ifeq ($(HAVE_NCCL),1)
NCCL_TESTS = $(B)/test_nccl $(if $(filter 1,$(HAVE_MPI)),$(B)/mpi-nccl-np3)
else
NCCL_TESTS =
endif

$(B)/test_nccl: tests/test_nccl.c $(TEST_HDRS) $(HEADERS) pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) $(NCCL_FLAGS) $(CFLAGS) $< -o $@ $(NCCL_LIBS) $(LDLIBS)

# the NCCL id by MPI_Bcast, under mpirun (ncclGetUniqueId needs no GPU)
$(B)/test_nccl_mpi: tests/test_nccl.c $(TEST_HDRS) $(HEADERS) pipeline_cuda.h pipeline_nccl.h | $(B)
	$(MPICC) $(BASE) $(NCCL_FLAGS) $(CFLAGS) -DPP_TEST_NCCL_MPI $< -o $@ $(NCCL_LIBS) $(LDLIBS)

$(B)/mpi-nccl-np%: $(B)/test_nccl_mpi
	@printf '#!/bin/sh\nexec timeout 300 $(MPIRUN) $(MPIRUN_FLAGS) -np $* $(B)/test_nccl_mpi\n' > $@ && chmod +x $@

# examples/gpt_nccl.cu: gpt_cuda's GPT with one process per GPU. Compiled by nvcc (with the
# NCCL id by MPI_Bcast where MPI is here: PP_GPT_NCCL_MPI), linked by $(CXX). check-nccl also
# builds it without MPI too (the id by --id-file) and runs a one-process step: where no
# GPU is, it must stop with its "no CUDA device" message, not crash.
GPT_NCCL_SRC = examples/gpt_nccl.cu examples/gpt_cuda.h examples/gpt_loop.h examples/gpt_data.h examples/gpt_traffic.h examples/splitmix.h $(HEADERS) pipeline_cuda.h pipeline_nccl.h
ifeq ($(HAVE_MPI),1)
GPT_NCCL_MPI_CFLAGS = -DPP_GPT_NCCL_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX \
  $(patsubst -I%,-isystem %,$(filter -I%,$(shell $(MPICC) -showme:compile 2>/dev/null || $(MPICC) -compile-info)))
GPT_NCCL_MPI_LIBS = $(filter -L% -l% -Wl%,$(shell $(MPICC) -showme:link 2>/dev/null || $(MPICC) -link-info))
endif

$(B)/gpt_nccl.o: $(GPT_NCCL_SRC) | $(B)
	$(NVCC) $(NVFLAGS) -I. $(NVCC_NCCL) $(GPT_NCCL_MPI_CFLAGS) -c $< -o $@

$(B)/gpt_nccl: $(B)/gpt_nccl.o
	$(CXX) $< -o $@ $(GPT_NCCL_MPI_LIBS) $(NCCL_LIBS) -lcublas -lpthread

$(B)/gpt_nccl-nompi.o: $(GPT_NCCL_SRC) | $(B)
	$(NVCC) $(NVFLAGS) -I. $(NVCC_NCCL) -c $< -o $@

$(B)/gpt_nccl-nompi: $(B)/gpt_nccl-nompi.o
	$(CXX) $< -o $@ $(NCCL_LIBS) -lcublas -lpthread

# `make cuda` builds every .cu: this one too where NCCL is
ifeq ($(HAVE_NCCL),1)
cuda: $(B)/gpt_nccl
endif

# Several ranks of real NCCL on one GPU (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1; the
# toolkit's 2.28 refuses). `make gpu-nccl NCCL_HOME=DIR B=gpubuild` builds what tools/gpu_nccl.sh
# runs, on a machine without a GPU: gpt_nccl-nompi and gpt_cuda for CUDA_ARCHS (sm_80 and sm_90 by default there), and NCCL's library
# (stripped) in $(B)/lib, to carry to the GPU machine. `make test-nccl-gpu` runs it: where no
# GPU answers it says so and exits 0. tools/build_nccl.sh builds a small NCCL from its source.
# test_nccl_pipeline and test_nccl_grid against real NCCL and the CUDA runtime (gcc: the layers are
# host functions on the streams, tests/layer_staged.h); and over the imitation with those layers,
# which make test runs.
$(B)/test_nccl_pipeline-gpu $(B)/test_nccl_grid-gpu: $(B)/%-gpu: tests/%.c tests/layer_staged.h $(TEST_HDRS) $(EXH) $(HEADERS) pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) $(NCCL_FLAGS) -DPP_TEST_REAL_CUDA $(CFLAGS) $< -o $@ $(NCCL_LIBS) $(LDLIBS)

$(B)/conn_probe: tools/conn_probe.cu | $(B)
	$(NVCC) $(NVFLAGS) $< -o $@

# The NCCL it packages must run several ranks on one GPU: 2.30.3 or later (NCCL_MULTI_RANK_GPU_ENABLE
# first appears in v2.30.3's src/init.cc; 2.29.7 fails "Duplicate GPU detected"). Checked from
# NCCL_HOME's nccl.h before anything is built (the toolkit's is 2.28 here); GPU_NCCL_SINGLE_RANK=1
# packages an older one anyway, for one rank per GPU only. tools/gpu_nccl.sh checks again what the
# binaries load (test_nccl_pipeline-gpu nccl-version).
GPU_NCCL_MIN = 23003
gpu-nccl-check:
	@set -- $$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{print $$3}' $(NCCL_HOME)/include/nccl.h 2>/dev/null); \
	if [ $$# -ne 3 ]; then echo "gpu-nccl: no NCCL version in $(NCCL_HOME)/include/nccl.h: set NCCL_HOME to an NCCL >= 2.30.3 (tools/build_nccl.sh builds one)"; exit 1; fi; \
	if [ $$(( $$1 * 10000 + $$2 * 100 + $$3 )) -lt $(GPU_NCCL_MIN) ] && [ "$(GPU_NCCL_SINGLE_RANK)" != 1 ]; then \
	  echo "gpu-nccl: NCCL_HOME=$(NCCL_HOME) holds NCCL $$1.$$2.$$3; two or more ranks on one GPU need 2.30.3 or later"; \
	  echo "  (NCCL_MULTI_RANK_GPU_ENABLE). Build one (docs/gpu.md: tools/build_nccl.sh) and pass NCCL_HOME=<it>,"; \
	  echo "  or set GPU_NCCL_SINGLE_RANK=1 to package this one for one rank per GPU. Nothing built."; exit 1; fi; \
	echo "gpu-nccl: NCCL $$1.$$2.$$3 from $(NCCL_HOME)"

gpu-nccl: gpu-nccl-check
	@$(MAKE) --no-print-directory $(B)/gpt_nccl-nompi $(B)/gpt_cuda $(B)/test_nccl_pipeline-gpu $(B)/test_nccl_grid-gpu $(B)/conn_probe
	@mkdir -p $(B)/lib && cp -L $(NCCL_LIBDIR)/libnccl.so.2 $(B)/lib/libnccl.so.2 && strip --strip-unneeded $(B)/lib/libnccl.so.2 && \
	  echo "gpu-nccl: $(B) holds the binaries and lib/libnccl.so.2 ($$(du -h $(B)/lib/libnccl.so.2 | cut -f1), from $(NCCL_LIBDIR)); $$(du -sh $(B) | cut -f1) in all"

test-nccl-gpu: gpu-nccl
	@sh tools/gpu_nccl.sh $(B)/gpu-nccl-out 420 $(B)

GPT_NCCL_RUN1 = $(B)/gpt_nccl -p 1 -m 4 --steps 2 --dim 16 --heads 2 --layers 2 --max-len 32 --seqs-per-step 8
GPT_NCCL_TRAIN = --wd 0.1 --clip 1 --warmup 1 --lr-min 1e-4 --eval-every 1 --eval-seqs 16 --save $(B)/gpt_nccl.ckpt --bucket-kb 64 --no-overlap

check-nccl: | $(B)
	@if [ "$(HAVE_NCCL)" = 1 ]; then \
	  $(MAKE) --no-print-directory $(B)/test_nccl && \
	  $(CLANG) $(BASE) $(NCCL_FLAGS) -c tests/test_nccl.c -o $(B)/nccl-clang.o && \
	  $(CXX) -std=c++11 $(WARN) -I. $(NCCL_FLAGS) -x c++ -c tests/test_nccl.c -o $(B)/nccl-cxx.o && \
	  { ! command -v $(NVCC) >/dev/null 2>&1 || $(NVCC) -std=c++17 -x cu -I. -c tests/test_nccl.c -o $(B)/nccl-nvcc.o; } && \
	  { [ "$(HAVE_MPI)" != 1 ] || $(MPICC) $(BASE) $(NCCL_FLAGS) -include mpi.h -c tests/test_nccl.c -o $(B)/nccl-mpi.o; } && \
	  echo "check-nccl: pipeline_nccl.h compiles (gcc, clang, C++, nvcc$(if $(filter 1,$(HAVE_MPI)), and with MPI)) and links" && \
	  { ! command -v $(NVCC) >/dev/null 2>&1 || { \
	    $(MAKE) --no-print-directory $(B)/gpt_nccl $(B)/gpt_nccl-nompi && \
	    if $(GPT_NCCL_RUN1) > $(B)/gpt_nccl_run1.log 2>&1; then tail -2 $(B)/gpt_nccl_run1.log; \
	    else grep -q "no CUDA device" $(B)/gpt_nccl_run1.log || { cat $(B)/gpt_nccl_run1.log; exit 1; }; \
	      echo "check-nccl: gpt_nccl builds$(if $(filter 1,$(HAVE_MPI)), with and without MPI,); no GPU here: it stops with: $$(grep -o 'no CUDA device.*' $(B)/gpt_nccl_run1.log | cut -c1-60)..."; fi && \
	    { $(GPT_NCCL_RUN1) $(GPT_NCCL_TRAIN) > $(B)/gpt_nccl_train.log 2>&1 || grep -q "no CUDA device" $(B)/gpt_nccl_train.log || { cat $(B)/gpt_nccl_train.log; exit 1; }; } && \
	    { ! $(GPT_NCCL_RUN1) --clip -1 > $(B)/gpt_nccl_bad.log 2>&1 && grep -q "clip wants a norm" $(B)/gpt_nccl_bad.log; } && \
	    { ! $(GPT_NCCL_RUN1) --bucket-kb -1 > $(B)/gpt_nccl_bad.log 2>&1 && grep -q "no-overlap" $(B)/gpt_nccl_bad.log; } && \
	    { ! $(GPT_NCCL_RUN1) --tp 3 > $(B)/gpt_nccl_bad.log 2>&1 && grep -q "must divide" $(B)/gpt_nccl_bad.log; } && \
	    { ! $(GPT_NCCL_RUN1) --tp 2 > $(B)/gpt_nccl_bad.log 2>&1 && grep -q "x --tp 2 must equal" $(B)/gpt_nccl_bad.log; } && \
	    echo "check-nccl: gpt_nccl's training options parse ($(GPT_NCCL_TRAIN)); --clip -1, --bucket-kb -1, --tp 3 (dim 16) and --tp 2 in a world of 1 are refused"; }; }; \
	else echo "check-nccl: nccl.h/libcudart not found under $(NCCL_HOME) and $(CUDA_HOME), skipped"; fi

# pipeline_mpi.h under clang and as C++ (without MPI's own C++ bindings, which are not -Wextra clean)
$(B)/clang-test_mpi.o: tests/test_mpi.c $(TEST_HDRS) $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(CLANG) $(BASE) $(CFLAGS) $$($(MPICC) -showme:compile 2>/dev/null || $(MPICC) -compile-info | cut -d' ' -f2-) -c $< -o $@

$(B)/mpi-cxx.o: tests/test_mpi.c $(TEST_HDRS) $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	OMPI_CC=$(CXX) MPICH_CC=$(CXX) $(MPICC) -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX -std=c++11 $(WARN) -I. -x c++ -c $< -o $@

# A test "binary" per world size: a script tests/run.sh runs like any other test.
# The negative control of the overlapped reduction over MPI (tests/test_mpi.c): the hook reduces
# every bucket to the end instead of starting it (MPI_Iallreduce) for the wait; the test's count
# of started buckets must fail.
$(B)/overlap-ctl-mpi-nostart: tests/test_mpi.c $(TEST_HDRS) $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DPP_TEST_NO_DP_START $(CFLAGS) $< -o $@ $(LDLIBS)
# examples/tlm_mpi.c reduces during the cool-down by default: built with the tied sum after the
# data-parallel one (PP_TEST_NO_TIED_FIRST, which only pp_dp_overlap_wait obeys), its --check
# against the sequential model must fail.
$(B)/tlm-mpi-ctl-tied-late: examples/tlm_mpi.c $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DPP_TEST_NO_TIED_FIRST $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/mpi-overlap-controls: tests/controls.sh $(B)/overlap-ctl-mpi-nostart $(B)/tlm-mpi-ctl-tied-late
	@printf '#!/bin/sh\nexec sh tests/controls.sh mpi-overlap-controls "$(MPIRUN) $(MPIRUN_FLAGS) -np 4 $(B)/overlap-ctl-mpi-nostart" "$(MPIRUN) $(MPIRUN_FLAGS) -np 4 $(B)/tlm-mpi-ctl-tied-late --pp 2 --steps 5 --check"\n' > $@ && chmod +x $@
# ---- issue 39: pp_dp_overlap over MPI after a failed step (tests/test_mpi.c, dp_abandon_case) ----
# Without the refusal of an all-reduce after an abandoned one (-DPP_TEST_NO_MPI_ABANDON) a rank
# returns PP_OK with another step's sum: the control must fail. Built without the overlap's vote
# too (-DPP_TEST_NO_DP_AGREE), whose own all-reduce would otherwise meet the abandoned one and
# hide the fault (with the vote alone, the refusal in place, test_mpi passes).
$(B)/mpi-ctl-no-abandon: tests/test_mpi.c $(TEST_HDRS) $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DPP_TEST_NO_MPI_ABANDON -DPP_TEST_NO_DP_AGREE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/mpi-dpfault-controls: tests/controls.sh $(B)/mpi-ctl-no-abandon
	@printf '#!/bin/sh\nexec sh tests/controls.sh mpi-dpfault-controls "$(MPIRUN) $(MPIRUN_FLAGS) -np 2 $(B)/mpi-ctl-no-abandon"\n' > $@ && chmod +x $@
MPI_TESTS += $(B)/mpi-dpfault-controls
ifeq ($(HAVE_MPI),1)
MPI_TESTS += $(B)/mpi-dpfault-controls
endif
# ---- end of issue 39's block ----
# A split communicator's MPI_TAG_UB taken as MPI's minimum, 32767 (-DPP_MPI_TEST_SPLIT_TAG_MIN, as
# before): Open MPI attaches the attribute to MPI_COMM_WORLD only; test_mpi's tag checks must fail.
$(B)/mpi-ctl-split-tag-min: tests/test_mpi.c $(TEST_HDRS) $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DPP_MPI_TEST_SPLIT_TAG_MIN $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/mpi-tag-controls: tests/controls.sh $(B)/mpi-ctl-split-tag-min
	@printf '#!/bin/sh\nexec sh tests/controls.sh mpi-tag-controls "$(MPIRUN) $(MPIRUN_FLAGS) -np 2 $(B)/mpi-ctl-split-tag-min"\n' > $@ && chmod +x $@
ifeq ($(HAVE_MPI),1)
MPI_TESTS += $(B)/mpi-tag-controls
endif
# the grid example, pp 2 x dp 2, against the sequential model bit for bit: the data-parallel
# reduction during the cool-down (its default) and after the step (--no-overlap)
$(B)/mpi-tlm: $(B)/tlm_mpi
	@printf '#!/bin/sh\nset -e\nfor o in "" --no-overlap; do timeout 300 $(MPIRUN) $(MPIRUN_FLAGS) -np 4 $(B)/tlm_mpi --pp 2 --steps 10 --check $$o | grep -q "equals, bit for bit"; done\necho "mpi-tlm: 2 passed, 0 failed"\n' > $@ && chmod +x $@
$(B)/mpi-np%: $(B)/test_mpi
	@printf '#!/bin/sh\nexec timeout 300 $(MPIRUN) $(MPIRUN_FLAGS) -np $* $(B)/test_mpi\n' > $@ && chmod +x $@

$(B)/test_tp_mpi: tests/test_tp_mpi.c $(TEST_HDRS) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/mpi-tp-np%: $(B)/test_tp_mpi
	@printf '#!/bin/sh\nexec timeout 300 $(MPIRUN) $(MPIRUN_FLAGS) -np $* $(B)/test_tp_mpi\n' > $@ && chmod +x $@
$(B)/tp-mpi-ctl-unordered: tests/test_tp_mpi.c $(TEST_HDRS) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DPP_TEST_TP_UNORDERED $(CTL_CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-mpi-ctl-no-gather: tests/test_tp_mpi.c $(TEST_HDRS) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DPP_TEST_TP_NO_GATHER $(CTL_CFLAGS) $< -o $@ $(LDLIBS)
# Each pipeline's outcome alone, not agreed over the TP group: the pipelines of a TP rank failed
# after the step's last TP message return PP_OK (verdict_checks).
$(B)/tp-mpi-ctl-no-tp-agree: tests/test_tp_mpi.c $(TEST_HDRS) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DPP_TEST_NO_TP_AGREE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/mpi-tp-controls: tests/controls.sh $(B)/tp-mpi-ctl-unordered $(B)/tp-mpi-ctl-no-gather $(B)/tp-mpi-ctl-no-tp-agree
	printf '#!/bin/sh\nexec sh tests/controls.sh mpi-tp-controls "$(MPIRUN) $(MPIRUN_FLAGS) -np 8 $(B)/tp-mpi-ctl-unordered" "$(MPIRUN) $(MPIRUN_FLAGS) -np 8 $(B)/tp-mpi-ctl-no-gather" "$(MPIRUN) $(MPIRUN_FLAGS) -np 4 $(B)/tp-mpi-ctl-no-tp-agree"\n' > $@
	chmod +x $@
$(B)/mpi-gpt-tp: tests/test_gpt_tp.sh tests/tp_lines.sh $(B)/gpt_mpi
	@printf '#!/bin/sh\nexec timeout 300 sh tests/test_gpt_tp.sh $(B)/gpt_mpi $(MPIRUN) $(MPIRUN_FLAGS)\n' > $@ && chmod +x $@
$(B)/mpi-ctl-gpt-tp-norow: examples/gpt_mpi.c $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) -DPP_TEST_GPT_TP_NO_ROW_REDUCE $(CTL_CFLAGS) $< -o $@ $(LDLIBS)
$(B)/mpi-gpt-tp-controls: tests/controls.sh $(B)/mpi-ctl-gpt-tp-norow
	@printf '#!/bin/sh\nexec sh tests/controls.sh mpi-gpt-tp-controls "$(MPIRUN) $(MPIRUN_FLAGS) -np 4 $(B)/mpi-ctl-gpt-tp-norow --generated --dim 32 --heads 4 --layers 2 --max-len 32 --seqs-per-step 8 -m 4 --steps 1 --tp 2 --check"\n' > $@ && chmod +x $@

# ASan+UBSan across 4 processes; leak checks off (MPI keeps its own allocations to the end)
$(B)/asan-test_mpi: tests/test_mpi.c $(TEST_HDRS) $(EXH) $(HEADERS) pipeline_mpi.h | $(B)
	$(MPICC) $(BASE) $(ASAN_FLAGS) $< -o $@ $(LDLIBS)

$(B)/mpi-asan-np%: $(B)/asan-test_mpi
	@printf '#!/bin/sh\nASAN_OPTIONS=detect_leaks=0 exec timeout 300 $(MPIRUN) $(MPIRUN_FLAGS) $(MPI_FWD_ASAN) -np $* $(B)/asan-test_mpi\n' > $@ && chmod +x $@

# checkpoints across processes: four gpt_mpi ranks write one file (gpt_cpu's bytes), two resume
# from it (tests/test_resume.sh)
$(B)/mpi-resume: tests/test_resume.sh tests/gpt_script.sh $(B)/gpt_cpu $(B)/gpt_mpi
	@printf '#!/bin/sh\nexec timeout 300 sh tests/test_resume.sh $(B)/gpt_cpu $(B)/gpt_mpi $(MPIRUN) $(MPIRUN_FLAGS)\n' > $@ && chmod +x $@
# the held-out evaluation over two ranks: pp_sequential_eval's bits, gpt_cpu's val losses
# (tests/test_trainer.sh)
$(B)/mpi-trainer: tests/test_trainer.sh tests/gpt_script.sh tests/tp_lines.sh $(B)/gpt_cpu $(B)/gpt_mpi
	@printf '#!/bin/sh\nexec timeout 300 sh tests/test_trainer.sh $(B)/gpt_cpu $(B)/gpt_mpi $(MPIRUN) $(MPIRUN_FLAGS)\n' > $@ && chmod +x $@

# make test runs the MPI scripts and test_nccl after the other tests (tests/run.sh sums them all)
TEST_BINS += $(MPI_TESTS) $(NCCL_TESTS)
test: mp-note $(MPI_BINS) $(MPI_TESTS) $(NCCL_TESTS)

mp-note:
	@[ -n "$(MPI_TESTS)" ] || echo "MPI tests skipped: $(MPICC)/$(MPIRUN) not found (apt-get install openmpi-bin libopenmpi-dev)"
	@[ -n "$(NCCL_TESTS)" ] || echo "NCCL checks skipped: nccl.h/libcudart not found under $(CUDA_HOME)"

test-mpi: $(MPI_TESTS)
	@[ -n "$(MPI_TESTS)" ] || echo "MPI tests skipped: $(MPICC)/$(MPIRUN) not found"
	@[ -z "$(MPI_TESTS)" ] || sh tests/run.sh $(MPI_TESTS)

run-mpi: $(B)/tlm_mpi
	$(MPIRUN) $(MPIRUN_FLAGS) -np 4 $(B)/tlm_mpi --pp 2

bench-mpi: $(B)/bench_mpi
	$(MPIRUN) $(MPIRUN_FLAGS) -np 4 $(B)/bench_mpi

# pp = 4 x dp = 2: over MPI where it is installed, and over the NCCL imitation
bench-overlap: $(B)/bench_overlap_nccl $(if $(filter 1,$(HAVE_MPI)),$(B)/bench_overlap_mpi)
	$(if $(filter 1,$(HAVE_MPI)),$(MPIRUN) $(MPIRUN_FLAGS) -np 8 $(B)/bench_overlap_mpi)
	$(B)/bench_overlap_nccl
