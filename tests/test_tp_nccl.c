/* tests/test_tp_nccl.c - the TP collectives over pipeline_nccl.h's transport, on the NCCL
   imitation (tests/fakenccl over tests/fakecuda), without a GPU. Four rank threads, each on its
   own imitation device, make one communicator (pp_nccl_comm_init) and a transport over it; then
   pp_tp_allreduce, pp_tp_reducescatter and pp_tp_allgather of host memory (staged through the
   device by the transport) over the four ranks (tp = 4) and over two groups of two at once
   ({0, 2} and {1, 3}: a TP group as a subset of the transport's ranks): f32, f64, f16, bf16,
   counts 0 .. 1001, every rank's result with the sequential sum's bits (tests/tp_data.h), the
   same bits as the threads and MPI transports give. Then over pp_nccl_grid_create_tp's g.tp
   (every pair connected at create: the collectives set nothing up)
   (pp 2 x tp 2, pp 1 x tp 4): the same. Not yet run on real NCCL and a GPU. */
#define _POSIX_C_SOURCE 200809L
#define PIPELINE_IMPLEMENTATION
#include "../pipeline_nccl.h"
#include "test.h"
#include "tp_data.h"

#define NR 4
#define OUTSZ (MAXC * 8)

typedef struct world {
    ncclUniqueId id;
    int bad[NR];
    pp_result rc[NR];
    char msg[NR][sizeof(((pp_error*)0)->msg)];
} world;

/* One group's collectives for every dtype and count; group member i's inputs are fill(seed0 + i). */
/* r: the calling thread's world rank (its slot of the buffers). */
static int run_group(const pp_group* grp, int r, int me, int n, int seed0, char* msg, size_t msg_n) {
    static unsigned char a[NR][OUTSZ], b[NR][OUTSZ], ref[NR][OUTSZ];
    int d, ci, i, seeds[MAXN];
    pp_error err;
    for (i = 0; i < n; i++) seeds[i] = seed0 + i;
    for (d = 0; d < 4; d++)
        for (ci = 0; ci < (int)NCOUNTS; ci++) {
            size_t cnt = COUNTS[ci], es = pp_dtype_size(DTYPES[d]), off, len;
            pp_tp_block(cnt, n, me, &off, &len);
            reference(ref[r], DTYPES[d], seeds, n, cnt);
            fill(a[r], DTYPES[d], seed0 + me, cnt);
            if (pp_tp_allreduce(grp, a[r], cnt, DTYPES[d], &err) != PP_OK) goto fail;
            if (memcmp(a[r], ref[r], cnt * es) != 0) {
                snprintf(msg, msg_n, "all-reduce %s count %zu (tp %d): not the sequential sum", pp_dtype_name(DTYPES[d]),
                         cnt, n);
                return 1;
            }
            fill(a[r], DTYPES[d], seed0 + me, cnt);
            if (pp_tp_reducescatter(grp, a[r], b[r], cnt, DTYPES[d], &err) != PP_OK) goto fail;
            if (memcmp(b[r], ref[r] + off * es, len * es) != 0) {
                snprintf(msg, msg_n, "reduce-scatter %s count %zu (tp %d) differs", pp_dtype_name(DTYPES[d]), cnt, n);
                return 1;
            }
            memset(a[r], 0xee, OUTSZ);
            if (pp_tp_allgather(grp, b[r], a[r], cnt, DTYPES[d], &err) != PP_OK) goto fail;
            if (memcmp(a[r], ref[r], cnt * es) != 0) {
                snprintf(msg, msg_n, "all-gather %s count %zu (tp %d) differs", pp_dtype_name(DTYPES[d]), cnt, n);
                return 1;
            }
        }
    return 0;
fail:
    snprintf(msg, msg_n, "%s", err.msg);
    return 1;
}

