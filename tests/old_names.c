/* tests/old_names.c - every public name of the earlier API still compiles, links and works.

   Each function that pipeline.h, pipeline_cuda.h and pipeline_nccl.h declared before the API
   was trimmed (docs/api.md) is named here (its address taken), each public type sized, and the
   renamed or deprecated ones are called and held against their replacements. pipeline_mpi.h's
   names (pp_mpi_counters among them) need mpi.h and are left to tests/test_mpi.c.
   Built and run by make check-c, under fakecuda and fakenccl.
   Negative control: -DOLD_NAMES_CONTROL drops the deprecated aliases before use (as a release
   that removed them would), and the file must then fail to compile. */
#define _POSIX_C_SOURCE 200809L
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_nccl.h"
#ifdef OLD_NAMES_CONTROL
#undef pp_schedule_stage_rank
#undef pp_schedule_stage
#endif
#define MLP_DEPTH 3
#include "../examples/mlp.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

typedef void (*any_fn)(void);
#define FN(f) (any_fn)(f)

static const any_fn every_function[] = {
    /* pipeline.h */
    FN(pp_allreduce_p2p), FN(pp_batch_split), FN(pp_batch_split_imbalance), FN(pp_dtype_is_float),
    FN(pp_dtype_name), FN(pp_dtype_size), FN(pp_flight_last), FN(pp_flight_print), FN(pp_flight_print_fd),
    FN(pp_grad_allreduce), FN(pp_grid_dp_split), FN(pp_grid_make), FN(pp_grid_pipe_split), FN(pp_grid_rank),
    FN(pp_grid_tied_split), FN(pp_launch_from_env), FN(pp_model_check), FN(pp_model_layer_costs),
    FN(pp_model_layer_name), FN(pp_partition_balanced), FN(pp_partition_capped), FN(pp_partition_check),
    FN(pp_partition_imbalance), FN(pp_partition_model), FN(pp_partition_print), FN(pp_partition_uniform),
    FN(pp_pipeline_create), FN(pp_pipeline_destroy), FN(pp_pipeline_error), FN(pp_pipeline_partition),
    FN(pp_pipeline_rank_result), FN(pp_pipeline_schedule), FN(pp_pipeline_stage), FN(pp_pipeline_step),
    FN(pp_pipeline_threads), FN(pp_pipeline_timeline), FN(pp_profile_layers), FN(pp_result_str),
    FN(pp_schedule_has_w), FN(pp_schedule_kind_parse), FN(pp_schedule_layer_rank), FN(pp_schedule_make),
    FN(pp_schedule_make_cost), FN(pp_schedule_name), FN(pp_schedule_parse), FN(pp_schedule_rank),
    FN(pp_schedule_size), FN(pp_schedule_stage), FN(pp_schedule_stage_rank), FN(pp_schedule_stash_cap),
    FN(pp_schedule_write), FN(pp_sequential_step), FN(pp_simulate), FN(pp_stage_create), FN(pp_stage_destroy),
    FN(pp_stage_error), FN(pp_stage_flight), FN(pp_stage_flight_print), FN(pp_stage_step), FN(pp_stage_timeline),
    FN(pp_tensor_bytes), FN(pp_threads_counters), FN(pp_threads_create), FN(pp_threads_destroy),
    FN(pp_threads_flight), FN(pp_threads_flight_print), FN(pp_threads_flight_print_fd), FN(pp_threads_pending),
    FN(pp_threads_reset), FN(pp_threads_run), FN(pp_threads_transport), FN(pp_tied_sum_grads),
    FN(pp_tied_sync_weights), FN(pp_timeline_ascii), FN(pp_timeline_chrome),
    /* pipeline_cuda.h */
    FN(pp_cuda_status), FN(pp_cuda_create), FN(pp_cuda_destroy), FN(pp_cuda_bind), FN(pp_cuda_transport),
    FN(pp_cuda_device_ops), FN(pp_cuda_stream), FN(pp_cuda_device), FN(pp_cuda_memory), FN(pp_cuda_error),
    FN(pp_cuda_reset), FN(pp_cuda_pending), FN(pp_cuda_step_begin), FN(pp_cuda_step_end), FN(pp_cuda_timeline),
    FN(pp_cuda_pipeline_create), FN(pp_cuda_pipeline_world), FN(pp_cuda_pipeline_info),
    /* pipeline_nccl.h (without MPI) */
    FN(pp_nccl_create), FN(pp_nccl_destroy), FN(pp_nccl_transport), FN(pp_nccl_step_end), FN(pp_nccl_comm_stream),
    FN(pp_nccl_counters), FN(pp_nccl_error), FN(pp_nccl_unique_id_file), FN(pp_nccl_comm_init),
    FN(pp_nccl_grid_create), FN(pp_nccl_grid_destroy), FN(pp_nccl_check_order), FN(pp_nccl_check_rendezvous),
};

