/* tests/test_nccl.c - pipeline_nccl.h: builds and links against NCCL and the CUDA runtime (make
   check-nccl), proves which schedules NCCL's order matching supports (pure, no GPU), and where
   a GPU exists runs one rank: a one-process communicator, the transport's all-reduce over one
   rank, and a host buffer staged through the device. Multi-rank NCCL needs one GPU per rank
   (NCCL refuses two ranks on one GPU) and is not exercised here. The bootstraps need no GPU
   (ncclGetUniqueId runs on the host): the id file always runs, and built with
   -DPP_TEST_NCCL_MPI under mpirun every rank must get rank 0's id by MPI_Bcast. */
#define PIPELINE_IMPLEMENTATION
#ifdef PP_TEST_NCCL_MPI
#include <mpi.h> /* first: pipeline_nccl.h then offers pp_nccl_unique_id_mpi */
#endif
#include "../pipeline.h"
#include "../pipeline_nccl.h"
#include "test.h"

#include <unistd.h>

static void order_checks(void) {
    static const struct { pp_schedule_kind k; int p, v, m, ok; } cases[] = {
        {PP_SCHED_GPIPE, 2, 1, 4, 1}, {PP_SCHED_GPIPE, 4, 1, 7, 1},    {PP_SCHED_1F1B, 2, 1, 5, 1},
        {PP_SCHED_1F1B, 4, 1, 8, 1},  {PP_SCHED_1F1B, 4, 1, 2, 1},     {PP_SCHED_INTERLEAVED, 3, 2, 6, 1},
        {PP_SCHED_INTERLEAVED, 4, 2, 8, 1}, {PP_SCHED_INTERLEAVED, 4, 3, 5, 1}, {PP_SCHED_INTERLEAVED, 2, 2, 4, 1},
        {PP_SCHED_INTERLEAVED, 2, 2, 3, 1}, {PP_SCHED_INTERLEAVED, 2, 2, 1, 1}, {PP_SCHED_INTERLEAVED, 2, 2, 6, 1},
        {PP_SCHED_ZB_H1, 4, 1, 8, 1}, {PP_SCHED_ZB_H1, 2, 1, 5, 1}, {PP_SCHED_ZB_V, 2, 2, 5, 1}, {PP_SCHED_ZB_V, 4, 2, 7, 1},
        /* p = 2, odd m >= 5: one pair carries activations and gradients in different orders, each
           kind in order: refused while both shared a channel, matched since they travel apart */
        {PP_SCHED_INTERLEAVED, 2, 2, 5, 1}, {PP_SCHED_INTERLEAVED, 2, 3, 7, 1}, {PP_SCHED_INTERLEAVED, 2, 4, 9, 1},
        {PP_SCHED_V_HALF, 4, 2, 8, 1}, {PP_SCHED_V_MIN, 4, 2, 8, 1}, {PP_SCHED_DUALPIPE_V, 4, 2, 8, 1},
    };
    int i;
    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        pp_action acts[4 * 4 * 3 * 9 + 16];
        pp_schedule s;
        pp_error err;
        pp_result rc = pp_schedule_make(cases[i].k, cases[i].p, cases[i].v, cases[i].m, acts, sizeof acts / sizeof acts[0], &s, &err);
        CHECK(rc == PP_OK, "schedule %d: %s", i, err.msg);
        if (rc != PP_OK) continue;
        err.msg[0] = 0;
        rc = pp_nccl_check_order(&s, &err);
        if (cases[i].ok)
            CHECK(rc == PP_OK, "%s p=%d v=%d m=%d should match in order: %s", pp_schedule_name(cases[i].k), cases[i].p,
                  cases[i].v, cases[i].m, err.msg);
        else
            CHECK(rc == PP_ERR_UNSUPPORTED && strstr(err.msg, "MPI transport"),
                  "%s p=%d v=%d m=%d should be refused with a reason: %s", pp_schedule_name(cases[i].k), cases[i].p,
                  cases[i].v, cases[i].m, err.msg);
    }
    /* A list whose receives of one kind are out of the sender's order (rank 1 of GPipe runs F1
       before F0) is refused, naming the message. */
    {
        pp_action acts[2 * 2 * 2], x;
        pp_schedule s;
        pp_error err;
        pp_action* r1;
        CHECK(pp_schedule_make(PP_SCHED_GPIPE, 2, 1, 2, acts, 8, &s, &err) == PP_OK, "gpipe: %s", err.msg);
        r1 = acts + s.per_rank;
        x = r1[0];
        r1[0] = r1[1];
        r1[1] = x;
        CHECK(pp_nccl_check_order(&s, &err) == PP_ERR_UNSUPPORTED && strstr(err.msg, "MPI transport"),
              "out-of-order receives must be refused with a reason: %s", err.msg);
    }
}