static pp_result rank_main(int r, void* user) {
    world* W = (world*)user;
    pp_launch L;
    pp_nccl_desc nd;
    pp_nccl* t = NULL;
    ncclComm_t comm = NULL;
    pp_transport tr;
    pp_group grp;
    pp_error err;
    int pairs[2][2] = {{0, 2}, {1, 3}}, k;
    pp_result rc;
    memset(&L, 0, sizeof L);
    L.rank = r;
    L.world = NR;
    L.local_rank = r;
    rc = pp_nccl_comm_init(&L, &W->id, 20, &comm, &err);
    if (rc == PP_OK) {
        memset(&nd, 0, sizeof nd);
        nd.comm = comm;
        nd.own_comm = 0; /* the grids below split it too */
        nd.channels = 1;
        nd.timeout_s = 20;
        rc = pp_nccl_create(&nd, &t, &err);
    }
    if (rc != PP_OK) {
        snprintf(W->msg[r], sizeof W->msg[r], "%s", err.msg);
        return W->rc[r] = rc;
    }
    tr = pp_nccl_transport(t);
    grp.t = &tr;
    grp.ranks = NULL; /* all four: tp = 4 */
    grp.n_ranks = 0;
    grp.timeout_s = 20;
    W->bad[r] += run_group(&grp, r, r, NR, 300, W->msg[r], sizeof W->msg[r]);
    grp.ranks = pairs[r % 2]; /* {0, 2} and {1, 3} at once */
    grp.n_ranks = 2;
    if (!W->bad[r]) W->bad[r] += run_group(&grp, r, r / 2, 2, 400 + 10 * (r % 2), W->msg[r], sizeof W->msg[r]);
    pp_nccl_destroy(t);
    /* pp_nccl_grid_create_tp: pp 2 x tp 2, then pp 1 x tp 4; g.tp's ranks are the TP ranks */
    for (k = 0; k < 2 && !W->bad[r]; k++) {
        pp_nccl_grid g;
        int tp = k == 0 ? 2 : 4;
        pp_transport gt;
        if ((rc = pp_nccl_grid_create_tp(comm, NR / tp, tp, PP_GRID_DP_INNER, 0, 20, &g, &err)) != PP_OK) {
            snprintf(W->msg[r], sizeof W->msg[r], "%.400s (grid tp %d)", err.msg, tp);
            W->bad[r]++;
            break;
        }
        if (!g.tp || g.grid.tp != tp) {
            snprintf(W->msg[r], sizeof W->msg[r], "grid tp %d: no TP transport", tp);
            W->bad[r]++;
        } else {
            gt = pp_nccl_transport(g.tp);
            grp.t = &gt;
            grp.ranks = NULL;
            grp.n_ranks = 0;
            if (gt.rank != g.grid.tp_rank || gt.size != tp) {
                snprintf(W->msg[r], sizeof W->msg[r], "grid tp %d: transport rank %d of %d", tp, gt.rank, gt.size);
                W->bad[r]++;
            } else {
                uint64_t c0 = fakenccl_thread_connects();
                W->bad[r] += run_group(&grp, r, g.grid.tp_rank, tp, 500 + 10 * (g.grid.pp_rank * g.grid.dp + g.grid.dp_rank),
                                       W->msg[r], sizeof W->msg[r]);
                if (!W->bad[r] && fakenccl_thread_connects() != c0) { /* every pair was connected at create */
                    snprintf(W->msg[r], sizeof W->msg[r], "grid tp %d: the collectives set up %llu connections", tp,
                             (unsigned long long)(fakenccl_thread_connects() - c0));
                    W->bad[r]++;
                }
            }
        }
        pp_nccl_grid_destroy(&g);
    }
    ncclCommDestroy(comm);
    return W->rc[r] = PP_OK;
}

int main(void) {
    static world W;
    pp_error err;
    int r;
    memset(&W, 0, sizeof W);
    ncclGetUniqueId(&W.id);
    CHECK(pp_threads_run(NR, rank_main, &W, &err) == PP_OK, "%s", err.msg);
    for (r = 0; r < NR; r++) {
        CHECK(W.rc[r] == PP_OK, "rank %d: %s", r, W.msg[r]);
        CHECK(W.bad[r] == 0, "rank %d: %s", r, W.msg[r]);
    }
    return TEST_DONE("test_tp_nccl");
}
