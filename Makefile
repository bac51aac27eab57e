# pipeline.h - build, test, run.   make | make test | make quick | make run | make bench | make check-cuda
#   make lint | make fuzz | make soak | make valgrind
CC      ?= cc
CLANG   ?= clang
CXX     ?= c++
NVCC    ?= $(if $(wildcard $(CUDA_HOME)/bin/nvcc),$(CUDA_HOME)/bin/nvcc,nvcc)
WARN     = -Wall -Wextra -Werror -pedantic
CFLAGS  ?= -O2 -g
BASE     = -std=c99 $(WARN) -I.
LDLIBS   = -lpthread -lm
B        = build

HEADERS  = pipeline.h
TEST_HDRS = tests/test.h tests/test_link.h tests/harness.h tests/tlm_grid.h tests/layer_calls.h tests/tp_data.h tests/tp_boundary.h
EXAMPLES = $(B)/mlp_cpu $(B)/gpt_cpu $(B)/pp-sched
TESTS    = test_schedule test_pipeline test_errors test_varlen test_gpt test_zb test_reliability test_soak test_devops test_cuda_host \
           test_model test_convenience test_cuda_pipeline test_imitation test_nccl_pipeline \
           test_nccl_grid test_agree test_validate test_gradnorm test_ckpt test_eval test_malloc
BENCHES  = $(B)/bench_overhead $(B)/bench_varlen $(B)/bench_zb $(B)/peers_ours $(B)/bench_imitation $(B)/bench_overlap_nccl

FUZZERS  = fuzz_split fuzz_sim fuzz_table fuzz_ckpt
FUZZ_RUNS ?= 20000
VALGRIND ?= valgrind
VG_TESTS = test_errors test_reliability
SOAK_STEPS ?= 5000

.PHONY: all test quick run run-gpt bench bench-validate bench-bf16 bench-peers check-cuda check-cxx check-c check-abi old-names api-doc doc-budget sections lint fuzz soak valgrind clean \
        cuda test-cuda sanitize-cuda bench-cuda

all: $(EXAMPLES) $(BENCHES)

$(B):
	@mkdir -p $(B)

