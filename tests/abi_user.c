/* A file of the program that includes pipeline.h with the default configuration (make
   check-abi). It refers to every function linked under a configuration name, so a link against
   an implementation built with other values names each one undefined; run, it calls
   pp_stage_create once. */
#include "../pipeline.h"
#include <string.h>

int main(int argc, char** argv) {
    pp_error err;
    pp_stage* st = NULL;
    (void)argv;
    if (argc > 1000) { /* never run: the references are what matters */
        pp_model m;
        pp_flight f;
        pp_grid g;
        pp_sim_result sr;
        memset(&m, 0, sizeof m);
        memset(&f, 0, sizeof f);
        memset(&g, 0, sizeof g);
        int a = 0, b = 0;
        pp_pipeline* pl = NULL;
        pp_threads* th = NULL;
        pp_model_check(&m, &err);
        pp_model_layer_name(&m, 0);
        pp_model_layer_costs(&m, NULL, NULL, NULL, NULL, &err);
        pp_partition_model(&m, NULL, NULL, NULL, NULL, &err);
        pp_partition_print(stdout, &m, NULL, 0, NULL);
        pp_sequential_step(&m, NULL, NULL, NULL, NULL, &err);
        pp_profile_layers(&m, NULL, NULL, NULL, 0, NULL, NULL, NULL, &err);
        pp_simulate(NULL, NULL, &sr, NULL, &err);
        pp_flight_last(&f, -1);
        pp_flight_print(stdout, &f);
        pp_flight_print_fd(1, &f);
        pp_threads_flight(th, 0, &f);
        pp_threads_transport(th, 0);
        pp_stage_flight(st, &f);
        pp_grid_make(1, 0, 1, PP_GRID_DP_INNER, &g, &err);
        pp_grid_rank(&g, 0, 0);
        pp_grid_pipe_split(&g, &a, &b);
        pp_grid_dp_split(&g, &a, &b);
        pp_grid_tied_split(&g, &a, &b);
        pp_grid_make_tp(1, 0, 1, 1, PP_GRID_DP_INNER, &g, &err);
        pp_grid_rank_tp(&g, 0, 0, 0);
        pp_grid_tp_split(&g, &a, &b);
        pp_pipeline_create(NULL, &pl, &err);
        pp_ckpt_size(NULL, NULL, &err);
        pp_ckpt_save(NULL, NULL, &err);
        pp_ckpt_load(NULL, NULL, NULL, &err);
        pp_ckpt_save_file(NULL, "x", &err);
        pp_ckpt_load_file(NULL, "x", NULL, &err);
        pp_ckpt_save_mem(NULL, NULL, 0, &err);
        pp_ckpt_load_mem(NULL, NULL, 0, NULL, &err);
        pp_sequential_eval(&m, NULL, NULL, NULL, NULL, &err);
        pp_stage_eval(st, NULL, NULL, NULL);
        pp_pipeline_eval(pl, NULL, NULL, NULL);
    }
    return pp_stage_create(NULL, &st, &err) == PP_ERR_INVALID ? 0 : 1;
}
