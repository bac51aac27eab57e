# pipeline.h - build, test, run.   make | make test | make run | make bench | make check-cuda
CC      ?= cc
CLANG   ?= clang
CXX     ?= c++
NVCC    ?= nvcc
WARN     = -Wall -Wextra -Werror -pedantic
CFLAGS  ?= -O2 -g
BASE     = -std=c99 $(WARN) -I.
LDLIBS   = -lpthread -lm
B        = build

HEADERS  = pipeline.h
EXAMPLES = $(B)/mlp_cpu $(B)/gpt_cpu $(B)/pp-sched
TESTS    = test_schedule test_pipeline test_errors test_varlen test_gpt test_devops
BENCHES  = $(B)/bench_overhead $(B)/bench_varlen

.PHONY: all test run run-gpt bench check-cuda check-cxx clean

all: $(EXAMPLES) $(BENCHES)

$(B):
	@mkdir -p $(B)

EXH = $(wildcard examples/*.h)

$(B)/mlp_cpu: examples/mlp_cpu.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/gpt_cpu: examples/gpt_cpu.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/pp-sched: tools/pp_sched.c $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/bench_%: bench/bench_%.c $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

# Tests: gcc build, clang build, ASan+UBSan, TSan (threaded), and every header as C++.
$(B)/%: tests/%.c tests/test.h $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/clang-%: tests/%.c tests/test.h $(EXH) $(HEADERS) | $(B)
	$(CLANG) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

$(B)/asan-%: tests/%.c tests/test.h $(EXH) $(HEADERS) | $(B)
	$(CC) $(BASE) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer $< -o $@ $(LDLIBS)

$(B)/tsan-%: tests/%.c tests/test.h $(EXH) $(HEADERS) | $(B)
	$(CLANG) $(BASE) -O1 -g -fsanitize=thread $< -o $@ $(LDLIBS)

$(B)/cxx-check.o: tests/cxx_check.cc $(HEADERS) | $(B)
	$(CXX) -std=c++11 -Wall -Wextra -Werror -I. -c $< -o $@

check-cxx: $(B)/cxx-check.o

# the examples under clang too (the tests already build with both)
$(B)/clang-ex-%: examples/%.c $(EXH) $(HEADERS) | $(B)
	$(CLANG) $(BASE) $(CFLAGS) $< -o $@ $(LDLIBS)

TEST_BINS = $(addprefix $(B)/,$(TESTS)) $(addprefix $(B)/clang-,$(TESTS)) \
            $(addprefix $(B)/asan-,$(TESTS)) $(addprefix $(B)/tsan-,$(TESTS))

test: $(TEST_BINS) $(EXAMPLES) $(BENCHES) $(B)/clang-ex-mlp_cpu $(B)/clang-ex-gpt_cpu check-cxx
	@sh tests/run.sh $(TEST_BINS)

run: $(B)/mlp_cpu
	$(B)/mlp_cpu --check

run-gpt: $(B)/gpt_cpu
	$(B)/gpt_cpu --check

bench: $(BENCHES)
	$(B)/bench_overhead
	$(B)/bench_varlen

# CUDA: every header must compile under nvcc (host C++), even on machines without a GPU.
check-cuda: | $(B)
	@if command -v $(NVCC) >/dev/null 2>&1; then \
	  $(NVCC) -std=c++17 -x cu -I. -c tests/cxx_check.cc -o $(B)/nvcc-check.o && echo "check-cuda: headers compile under nvcc"; \
	else echo "check-cuda: nvcc not found, skipped"; fi

clean:
	rm -rf $(B)