EXH = $(wildcard examples/*.h)

# Negative controls (the binaries named *-ctl-*, built against a deliberately broken library)
# compile at -O0: a sixth of -O2 -g's time (a fifth with the imitations), and each one only has
# to fail, for its reason (every control was checked to fail as before at -O0, 2026-12-02).
# CTL_CFLAGS="-O2 -g" builds them as the tests are built.
CTL_CFLAGS ?= -O0
# The tests' gcc and clang builds (the sanitizers' keep -g for their reports): -O2 without debug
# information, a fifth less to compile; TEST_CFLAGS="-O2 -g" for a debugger.
TEST_CFLAGS ?= -O2
CTL_KINDS   = agree ckpt conv cuda cudap errors eval gpt_cpu gradnorm malloc model nccl ncclgrid overlap recompute rel soak mpi \
              validate zb tlm-mpi dpfault tp tp-mpi
$(foreach k,$(CTL_KINDS),$(B)/$(k)-ctl-%): CFLAGS = $(CTL_CFLAGS)

$(B)/mlp_cpu: examples/mlp_cpu.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/gpt_cpu: examples/gpt_cpu.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/pp-sched: tools/pp_sched.c $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/bench_%: bench/bench_%.c tests/harness.h $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

# The validation layer's cost: bench_overhead with it and without it (-DPP_NO_VALIDATE), side
# by side (bench/validate_cost.sh prints each figure's medians and their ratio).
$(B)/bench_overhead-novalidate: bench/bench_overhead.c tests/harness.h $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_NO_VALIDATE $(CFLAGS) $< -o $@ $(LDLIBS)
bench-validate: $(B)/bench_overhead $(B)/bench_overhead-novalidate
	sh bench/validate_cost.sh 5 --steps 5 --hidden 64 --rows 256
# bf16 activations against f32 in the CPU GPT (bench/bf16.sh: bytes sent, tokens/s, the loss
# curves side by side; docs/PERFORMANCE.md "bf16 activations").
bench-bf16: $(B)/gpt_cpu
	sh bench/bf16.sh 1 --steps 200 --warmup 20 --lr-min 3e-4 --clip 1

# Tests: gcc build, clang build, ASan+UBSan, TSan (threaded), and every header as C++.
$(B)/%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(TEST_CFLAGS) $< -o $@ $(LDLIBS)

# The clang builds are the second compiler (its warnings, its code): -DPP_TEST_SECOND_BUILD makes
# them take a sweep's heavy cases as a rotation (tests/test.h, test_heavy), as the sanitizers do;
# the gcc build runs every case.
SECOND = -DPP_TEST_SECOND_BUILD
$(B)/clang-%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CLANG) $(BASE) $(SECOND) $(TEST_CFLAGS) $< -o $@ $(LDLIBS)

$(B)/asan-%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(ASAN_FLAGS) $< -o $@ $(LDLIBS)

$(B)/tsan-%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CLANG) $(BASE) $(TSAN_FLAGS) $< -o $@ $(LDLIBS)

# The implementation once per flavour: the tests that use only the library's public names
# (LINKED_TESTS) are compiled with -DPP_TEST_LINK_IMPL, which leaves pipeline.h's implementation
# out of them, and linked with tests/impl.c's object of their flavour; it was four fifths of each
# one's compile. The flags are spelled out here (IMPL_*), not taken from BASE, which targets
# extend for themselves and make would pass on to a shared prerequisite.
LINKED_TESTS = test_pipeline test_errors test_varlen test_gpt test_zb test_devops test_recompute \
               test_validate test_gradnorm test_eval test_grid test_schedule test_tp test_dpfault test_ckpt
O           = $(B)/obj
IMPL_BASE  := -std=c99 $(WARN) -I.
LINK_DEFS   = -DPP_TEST_LINK_IMPL -D_POSIX_C_SOURCE=200809L
ASAN_FLAGS  = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN_FLAGS  = -O1 -g -fsanitize=thread
$(O):
	@mkdir -p $(O)
$(O)/impl.o: tests/impl.c $(HEADERS) | $(O)
	$(CC) $(IMPL_BASE) $(TEST_CFLAGS) -c $< -o $@
$(O)/clang-impl.o: tests/impl.c $(HEADERS) | $(O)
	$(CLANG) $(IMPL_BASE) $(TEST_CFLAGS) -c $< -o $@
$(O)/asan-impl.o: tests/impl.c $(HEADERS) | $(O)
	$(CC) $(IMPL_BASE) $(ASAN_FLAGS) -c $< -o $@
$(O)/tsan-impl.o: tests/impl.c $(HEADERS) | $(O)
	$(CLANG) $(IMPL_BASE) $(TSAN_FLAGS) -c $< -o $@
$(addprefix $(B)/,$(LINKED_TESTS)): $(B)/%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) $(O)/impl.o
	$(CC) $(BASE) $(LINK_DEFS) $(TEST_CFLAGS) $< $(O)/impl.o -o $@ $(LDLIBS)
$(addprefix $(B)/clang-,$(LINKED_TESTS)): $(B)/clang-%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) $(O)/clang-impl.o
	$(CLANG) $(BASE) $(SECOND) $(LINK_DEFS) $(TEST_CFLAGS) $< $(O)/clang-impl.o -o $@ $(LDLIBS)
$(addprefix $(B)/asan-,$(LINKED_TESTS)): $(B)/asan-%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) $(O)/asan-impl.o
	$(CC) $(BASE) $(LINK_DEFS) $(ASAN_FLAGS) $< $(O)/asan-impl.o -o $@ $(LDLIBS)
$(addprefix $(B)/tsan-,$(LINKED_TESTS)): $(B)/tsan-%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) $(O)/tsan-impl.o
	$(CLANG) $(BASE) $(LINK_DEFS) $(TSAN_FLAGS) $< $(O)/tsan-impl.o -o $@ $(LDLIBS)

# pipeline_cuda.h on the host: tests/fakecuda imitates the CUDA runtime (streams as threads).
FAKE_CUDA = $(foreach t,test_cuda_host test_cuda_pipeline,$(B)/$(t) $(B)/clang-$(t) $(B)/asan-$(t) $(B)/tsan-$(t))
$(FAKE_CUDA): BASE += -Itests/fakecuda
$(FAKE_CUDA): tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h pipeline_cuda.h

# The imitations themselves (tests/fakenccl over tests/fakecuda): each rule against a correct and
# a known-bad client. Also compiled as C++ by check-cxx.
FAKE_NCCL = $(foreach t,test_imitation test_nccl_pipeline test_nccl_grid test_tp_nccl test_tp_nccl_fault,$(B)/$(t) $(B)/clang-$(t) $(B)/asan-$(t) $(B)/tsan-$(t))
$(FAKE_NCCL): BASE += -Itests/fakenccl -Itests/fakecuda
$(FAKE_NCCL): tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h pipeline_nccl.h

# pipeline_nccl.h with the real executor over the imitations: eight ranks need eight devices
NCCL_PIPE = $(foreach t,test_nccl_pipeline test_tp_nccl_fault,$(B)/$(t) $(B)/clang-$(t) $(B)/asan-$(t) $(B)/tsan-$(t))
$(NCCL_PIPE): BASE += -DFAKECUDA_DEVICES=8

# GPU transports' host work (runtime calls per transfer, host waits per action) on the imitation;
# make test runs it once, shortly (bench-imitation-smoke)
$(B)/bench_imitation: bench/bench_imitation.c tests/harness.h tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h \
                      tests/fakenccl/nccl.h examples/mlp.h $(HEADERS) pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/bench_overlap_nccl: bench/bench_overlap.c tests/harness.h tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h \
                         tests/fakenccl/nccl.h examples/mlp.h $(HEADERS) pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DFAKECUDA_DEVICES=8 $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/bench-imitation-smoke: $(B)/bench_imitation
	@printf '#!/bin/sh\nexec $(B)/bench_imitation --smoke\n' > $@ && chmod +x $@

# the pp-sched command line (tests/test_pp_sched.sh)
$(B)/pp-sched-cli: tests/test_pp_sched.sh $(B)/pp-sched
	@printf '#!/bin/sh\nexec sh tests/test_pp_sched.sh $(B)/pp-sched\n' > $@ && chmod +x $@

# test_nccl_pipeline's `gpu` mode as tools/gpu_nccl.sh runs it on a GPU (tests/layer_staged.h's
# layers, every rank a thread on one device, NCCL_MULTI_RANK_GPU_ENABLE=1,
# CUDA_DEVICE_MAX_CONNECTIONS=32), over the imitation. `gpu 2`, the GPU run's must-pass case (two
# ranks), runs on the device's 32 queues as they are; at CUDA's default 8 the ranks' streams share
# them and the world hangs (build/nccl-controls runs that, 30 s). The whole mode (p up to 4, and 8)
# runs with a queue for every stream (FAKECUDA_MAX_CONNECTIONS=0): with NCCL's two streams per
# communicator made too, three ranks or more on one device outnumber 32 queues and hang here; on
# the GPU they are tried, not required (tools/gpu_nccl.sh).
$(B)/staged-test_nccl_pipeline: tests/test_nccl_pipeline.c tests/layer_staged.h $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DFAKECUDA_DEVICES=1 -DPP_TEST_STAGED_LAYERS $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/nccl-staged-gpu-mode: $(B)/staged-test_nccl_pipeline
	@printf '#!/bin/sh\nexport NCCL_MULTI_RANK_GPU_ENABLE=1 CUDA_DEVICE_MAX_CONNECTIONS=32\n$(B)/staged-test_nccl_pipeline gpu 2 || exit 1\nFAKECUDA_MAX_CONNECTIONS=0 exec $(B)/staged-test_nccl_pipeline gpu\n' > $@ && chmod +x $@
# tools/gpu_nccl.sh and make gpu-nccl-check against stand-ins, without a GPU (tests/test_gpu_scripts.sh);
# its negative control in build/nccl-controls runs the same checks on the script as it was before
# (commit cc8d5cc: binaries from build/, no version check, every rank count must pass), which fails them.
$(B)/gpu-scripts: tests/test_gpu_scripts.sh tools/gpu_nccl.sh tools/gpu_lib.sh tools/nccl_local.sh multiprocess.mk | $(B)
	@printf '#!/bin/sh\nexec sh tests/test_gpu_scripts.sh\n' > $@ && chmod +x $@
$(B)/gpu_nccl-before.sh: | $(B)
	git show cc8d5cc:tools/gpu_nccl.sh > $@
# A second pp_pipeline_step while one runs, without the guard that refuses it: the process crashes
# (test_convenience's concurrent step).
$(B)/conv-ctl-no-step-guard: tests/test_convenience.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_STEP_GUARD $(CFLAGS) $< -o $@ $(LDLIBS)
# A schedule table whose stage runs B1 before B0 (or W2 before W1), without the ordering rule's
# check: parsed and created as if exact (test_convenience's table order).
$(B)/conv-ctl-no-order-check: tests/test_convenience.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_ORDER_CHECK $(CFLAGS) $< -o $@ $(LDLIBS)
# The NaN/Inf checks (test_reliability's nonfinite, test_cuda_pipeline's nan): without the default
# loss check a NaN loss passes, on threads and on CUDA stages; with only the stage's output
# scanned the message names the stage's last layer, not the layer that wrote the NaN.
$(B)/rel-ctl-no-loss-check: tests/test_reliability.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_LOSS_CHECK $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/rel-ctl-no-layer-scan: tests/test_reliability.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_LAYER_SCAN $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/cudap-ctl-no-loss-check: tests/test_cuda_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h pipeline_cuda.h | $(B)
	$(CC) $(BASE) -Itests/fakecuda -DPP_TEST_NO_LOSS_CHECK $(CFLAGS) $< -o $@ $(LDLIBS)
# pp_simulate forming p * v before it refuses v = INT_MAX (test_errors overflow, under the
# sanitizers, which turn the overflow into a failure).
$(B)/errors-ctl-header-bounds: tests/test_errors.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -DPP_TEST_NO_HEADER_BOUNDS $< -o $@ $(LDLIBS)
# BROADCAST keeping one metadata buffer when the other's allocation failed: the next step
# unpacks into NULL (SEGV), or leaks the one kept (test_soak nomem).
$(B)/soak-ctl-bc-pair: tests/test_soak.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_BC_PAIR $(CFLAGS) $< -o $@ $(LDLIBS)
# pp_pipeline_rank_result saying PP_OK for ranks a failed step never ran (test_soak nomem).
$(B)/soak-ctl-not-run: tests/test_soak.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_NOT_RUN $(CFLAGS) $< -o $@ $(LDLIBS)
ERRORS_CTL = $(B)/conv-ctl-no-step-guard $(B)/conv-ctl-no-order-check $(B)/rel-ctl-no-loss-check $(B)/rel-ctl-no-layer-scan \
             $(B)/cudap-ctl-no-loss-check $(B)/errors-ctl-header-bounds $(B)/soak-ctl-bc-pair $(B)/soak-ctl-not-run
$(B)/errors-controls: tests/controls.sh $(ERRORS_CTL)
	printf '#!/bin/sh\nexec sh tests/controls.sh errors-controls "$(B)/conv-ctl-no-step-guard" "$(B)/conv-ctl-no-order-check order" "$(B)/rel-ctl-no-loss-check nonfinite" "$(B)/rel-ctl-no-layer-scan nonfinite" "$(B)/cudap-ctl-no-loss-check nan" "$(B)/errors-ctl-header-bounds overflow" "$(B)/soak-ctl-bc-pair nomem" "$(B)/soak-ctl-bc-pair nomem-msg" "$(B)/soak-ctl-not-run nomem"\n' > $@
	chmod +x $@
# Every schedule kind at p = 8 over the NCCL imitation: eighteen layers (two chunks a rank).
$(B)/deep-test_nccl_pipeline: tests/test_nccl_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DFAKECUDA_DEVICES=8 -DPP_TEST_DEEP $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/nccl-p8: $(B)/deep-test_nccl_pipeline
	@printf '#!/bin/sh\nexec $(B)/deep-test_nccl_pipeline p8\n' > $@ && chmod +x $@
# The validation layer's negative control (tests/test_validate.c): without the guards
# (-DPP_NO_VALIDATE) the layers' writes past their buffers go unnamed: the steps return PP_OK or
# the process crashes, and the test must fail.
$(B)/validate-ctl-novalidate: tests/test_validate.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_NO_VALIDATE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/validate-controls: tests/controls.sh $(B)/validate-ctl-novalidate
	printf '#!/bin/sh\nexec sh tests/controls.sh validate-controls "$(B)/validate-ctl-novalidate"\n' > $@
	chmod +x $@
TEST_BINS_EXTRA = $(B)/gpt-resume $(B)/gpt-trainer $(B)/nccl-p8 $(B)/tp-verdict-wrap $(B)/nccl-no-host-hang $(B)/nccl-staged-gpu-mode $(B)/gpu-scripts $(B)/bench-imitation-smoke $(B)/pp-sched-cli $(B)/agree-controls $(B)/zb-controls $(B)/cuda-controls $(B)/nccl-controls $(B)/errors-controls \
                  $(B)/validate-controls $(B)/gradnorm-controls $(B)/ckpt-controls $(B)/eval-controls $(B)/malloc-controls \
                  $(B)/overlap-controls $(B)/bf16-controls $(B)/model-controls

# Negative controls of tests/test_model.c (PP_MODEL_ORDER and the lists from the params hook):
# every layer of a kind given index 0 of it (no-index), the order ignored (the list's order:
# list-order), and the derived gradient lists' layers one off (gbufs-off); each must fail.
$(B)/model-ctl-order-no-index: tests/test_model.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_ORDER_NO_INDEX $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/model-ctl-order-list-order: tests/test_model.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_ORDER_LIST_ORDER $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/model-ctl-gbufs-off: tests/test_model.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_GBUFS_LAYER_OFF $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/model-controls: tests/controls.sh $(B)/model-ctl-order-no-index $(B)/model-ctl-order-list-order $(B)/model-ctl-gbufs-off
	printf '#!/bin/sh\nexec sh tests/controls.sh model-controls "$(B)/model-ctl-order-no-index order" "$(B)/model-ctl-order-list-order order" "$(B)/model-ctl-gbufs-off lists"\n' > $@
	chmod +x $@

# Negative controls of tests/test_gradnorm.c: the norm's per-layer sums added rank by rank (each
# rank's layers, then the ranks' totals) instead of in layer order, and the loss scaler's found-Inf
# flag not shared (each rank skips or keeps its step alone); with tensor parallelism, replicated
# parameters counted once per TP rank (tp), and the scaler's groups without the TP group
# (tpscaler); each must fail.
$(B)/gradnorm-ctl-no-norm-order: tests/test_gradnorm.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_NORM_ORDER $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/gradnorm-ctl-no-scaler-agree: tests/test_gradnorm.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_SCALER_AGREE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/gradnorm-ctl-tp-replicated-each: tests/test_gradnorm.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_REPLICATED_EACH $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/gradnorm-ctl-tp-scaler-no-tp: tests/test_gradnorm.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_SCALER_NO_TP $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/gradnorm-controls: tests/controls.sh $(B)/gradnorm-ctl-no-norm-order $(B)/gradnorm-ctl-no-scaler-agree \
                        $(B)/gradnorm-ctl-tp-replicated-each $(B)/gradnorm-ctl-tp-scaler-no-tp
	printf '#!/bin/sh\nexec sh tests/controls.sh gradnorm-controls "$(B)/gradnorm-ctl-no-norm-order order" "$(B)/gradnorm-ctl-no-norm-order norm" "$(B)/gradnorm-ctl-no-scaler-agree scaler" "$(B)/gradnorm-ctl-no-scaler-agree tpscaler" "$(B)/gradnorm-ctl-tp-replicated-each tp" "$(B)/gradnorm-ctl-tp-scaler-no-tp tpscaler"\n' > $@
	chmod +x $@
# Negative controls of the overlapped data-parallel reduction (tests/test_grid.c): the executor
# never calls the gradients-final hook (every bucket waits for the end: the test's count of
# buckets reduced inside the step fails), and the tied sum after the tied layers' data-parallel
# sum (the gradients differ from the reference); and (tests/test_zb.c final) the hook fired at a
# stage's last B where W is deferred (its gradients change after it); and coalesce ignored (three
# adjacent buffers take three all-reduces); each must fail.
$(B)/overlap-ctl-no-hook: tests/test_grid.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_GRADS_FINAL $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/overlap-ctl-tied-late: tests/test_grid.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_TIED_FIRST $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/overlap-ctl-final-at-b: tests/test_zb.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_GRADS_FINAL_AT_B $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/overlap-ctl-no-coalesce: tests/test_grid.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_DP_COALESCE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/overlap-controls: tests/controls.sh $(B)/overlap-ctl-no-hook $(B)/overlap-ctl-tied-late $(B)/overlap-ctl-final-at-b \
                       $(B)/overlap-ctl-no-coalesce
	printf '#!/bin/sh\nexec sh tests/controls.sh overlap-controls "$(B)/overlap-ctl-no-hook" "$(B)/overlap-ctl-tied-late" "$(B)/overlap-ctl-final-at-b final" "$(B)/overlap-ctl-no-coalesce"\n' > $@
	chmod +x $@
# The checkpoints' negative control (tests/test_ckpt.c): without the checksums compared
# (-DPP_TEST_NO_CKPT_CHECKSUM) a flipped byte loads silently, and the test must fail; with the
# tensor-parallel slices laid out in reverse rank order (-DPP_TEST_CKPT_TP_ORDER) `tp` must fail.
$(B)/ckpt-ctl-no-checksum: tests/test_ckpt.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_CKPT_CHECKSUM $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/ckpt-ctl-tp-order: tests/test_ckpt.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_CKPT_TP_ORDER $(CFLAGS) $< -o $@ $(LDLIBS)
# A sharded save whose write fails on TP rank 0: without the outcome sent to the other TP ranks
# (PP_TEST_CKPT_TP_OUTCOME_OFF) they return PP_OK, and test_ckpt tp fails.
$(B)/ckpt-ctl-tp-outcome-off: tests/test_ckpt.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_CKPT_TP_OUTCOME_OFF $(CFLAGS) $< -o $@ $(LDLIBS)
# A sharded save whose slices go to TP rank 0 unasked, under one tag (PP_TEST_CKPT_PUSH, as before):
# a save that fails on TP rank 0 leaves them queued, and the next save writes them (test_ckpt tp).
$(B)/ckpt-ctl-tp-push: tests/test_ckpt.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_CKPT_PUSH $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/ckpt-controls: tests/controls.sh $(B)/ckpt-ctl-no-checksum $(B)/ckpt-ctl-tp-order $(B)/ckpt-ctl-tp-outcome-off $(B)/ckpt-ctl-tp-push
	printf '#!/bin/sh\nexec sh tests/controls.sh ckpt-controls "$(B)/ckpt-ctl-no-checksum corrupt" "$(B)/ckpt-ctl-tp-order tp" "$(B)/ckpt-ctl-tp-outcome-off tp" "$(B)/ckpt-ctl-tp-push tp"\n' > $@
	chmod +x $@
# Checkpoints through examples/gpt_cpu.c (tests/test_resume.sh): --check-resume, and files saved
# at p = 4 interleaved and resumed at p = 2 1F1B equal to an uninterrupted run's, byte for byte.
$(B)/gpt-resume: tests/test_resume.sh tests/gpt_script.sh $(B)/gpt_cpu
	@printf '#!/bin/sh\nexec sh tests/test_resume.sh $(B)/gpt_cpu\n' > $@ && chmod +x $@
# The loop around the step in examples/gpt_cpu.c (tests/test_trainer.sh): --eval-every's val
# loss equal to pp_sequential_eval's bits at p = 4, 2, 1, a run with evaluations saving the bytes
# of one without, AdamW's decay and the warm-up's rate.
$(B)/gpt-trainer: tests/test_trainer.sh tests/gpt_script.sh tests/tp_lines.sh $(B)/gpt_cpu
	@printf '#!/bin/sh\nexec sh tests/test_trainer.sh $(B)/gpt_cpu\n' > $@ && chmod +x $@
# Its --dtype bf16 part's negative control: a gpt_cpu whose --dtype bf16 leaves the activations
# f32 (-DPP_TEST_NO_GPT_BF16): the bytes are not halved nor the loss another, and it must fail.
$(B)/gpt_cpu-ctl-no-bf16: examples/gpt_cpu.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_GPT_BF16 $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/bf16-controls: tests/controls.sh tests/test_trainer.sh $(B)/gpt_cpu-ctl-no-bf16
	printf '#!/bin/sh\nexec sh tests/controls.sh bf16-controls "env TRAINER_PART=bf16 sh tests/test_trainer.sh $(B)/gpt_cpu-ctl-no-bf16"\n' > $@
	chmod +x $@

# Negative controls of tests/test_eval.c: an evaluation's stashes kept to the step's end (the
# peak check of the grid fails), and the step's kind left out of the step's identity (a rank that
# trains while the others evaluate runs into its deadline: the sync case fails).
$(B)/eval-ctl-nofree: BASE += -DPP_TEST_NO_EVAL_FREE
$(B)/eval-ctl-nosync: BASE += -DPP_TEST_NO_EVAL_SYNC
$(B)/eval-ctl-%: tests/test_eval.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/eval-controls: tests/controls.sh $(B)/eval-ctl-nofree $(B)/eval-ctl-nosync
	printf '#!/bin/sh\nexec sh tests/controls.sh eval-controls "$(B)/eval-ctl-nofree grid" "$(B)/eval-ctl-nosync sync"\n' > $@
	chmod +x $@

# Negative controls of tests/test_agree.c: without the tags' generation, or without the step
# agreement (each without the plan check, which would hide them), it must fail.
$(B)/agree-ctl-nogen: BASE += -DPP_TEST_NO_PLAN_CHECK -DPP_TEST_NO_GEN
$(B)/agree-ctl-noagree: BASE += -DPP_TEST_NO_PLAN_CHECK -DPP_TEST_NO_AGREE
$(B)/agree-ctl-nombcheck: BASE += -DPP_TEST_NO_MB_CHECK
# The PP_MALLOC sweep's negative control (tests/test_malloc.c): without the step's identity from
# rank 0 and the agreement's abort, a failed allocation in the agreement splits the ranks for good.
$(B)/malloc-ctl-noresync: tests/test_malloc.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_GO -DPP_TEST_NO_AGREE_ABORT $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/malloc-controls: tests/controls.sh $(B)/malloc-ctl-noresync
	printf '#!/bin/sh\nexec sh tests/controls.sh malloc-controls "$(B)/malloc-ctl-noresync control"\n' > $@
	chmod +x $@
# The plan check without the micro-batches' layouts: ranks whose cu_seqlens differ at the same
# rows per micro-batch return PP_OK under LOCAL (test_agree seqbounds).
$(B)/agree-ctl-noseqhash: BASE += -DPP_TEST_NO_SEQ_HASH
$(B)/agree-ctl-nogo: BASE += -DPP_TEST_NO_GO
$(B)/agree-ctl-noabort: BASE += -DPP_TEST_NO_AGREE_ABORT
$(B)/agree-ctl-%: tests/test_agree.c tests/test.h tests/harness.h $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/agree-controls: tests/controls.sh $(B)/agree-ctl-nogen $(B)/agree-ctl-noagree $(B)/agree-ctl-nombcheck $(B)/agree-ctl-nogo $(B)/agree-ctl-noabort \
                     $(B)/agree-ctl-noseqhash
	printf '#!/bin/sh\nexec sh tests/controls.sh agree-controls "$(B)/agree-ctl-nogen controls" "$(B)/agree-ctl-noagree controls" "$(B)/agree-ctl-nombcheck controls" "$(B)/agree-ctl-nogo skew" "$(B)/agree-ctl-noabort fault" "$(B)/agree-ctl-noseqhash seqbounds"\n' > $@
	chmod +x $@

# Negative controls of tests/test_zb.c: the turn of the V sent to itself again, the B-only
# scratch kept until W (the W share's peak_mem then differs from the simulator's), and V-Min's
# cap before 2026-11-28 (5 chunks at p = 4: the grid's peaks go over the authors'); each must fail.
$(B)/zb-ctl-nohandover: tests/test_zb.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_HANDOVER $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/zb-ctl-nobfree: tests/test_zb.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_B_FREE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/zb-ctl-oldvmincap: tests/test_zb.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_OLD_VMIN_CAP $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/zb-controls: tests/controls.sh $(B)/zb-ctl-nohandover $(B)/zb-ctl-nobfree $(B)/zb-ctl-oldvmincap
	printf '#!/bin/sh\nexec sh tests/controls.sh zb-controls "$(B)/zb-ctl-nohandover turn" "$(B)/zb-ctl-nobfree wshare" "$(B)/zb-ctl-oldvmincap grid"\n' > $@
	chmod +x $@

# tests/test_recompute.c (activation recomputation, pp_plan_recompute) and its negative controls:
# the B skips the recompute (stale scratch and activations; also over the NCCL imitation,
# test_nccl_pipeline's `recompute`), and the plan must beat the hand choices by 10%; each must
# fail. Added here, before the test rule.
TESTS += test_recompute
$(B)/recompute-ctl-norecompute: tests/test_recompute.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_RECOMPUTE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/recompute-ctl-slack: tests/test_recompute.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPLAN_SLACK=0.9 $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/recompute-ctl-nccl: tests/test_nccl_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DFAKECUDA_DEVICES=8 -DPP_TEST_NO_RECOMPUTE $(CFLAGS) $< -o $@ $(LDLIBS)
# gpt_cpu whose B skips the recompute: test_trainer.sh's --recompute part must fail on it
$(B)/gpt_cpu-ctl-no-recompute: examples/gpt_cpu.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_RECOMPUTE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/recompute-controls: tests/controls.sh tests/test_trainer.sh $(B)/recompute-ctl-norecompute $(B)/recompute-ctl-slack $(B)/recompute-ctl-nccl \
                         $(B)/gpt_cpu-ctl-no-recompute
	printf '#!/bin/sh\nexec sh tests/controls.sh recompute-controls "$(B)/recompute-ctl-norecompute" "$(B)/recompute-ctl-slack" "$(B)/recompute-ctl-nccl recompute" "env TRAINER_PART=recompute sh tests/test_trainer.sh $(B)/gpt_cpu-ctl-no-recompute"\n' > $@
	chmod +x $@
TEST_BINS_EXTRA += $(B)/recompute-controls
BENCHES += $(B)/bench_recompute

# ---- issue 39: the failure paths' negative controls (build/failpath-controls); each must fail ----
# test_ckpt: a save written in place (the file truncated first, the layers' data unchecked), the
# user bytes read at the desc's header size (a partial load refused); test_eval: a bad output
# rank refused before the step's agreement (the other ranks wait to their deadline); test_gradnorm:
# max_norm = DBL_MAX refused; test_recompute: the planner's old bounds (mem_cap 1e300 refused, v
# not checked before p * v).
FAILPATH_CTL = $(B)/ckpt-ctl-in-place $(B)/ckpt-ctl-user-at-desc $(B)/eval-ctl-bad-rank-early \
               $(B)/gradnorm-ctl-clip-bound $(B)/recompute-ctl-plan-bounds
$(B)/ckpt-ctl-in-place: BASE += -DPP_TEST_CKPT_IN_PLACE
$(B)/ckpt-ctl-user-at-desc: BASE += -DPP_TEST_CKPT_USER_AT_DESC
$(B)/ckpt-ctl-in-place $(B)/ckpt-ctl-user-at-desc: tests/test_ckpt.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/eval-ctl-bad-rank-early: tests/test_eval.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_EVAL_RANK_EARLY $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/gradnorm-ctl-clip-bound: tests/test_gradnorm.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_OLD_CLIP_BOUND $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/recompute-ctl-plan-bounds: tests/test_recompute.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_OLD_PLAN_BOUNDS $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/failpath-controls: tests/controls.sh $(FAILPATH_CTL)
	printf '#!/bin/sh\nexec sh tests/controls.sh failpath-controls "$(B)/ckpt-ctl-in-place save" "$(B)/ckpt-ctl-user-at-desc partial" "$(B)/eval-ctl-bad-rank-early badrank" "$(B)/gradnorm-ctl-clip-bound clipbound" "$(B)/recompute-ctl-plan-bounds planbounds"\n' > $@
	chmod +x $@
TEST_BINS_EXTRA += $(B)/failpath-controls
# ---- end of issue 39's block ----
# ---- tests/test_dpfault.c: the data-parallel path's failures (issue 39, items 1-3) ----------
# A fault sweep over a pp 2 x dp 2 threads grid (sampled: PP_TEST_FULL=1 runs every case,
# PP_TEST_SEED picks the sample), the grid's agreement on the step (agree), the one-deadline wait,
# the scale check. Negative controls, each must fail: no step identity on the dp wire, a deadline
# per started bucket, NaN/Inf scale taken, no agreement (each rank keeps its own outcome).
TESTS += test_dpfault
$(B)/dpfault-ctl-no-step-id: tests/test_dpfault.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_DP_STEP_ID $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/dpfault-ctl-deadline-each: tests/test_dpfault.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_DP_ONE_DEADLINE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/dpfault-ctl-no-scale-check: tests/test_dpfault.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_DP_SCALE_CHECK $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/dpfault-ctl-no-agree: tests/test_dpfault.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_DP_AGREE $(CFLAGS) $< -o $@ $(LDLIBS)
# plain (pp_dp_agree, then pp_grad_allreduce): pp_dp_agree exchanging nothing (each member keeps
# its own outcome): the good replica reduces alone, waits a deadline, and its leftovers give the
# next steps' sums wrong with PP_OK.
$(B)/dpfault-ctl-agree-alone: tests/test_dpfault.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_DP_AGREE_ALONE $(CFLAGS) $< -o $@ $(LDLIBS)
# Over the NCCL imitation (tests/test_nccl_grid.c fault: a layer failing on one replica): no
# vote (the good replica takes the failed step's sums as PP_OK), and a failed rank that skips
# its wait's all-reduces (the collectives meet out of order: the grid hangs to its deadline).
$(B)/ncclgrid-ctl-no-agree: BASE += -DPP_TEST_NO_DP_AGREE
$(B)/ncclgrid-ctl-same-order: BASE += -DPP_TEST_NO_DP_SAME_ORDER
$(B)/ncclgrid-ctl-copy-untimed: BASE += -DPP_NCCL_TEST_COPY_UNTIMED
$(B)/dpfault-controls: tests/controls.sh $(B)/dpfault-ctl-no-step-id $(B)/dpfault-ctl-deadline-each $(B)/dpfault-ctl-no-scale-check \
                       $(B)/dpfault-ctl-no-agree $(B)/dpfault-ctl-agree-alone $(B)/ncclgrid-ctl-no-agree $(B)/ncclgrid-ctl-same-order $(B)/ncclgrid-ctl-copy-untimed
	printf '#!/bin/sh\nexec sh tests/controls.sh dpfault-controls "$(B)/dpfault-ctl-no-step-id sweep" "$(B)/dpfault-ctl-deadline-each deadline" "$(B)/dpfault-ctl-no-scale-check scale" "$(B)/dpfault-ctl-no-agree agree" "$(B)/dpfault-ctl-agree-alone plain" "$(B)/ncclgrid-ctl-no-agree fault" "timeout 10 $(B)/ncclgrid-ctl-same-order fault" "timeout 10 $(B)/ncclgrid-ctl-copy-untimed fault"\n' > $@
	chmod +x $@
TEST_BINS_EXTRA += $(B)/dpfault-controls
# ---- tests/test_tp.c: the pp x dp x tp grid and the TP collectives (issue 40) ----------------
# (tests/test_tp_nccl.c: the collectives over pipeline_nccl.h on the imitation, FAKE_NCCL above;
# tests/test_tp_mpi.c: over MPI, multiprocess.mk)
# Its negative controls must fail: each rank sums every copy itself, its own first (at tp = 4 the
# ranks' bits differ from each other and from the sequential sum); pp_grid_tp_split colours by
# stage alone (the replicas' TP groups merged: the split's groups are not g.tp_group); the split
# boundaries never gathered; slices of rows / tp with the remainder dropped (odd row counts).
TESTS += test_tp test_tp_nccl
# tests/test_tp_nccl_fault.c: a layer failing on one TP rank of a pp 2 x dp 2 x tp 2 grid whose
# layers' TP collectives run in stream order (pp_nccl_tp_allreduce), before its all-reduce (a
# partner's collective stuck on its GPU) and after its last one; pp_nccl_grid_recover after it.
# Its controls: each host wait its own deadline, not the stuck collective's (4.1 s at a 2 s
# deadline); the failed member's verdict exchange a deadline of its own (4.1 s); recover's vote
# without a deadline (a rank that never votes: a hang, ended by its timeout); recover without the vote (replica 1 keeps its grid, replica 0 splits again), the
# grid kept, a failed member that only tells its verdict (its partners' sends wait for a receive:
# their communicators aborted where nothing had to be), no TP verdict at all (a hang: timeout).
TESTS += test_tp_nccl_fault
TP_FAULT_DEPS = tests/test_tp_nccl_fault.c $(TEST_HDRS) $(HEADERS) tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h \
  pipeline_cuda.h pipeline_nccl.h
TP_FAULT_CC = $(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DFAKECUDA_DEVICES=8
# And a layer's TP collective inside a stage given no TP group allowed, as before (test_tp undeclared).
$(B)/tp-ctl-undeclared-ok: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_UNDECLARED_OK $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-fault-due: $(TP_FAULT_DEPS) | $(B)
	$(TP_FAULT_CC) -DPP_NCCL_TEST_TP_NO_DUE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-fault-full: $(TP_FAULT_DEPS) | $(B)
	$(TP_FAULT_CC) -DPP_TEST_TP_VERDICT_FULL_WAIT $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-fault-untimed: $(TP_FAULT_DEPS) | $(B)
	$(TP_FAULT_CC) -DPP_NCCL_TEST_RECOVER_UNTIMED $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-fault-alone: $(TP_FAULT_DEPS) | $(B)
	$(TP_FAULT_CC) -DPP_NCCL_TEST_RECOVER_ALONE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-fault-kept: $(TP_FAULT_DEPS) | $(B)
	$(TP_FAULT_CC) -DPP_TEST_FAULT_NO_REBUILD $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-fault-tell: $(TP_FAULT_DEPS) | $(B)
	$(TP_FAULT_CC) -DPP_TEST_TP_VERDICT_TELL_ONLY $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-fault-unagreed: $(TP_FAULT_DEPS) | $(B)
	$(TP_FAULT_CC) -DPP_TEST_NO_TP_AGREE $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-unordered: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_UNORDERED $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-split-no-dp: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_SPLIT_NO_DP $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-no-gather: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_NO_GATHER $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-even-slice: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_EVEN_SLICE $(CFLAGS) $< -o $@ $(LDLIBS)
# And the fixed TP tags inside a step: the step after a failed one takes its leftovers ("stale").
$(B)/tp-ctl-no-step-tag: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_NO_STEP_TAG $(CFLAGS) $< -o $@ $(LDLIBS)
# And each pipeline's outcome alone, not agreed over the TP group: a layer failing after the step's
# last TP message on one TP rank leaves the other pipeline returning PP_OK ("stale", run 3).
$(B)/tp-ctl-no-tp-agree: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_NO_TP_AGREE $(CFLAGS) $< -o $@ $(LDLIBS)
# The TP verdict's tag repeating every step (it does every 4096): the step after a failed one meets
# the verdict the failed rank left unreceived, and must pass it over ("stale" in tp-verdict-wrap);
# taken (-DPP_TEST_TP_VERDICT_NO_SKIP), that rank fails a clean step alone.
$(B)/tp-verdict-mod1: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_VERDICT_MASK=0 $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-verdict-wrap: $(B)/tp-verdict-mod1
	@printf '#!/bin/sh\nexec $(B)/tp-verdict-mod1 stale\n' > $@ && chmod +x $@
$(B)/tp-ctl-verdict-no-skip: tests/test_tp.c $(TEST_HDRS) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_TP_VERDICT_MASK=0 -DPP_TEST_TP_VERDICT_NO_SKIP $(CFLAGS) $< -o $@ $(LDLIBS)
# tests/test_pipeline.c "grid" (pp_pipeline with dp and tp): the step skips the data-parallel sum
# (every dp = 2 case's gradients are one replica's); the layers get the dp group as io->tp (every
# tp = 2 case's products are summed over the wrong ranks, or not at all).
$(B)/tp-ctl-pl-no-dp-sum: tests/test_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -D_POSIX_C_SOURCE=200809L -DPP_TEST_PL_NO_DP_SUM $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-pl-tp-is-dp: tests/test_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -D_POSIX_C_SOURCE=200809L -DPP_TEST_PL_TP_IS_DP $(CFLAGS) $< -o $@ $(LDLIBS)
# And "matrix": the layers of pipeline ranks past the first sum their partial products in reverse
# (p > 1 differs from p = 1 in the last bits, at every tp).
$(B)/tp-ctl-pl-matrix-order: tests/test_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -D_POSIX_C_SOURCE=200809L -DPP_TEST_PL_MATRIX_ORDER $(CFLAGS) $< -o $@ $(LDLIBS)
# And gpt_cpu --dp 2 with that step (tests/test_trainer.sh, TRAINER_PART=dp): --check fails.
$(B)/gpt_cpu-ctl-no-dp-sum: examples/gpt_cpu.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_PL_NO_DP_SUM $(CFLAGS) $< -o $@ $(LDLIBS)
# And gpt_cpu --tp 2 (TRAINER_PART=tp) whose blocks skip the attention projection's row-parallel
# all-reduce (examples/gpt.h): the check against tp 1 and the losses' closeness fail.
$(B)/gpt_cpu-ctl-tp-no-row: examples/gpt_cpu.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -DPP_TEST_GPT_TP_NO_ROW_REDUCE $(CFLAGS) $< -o $@ $(LDLIBS)
# tests/test_gpt_tp_nccl.c: examples/gpt.h's GPT with Megatron-style TP over pipeline_nccl.h's
# pp 2 x tp 2 grid on the imitation (one gcc build: the collectives' sanitizer runs are
# test_tp_nccl's). Its control drops the attention projection's row-parallel all-reduce.
GPT_TP_NCCL_DEPS = tests/test_gpt_tp_nccl.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakenccl/nccl.h \
  tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h pipeline_nccl.h
$(B)/test_gpt_tp_nccl: $(GPT_TP_NCCL_DEPS) | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-gpt-nccl-norow: $(GPT_TP_NCCL_DEPS) | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DPP_TEST_GPT_TP_NO_ROW_REDUCE $(CFLAGS) $< -o $@ $(LDLIBS)
TEST_BINS_EXTRA += $(B)/test_gpt_tp_nccl
# Its boundaries go split over TP with device blocks (the gather over g.tp reads and writes them):
# once under ThreadSanitizer, where a copy or collective not ordered after its writer races; and
# with the gather dropped (PP_TEST_TP_NO_GATHER), which must fail its bits.
$(B)/tsan-test_gpt_tp_nccl: $(GPT_TP_NCCL_DEPS) | $(B)
	$(CLANG) $(BASE) -Itests/fakenccl -Itests/fakecuda $(TSAN_FLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-gpt-nccl-nogather: $(GPT_TP_NCCL_DEPS) | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DPP_TEST_TP_NO_GATHER $(CFLAGS) $< -o $@ $(LDLIBS)
TEST_BINS_EXTRA += $(B)/tsan-test_gpt_tp_nccl
# tests/test_tp_nccl.c's stream-ordered device collectives (pp_nccl_tp_*): the host waiting for
# the collective (the gate kernel before it times out), pp_nccl_step_end not waiting for them (a
# member that never calls is not a timeout), and no warm-up all-reduce at create (the first
# collective sets NCCL's ring up inside the run).
TP_NCCL_DEPS = tests/test_tp_nccl.c tests/tp_data.h $(TEST_HDRS) $(HEADERS) tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h \
  pipeline_cuda.h pipeline_nccl.h
$(B)/tp-ctl-nccl-host-wait: $(TP_NCCL_DEPS) | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DPP_NCCL_TEST_TP_HOST_WAIT $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-unwaited: $(TP_NCCL_DEPS) | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DPP_NCCL_TEST_TP_UNWAITED $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-ctl-nccl-no-warmup: $(TP_NCCL_DEPS) | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DPP_NCCL_TEST_NO_WARMUP $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/tp-controls: tests/controls.sh tests/test_trainer.sh $(B)/tp-ctl-unordered $(B)/tp-ctl-split-no-dp $(B)/tp-ctl-pl-no-dp-sum \
                  $(B)/tp-ctl-pl-tp-is-dp $(B)/gpt_cpu-ctl-no-dp-sum $(B)/tp-ctl-gpt-nccl-norow $(B)/gpt_cpu-ctl-tp-no-row \
                  $(B)/tp-ctl-no-gather $(B)/tp-ctl-even-slice $(B)/tp-ctl-pl-matrix-order $(B)/tp-ctl-no-step-tag $(B)/tp-ctl-no-tp-agree $(B)/tp-ctl-verdict-no-skip \
                  $(B)/tp-ctl-nccl-host-wait $(B)/tp-ctl-nccl-unwaited $(B)/tp-ctl-gpt-nccl-nogather $(B)/tp-ctl-nccl-no-warmup \
                  $(B)/tp-ctl-undeclared-ok $(B)/tp-ctl-nccl-fault-due $(B)/tp-ctl-nccl-fault-full $(B)/tp-ctl-nccl-fault-untimed \
                  $(B)/tp-ctl-nccl-fault-alone $(B)/tp-ctl-nccl-fault-kept $(B)/tp-ctl-nccl-fault-tell \
                  $(B)/tp-ctl-nccl-fault-unagreed
	printf '#!/bin/sh\nexec sh tests/controls.sh tp-controls "$(B)/tp-ctl-unordered coll" "$(B)/tp-ctl-split-no-dp grid" "$(B)/tp-ctl-pl-no-dp-sum grid" "$(B)/tp-ctl-pl-tp-is-dp grid" "env TRAINER_PART=dp sh tests/test_trainer.sh $(B)/gpt_cpu-ctl-no-dp-sum" "$(B)/tp-ctl-gpt-nccl-norow" "env TRAINER_PART=tp sh tests/test_trainer.sh $(B)/gpt_cpu-ctl-tp-no-row" "$(B)/tp-ctl-no-gather boundary" "$(B)/tp-ctl-even-slice boundary" "$(B)/tp-ctl-pl-matrix-order matrix" "$(B)/tp-ctl-no-step-tag stale" "$(B)/tp-ctl-no-tp-agree stale" "$(B)/tp-ctl-verdict-no-skip stale" "$(B)/tp-ctl-nccl-host-wait" "$(B)/tp-ctl-nccl-unwaited" "$(B)/tp-ctl-gpt-nccl-nogather" "$(B)/tp-ctl-nccl-no-warmup" "$(B)/tp-ctl-undeclared-ok undeclared" "timeout 60 $(B)/tp-ctl-nccl-fault-due before" "timeout 60 $(B)/tp-ctl-nccl-fault-full before" "timeout 15 $(B)/tp-ctl-nccl-fault-untimed novote" "timeout 60 $(B)/tp-ctl-nccl-fault-alone before" "timeout 60 $(B)/tp-ctl-nccl-fault-kept before" "timeout 60 $(B)/tp-ctl-nccl-fault-tell after" "timeout 15 $(B)/tp-ctl-nccl-fault-unagreed after"\n' > $@
	chmod +x $@
TEST_BINS_EXTRA += $(B)/tp-controls
# ---- end of test_dpfault's block ------------------------------------------------------------

# Negative control of tests/test_cuda_host.c's early copy: made on the sender's own stream (behind
# its later work), it must fail.
$(B)/cuda-ctl-early-on-stream: tests/test_cuda_host.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h | $(B)
	$(CC) $(BASE) -Itests/fakecuda -DPP_TEST_EARLY_COPY_ON_STREAM $(CFLAGS) $< -o $@ $(LDLIBS)
# And of tests/test_cuda_pipeline.c's rare early copies: a send done once its receive is posted
# puts its block back before the receiver pulled it, and a sixth of the transfers are copied early.
$(B)/cuda-ctl-done-at-post: tests/test_cuda_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h pipeline_cuda.h | $(B)
	$(CC) $(BASE) -Itests/fakecuda -DPP_CUDA_TEST_SEND_DONE_AT_POST $(CFLAGS) $< -o $@ $(LDLIBS)
# And of the spares of early copies: one taken again without waiting for its last reader hands
# that reader the next message's bytes.
$(B)/cuda-ctl-spare-no-wait: tests/test_cuda_host.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h | $(B)
	$(CC) $(BASE) -Itests/fakecuda -DPP_CUDA_TEST_SPARE_NO_WAIT $(CFLAGS) $< -o $@ $(LDLIBS)
# And of the spares' sizes: with none made, every early copy of the varlen run falls back.
$(B)/cuda-ctl-no-spares: tests/test_cuda_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h pipeline_cuda.h | $(B)
	$(CC) $(BASE) -Itests/fakecuda -DPP_CUDA_TEST_NO_SPARES $(CFLAGS) $< -o $@ $(LDLIBS)
# And of the device ops' copy (the gradient norm on device gradients): a copy not ordered after
# the rank's stream reads a gradient before the kernel writing it ran.
$(B)/cuda-ctl-copy-unordered: tests/test_cuda_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h pipeline_cuda.h | $(B)
	$(CC) $(BASE) -Itests/fakecuda -DPP_CUDA_TEST_COPY_UNORDERED $(CFLAGS) $< -o $@ $(LDLIBS)
# And of the host's waits on the GPU (pp_cuda_desc.timeout_s): a block's free, the device ops' copy
# and pp_cuda_destroy waiting in cudaStreamSynchronize stay behind a kernel that never ends
# (test_cuda_pipeline's "deadline": each returns only when the stand-in kernel gives up, 6 s).
$(B)/cuda-ctl-unbounded-waits: tests/test_cuda_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h pipeline_cuda.h | $(B)
	$(CC) $(BASE) -Itests/fakecuda -DPP_CUDA_TEST_UNBOUNDED_WAITS $(CFLAGS) $< -o $@ $(LDLIBS)
$(B)/cuda-controls: tests/controls.sh $(B)/cuda-ctl-early-on-stream $(B)/cuda-ctl-done-at-post $(B)/cuda-ctl-spare-no-wait $(B)/cuda-ctl-no-spares \
                    $(B)/cuda-ctl-copy-unordered $(B)/cuda-ctl-unbounded-waits
	printf '#!/bin/sh\nexec sh tests/controls.sh cuda-controls "$(B)/cuda-ctl-early-on-stream early" "$(B)/cuda-ctl-done-at-post early" "$(B)/cuda-ctl-spare-no-wait spare" "env PP_TEST_POOL_STEPS=200 $(B)/cuda-ctl-no-spares varlen" "$(B)/cuda-ctl-copy-unordered graddev" "$(B)/cuda-ctl-unbounded-waits deadline"\n' > $@
	chmod +x $@

# Negative controls built from tests/test_nccl_pipeline.c, each with one -D (rule below). Together
# over a minute (64 s, 2026-12-02; about 28 s more since the deadline and GPU-script controls): several must hang to a deadline of 2-3 s, or run the staged
# gpu mode into its 30 s timeout, which is how they show the rule they guard. The
# drained failure: with the stage aborting as before, the peers wait for their deadline (3 s
# here) and the test fails.
$(B)/nccl-ctl-nodrain: BASE += -DPP_TEST_NO_DRAIN
# The default channel count: one channel for every schedule, unchecked, hangs interleaved p = 2
# in the imitation (the check picks two or more for it).
$(B)/nccl-ctl-one-channel: BASE += -DPP_NCCL_TEST_ONE_CHANNEL
# A send counted done once the compute stream waited for a later group of its channel: counted
# on another channel's waits, interleaved p = 2 (two channels) loses bit-exactness.
$(B)/nccl-ctl-wrong-channel: BASE += -DPP_NCCL_TEST_WRONG_CHANNEL
# A group of sends without a completion event: counted done when a host wait asks, a wait for
# its send returns before the receive was even posted (test_nccl_pipeline's "sends").
$(B)/nccl-ctl-eventless-done: BASE += -DPP_NCCL_TEST_EVENTLESS_DONE
# A released block taking a receive too early: counted free from the compute stream's last
# record before its release, the receive overwrites it under a slow reader ("sends").
$(B)/nccl-ctl-released-now: BASE += -DPP_NCCL_TEST_RELEASED_NOW
# The executor zeroing a gradient workspace's received bytes before its receive: a receive that
# no longer waits for the compute stream lands first, and the zeros win (rank 0's compute stream
# held back 5 ms per forward layer, PP_TEST_DEVICE_DELAY_US, so that it does every time).
$(B)/nccl-ctl-zero-received: BASE += -DPP_TEST_ZERO_RECEIVED -DPP_NO_VALIDATE
# The same with the executor's debug check on: it names the write between take and receive.
$(B)/nccl-ctl-zero-caught: BASE += -DPP_TEST_ZERO_RECEIVED
# Sends proven done by a later message of their peer (_ppn_proven): without the rule the first
# and last ranks' pools hold their sends to the step's end ("sends"); with any message of the
# peer counted as proof, blocks are rewritten under NCCL and interleaved p = 2 goes wrong.
$(B)/nccl-ctl-no-proof: BASE += -DPP_NCCL_TEST_NO_PROOF
$(B)/nccl-ctl-proof-any: BASE += -DPP_NCCL_TEST_PROOF_ANY
# NCCL's lazy connection set-up left to first use (no _ppn_connect): 1F1B p = 3 waits in a cycle at
# the hosts (the imitation gives up after FAKENCCL_CONNECT_TIMEOUT), and p = 2 sets up during steps.
$(B)/nccl-ctl-no-preconnect: BASE += -DPP_NCCL_TEST_NO_PRECONNECT
# Issue 42: every pair connected on every channel in use, whatever the schedule talks over
# (1F1B p = 8: rank 3 holds 7 + 7 connections, not its neighbours' and rank 0's 3 + 3).
$(B)/nccl-ctl-connect-all: BASE += -DPP_NCCL_TEST_CONNECT_ALL
# NCCL_COMM_SPLIT_SHARE_RESOURCES=1 not refused: the channels share one launch queue and hang.
$(B)/nccl-ctl-share-unchecked: BASE += -DPP_NCCL_TEST_SHARE_UNCHECKED
# More channels than CUDA_DEVICE_MAX_CONNECTIONS leaves queues for, not refused.
$(B)/nccl-ctl-queues-unchecked: BASE += -DPP_NCCL_TEST_QUEUES_UNCHECKED
# NCCL's own two streams per communicator not counted: four channels accepted on CUDA's default 8
# queues, where NCCL's deviceStreams share queues with the channels' streams and the step hangs.
$(B)/nccl-ctl-old-queues: BASE += -DPP_NCCL_TEST_OLD_QUEUES
# NCCL_LAUNCH_ORDER_IMPLICIT not read: several channels under NCCL's launch order hang.
$(B)/nccl-ctl-order-ignored: BASE += -DPP_NCCL_TEST_ORDER_IGNORED
# A host receive unstaged by a blocking cudaMemcpy: behind nccl-ctl-old-queues' stuck shared queue
# a host never comes back (tests/no_hang.sh's watchdog ends it). build/nccl-no-host-hang is the
# positive side: the library as it is comes back from the same run by its deadlines. Both run
# with the device holding 7 queues where the library reads 8 (FAKECUDA_MAX_CONNECTIONS): since
# the imitation makes NCCL's streams at init, at 8 the legacy stream's copy no longer lands
# behind a stuck kernel, and the blocking control came back too.
$(B)/nccl-ctl-unstage-blocking: BASE += -DPP_NCCL_TEST_OLD_QUEUES -DPP_NCCL_TEST_UNSTAGE_BLOCKING
# A stream more than the queue count allows (1 + 3 per channel; test_nccl_pipeline's queues mode
# counts each rank's): a host receive's copy on a stream of the transport's own, and pp_cuda's side
# stream made at create though NCCL never uses it. Together they took the compute stream's queue
# at two channels on CUDA's default 8, and interleaved p = 4 hung by chance (4 runs in 48).
$(B)/nccl-ctl-copy-stream: BASE += -DPP_NCCL_TEST_COPY_STREAM
$(B)/nccl-ctl-eager-side: BASE += -DPP_CUDA_TEST_EAGER_SIDE
$(B)/nccl-no-host-hang: tests/no_hang.sh $(B)/nccl-ctl-old-queues
	@printf '#!/bin/sh\nexec sh tests/no_hang.sh 120 env FAKECUDA_MAX_CONNECTIONS=7 PP_TEST_NCCL_TIMEOUT=3 $(B)/nccl-ctl-old-queues queues\n' > $@ && chmod +x $@
# The host's waits (test_nccl_pipeline's "deadlines N", each case alone under a 6 s watchdog): the connection
# set-up's wait for its empty messages deaf to NCCL's asynchronous error (a failed peer costs the
# whole 5 s deadline); a group's launch settled against PP_DEFAULT_TIMEOUT_S, not the transport's
# timeout_s; pp_nccl_destroy waiting in cudaStreamSynchronize for a send never received, or
# freeing a staging buffer the caller's communicator's send still uses (cudaFree waits for it).
$(B)/nccl-ctl-connect-no-async: BASE += -DPP_NCCL_TEST_CONNECT_NO_ASYNC
$(B)/nccl-ctl-flush-default-timeout: BASE += -DPP_NCCL_TEST_FLUSH_DEFAULT_TIMEOUT
$(B)/nccl-ctl-destroy-unbounded: BASE += -DPP_NCCL_TEST_DESTROY_UNBOUNDED
$(B)/nccl-ctl-destroy-frees: BASE += -DPP_NCCL_TEST_DESTROY_FREES
$(B)/nccl-ctl-%: tests/test_nccl_pipeline.c $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DFAKECUDA_DEVICES=8 $(CFLAGS) $< -o $@ $(LDLIBS)
# Built from tests/test_nccl_grid.c: the overlapped data-parallel reduction over the grid's dp
# communicator. Every bucket blocking the hook (no started all-reduce) fails its "all started"
# check; an all-reduce enqueued without waiting for the compute stream reads the gradients (host:
# staged; device: the slow kernel's memory) before the backward wrote them.
# Issue 42: the dp and tied transports made like a pipeline's (channels split, every pair
# connected both ways on each: the memory check, dp holding point-to-point connections, fails);
# no warm-up all-reduce at create (NCCL sets the ring up inside step 0: its set-up count fails).
$(B)/ncclgrid-ctl-dp-channels: BASE += -DPP_NCCL_TEST_DP_CHANNELS
$(B)/ncclgrid-ctl-no-warmup: BASE += -DPP_NCCL_TEST_NO_WARMUP
$(B)/ncclgrid-ctl-dp-nostart: BASE += -DPP_TEST_NO_DP_START
$(B)/ncclgrid-ctl-dp-unordered: BASE += -DPP_NCCL_TEST_DP_UNORDERED
# The grid's pipe counting its own streams only (queues_held 0): at 14 queues it takes 2 channels
# for interleaved p = 2 where the grid's 15 streams do not fit, and the refusal check fails.
$(B)/ncclgrid-ctl-grid-unheld: BASE += -DPP_NCCL_TEST_GRID_UNHELD
$(B)/ncclgrid-ctl-%: tests/test_nccl_grid.c tests/tlm_grid.h $(TEST_HDRS) $(EXH) $(HEADERS) tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda $(CFLAGS) $< -o $@ $(LDLIBS)
# The block pool over pp_nccl (built from the bench): a send counted done once issued lets the
# stage write a block NCCL still reads, and bench_imitation's gradients come out wrong. It runs
# with 32 queues, so the transport takes its channels per direction and kind (at CUDA's default 8
# it now makes two, which leaves the overwrite a narrower window: 1 run in 3 caught it).
$(B)/nccl-ctl-early-reuse: bench/bench_imitation.c tests/harness.h tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h \
                           tests/fakenccl/nccl.h examples/mlp.h $(HEADERS) pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(BASE) -Itests/fakenccl -Itests/fakecuda -DPP_NCCL_TEST_EARLY_REUSE $(CFLAGS) $< -o $@ $(LDLIBS)
# nccl-controls runs about 78 s (2026-12-07), three controls at a time: most must hang to a
# deadline (2-3 s each, the staged gpu mode's 30 s) and the run waits more than it computes (26 s
# on a core of 78 s alone), so the controls share the time and not a build.
$(B)/nccl-controls: tests/controls.sh $(B)/nccl-ctl-nodrain $(B)/nccl-ctl-early-reuse $(B)/nccl-ctl-one-channel $(B)/nccl-ctl-wrong-channel \
                    $(B)/nccl-ctl-eventless-done $(B)/nccl-ctl-released-now $(B)/nccl-ctl-zero-received $(B)/nccl-ctl-no-proof \
                    $(B)/nccl-ctl-proof-any $(B)/nccl-ctl-no-preconnect $(B)/nccl-ctl-connect-all $(B)/nccl-ctl-share-unchecked \
                    $(B)/nccl-ctl-queues-unchecked $(B)/nccl-ctl-old-queues $(B)/nccl-ctl-order-ignored $(B)/nccl-ctl-unstage-blocking $(B)/nccl-ctl-zero-caught $(B)/staged-test_nccl_pipeline \
                    $(B)/nccl-ctl-copy-stream $(B)/nccl-ctl-eager-side $(B)/test_nccl_grid \
                    $(B)/ncclgrid-ctl-dp-nostart $(B)/ncclgrid-ctl-dp-unordered $(B)/ncclgrid-ctl-dp-channels $(B)/ncclgrid-ctl-no-warmup $(B)/ncclgrid-ctl-grid-unheld $(B)/nccl-ctl-connect-no-async \
                    $(B)/nccl-ctl-flush-default-timeout $(B)/nccl-ctl-destroy-unbounded $(B)/nccl-ctl-destroy-frees $(B)/gpu_nccl-before.sh
	printf '#!/bin/sh\nCONTROLS_JOBS=3 exec sh tests/controls.sh nccl-controls "env PP_TEST_DRAIN_DEADLINE=3 $(B)/nccl-ctl-nodrain drain" "env CUDA_DEVICE_MAX_CONNECTIONS=32 $(B)/nccl-ctl-early-reuse --steps 2" "env PP_TEST_NCCL_TIMEOUT=3 $(B)/nccl-ctl-one-channel one interleaved 2 2 4" "$(B)/nccl-ctl-wrong-channel one interleaved 2 2 5" "$(B)/nccl-ctl-eventless-done sends" "$(B)/nccl-ctl-released-now sends" "env PP_TEST_DEVICE_DELAY_US=5000 $(B)/nccl-ctl-zero-received one interleaved 2 2 4 2" "$(B)/nccl-ctl-no-proof sends" "$(B)/nccl-ctl-proof-any one interleaved 2 2 5" "env FAKENCCL_CONNECT_TIMEOUT=2 $(B)/nccl-ctl-no-preconnect one 1f1b 3 1 4" "$(B)/nccl-ctl-no-preconnect one 1f1b 2 1 3" "$(B)/nccl-ctl-connect-all neighbours" "env PP_TEST_NCCL_TIMEOUT=2 $(B)/nccl-ctl-share-unchecked share" "env PP_TEST_NCCL_RENDEZVOUS=1 PP_QUICK=1 $(B)/nccl-ctl-queues-unchecked" "env PP_TEST_NCCL_TIMEOUT=3 $(B)/nccl-ctl-old-queues queues" "env PP_TEST_NCCL_TIMEOUT=3 $(B)/nccl-ctl-order-ignored queues" "sh tests/no_hang.sh 45 env FAKECUDA_MAX_CONNECTIONS=7 PP_TEST_NCCL_TIMEOUT=3 $(B)/nccl-ctl-unstage-blocking queues" "$(B)/nccl-ctl-copy-stream queues" "$(B)/nccl-ctl-eager-side queues" "$(B)/nccl-ctl-zero-caught one interleaved 2 2 4" "env NCCL_MULTI_RANK_GPU_ENABLE=1 CUDA_DEVICE_MAX_CONNECTIONS=8 timeout 30 $(B)/staged-test_nccl_pipeline gpu" "env CUDA_DEVICE_MAX_CONNECTIONS=8 $(B)/test_nccl_grid" "$(B)/ncclgrid-ctl-dp-nostart" "$(B)/ncclgrid-ctl-dp-unordered" "$(B)/ncclgrid-ctl-dp-channels" "$(B)/ncclgrid-ctl-no-warmup" "$(B)/ncclgrid-ctl-grid-unheld queues" "$(B)/nccl-ctl-connect-no-async deadlines 0" "$(B)/nccl-ctl-connect-no-async deadlines 4" "$(B)/nccl-ctl-flush-default-timeout deadlines 1" "$(B)/nccl-ctl-destroy-unbounded deadlines 2" "$(B)/nccl-ctl-destroy-frees deadlines 3" "sh tests/test_gpu_scripts.sh $(B)/gpu_nccl-before.sh"\n' > $@
	chmod +x $@

$(B)/cxx-imitation.o: tests/test_imitation.c $(TEST_HDRS) tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h | $(B)
	$(CXX) -std=c++11 -Wall -Wextra -Werror -I. -Itests/fakenccl -Itests/fakecuda -x c++ -c $< -o $@

$(B)/cxx-check.o: tests/cxx_check.cc $(HEADERS) | $(B)
	$(CXX) -std=c++11 -Wall -Wextra -Werror -I. -c $< -o $@

check-cxx: $(B)/cxx-check.o $(B)/cxx-imitation.o

# every header as C (declarations alone, then with the implementation), gcc and clang
$(B)/c-check.o: tests/c_check.c $(HEADERS) | $(B)
	$(CC) $(BASE) -c $< -o $@
	$(CLANG) $(BASE) -c $< -o $(B)/c-check-clang.o

# the implementation after the C library's headers (they fix the feature set first)
$(B)/c-impl-order.o: tests/c_impl_order.c $(HEADERS) | $(B)
	$(CC) $(BASE) -c $< -o $@
	$(CLANG) $(BASE) -c $< -o $(B)/c-impl-order-clang.o

# every public name of the earlier API still compiles, links and works (tests/old_names.c), gcc
# and clang; without the deprecated aliases (its negative control) the file must not compile.
OLD_NAMES_FLAGS = $(BASE) -Itests/fakenccl -Itests/fakecuda
$(B)/old-names: tests/old_names.c tests/test.h examples/mlp.h $(HEADERS) pipeline_cuda.h pipeline_nccl.h | $(B)
	$(CC) $(OLD_NAMES_FLAGS) -O0 $< -o $@ $(LDLIBS)
	$(CLANG) $(OLD_NAMES_FLAGS) -O0 $< -o $@-clang $(LDLIBS)

old-names: $(B)/old-names
	@$(B)/old-names && $(B)/old-names-clang && \
	  if $(CC) $(OLD_NAMES_FLAGS) -DOLD_NAMES_CONTROL -c tests/old_names.c -o $(B)/old-names-ctl.o 2>/dev/null; then \
	    echo "old-names: FAILED, the control without the aliases compiled"; exit 1; \
	  else echo "old-names: the control without the aliases fails to compile, as it must"; fi

# docs/api.md names every public function, type, struct field, macro and enum value. Its controls
# each delete one line of it (a function, a struct field, an enum value) and must fail naming it.
API_DOC_CONTROLS = pp_grid_rank pp_stage_desc.timeout_s PP_ERR_CORRUPT
api-doc: | $(B)
	@sh tests/api_doc.sh && for name in $(API_DOC_CONTROLS); do \
	  grep -vF -e "- \`$$name\` —" docs/api.md > $(B)/api-doc-control.md; \
	  if out=$$(sh tests/api_doc.sh $(B)/api-doc-control.md); then \
	    echo "api-doc: FAILED, the control without $$name's line passed"; exit 1; fi; \
	  printf '%s\n' "$$out" | grep -q " $$name is public but not in" || \
	    { echo "api-doc: FAILED, the control without $$name's line did not name it: $$out"; exit 1; }; \
	  echo "api-doc control, the line of $$name deleted: $$(printf '%s\n' "$$out" | grep " $$name is public") (exit 1)"; done

# README.md and docs/ stay short enough to read (README <= 400 lines, README + docs/*.md <= 3000),
# and every relative link among them resolves, anchors included; its control (a README 400 lines
# longer, with a broken link) must fail naming both.
doc-budget: | $(B)
	@sh tests/doc_budget.sh && { cat README.md; seq 1 400; echo '[gone](docs/none.md)'; } > $(B)/doc-budget-control.md && \
	  if out=$$(DOC_README=$(B)/doc-budget-control.md sh tests/doc_budget.sh); then \
	    echo "doc-budget: FAILED, the control with a long README and a broken link passed"; exit 1; fi; \
	  printf '%s\n' "$$out" | grep -q 'docs/none.md' && printf '%s\n' "$$out" | grep -q 'README.md is' || \
	    { echo "doc-budget: FAILED, the control did not name what it broke: $$out"; exit 1; }; \
	  echo "doc-budget control (400 lines and a broken link added) fails, as it must"

# pipeline.h's SECTIONS map matches its >>markers; the control renames one marker and must fail.
sections: | $(B)
	@sh tests/sections.sh && sed 's|^/\* >>impl-stage-exec|/* >>impl-stage-run|' pipeline.h > $(B)/sections-control.h && \
	  if sh tests/sections.sh $(B)/sections-control.h > /dev/null; then \
	    echo "sections: FAILED, the control with a renamed marker passed"; exit 1; fi

check-c: $(B)/c-check.o $(B)/c-impl-order.o check-abi old-names api-doc doc-budget sections

# a configuration that sizes public structs must agree across files: a mismatch fails to link.
# tests/abi_user.c refers to every function linked under the configuration's name (ABI_FNS);
# against an implementation with another value of each of the four macros, each must be undefined.
# Linked with no implementation at all, the undefined names must say to define it.
ABI_FNS = stage_create pipeline_create model_check model_layer_name model_layer_costs partition_model \
          partition_print sequential_step profile_layers simulate flight_last flight_print flight_print_fd \
          threads_flight threads_transport stage_flight grid_make grid_rank grid_pipe_split grid_dp_split grid_tied_split \
          grid_make_tp grid_rank_tp grid_tp_split \
          ckpt_size ckpt_save ckpt_load ckpt_save_file ckpt_load_file ckpt_save_mem ckpt_load_mem \
          sequential_eval stage_eval pipeline_eval
check-abi: | $(B)
	@$(CC) $(BASE) -c tests/abi_impl.c -o $(B)/abi-impl.o && $(CC) $(BASE) -c tests/abi_user.c -o $(B)/abi-user.o && \
	  $(CC) $(B)/abi-user.o $(B)/abi-impl.o -o $(B)/abi-same $(LDLIBS) && $(B)/abi-same && \
	  if $(CC) $(B)/abi-user.o -o $(B)/abi-none $(LDLIBS) 2>$(B)/abi-none.log; then \
	    echo "check-abi: FAILED, a file linked without the implementation"; exit 1; fi && \
	  for f in $(ABI_FNS); do grep -q "pp_$${f}_abi_t4_r256_f32_k16_define_PIPELINE_IMPLEMENTATION_in_one_file" $(B)/abi-none.log || \
	    { echo "check-abi: FAILED, pp_$$f's undefined name without the implementation has no hint"; exit 1; }; done && \
	  for cfg in PP_MAX_TENSORS=8 PP_MAX_RANKS=64 PP_FLIGHT_LEN=16 PP_MAX_LAYER_KINDS=8; do \
	    $(CC) $(BASE) -D$$cfg -c tests/abi_impl.c -o $(B)/abi-impl-other.o || exit 1; \
	    if $(CC) $(B)/abi-user.o $(B)/abi-impl-other.o -o $(B)/abi-mismatch $(LDLIBS) 2>$(B)/abi-mismatch.log; then \
	      echo "check-abi: FAILED, a file with the defaults linked against an implementation with $$cfg"; exit 1; fi; \
	    for f in $(ABI_FNS); do grep -q "pp_$${f}_abi_t4_r256_f32_k16" $(B)/abi-mismatch.log || \
	      { echo "check-abi: FAILED, pp_$$f links against an implementation with $$cfg"; exit 1; }; done; \
	  done && \
	  echo "check-abi: the same configuration links and runs; another value of any of the four macros leaves each of the $(words $(ABI_FNS)) functions unresolved; without the implementation each one's name says to define PIPELINE_IMPLEMENTATION"

# Static analysis of the headers: cppcheck (declarations, and with the implementation) and
# clang-tidy (checks in .clang-tidy, over tests/lint.c). A tool that is not installed is skipped.
lint: | $(B)
	@if command -v cppcheck >/dev/null 2>&1; then \
	  cppcheck -q --std=c99 --enable=warning,portability,performance --error-exitcode=1 -D__CPPCHECK__ $(HEADERS) && \
	  cppcheck -q --std=c99 --enable=warning,portability,performance --error-exitcode=1 -D__CPPCHECK__ -DPIPELINE_IMPLEMENTATION $(HEADERS) && \
	  echo "lint: cppcheck clean on $(HEADERS)"; \
	else echo "lint: cppcheck not found, skipped"; fi
	@if command -v clang-tidy >/dev/null 2>&1; then \
	  if out=$$(clang-tidy --quiet tests/lint.c -- -std=c99 -I. 2>&1); then echo "lint: clang-tidy clean on $(HEADERS)"; \
	  else printf '%s\n' "$$out"; echo "lint: clang-tidy found problems"; exit 1; fi; \
	else echo "lint: clang-tidy not found, skipped"; fi

# Fuzz targets. fuzzrun-*: replay the seed corpus and fixed random inputs (any compiler, part of
# make test, under ASan+UBSan). fuzz-*: libFuzzer (clang); make fuzz runs each FUZZ_RUNS times
# from the seed corpus (new inputs go to build/fuzz-work, the repo's corpus is left alone).
$(B)/fuzzrun-%: tests/fuzz/%.c tests/fuzz/fuzz.h $(HEADERS) $(O)/asan-impl.o | $(B)
	$(CC) $(BASE) $(LINK_DEFS) $(ASAN_FLAGS) -DPP_FUZZ_STANDALONE $< $(O)/asan-impl.o -o $@ $(LDLIBS)

$(B)/fuzz-%: tests/fuzz/%.c tests/fuzz/fuzz.h $(HEADERS) | $(B)
	$(CLANG) $(BASE) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $< -o $@ $(LDLIBS)

# FUZZ_RUNS inputs per target, or FUZZ_SECONDS each at most (0: no limit): fuzz_sim's cost-aware
# generators under ASan take some 40 ms an input, and 20,000 of them 15 minutes; the four
# targets run two at a time. What each did is printed ("N runs").
FUZZ_SECONDS ?= 150
fuzz: $(addprefix $(B)/fuzz-,$(FUZZERS))
	@printf '%s\n' $(FUZZERS) | xargs -P 2 -I{} sh -c 'mkdir -p $(B)/fuzz-work/{} && \
	  if ! $(B)/fuzz-{} -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECONDS) -seed=1 -artifact_prefix=$(B)/fuzz-work/{}- \
	       $(B)/fuzz-work/{} tests/fuzz/corpus/{} > $(B)/fuzz-work/{}.log 2>&1; then \
	    tail -40 $(B)/fuzz-work/{}.log; echo "{}: FINDING (input saved as $(B)/fuzz-work/{}-crash-*)"; exit 1; fi; \
	  n=$$(grep -ao "Done [0-9]* runs" $(B)/fuzz-work/{}.log | grep -o "[0-9]*"); \
	  echo "{}: $$n runs, no finding"'


# The long soak: thousands of steps with changing shapes (make test runs a short one).
soak: $(B)/test_soak
	$(B)/test_soak --steps $(SOAK_STEPS)

# memcheck on a small subset (make test runs it too when valgrind is installed)
valgrind: $(addprefix $(B)/,$(VG_TESTS))
	@sh tests/run.sh $(addprefix valgrind:$(B)/,$(VG_TESTS))

# the examples under clang too (the tests already build with both)
$(B)/clang-ex-%: examples/%.c $(EXH) $(HEADERS) | $(B)
	$(CLANG) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

TEST_BINS = $(addprefix $(B)/,$(TESTS)) $(addprefix $(B)/clang-,$(TESTS)) \
            $(addprefix $(B)/asan-,$(TESTS)) $(addprefix $(B)/tsan-,$(TESTS)) \
            $(addprefix $(B)/fuzzrun-,$(FUZZERS)) $(TEST_BINS_EXTRA)

# The run: TEST_JOBS binaries at a time (most of the slow ones wait on deadlines and imitated
# devices, not on a core), the slowest first (TEST_FIRST) so that the runners finish together.
# The sampled sweeps' seed is new each run and printed first: PP_TEST_SEED=N make test repeats a
# run; make test-full runs every case of every sweep (PP_TEST_FULL=1).
TEST_JOBS ?= 3
TEST_FIRST = $(addprefix $(B)/,tsan-test_nccl_pipeline tsan-test_zb nccl-controls asan-test_nccl_pipeline tsan-test_schedule \
             clang-test_nccl_pipeline test_nccl_pipeline asan-test_zb dpfault-controls tsan-test_recompute \
             recompute-controls failpath-controls tsan-test_malloc mpi-np8 asan-test_malloc tsan-test_reliability \
             asan-test_reliability)
ifndef PP_TEST_SEED
PP_TEST_SEED := $(shell date +%s)
endif
export PP_TEST_SEED PP_TEST_FULL
test: $(TEST_BINS) $(EXAMPLES) $(BENCHES) $(B)/clang-ex-mlp_cpu $(B)/clang-ex-gpt_cpu check-cxx check-c lint
	@echo "make test: PP_TEST_SEED=$(PP_TEST_SEED)$(if $(PP_TEST_FULL), PP_TEST_FULL=$(PP_TEST_FULL)), $(TEST_JOBS) at a time"
	@PP_TEST_JOBS=$(TEST_JOBS) PP_TEST_TIMES=$(B)/test-times.txt sh tests/run.sh $(filter $(TEST_BINS),$(TEST_FIRST)) $(addprefix valgrind:$(B)/,$(VG_TESTS)) \
	  $(filter-out $(TEST_FIRST),$(TEST_BINS))

.PHONY: test-full
test-full:
	@$(MAKE) --no-print-directory test PP_TEST_FULL=1

# The main job: the GPU example where nvcc and a GPU are present (CPU=1 forces the CPU one).
run: $(B)/mlp_cpu
	@if [ -z "$(CPU)" ] && command -v $(NVCC) >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 \
	   && nvidia-smi -L 2>/dev/null | grep -q GPU; then \
	  echo "make run: a GPU is here, running the GPU example (make run CPU=1 for the CPU one)"; \
	  $(MAKE) --no-print-directory $(B)/gpt_cuda && $(B)/gpt_cuda -p 4 --check; \
	else $(B)/mlp_cpu --check; fi
	@echo "next: $(B)/mlp_cpu --schedule zb-v -p 2 --check (any schedule, one flag); make run-gpt (a GPT on packed" \
	      "variable-length text); $(B)/pp-sched zb-h1 -p 4 -m 8 (a schedule's timeline); the README's quick start"

run-gpt: $(B)/gpt_cpu
	$(B)/gpt_cpu --check

bench: $(BENCHES)
	$(B)/bench_overhead
	$(B)/bench_varlen
	$(B)/bench_zb
	$(B)/bench_imitation
	$(B)/bench_recompute

# Side by side with torch.distributed.pipelining (docs/PERFORMANCE.md). Ours links OpenBLAS's
# cblas when it is installed (libopenblas-dev), else the naive kernel; PEERS_KERNEL=naive forces it.
OPENBLAS := $(shell printf '\043include <cblas.h>\nint main(void){cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,1,1,1,1.0f,0,1,0,1,0.0f,0,1);return 0;}\n' | $(CC) -x c - -lopenblas -o /dev/null 2>/dev/null && echo yes)
ifeq ($(PEERS_KERNEL),naive)
OPENBLAS :=
endif
PEERS_BLAS = $(if $(OPENBLAS),-DPEERS_CBLAS,)
PEERS_LIBS = $(if $(OPENBLAS),-lopenblas,)
PYTHON ?= python3

$(B)/peers_ours: bench/peers/ours.c tests/harness.h $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $(PEERS_BLAS) $< -o $@ $(PEERS_LIBS) $(LDLIBS)

bench-peers: $(B)/peers_ours
	$(PYTHON) bench/peers/run_peers.py --ours $(B)/peers_ours $(PEERS_ARGS)

# CUDA: every header must compile under nvcc (host C++), even on machines without a GPU;
# pipeline_cuda.h also as C99 (gcc, CUDA include path). `make cuda` builds every .cu.
CUDA_HOME ?= /usr/local/cuda
NVFLAGS  ?= -O2 -std=c++17 $(NVCC_ARCH_FLAGS) \
            -Xcompiler -Wall,-Wextra,-Werror
CUDA_BINS = $(B)/test_cuda $(B)/gpt_cuda $(B)/bubble_cuda $(B)/peers_ours_cuda $(B)/test_gptc_tp
CUDA_HDRS = pipeline.h pipeline_cuda.h

$(B)/test_cuda: tests/test_cuda.cu $(TEST_HDRS) $(CUDA_HDRS) | $(B)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ -lpthread

$(B)/gpt_cuda: examples/gpt_cuda.cu examples/gpt_cuda.h examples/gpt_loop.h examples/gpt_data.h examples/gpt_traffic.h examples/splitmix.h $(CUDA_HDRS) | $(B)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ -lcublas -lpthread

# TP in gpt_cuda.h's model, on the host (tests/test_gptc_tp.cu); its controls drop the attention
# projection's all-reduce (PP_TEST_GPTC_TP_NO_ROW_REDUCE) and flag no buffer a shard for the norm
# (PP_TEST_GPTC_TP_UNSHARDED): each must fail.
GPTC_TP_DEPS = tests/test_gptc_tp.cu examples/gpt_cuda.h examples/gpt_loop.h examples/gpt_data.h examples/gpt_traffic.h \
  examples/splitmix.h tests/test.h tests/harness.h $(CUDA_HDRS)
$(B)/test_gptc_tp: $(GPTC_TP_DEPS) | $(B)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ -lcublas -lpthread
$(B)/gptc-tp-ctl-norow: $(GPTC_TP_DEPS) | $(B)
	$(NVCC) $(NVFLAGS) -DPP_TEST_GPTC_TP_NO_ROW_REDUCE -I. $< -o $@ -lcublas -lpthread
$(B)/gptc-tp-ctl-unsharded: $(GPTC_TP_DEPS) | $(B)
	$(NVCC) $(NVFLAGS) -DPP_TEST_GPTC_TP_UNSHARDED -I. $< -o $@ -lcublas -lpthread

$(B)/bubble_cuda: bench/bubble_cuda.cu tests/harness.h $(CUDA_HDRS) | $(B)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ -lpthread

$(B)/peers_ours_cuda: bench/peers/ours_cuda.cu tests/harness.h $(CUDA_HDRS) | $(B)
	$(NVCC) $(NVFLAGS) -I. $< -o $@ -lcublas -lpthread

check-cuda: | $(B)
	@if command -v $(NVCC) >/dev/null 2>&1; then \
	  $(NVCC) -std=c++17 -x cu -I. -c tests/cxx_check.cc -o $(B)/nvcc-check.o && \
	  $(NVCC) -std=c++17 -x cu -I. -DPIPELINE_IMPLEMENTATION -Xcompiler -Wall,-Wextra,-Werror -c pipeline_cuda.h -o $(B)/nvcc-cuda-check.o && \
	  $(CC) $(BASE) -isystem $(CUDA_HOME)/include -DPIPELINE_IMPLEMENTATION -x c -c pipeline_cuda.h -o $(B)/cuda-c99-check.o && \
	  $(CXX) -std=c++11 -Wall -Wextra -Werror -I. -isystem $(CUDA_HOME)/include -DPIPELINE_IMPLEMENTATION -x c++ -c pipeline_cuda.h -o $(B)/cuda-cxx-check.o && \
	  $(MAKE) --no-print-directory cuda && \
	  $(B)/test_cuda && \
	  $(B)/test_gptc_tp && $(MAKE) --no-print-directory $(B)/gptc-tp-ctl-norow $(B)/gptc-tp-ctl-unsharded && \
	  sh tests/controls.sh gptc-tp-controls "$(B)/gptc-tp-ctl-norow" "$(B)/gptc-tp-ctl-unsharded" && \
	  $(B)/gpt_cuda --cpu --check -p 4 -m 4 --steps 3 --dim 16 --heads 2 --layers 2 --max-len 32 --seqs-per-step 8 > $(B)/gpt_cuda_cpu.log && \
	  tail -1 $(B)/gpt_cuda_cpu.log && \
	  $(B)/gpt_cuda --cpu --check -p 4 -m 4 --steps 3 --dim 16 --heads 2 --layers 2 --max-len 32 --seqs-per-step 8 --dtype bf16 > $(B)/gpt_cuda_bf16.log && \
	  tail -1 $(B)/gpt_cuda_bf16.log && \
	  f=$$(sed -n 's/.*tensors (f32): \([0-9]*\) bytes.*/\1/p' $(B)/gpt_cuda_cpu.log) && b=$$(sed -n 's/.*tensors (bf16): \([0-9]*\) bytes.*/\1/p' $(B)/gpt_cuda_bf16.log) && \
	  [ -n "$$b" ] && [ $$((b * 2)) -eq "$$f" ] && echo "check-cuda: --dtype bf16 sends $$b tensor bytes, f32 $$f" && \
	  $(B)/gpt_cuda --cpu --gradcheck -m 1 --dim 16 --heads 2 --layers 2 --max-len 32 --seqs-per-step 4 && \
	  $(MAKE) --no-print-directory $(B)/gpt_cpu $(B)/cuda-trainer-controls && \
	  sh tests/test_cuda_trainer.sh $(B)/gpt_cuda $(B)/gpt_cpu && $(B)/cuda-trainer-controls && \
	  echo "check-cuda: headers compile under nvcc and C99, all CUDA code builds, its host paths pass"; \
	else echo "check-cuda: nvcc not found, skipped"; fi

cuda: $(CUDA_BINS)

# The training loop of gpt_cuda --cpu (tests/test_cuda_trainer.sh, run by check-cuda): its
# --check-resume part's negative control, a gpt_cuda whose resume loads the weights without
# Adam's moments (-DPP_TEST_NO_CKPT_STATE): the resumed run is another, and it must fail.
$(B)/gpt_cuda-ctl-no-state: examples/gpt_cuda.cu examples/gpt_cuda.h examples/gpt_loop.h examples/gpt_data.h examples/gpt_traffic.h examples/splitmix.h $(CUDA_HDRS) | $(B)
	$(NVCC) $(NVFLAGS) -DPP_TEST_NO_CKPT_STATE -I. $< -o $@ -lcublas -lpthread
$(B)/cuda-trainer-controls: tests/controls.sh tests/test_cuda_trainer.sh $(B)/gpt_cuda-ctl-no-state
	printf '#!/bin/sh\nexec sh tests/controls.sh cuda-trainer-controls "env PART=resume sh tests/test_cuda_trainer.sh $(B)/gpt_cuda-ctl-no-state"\n' > $@
	chmod +x $@

# GPU tests: built with nvcc, run only where a GPU answers (the binary's --probe), else skipped.
test-cuda: | $(B)
	@if ! command -v $(NVCC) >/dev/null 2>&1; then echo "test-cuda: nvcc not found, skipped"; exit 0; fi; \
	$(MAKE) --no-print-directory $(B)/test_cuda $(B)/gpt_cuda || exit 1; \
	if $(B)/test_cuda --probe; then sh tests/run.sh $(B)/test_cuda && $(B)/gpt_cuda --check; \
	else echo "test-cuda: no CUDA GPU here, GPU tests skipped (make cuda still builds them)"; fi

# compute-sanitizer over the GPU tests (small configuration): memcheck, racecheck, initcheck, synccheck.
sanitize-cuda: $(B)/test_cuda
	@if ! $(B)/test_cuda --probe; then echo "sanitize-cuda: no CUDA GPU here, skipped"; exit 0; fi; \
	for tool in memcheck racecheck initcheck synccheck; do \
	  compute-sanitizer --tool $$tool --error-exitcode 1 $(B)/test_cuda --quick || exit 1; done

bench-cuda: $(B)/bubble_cuda $(B)/gpt_cuda $(B)/test_cuda
	@if ! $(B)/test_cuda --probe 2>/dev/null && ! nvidia-smi -L >/dev/null 2>&1; then echo "bench-cuda: no CUDA GPU here, skipped"; exit 0; fi; \
	$(B)/bubble_cuda && $(B)/gpt_cuda --bench

clean:
	rm -rf $(B)

include multiprocess.mk

# The edit-test loop: gcc at -O0 without sanitizers (its own build/quick/, so it never mixes
# with make test's -O2 objects), every test in its quick mode (PP_QUICK=1: fewer repetitions
# where a test has many), the examples built and their --check run. make test stays the gate.
Q = $(B)/quick
QUICK_BINS = $(addprefix $(Q)/,$(TESTS)) $(Q)/mlp_cpu $(Q)/gpt_cpu $(Q)/pp-sched

$(Q): | $(B)
	@mkdir -p $(Q)

# The tests that spend their time generating schedules build at -O1 (2 s more to build, 7 s
# less to run for test_schedule); the rest at -O0.
QOPT = -O0
$(Q)/test_schedule $(Q)/test_zb: QOPT = -O1
$(Q)/%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(Q)
	$(CC) $(BASE) $(QOPT) $< -o $@ $(LDLIBS)

# The linked tests link one implementation object, as make test's do; it builds at -O1 (the
# schedule generators run in it), the tests themselves at QOPT.
$(Q)/obj/impl.o: tests/impl.c $(HEADERS) | $(Q)
	@mkdir -p $(Q)/obj
	$(CC) $(IMPL_BASE) -O1 -c $< -o $@
$(addprefix $(Q)/,$(LINKED_TESTS)): $(Q)/%: tests/%.c $(TEST_HDRS) $(EXH) $(HEADERS) $(Q)/obj/impl.o
	$(CC) $(BASE) $(LINK_DEFS) $(QOPT) $< $(Q)/obj/impl.o -o $@ $(LDLIBS)

$(Q)/%: examples/%.c $(EXH) $(HEADERS) | $(Q)
	$(CC) $(BASE) -O0 $< -o $@ $(LDLIBS)

$(Q)/pp-sched: tools/pp_sched.c $(HEADERS) | $(Q)
	$(CC) $(BASE) -O0 $< -o $@ $(LDLIBS)

$(Q)/test_cuda_host $(Q)/test_cuda_pipeline: BASE += -Itests/fakecuda
$(Q)/test_cuda_host $(Q)/test_cuda_pipeline: tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h pipeline_cuda.h
$(Q)/test_imitation $(Q)/test_nccl_pipeline $(Q)/test_nccl_grid $(Q)/test_tp_nccl $(Q)/test_tp_nccl_fault: BASE += -Itests/fakenccl -Itests/fakecuda
$(Q)/test_nccl_pipeline $(Q)/test_tp_nccl_fault: BASE += -DFAKECUDA_DEVICES=8
$(Q)/test_imitation $(Q)/test_nccl_pipeline $(Q)/test_nccl_grid $(Q)/test_tp_nccl $(Q)/test_tp_nccl_fault: tests/fakenccl/nccl.h tests/fakecuda/cuda_runtime_api.h pipeline_cuda.h pipeline_nccl.h

# Two at a time by default (make -jN quick: N builds); the slowest tests first, so that the
# two runners finish together.
QUICK_SLOW = test_nccl_pipeline test_malloc test_recompute test_dpfault test_imitation test_zb test_schedule test_cuda_pipeline \
             test_reliability
QUICK_RUN = $(addprefix $(Q)/,$(filter $(TESTS),$(QUICK_SLOW)) $(filter-out $(QUICK_SLOW),$(TESTS)))

quick:
	@$(MAKE) --no-print-directory $(if $(findstring -j,$(MAKEFLAGS)),,-j2) $(QUICK_BINS)
	@$(Q)/mlp_cpu --check --steps 2 > /dev/null && $(Q)/gpt_cpu --check --steps 2 --generated --eval-every 1 --eval-seqs 32 > /dev/null && \
	  echo "quick: examples pass their --check"
	@PP_QUICK=1 PP_TEST_JOBS=3 sh tests/run.sh $(QUICK_RUN)
	@echo "quick leaves out (make test runs them): the clang, ASan+UBSan, TSan and valgrind builds, the negative" \
	      "controls, the fuzz replays, MPI, the C/C++ header builds, lint, api-doc, install and the README's programs"

# ---- install, pkg-config, versions, NVTX, CUDA architectures, the README's program ------------
# make install [PREFIX=/usr/local] [DESTDIR=]: the headers into $(INCLUDEDIR)/pipeline, pp-sched into
# $(BINDIR), pkg-config files into $(PKGCONFIGDIR): pipeline.pc (Cflags -I.../include/pipeline,
# Libs -lpthread -lm), and pipeline-cuda.pc where CUDA_HOME has the CUDA runtime, pipeline-nccl.pc
# where NCCL_HOME has NCCL too, pipeline-mpi.pc where mpicc is (pkgconfig/*.pc.in, which CMake
# fills too), and, where cmake is, the CMake package into $(LIBDIR)/cmake/pipeline (what
# find_package(pipeline) reads: CMakeLists.txt configured in $(B)/cmake-package, its install
# component pipeline_cmake_package; the same files cmake --install writes). make uninstall
# removes them. make check-install builds a consumer through every route (tests/check_install.sh).
.PHONY: install uninstall check-install check-nvtx
PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
INCLUDEDIR   ?= $(PREFIX)/include
LIBDIR       ?= $(PREFIX)/lib
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL      ?= install
PP_VERSION_STRING := $(shell sed -n 's/^\#define PP_VERSION_STRING "\(.*\)"/\1/p' pipeline.h)
CUDA_LIBDIR = $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart.so $(CUDA_HOME)/lib/libcudart.so))
HAVE_CUDART = $(if $(CUDA_LIBDIR),$(if $(wildcard $(CUDA_HOME)/include/cuda_runtime_api.h),1))
MPI_CFLAGS  = $(shell $(MPICC) -showme:compile 2>/dev/null || $(MPICC) -compile-info 2>/dev/null | cut -d' ' -f2-)
MPI_LIBS    = $(shell $(MPICC) -showme:link 2>/dev/null || $(MPICC) -link-info 2>/dev/null | cut -d' ' -f2-)
INSTALL_PCS = pipeline $(if $(HAVE_CUDART),pipeline-cuda $(if $(filter 1,$(HAVE_NCCL)),pipeline-nccl)) \
              $(if $(filter 1,$(HAVE_MPI)),pipeline-mpi)
