/* examples/gpt_traffic.h - what a GPT trainer's steps sent between pipeline stages, from
   pp_step_stats: gpt_cpu.c and gpt_mpi.c (through gpt_train.h), gpt_cuda.cu and gpt_nccl.cu
   (through gpt_cuda.h) print it after training. Include after pipeline.h; static inline, C and
   C++. */
#ifndef PP_EXAMPLE_GPT_TRAFFIC_H
#define PP_EXAMPLE_GPT_TRAFFIC_H

#include <stdio.h>

/* What the steps sent between stages (pp_step_stats, summed over ranks): all of it, and the
   tensors' share (activations forward, their gradients backward), without the shape metadata
   and the step's agreement. --dtype bf16 halves the tensors' bytes. */
typedef struct gpt_traffic {
    uint64_t bytes, msgs, tensor_bytes, tensor_msgs; /* in this order (gpt_mpi sums the four over ranks) */
    int steps;
} gpt_traffic;

static inline void gpt_traffic_add(gpt_traffic* tr, const pp_step_stats* st) {
    tr->bytes += st->bytes_sent;
    tr->msgs += st->msgs_sent;
    tr->tensor_bytes += st->bytes_sent - st->meta_bytes_sent - st->agree_bytes;
    tr->tensor_msgs += st->msgs_sent - st->meta_msgs_sent - st->agree_msgs;
    tr->steps++;
}

static inline void gpt_traffic_print(const char* who, const gpt_traffic* tr, pp_dtype act) {
    printf("%ssent in %d steps: %llu bytes in %llu messages; tensors (%s): %llu bytes in %llu messages, %.1f bytes per "
           "transfer\n",
           who, tr->steps, (unsigned long long)tr->bytes, (unsigned long long)tr->msgs, pp_dtype_name(act),
           (unsigned long long)tr->tensor_bytes, (unsigned long long)tr->tensor_msgs,
           tr->tensor_msgs ? (double)tr->tensor_bytes / (double)tr->tensor_msgs : 0.0);
}

#endif
