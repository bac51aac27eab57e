/* bench/bench_mpi.c - one process per stage over MPI: step time of a pipeline against the
   sequential run of the same model, and the bytes each rank sends per step against the
   theoretical minimum.

       make bench-mpi            (mpirun -np 4 build/bench_mpi: pp = 4)

   Model: the tied-embedding LM of examples/tlm.h, wider (vocab 256, width 64, 6 dense layers),
   partitioned by describe()'s cost. Batch: 32 packed sequences of 1..48 tokens, split into
   m = 8 micro-batches balanced by tokens, so every micro-batch has its own size.
   Columns: step time (median of 5 steps after one warm-up, slowest rank), speed-up over the
   sequential step on one process, bytes sent per step summed over the ranks (what each MPI
   transport counted: payload plus any shape metadata), the minimum (exactly the activation and
   gradient tensors each rank must send, no padding, no metadata), the ratio, what padding every
   micro-batch to the largest would send, and #wrong; under each row, each rank's bytes sent
   and its own minimum. CPU columns do not depend on what else runs on the machine: the
   sequential step's CPU time, the busiest rank's CPU time per step, and their ratio (cpu bnd:
   the speed-up with one core per rank if waiting cost nothing, i.e. the partition's balance): steps whose loss differs
   from the sequential step's (bit for bit). The footer says OK or FAILED; the exit code agrees.
   The machine's cores bound the speed-up: 4 processes on 2 cores run at most 2 at a time. Rows
   marked "spin" busy-poll their waits (pp_mpi_set_spin), the others sleep between polls. */
#define PIPELINE_IMPLEMENTATION
#include "../pipeline.h"
#include "../pipeline_mpi.h"
#include "../examples/tlm.h"
#include "../tests/harness.h"

#define VOCAB 256
#define DIM 64
#define NSEQ 32
#define MAXLEN 48
#define M 8
#define REPS 5

static int cmp_double(const void* a, const void* b);
static double median(double* v, int n);

/* CPU time of this process: what a rank computes, whatever else shares the cores. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The sequential step of the whole model on rank 0 alone (the others sleep in a barrier):
   median of REPS after one warm-up, in ms, on every rank. */