PC_SED = -e 's|@prefix@|$(PREFIX)|g' -e 's|@includedir@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(PP_VERSION_STRING)|g' \
         -e 's|@CUDA_HOME@|$(CUDA_HOME)|g' -e 's|@CUDA_LIBDIR@|$(patsubst %/,%,$(dir $(CUDA_LIBDIR)))|g' \
         -e 's|@NCCL_HOME@|$(NCCL_HOME)|g' -e 's|@NCCL_LIBDIR@|$(NCCL_LIBDIR)|g' \
         -e 's|@MPI_CFLAGS@|$(MPI_CFLAGS)|g' -e 's|@MPI_LIBS@|$(MPI_LIBS)|g'
PP_INSTALLED_HDRS = pipeline.h pipeline_cuda.h pipeline_nccl.h pipeline_mpi.h
CMAKE        ?= cmake
CMAKEDIR      = $(LIBDIR)/cmake/pipeline
# the CMake package's directories as make install's (relative to PREFIX where they are under it,
# so the package finds its headers from where it lies)
CMAKE_PKG_ARGS = -DCMAKE_INSTALL_PREFIX="$(PREFIX)" -DCMAKE_INSTALL_INCLUDEDIR="$(patsubst $(PREFIX)/%,%,$(INCLUDEDIR))" \
                 -DCMAKE_INSTALL_LIBDIR="$(patsubst $(PREFIX)/%,%,$(LIBDIR))" -DPIPELINE_BUILD_TOOLS=OFF -DPIPELINE_INSTALL=ON