/* A file an earlier run left at the id path is never taken: the old format (the bare id), one
   written long before this rank started, one written by another job; each times out saying it
   was stale. Rank 0 replaces it, and then a reader gets the new id. Negative control: with the
   staleness check off (_ppn_idfile_stale returning "" at once) the three refusals fail. */
static void write_file(const char* path, const void* p, size_t n) {
    FILE* f = fopen(path, "wb");
    CHECK(f && fwrite(p, n, 1, f) == 1, "writing %s", path);
    if (f) fclose(f);
}

static void stale_id_checks(const char* path) {
    ncclUniqueId id, id2, old;
    _ppn_idfile f;
    pp_error err;
    FILE* fp;
    memset(&old, 7, sizeof old);
    write_file(path, &old, sizeof old);
    err.msg[0] = 0;
    CHECK(pp_nccl_unique_id_file(path, 1, 0.3, &id2, &err) == PP_ERR_TIMEOUT && strstr(err.msg, "stale") &&
              strstr(err.msg, "not an id file"),
          "an earlier version's id file must be refused: %s", err.msg);
    CHECK(pp_nccl_unique_id_file(path, 0, 5, &id, &err) == PP_OK, "rank 0 replaces a stale file: %s", err.msg);
    CHECK(pp_nccl_unique_id_file(path, 1, 5, &id2, &err) == PP_OK && !memcmp(&id, &id2, sizeof id), "then it is read: %s",
          err.msg);
    fp = fopen(path, "rb");
    CHECK(fp && fread(&f, sizeof f, 1, fp) == 1, "reading back %s", path);
    if (fp) fclose(fp);
    f.written -= 3600; /* an hour before: an earlier run's */
    write_file(path, &f, sizeof f);
    CHECK(pp_nccl_unique_id_file(path, 1, 0.3, &id2, &err) == PP_ERR_TIMEOUT && strstr(err.msg, "stale") &&
              strstr(err.msg, "before this rank started"),
          "an old id file must be refused: %s", err.msg);
    f.written += 3600;
    snprintf(f.job, sizeof f.job, "SLURM_JOB_ID=pp-test-another-job");
    write_file(path, &f, sizeof f);
    CHECK(pp_nccl_unique_id_file(path, 1, 0.3, &id2, &err) == PP_ERR_TIMEOUT && strstr(err.msg, "another-job"),
          "another job's id file must be refused: %s", err.msg);
    remove(path);
}

/* The id through a file: rank 0 publishes it atomically, a reader gets the same bytes, a reader
   with no writer times out instead of polling forever. Without a device, comm init says so. */
