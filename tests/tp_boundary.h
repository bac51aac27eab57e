/* tests/tp_boundary.h - the model of tests/test_tp.c "boundary" and tests/test_tp_mpi.c
   "boundary": BN row-parallel linears over a TP group, then a squared-error loss (see test_tp.c).
   A layer reaches its TP group through io->ctx (a tpb_ctx); describe reads tp, tp_rank and sp
   from the rank's weights (a bw). */
#ifndef PP_TEST_TP_BOUNDARY_H
#define PP_TEST_TP_BOUNDARY_H
#include <stdlib.h>
#include <string.h>

typedef struct tpb_ctx { /* what layer_ctx points to: one per rank */
    pp_group tp;
    int tp_rank;
} tpb_ctx;

#define BK 4
#define BN 8
#define BMAXR 64
typedef struct bw {
    int tp, tp_rank, sp;
    int extra; /* 1: two more boundary tensors, both replicated: positions (rows, 3) i32, checked by
                  every layer, and a side path (rows, 2) f32 into the loss (its gradient back) */
    float w[BN][BK * BK]; /* this TP rank's rows of each layer's W: (BK / tp, BK) */
    int fail_layer, fail_mb; /* fail_layer > 0: that layer's forward of micro-batch fail_mb returns an
                                error after its collective (test_tp.c "stale") */
    int fail_bwd;            /* > 0: layer fail_bwd - 1's backward of micro-batch fail_mb returns an
                                error after its collectives (test_tp.c "stale": after the step's last) */
} bw;

static float BX[BMAXR * BK], BT[BMAXR * BK], BW[BN][BK * BK];
static int b_bad_out_tp; /* describe gives this out_tp (the refusal checks) */

static size_t b_shard(int64_t rows, int tp, int t, size_t* off) {
    size_t len;
    pp_tp_block((size_t)rows * BK, tp, t, off, &len);
    return len;
}

/* x (rows, BK) whole: the input, or gathered from its shard (in tmp) */
static const float* b_whole(const tpb_ctx* c, const pp_tensor* in, int sharded, int64_t rows, float* tmp, int* bad) {
    pp_error err;
    if (!sharded) return (const float*)in->data;
    if (pp_tp_allgather(&c->tp, in->data, tmp, (size_t)rows * BK, PP_F32, &err) != PP_OK) *bad = 1;
    return tmp;
}

static int b_fwd(const void* weights, int layer, pp_layer_io* io) {
    const tpb_ctx* c = (const tpb_ctx*)io->ctx;
    const bw* w = (const bw*)weights;
    int64_t r, rows = io->mb->rows;
    int k, n, bad = 0, kh = BK / w->tp, in_sh = w->sp && layer > 0;
    float* tmp = (float*)malloc(sizeof(float) * (size_t)rows * BK * 2);
    const float* x;
    pp_error err;
    if (!c || !tmp) return 3;
    x = b_whole(c, &io->in[0], in_sh, rows, tmp, &bad);
    if (w->extra && layer > 0) { /* the positions arrived whole and right */
        const int32_t* pos = (const int32_t*)io->in[1].data;
        for (r = 0; r < rows * 3; r++) bad |= pos[r] != (int32_t)(io->mb->row0 * 3 + r) ? 2 : 0;
    }
    if (w->extra && layer < BN) {
        int32_t* pos = (int32_t*)io->out[1].data;
        float* side = (float*)io->out[2].data;
        for (r = 0; r < rows * 3; r++) pos[r] = (int32_t)(io->mb->row0 * 3 + r);
        for (r = 0; r < rows; r++)
            for (k = 0; k < 2; k++)
                side[r * 2 + k] = layer == 0 ? x[r * BK + k] * 0.5f : ((const float*)io->in[2].data)[r * 2 + k] * 0.875f;
    }
    if (layer == BN) {
        const float* t = (const float*)io->mb->targets;
        float acc = 0;
        for (r = 0; r < rows * BK; r++) acc += (x[r] - t[r]) * (x[r] - t[r]);
        if (w->extra)
            for (r = 0; r < rows * 2; r++) acc += ((const float*)io->in[2].data)[r] * ((const float*)io->in[2].data)[r];
        io->loss = acc / (float)rows;
    } else {
        float* y = w->sp ? tmp + rows * BK : (float*)io->out[0].data;
        for (r = 0; r < rows; r++)
            for (n = 0; n < BK; n++) {
                float a = 0;
                for (k = 0; k < kh; k++) a += x[r * BK + w->tp_rank * kh + k] * w->w[layer][k * BK + n];
                y[r * BK + n] = a;
            }
        if (w->sp) bad |= pp_tp_reducescatter(&c->tp, y, io->out[0].data, (size_t)rows * BK, PP_F32, &err) != PP_OK;
        else bad |= pp_tp_allreduce(&c->tp, y, (size_t)rows * BK, PP_F32, &err) != PP_OK;
    }
    free(tmp);
    if (w->fail_layer > 0 && w->fail_layer == layer && io->mb->index == w->fail_mb) return 9;
    return bad ? 4 + bad : 0;
}