install: $(B)/pp-sched
	@mkdir -p $(B)/pkgconfig && \
	$(INSTALL) -d "$(DESTDIR)$(INCLUDEDIR)/pipeline" "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(PKGCONFIGDIR)" && \
	$(INSTALL) -m 644 $(PP_INSTALLED_HDRS) "$(DESTDIR)$(INCLUDEDIR)/pipeline/" && \
	$(INSTALL) -m 755 $(B)/pp-sched "$(DESTDIR)$(BINDIR)/pp-sched" && \
	for pc in $(INSTALL_PCS); do \
	  sed $(PC_SED) pkgconfig/$$pc.pc.in > $(B)/pkgconfig/$$pc.pc && \
	  $(INSTALL) -m 644 $(B)/pkgconfig/$$pc.pc "$(DESTDIR)$(PKGCONFIGDIR)/" || exit 1; done && \
	if command -v $(CMAKE) >/dev/null 2>&1; then \
	  if $(CMAKE) -S . -B $(B)/cmake-package $(CMAKE_PKG_ARGS) > $(B)/cmake-package.log 2>&1 && \
	     DESTDIR="$(DESTDIR)" $(CMAKE) --install $(B)/cmake-package --component pipeline_cmake_package >> $(B)/cmake-package.log 2>&1; \
	  then pkg="the CMake package in $(CMAKEDIR)"; \
	  else tail -20 $(B)/cmake-package.log; echo "install: the CMake package failed ($(B)/cmake-package.log)"; exit 1; fi; \
	else pkg="no CMake package ($(CMAKE) not found)"; fi && \
	echo "install: pipeline $(PP_VERSION_STRING) into $(DESTDIR)$(PREFIX): headers in $(INCLUDEDIR)/pipeline, pp-sched," \
	     "pkg-config $(INSTALL_PCS), $$pkg"