/* every public type: complete ones by value, opaque ones by pointer */
static const size_t every_type[] = {
    sizeof(pp_action), sizeof(pp_batch), sizeof(pp_device_ops), sizeof(pp_dtype), sizeof(pp_error),
    sizeof(pp_event), sizeof(pp_flight), sizeof(pp_flight_entry), sizeof(pp_flight_state), sizeof(pp_grid),
    sizeof(pp_grid_order), sizeof(pp_launch), sizeof(pp_layer_desc), sizeof(pp_layer_io), sizeof(pp_layer_kind),
    sizeof(pp_loss_reduction), sizeof(pp_microbatch), sizeof(pp_model), sizeof(pp_op), sizeof(pp_partition_desc),
    sizeof(pp_partition_policy), sizeof(pp_pipeline*), sizeof(pp_pipeline_desc), sizeof(pp_rank_fn),
    sizeof(pp_request), sizeof(pp_result), sizeof(pp_schedule), sizeof(pp_schedule_kind), sizeof(pp_shape_policy),
    sizeof(pp_sim_cost), sizeof(pp_sim_result), sizeof(pp_split_policy), sizeof(pp_stage*), sizeof(pp_stage_desc),
    sizeof(pp_stage_map), sizeof(pp_step_stats), sizeof(pp_tensor), sizeof(pp_threads*), sizeof(pp_transport),
    sizeof(pp_cuda*), sizeof(pp_cuda_desc), sizeof(pp_cuda_step_info), sizeof(pp_cuda_layer_ctx),
    sizeof(pp_nccl*), sizeof(pp_nccl_desc), sizeof(pp_nccl_grid),
};

/* the renamed mapping functions give what their new names give, for every map */
static void check_stage_maps(void) {
    static const pp_schedule_kind kinds[] = {PP_SCHED_1F1B, PP_SCHED_INTERLEAVED, PP_SCHED_ZB_V};
    static pp_action buf[4096];
    size_t k;
    for (k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        pp_schedule s;
        pp_error err;
        int v = kinds[k] == PP_SCHED_1F1B ? 1 : 2, st, r, c, r2, c2, bad = 0;
        if (pp_schedule_make(kinds[k], 4, v, 8, buf, sizeof buf / sizeof buf[0], &s, &err) != PP_OK) {
            CHECK(0, "%s: %s", pp_schedule_name(kinds[k]), err.msg);
            continue;
        }
        for (st = -1; st <= s.n_stages; st++) {
            pp_schedule_stage_rank(&s, st, &r, &c);
            pp_schedule_stage_to_rank(&s, st, &r2, &c2);
            bad += r != r2 || c != c2;
            if (st >= 0 && st < s.n_stages) bad += pp_schedule_stage(&s, r, c) != st;
            bad += pp_schedule_stage(&s, st, 0) != pp_schedule_rank_to_stage(&s, st, 0);
        }
        CHECK(bad == 0, "%s: %d disagreements between the old and new stage-map names", pp_schedule_name(kinds[k]), bad);
    }
}

/* the deprecated counters and flight printer, on a real step */
static void check_deprecated_calls(void) {
    int dims[MLP_DEPTH + 1] = {4, 8, 8, 3}, i, r;
    mlp_model w, g;
    float *gbuf = NULL, *wbuf = mlp_init(&w, &g, dims, 7, &gbuf), x[16 * 4];
    int32_t y[16];
    pp_pipeline_desc d;
    pp_pipeline* pl = NULL;
    pp_step_stats st;
    pp_error err;
    memset(&d, 0, sizeof d);
    d.model = mlp_model_desc();
    d.weights = &w;
    d.grads = &g;
    d.schedule = PP_SCHED_1F1B;
    d.p = 2;
    d.m = 4;
    for (i = 0; i < 16 * 4; i++) x[i] = (float)(i % 7) * 0.1f;
    for (i = 0; i < 16; i++) y[i] = i % 3;
    CHECK(wbuf && gbuf && pp_pipeline_create(&d, &pl, &err) == PP_OK, "create: %s", wbuf ? err.msg : "no memory");
    if (pl) {
        pp_batch b;
        memset(&b, 0, sizeof b);
        b.input.data = x;
        b.input.rows = 16;
        b.input.cols = 4;
        b.input.dtype = PP_F32;
        b.targets = y;
        b.target_row_bytes = sizeof(int32_t);
        CHECK(pp_pipeline_step(pl, &b, &st) == PP_OK, "step: %s", pp_pipeline_error(pl));
        for (r = 0; r < 2; r++) {
            uint64_t bytes = 0, msgs = 0;
            pp_step_stats rs;
            FILE* f = tmpfile();
            long n = 0;
            pp_pipeline_rank_result(pl, r, &rs);
            pp_threads_counters(pp_pipeline_threads(pl), r, &bytes, &msgs);
            CHECK(bytes == rs.bytes_sent && msgs == rs.msgs_sent,
                  "rank %d: pp_threads_counters %llu bytes %llu messages, the step's stats %llu and %llu", r,
                  (unsigned long long)bytes, (unsigned long long)msgs, (unsigned long long)rs.bytes_sent,
                  (unsigned long long)rs.msgs_sent);
            if (f) {
                pp_stage_flight_print(f, pp_pipeline_stage(pl, r));
                n = ftell(f);
                fclose(f);
            }
            CHECK(n > 0, "rank %d: pp_stage_flight_print printed nothing", r);
        }
        pp_pipeline_destroy(pl);
    }
    free(wbuf);
    free(gbuf);
}

int main(void) {
    size_t i, n_fn = sizeof every_function / sizeof every_function[0], n_ty = sizeof every_type / sizeof every_type[0];
    int null_fns = 0, zero_types = 0;
    for (i = 0; i < n_fn; i++) null_fns += every_function[i] == NULL;
    for (i = 0; i < n_ty; i++) zero_types += every_type[i] == 0;
    CHECK(null_fns == 0 && zero_types == 0, "%d functions without an address, %d empty types", null_fns, zero_types);
    check_stage_maps();
    check_deprecated_calls();
    printf("old_names: %zu functions and %zu types of the earlier API\n", n_fn, n_ty);
    return TEST_DONE("old_names");
}