static int b_bwd(const void* weights, void* grads, int layer, pp_layer_io* io) {
    const tpb_ctx* c = (const tpb_ctx*)io->ctx;
    const bw* w = (const bw*)weights;
    bw* g = (bw*)grads;
    int64_t r, rows = io->mb->rows;
    int k, n, bad = 0, kh = BK / w->tp, in_sh = w->sp && layer > 0;
    float* tmp = (float*)malloc(sizeof(float) * (size_t)rows * BK * 3);
    float *dx, *dy;
    const float* x;
    pp_error err;
    size_t off = 0;
    if (!c || !tmp) return 3;
    x = b_whole(c, &io->in[0], in_sh, rows, tmp, &bad);
    dx = tmp + 2 * rows * BK; /* (rows, BK): the whole input gradient */
    if (layer == BN) {
        const float* t = (const float*)io->mb->targets;
        for (r = 0; r < rows * BK; r++) dx[r] = 2.0f * (x[r] - t[r]) / (float)rows * io->mb->loss_scale;
        if (w->extra && io->d_in[2].data)
            for (r = 0; r < rows * 2; r++)
                ((float*)io->d_in[2].data)[r] = 2.0f * ((const float*)io->in[2].data)[r] / (float)rows * io->mb->loss_scale;
        if (io->d_in[0].data) {
            if (in_sh) {
                size_t len = b_shard(rows, w->tp, w->tp_rank, &off);
                memcpy(io->d_in[0].data, dx + off, len * sizeof(float));
            } else {
                memcpy(io->d_in[0].data, dx, (size_t)rows * BK * sizeof(float));
            }
        }
        free(tmp);
        return bad ? 4 : 0;
    }
    if (w->extra) { /* the side path: side_out = 0.875 side_in; its gradient also lands in W[0] */
        const float* ds = (const float*)io->d_out[2].data;
        for (r = 0; r < rows * 2; r++) g->w[layer][0] += ds[r];
        if (layer > 0 && io->d_in[2].data)
            for (r = 0; r < rows * 2; r++) ((float*)io->d_in[2].data)[r] = ds[r] * 0.875f;
    }
    dy = w->sp ? tmp + rows * BK : (float*)io->d_out[0].data;
    if (w->sp && pp_tp_allgather(&c->tp, io->d_out[0].data, dy, (size_t)rows * BK, PP_F32, &err) != PP_OK) bad = 1;
    for (k = 0; k < kh; k++)
        for (n = 0; n < BK; n++) {
            float a = 0;
            for (r = 0; r < rows; r++) a += x[r * BK + w->tp_rank * kh + k] * dy[r * BK + n];
            g->w[layer][k * BK + n] += a;
        }
    if (io->d_in[0].data) {
        for (r = 0; r < rows; r++)
            for (k = 0; k < BK; k++) {
                float a = 0;
                int kk = k - w->tp_rank * kh;
                if (kk >= 0 && kk < kh)
                    for (n = 0; n < BK; n++) a += dy[r * BK + n] * w->w[layer][kk * BK + n];
                dx[r * BK + k] = a;
            }
        if (in_sh) bad |= pp_tp_reducescatter(&c->tp, dx, io->d_in[0].data, (size_t)rows * BK, PP_F32, &err) != PP_OK;
        else {
            bad |= pp_tp_allreduce(&c->tp, dx, (size_t)rows * BK, PP_F32, &err) != PP_OK;
            memcpy(io->d_in[0].data, dx, (size_t)rows * BK * sizeof(float));
        }
    }
    free(tmp);
    if (w->fail_bwd == layer + 1 && io->mb->index == w->fail_mb) return 9;
    return bad ? 4 : 0;
}