uninstall:
	rm -f $(addprefix "$(DESTDIR)$(INCLUDEDIR)/pipeline/,$(addsuffix ",$(PP_INSTALLED_HDRS))) "$(DESTDIR)$(BINDIR)/pp-sched" \
	      $(foreach pc,pipeline pipeline-cuda pipeline-nccl pipeline-mpi,"$(DESTDIR)$(PKGCONFIGDIR)/$(pc).pc")
	rm -f "$(DESTDIR)$(CMAKEDIR)/"pipeline*.cmake
	@rmdir "$(DESTDIR)$(INCLUDEDIR)/pipeline" "$(DESTDIR)$(CMAKEDIR)" 2>/dev/null || true

# The consumer routes (pkg-config after make install into a temporary prefix, the installed CMake
# package, add_subdirectory, FetchContent): make test runs them where cmake and pkg-config are.
HAVE_PKG_TOOLS := $(shell command -v cmake >/dev/null 2>&1 && command -v pkg-config >/dev/null 2>&1 && echo 1)
check-install:
	@if [ "$(HAVE_PKG_TOOLS)" = 1 ]; then sh tests/check_install.sh $(B); \
	else echo "check-install: cmake or pkg-config not found, skipped (apt-get install cmake pkg-config)"; fi
$(B)/check-install: tests/check_install.sh | $(B)
	@printf '#!/bin/sh\nMAKE="$(MAKE)" exec sh tests/check_install.sh $(B)\n' > $@ && chmod +x $@