static void bootstrap_checks(void) {
    ncclUniqueId id, id2;
    pp_error err;
    char path[256];
    pp_launch L;
    ncclComm_t comm = NULL;
    int n = 0;
    snprintf(path, sizeof path, "/tmp/pp_nccl_id_%d", (int)getpid());
    CHECK(pp_nccl_unique_id_file(path, 0, 5, &id, &err) == PP_OK, "id file (rank 0): %s", err.msg);
    CHECK(pp_nccl_unique_id_file(path, 1, 5, &id2, &err) == PP_OK && !memcmp(&id, &id2, sizeof id), "id file (rank 1): %s",
          err.msg);
    remove(path);
    CHECK(pp_nccl_unique_id_file(path, 1, 0.05, &id2, &err) == PP_ERR_TIMEOUT && strstr(err.msg, path),
          "a missing id file times out, naming it: %s", err.msg);
    CHECK(pp_nccl_unique_id_file(NULL, 0, 1, &id, &err) == PP_ERR_INVALID, "no path");
    stale_id_checks(path);
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError();
        memset(&L, 0, sizeof L);
        L.world = 1;
        CHECK(pp_nccl_comm_init(&L, &id, 5, &comm, &err) == PP_ERR_UNSUPPORTED && strstr(err.msg, "no CUDA device"),
              "no GPU: a clear error: %s", err.msg);
    }
}

static void gpu_checks(void) {
    pp_launch L;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    pp_nccl* t = NULL;
    pp_nccl_desc d;
    pp_error err;
    pp_transport tr;
    float* dev = NULL;
    float host[4] = {1, 2, 3, 4}, back[4] = {0, 0, 0, 0};
    int one = 0;
    memset(&L, 0, sizeof L);
    L.world = 1;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    CHECK(pp_nccl_comm_init(&L, &id, 60, &comm, &err) == PP_OK, "comm init: %s", err.msg);
    if (!comm) return;
    memset(&d, 0, sizeof d);
    d.comm = comm;
    d.own_comm = 1;
    CHECK(pp_nccl_create(&d, &t, &err) == PP_OK, "create: %s", err.msg);
    if (!t) return;
    tr = pp_nccl_transport(t);
    CHECK(tr.rank == 0 && tr.size == 1, "rank %d of %d", tr.rank, tr.size);
    CHECK(cudaMalloc((void**)&dev, sizeof host) == cudaSuccess, "cudaMalloc");
    cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice);
    CHECK(tr.allreduce_sum(tr.self, dev, 4, PP_F32, &one, 1, 10, &err) == PP_OK, "all-reduce over one rank: %s", err.msg);
    cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost);
    CHECK(!memcmp(back, host, sizeof host), "one-rank all-reduce keeps the data");
    CHECK(pp_grad_allreduce(&tr, NULL, 0, host, 4, PP_F32, 0.5, 10, &err) == PP_OK && host[3] == 2.0f,
          "host buffer, scaled: %s", err.msg);
    cudaFree(dev);
    pp_nccl_destroy(t);
}

#ifdef PP_TEST_NCCL_MPI
/* Every rank must hold rank 0's id after pp_nccl_unique_id_mpi. */
static void mpi_bootstrap_checks(void) {
    ncclUniqueId id, root;
    pp_error err;
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    CHECK(pp_nccl_unique_id_mpi(MPI_COMM_WORLD, &id, &err) == PP_OK, "rank %d: %s", me, err.msg);
    memcpy(&root, &id, sizeof id);
    MPI_Bcast(&root, (int)sizeof root, MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(!memcmp(&root, &id, sizeof id), "rank %d holds another id than rank 0", me);
}
#endif

int main(int argc, char** argv) {
    int n = 0, me = 0;
#ifdef PP_TEST_NCCL_MPI
    int mine[2], all[2];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    mpi_bootstrap_checks();
#else
    (void)argc;
    (void)argv;
#endif
    if (me == 0) {
        order_checks();
        bootstrap_checks();
        if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
            gpu_checks();
        else
            printf("test_nccl: no CUDA device: the GPU part (one rank) did not run\n");
    }
#ifdef PP_TEST_NCCL_MPI
    mine[0] = _t_pass;
    mine[1] = _t_fail;
    MPI_Reduce(mine, all, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    if (me != 0) return _t_fail ? 1 : 0;
    _t_pass = all[0];
    _t_fail = all[1];
    return TEST_DONE("test_nccl (MPI bootstrap)");
#else
    return TEST_DONE("test_nccl");
#endif
}