static double sequential_ms(int rank, const pp_model* model, const tlm_model* w, tlm_model* gw, float* garena,
                            size_t n, const pp_batch* b, float* loss, double* cpu_ms) {
    double t[REPS], c[REPS], ms[2] = {0, 0};
    pp_error err;
    int rep;
    hx_quiet_barrier();
    if (rank == 0) {
        for (rep = 0; rep <= REPS; rep++) {
            double t0 = MPI_Wtime(), c0 = cpu_s();
            memset(garena, 0, n * sizeof(float));
            if (pp_sequential_step(model, w, gw, b, loss, &err) != PP_OK) {
                fprintf(stderr, "sequential: %s\n", err.msg);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            if (rep) {
                t[rep - 1] = MPI_Wtime() - t0;
                c[rep - 1] = cpu_s() - c0;
            }
        }
        ms[0] = median(t, REPS) * 1e3;
        ms[1] = median(c, REPS) * 1e3;
    }
    hx_quiet_barrier();
    MPI_Bcast(ms, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (cpu_ms) *cpu_ms = ms[1];
    return ms[0];
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* Bytes rank `rank` must send in one step: each of its stages sends its output forward (unless
   last) and the gradient of its input backward (unless first), summed over micro-batches;
   padded: the same with every micro-batch as large as the largest. */
static void min_bytes(const pp_schedule* sc, const int* first, int rank, int64_t rows, int64_t max_rows,
                      uint64_t* exact, uint64_t* padded) {
    int st, r, c;
    *exact = *padded = 0;
    for (st = 0; st < sc->n_stages; st++) {
        pp_schedule_stage_to_rank(sc, st, &r, &c);
        if (r != rank) continue;
        if (st < sc->n_stages - 1) {
            int last = first[st + 1] - 1;
            int64_t cols = last == TLM_HEAD_LAYER ? VOCAB : DIM;
            *exact += (uint64_t)(rows * cols * 4);
            *padded += (uint64_t)(max_rows * M * cols * 4);
        }
        if (st > 0) {
            int in_layer = first[st];
            int64_t cols = in_layer == TLM_HEAD_LAYER + 1 ? VOCAB : DIM;
            *exact += (uint64_t)(rows * cols * 4);
            *padded += (uint64_t)(max_rows * M * cols * 4);
        }
    }
}

int main(int argc, char** argv) {
    static const struct {
        pp_schedule_kind kind;
        int v;
        pp_shape_policy shapes;
        const char* shapes_name;
        int spin;
    } rows_cfg[] = {
        {PP_SCHED_GPIPE, 1, PP_SHAPES_LOCAL, "local", 0},
        {PP_SCHED_1F1B, 1, PP_SHAPES_LOCAL, "local", 0},
        {PP_SCHED_1F1B, 1, PP_SHAPES_BROADCAST, "broadcast", 0},
        {PP_SCHED_1F1B, 1, PP_SHAPES_PER_MESSAGE, "per_message", 0},
        {PP_SCHED_1F1B, 1, PP_SHAPES_AUTO, "auto", 0},
        {PP_SCHED_INTERLEAVED, 2, PP_SHAPES_LOCAL, "local", 0},
        {PP_SCHED_1F1B, 1, PP_SHAPES_LOCAL, "local", 1},
        {PP_SCHED_INTERLEAVED, 2, PP_SHAPES_LOCAL, "local", 1},
    };
    int rank, world, pp, i, rep, failed = 0;
    size_t n = tlm_param_count(VOCAB, DIM);
    float* warena;
    float* garena;
    tlm_model w, gw;
    pp_model model = tlm_model_desc();
    int32_t tok[NSEQ * MAXLEN], tgt[NSEQ * MAXLEN], cu[NSEQ + 1];
    pp_microbatch mbs[M];
    int32_t mcu[NSEQ + M];
    pp_batch b;
    pp_error err;
    double seq_ms = 0;
    float seq_loss = 0;
    int64_t max_rows = 0;
    pp_mpi_grid g;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    pp = world;
    if (world > 64) {
        if (!rank) fprintf(stderr, "at most 64 processes\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    (void)argc;
    (void)argv;
    warena = (float*)malloc(n * sizeof(float));
    garena = (float*)calloc(n, sizeof(float));
    tlm_fill(warena, VOCAB, DIM, 9);
    tlm_layout(&w, warena, VOCAB, DIM, 0);
    tlm_layout(&gw, garena, VOCAB, DIM, 0);
    tlm_batch(&b, tok, tgt, cu, NSEQ, MAXLEN, VOCAB, 5, M);
    if (pp_batch_split(&b, mbs, mcu, &err) != PP_OK) {
        fprintf(stderr, "split: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (i = 0; i < M; i++) max_rows = mbs[i].rows > max_rows ? mbs[i].rows : max_rows;

    seq_ms = sequential_ms(rank, &model, &w, &gw, garena, n, &b, &seq_loss, NULL);
    if (rank == 0) {
        printf("bench_mpi: %d processes, pp = %d, tied LM (vocab %d, width %d, %d layers), %lld tokens in %d packed "
               "sequences, m = %d (token-balanced, largest %lld rows)\n",
               world, pp, VOCAB, DIM, model.n_layers, (long long)b.input.rows, NSEQ, M, (long long)max_rows);
        printf("sequential step on one process: %.2f ms (measured again before each row: seq ms)\n\n", seq_ms);
        printf("%-21s %-12s %8s %8s %8s %8s %8s %8s %10s %10s %6s %10s %6s\n", "schedule", "shapes", "seq ms", "step ms",
               "speedup", "seq cpu", "rank cpu", "cpu bnd", "bytes/step", "minimum", "ratio", "padded", "#wrong");
    }
    hx_quiet_barrier();
    MPI_Bcast(&seq_loss, 1, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (pp_mpi_grid_create(MPI_COMM_WORLD, pp, PP_GRID_DP_INNER, &g, &err) != PP_OK) {
        fprintf(stderr, "grid: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (i = 0; i < (int)(sizeof rows_cfg / sizeof rows_cfg[0]); i++) {
        pp_schedule sc;
        pp_action* acts;
        size_t na = pp_schedule_size(rows_cfg[i].kind, pp, rows_cfg[i].v, M);
        int first[64 + 1], wrong = 0, bad_setup = 0;
        pp_stage* st = NULL;
        pp_stage_desc d;
        pp_partition_desc pd;
        pp_tensor sample;
        double t[REPS], ct[REPS], mine, slow, row_seq, row_cpu, mine_cpu = 0, max_cpu = 0;
        uint64_t sent0 = 0, sent1 = 0, exact, padded, worst_sent = 0, worst_min = 0, worst_pad = 0, v[3], all[3 * 64];
        pp_result rc;
        acts = (pp_action*)malloc(na * sizeof *acts);
        rc = pp_schedule_make(rows_cfg[i].kind, pp, rows_cfg[i].v, M, acts, na, &sc, &err);
        memset(&pd, 0, sizeof pd);
        memset(&sample, 0, sizeof sample);
        sample.rows = max_rows;
        sample.cols = 1;
        sample.dtype = PP_I32;
        pd.policy = PP_PARTITION_COST;
        pd.n_stages = pp * rows_cfg[i].v;
        pd.sample = &sample;
        if (rc == PP_OK) rc = pp_partition_model(&model, &w, &pd, first, NULL, &err);
        hx_stage_desc(&d, NULL, model, &w, &gw, &sc, first, g.grid.pp_rank, pp_mpi_transport(g.pipe));
        d.timeout_s = 120;
        d.shapes = rows_cfg[i].shapes;
        d.max_seqs = NSEQ;
        if (rc == PP_OK) rc = pp_stage_create(&d, &st, &err);
        if (rc != PP_OK) {
            fprintf(stderr, "rank %d: %s\n", rank, err.msg);
            bad_setup = 1;
        }
        pp_mpi_set_spin(g.pipe, rows_cfg[i].spin);
        for (rep = 0; rep <= REPS && !bad_setup; rep++) {
            pp_step_stats stats;
            hx_quiet_barrier();
            double c0;
            pp_mpi_counters(g.pipe, &sent0, NULL);
            memset(garena, 0, n * sizeof(float));
            c0 = cpu_s();
            rc = pp_stage_step(st, &b, &stats);
            if (rep) ct[rep - 1] = cpu_s() - c0;
            pp_mpi_counters(g.pipe, &sent1, NULL);
            if (rc != PP_OK) {
                fprintf(stderr, "rank %d: %s\n", rank, pp_stage_error(st));
                wrong++;
                break;
            }
            if (stats.has_loss && stats.loss != seq_loss) wrong++;
            if (rep) t[rep - 1] = stats.t_total;
        }
        mine = bad_setup || wrong ? 1e9 : median(t, REPS);
        if (!bad_setup && !wrong) mine_cpu = median(ct, REPS);
        row_seq = sequential_ms(rank, &model, &w, &gw, garena, n, &b, &seq_loss, &row_cpu);
        MPI_Allreduce(&mine_cpu, &max_cpu, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        min_bytes(&sc, first, g.grid.pp_rank, b.input.rows, max_rows, &exact, &padded);
        v[0] = sent1 - sent0;
        v[1] = exact;
        v[2] = padded;
        MPI_Allreduce(&mine, &slow, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Gather(v, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0) {
            char sname[32];
            int r;
            snprintf(sname, sizeof sname, "%s%s%s", pp_schedule_name(rows_cfg[i].kind), rows_cfg[i].v > 1 ? " v=2" : "",
                     rows_cfg[i].spin ? " spin" : "");
            for (r = 0; r < world; r++) {
                worst_sent += all[3 * r];
                worst_min += all[3 * r + 1];
                worst_pad += all[3 * r + 2];
            }
            printf("%-21s %-12s %8.2f %8.2f %7.2fx %8.2f %8.2f %7.2fx %10llu %10llu %5.3fx %10llu %6d\n", sname,
                   rows_cfg[i].shapes_name, row_seq, slow * 1e3, row_seq / (slow * 1e3), row_cpu, max_cpu * 1e3,
                   max_cpu > 0 ? row_cpu / (max_cpu * 1e3) : 0.0, (unsigned long long)worst_sent, (unsigned long long)worst_min,
                   worst_min ? (double)worst_sent / (double)worst_min : 0.0, (unsigned long long)worst_pad, wrong);
            printf("%-21s per rank sent/minimum:", "");
            for (r = 0; r < world; r++)
                printf(" r%d %llu/%llu", r, (unsigned long long)all[3 * r], (unsigned long long)all[3 * r + 1]);
            printf("\n");
        }
        failed += wrong;
        pp_stage_destroy(st);
        free(acts);
        if (bad_setup) break;
    }
    if (rank == 0) {
        printf("\nbytes/step, minimum, padded: summed over all ranks (per rank below each row). %s\n",
               failed ? "FAILED" : "OK");
    }
    pp_mpi_grid_destroy(&g);
    free(warena);
    free(garena);
    MPI_Finalize();
    return failed ? 1 : 0;
}