ifeq ($(HAVE_PKG_TOOLS),1)
TEST_BINS_EXTRA += $(B)/check-install
test: $(B)/check-install
else
test: pkg-note
endif
.PHONY: pkg-note
pkg-note:
	@echo "check-install skipped: cmake or pkg-config not found (apt-get install cmake pkg-config)"

# The README's quick start, extracted, compiled (gcc and clang, C99, strict) and run; and the
# companion headers against a pipeline.h of another version: each must fail, naming both.
$(B)/readme-quickstart: tests/readme_quickstart.sh tests/doc_program.sh README.md $(HEADERS) | $(B)
	@printf '#!/bin/sh\nexec sh tests/readme_quickstart.sh $(B)\n' > $@ && chmod +x $@
$(B)/version-skew: tests/version_skew.sh | $(B)
	@printf '#!/bin/sh\nexec sh tests/version_skew.sh $(B)\n' > $@ && chmod +x $@
# docs/training.md's trainer, the same way; its control (resumed without the optimizer's state)
# must differ.
$(B)/training-trainer: tests/training_trainer.sh tests/doc_program.sh docs/training.md $(HEADERS) | $(B)
	@printf '#!/bin/sh\nexec sh tests/training_trainer.sh $(B)\n' > $@ && chmod +x $@