static void b_desc(const void* weights, int layer, const pp_microbatch* mb, const pp_tensor* in, int n_in,
                   pp_layer_desc* d) {
    const bw* w = (const bw*)weights;
    (void)in;
    (void)n_in;
    d->n_out = layer == BN ? 0 : 1;
    d->out[0].rows = w->sp ? (int64_t)b_shard(mb->rows, w->tp, w->tp_rank, NULL) : mb->rows;
    d->out[0].cols = w->sp ? 1 : BK;
    d->out[0].dtype = PP_F32;
    d->out_tp[0] = w->sp ? PP_TP_SHARDED : PP_TP_REPLICATED;
    if (w->extra && layer < BN) {
        d->n_out = 3;
        d->out[1].rows = d->out[2].rows = mb->rows;
        d->out[1].cols = 3;
        d->out[1].dtype = PP_I32;
        d->out[2].cols = 2;
        d->out[2].dtype = PP_F32;
    }
    if (b_bad_out_tp) d->out_tp[0] = (pp_tp_layout)b_bad_out_tp;
    d->n_params = layer == BN ? 0 : BK * BK;
}

static const char* b_name(int layer) { return layer == BN ? "loss" : "rowpar"; }

/* The data: inputs and targets of BMAXR rows, the whole W of each layer. */
static void b_fill(void) {
    int k, l;
    for (k = 0; k < BMAXR * BK; k++) {
        BX[k] = (float)((k * 7) % 11 - 5) / 8.0f;
        BT[k] = (float)((k * 5) % 9 - 4) / 8.0f;
    }
    for (l = 0; l < BN; l++)
        for (k = 0; k < BK * BK; k++) BW[l][k] = (k % (BK + 1) == 0 ? 0.75f : 0.0f) + (float)((k * 3 + l * 5) % 7 - 3) / 16.0f;
}

/* The whole batch over BX and BT: m micro-batches of `rows` rows in all, dense (b's other fields zero). */
static void b_batch(pp_batch* b, int m, int64_t rows) {
    memset(b, 0, sizeof *b);
    b->m = m;
    b->input.data = BX;
    b->input.rows = rows;
    b->input.cols = BK;
    b->input.dtype = PP_F32;
    b->targets = BT;
    b->target_row_bytes = BK * sizeof(float);
}

/* Rank (tp, tp_rank)'s weights: its rows of every layer. */
static void b_weights(bw* w, int tp, int tp_rank, int sp) {
    int l;
    memset(w, 0, sizeof *w);
    w->tp = tp;
    w->tp_rank = tp_rank;
    w->sp = sp;
    for (l = 0; l < BN; l++) memcpy(w->w[l], BW[l] + tp_rank * (BK / tp) * BK, sizeof(float) * (BK / tp) * BK);
}

static void b_model(pp_model* m) {
    memset(m, 0, sizeof *m);
    m->name = "bnd";
    m->n_layers = BN + 1;
    m->forward = b_fwd;
    m->backward = b_bwd;
    m->describe = b_desc;
    m->layer_name = b_name;
}
#endif