TEST_BINS_EXTRA += $(B)/readme-quickstart $(B)/version-skew $(B)/training-trainer

# NVTX (PP_NVTX): tests/test_nvtx.c over the CUDA and NVTX imitations, built four ways like every
# test; build/nvtx-off, the same without PP_NVTX, must push no range. check-nvtx: pipeline_cuda.h
# with PP_NVTX against the toolkit's nvtx3 under nvcc, C99 and C++ (check-cuda runs it).
# NVTX=1 builds the CUDA programs with the ranges (make B=build/nvtx NVTX=1 build/nvtx/gpt_cuda).
TESTS += test_nvtx
NVTX_BINS = $(foreach t,test_nvtx,$(B)/$(t) $(B)/clang-$(t) $(B)/asan-$(t) $(B)/tsan-$(t)) $(Q)/test_nvtx
$(NVTX_BINS): BASE += -Itests/fakecuda -DPP_NVTX
$(NVTX_BINS) $(B)/nvtx-off: tests/fakecuda/cuda_runtime_api.h tests/fakecuda/layer_kernels.h tests/fakecuda/nvtx3/nvToolsExt.h pipeline_cuda.h
$(B)/nvtx-off: tests/test_nvtx.c $(TEST_HDRS) $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -Itests/fakecuda $(CFLAGS) $< -o $@ $(LDLIBS)
TEST_BINS_EXTRA += $(B)/nvtx-off
# test's prerequisites were read before the additions to TESTS and TEST_BINS_EXTRA in this block
# (its recipe runs them all): they are named here too, or they would not be built
test: $(foreach t,test_nvtx,$(B)/$(t) $(B)/clang-$(t) $(B)/asan-$(t) $(B)/tsan-$(t)) $(B)/nvtx-off \
      $(B)/readme-quickstart $(B)/version-skew $(B)/training-trainer
ifeq ($(NVTX),1)
NVFLAGS += -DPP_NVTX
endif
check-cuda: check-nvtx
check-nvtx: | $(B)
	@if command -v $(NVCC) >/dev/null 2>&1; then \
	  $(NVCC) -std=c++17 -x cu -I. -DPP_NVTX -DPIPELINE_IMPLEMENTATION -Xcompiler -Wall,-Wextra,-Werror -c pipeline_cuda.h -o $(B)/nvcc-nvtx-check.o && \
	  $(CC) $(BASE) -isystem $(CUDA_HOME)/include -DPP_NVTX -DPIPELINE_IMPLEMENTATION -x c -c pipeline_cuda.h -o $(B)/nvtx-c99-check.o && \
	  $(CXX) -std=c++11 $(WARN) -I. -isystem $(CUDA_HOME)/include -DPP_NVTX -DPIPELINE_IMPLEMENTATION -x c++ -c pipeline_cuda.h -o $(B)/nvtx-cxx-check.o && \
	  echo "check-nvtx: pipeline_cuda.h with PP_NVTX compiles against the toolkit's nvtx3 (nvcc, C99, C++)"; \
	else echo "check-nvtx: nvcc not found, skipped"; fi

# CUDA architectures for nvcc (NVFLAGS): CUDA_ARCHS="80 90", compute capabilities without the dot.
# Default (tools/cuda_archs.sh, asked once per make): the GPUs nvidia-smi finds here where nvcc
# supports them, else 80 and 90 (A100; H100, H200) as far as nvcc supports them. The highest
# also goes in as PTX, which the driver compiles for newer GPUs.
CUDA_ARCHS ?= $(eval CUDA_ARCHS := $(shell sh tools/cuda_archs.sh $(NVCC)))$(CUDA_ARCHS)
NVCC_ARCH_FLAGS = $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                  -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
