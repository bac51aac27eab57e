/* tests/fuzz/fuzz_split.c - libFuzzer target: the cu_seqlens checker and the micro-batch
   splitter (pp_batch_split) on arbitrary batches.
   Any input: an error with a message, or a split whose micro-batches are non-empty, contiguous,
   cover every row and sequence once, carry rebased cu_seqlens matching the input lengths, and,
   for the balanced policies, are never worse than the equal-count split. */
#ifndef PP_TEST_LINK_IMPL /* make links build/obj/impl.o (tests/impl.c) instead */
#define PIPELINE_IMPLEMENTATION
#endif
#include "../../pipeline.h"
#define FUZZ_NAME "fuzz_split"
#include "fuzz.h"

#include <math.h>

#define MAX_SEQS 96
#define MAX_M 100

static double pick_weight(uint32_t k) {
    static const double w[] = {0, 1, 0.5, 1.0 / 64, 3, 1e-9, 1e6, -1, 1e308, 0};
    if (k == 9) return (double)NAN;
    return w[k % 10];
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fz f = {data, size, 0};
    pp_batch b;
    pp_microbatch mbs[MAX_M];
    int32_t cu_in[MAX_SEQS + 1], cu_out[MAX_SEQS + MAX_M];
    int mode, n, i, total_seqs = 0;
    int64_t rows = 0, row = 0;
    double scale = 0;
    pp_error err;
    pp_result rc;
    memset(&b, 0, sizeof b);
    memset(&err, 0, sizeof err);
    mode = (int)(fz_u8(&f) % 4);         /* 0 lengths, 1 raw cu_seqlens, 2 rows only, 3 bad fields */
    n = 1 + (int)(fz_u8(&f) % MAX_SEQS);
    b.m = 1 + (int)(fz_u8(&f) % MAX_M);
    b.split = (pp_split_policy)(fz_u8(&f) % 3);
    b.loss = (pp_loss_reduction)(fz_u8(&f) % 2);
    b.split_a = pick_weight(fz_u8(&f) % 10);
    b.split_b = pick_weight(fz_u8(&f) % 10);
    b.input.cols = 1 + fz_u8(&f) % 8;
    b.input.dtype = PP_F32;
    if (mode == 0 || mode == 3) {
        cu_in[0] = 0;
        for (i = 0; i < n; i++) cu_in[i + 1] = cu_in[i] + 1 + (int32_t)(fz_u16(&f) % (fz_left(&f) ? 2048 : 1));
        rows = cu_in[n];
    } else if (mode == 1) {
        for (i = 0; i <= n; i++) cu_in[i] = (int32_t)fz_u32(&f);
        rows = cu_in[n];
    } else {
        rows = fz_u16(&f);
    }
    b.input.rows = rows;
    if (mode != 2) {
        b.cu_seqlens = cu_in;
        b.n_seqs = n;
    }
    if (mode == 3) { /* one field out of range */
        switch (fz_u8(&f) % 6) {
        case 0: b.m = -(int)fz_u8(&f); break;
        case 1: b.split = (pp_split_policy)(3 + fz_u8(&f)); break;
        case 2: b.loss = (pp_loss_reduction)(2 + fz_u8(&f)); break;
        case 3: b.input.dtype = (pp_dtype)(PP_DTYPE_COUNT + fz_u8(&f)); break;
        case 4: b.n_seqs = -(int)fz_u8(&f); break;
        default: b.input.rows = rows - 1 - fz_u8(&f); break;
        }
    }
    rc = pp_batch_split(&b, mbs, cu_out, &err);
    if (rc != PP_OK) {
        FZ_CHECK(err.code == rc && err.msg[0], "error %s without a message", pp_result_str(rc));
        FZ_CHECK(mode != 0 || b.m > n || b.split_a < 0 || b.split_b < 0 || b.split_a != b.split_a ||
                     b.split_b != b.split_b || b.split_a >= 1e300 || b.split_b >= 1e300,
                 "a valid batch was rejected: %s", err.msg);
        return 0;
    }
    FZ_CHECK(mode != 3, "an out-of-range field was accepted (m %d split %d loss %d dtype %d n_seqs %d rows %lld)", b.m,
             (int)b.split, (int)b.loss, (int)b.input.dtype, b.n_seqs, (long long)b.input.rows);
    for (i = 0; i < b.m; i++) {
        const pp_microbatch* mb = &mbs[i];
        FZ_CHECK(mb->index == i && mb->count == b.m, "index %d count %d", mb->index, mb->count);
        FZ_CHECK(mb->rows >= 1 && mb->row0 == row, "micro-batch %d: row0 %lld rows %lld, expected row0 %lld", i,
                 (long long)mb->row0, (long long)mb->rows, (long long)row);
        FZ_CHECK(mb->loss_scale > 0 && mb->loss_scale <= 1, "loss scale %g", (double)mb->loss_scale);
        scale += mb->loss_scale;
        if (b.cu_seqlens) {
            int j, mx = 0;
            FZ_CHECK(mb->n_seqs >= 1 && mb->cu_seqlens && mb->cu_seqlens[0] == 0, "micro-batch %d: %d sequences", i,
                     mb->n_seqs);
            for (j = 0; j < mb->n_seqs; j++) {
                int32_t len = mb->cu_seqlens[j + 1] - mb->cu_seqlens[j];
                int32_t want = cu_in[total_seqs + j + 1] - cu_in[total_seqs + j];
                FZ_CHECK(len == want, "micro-batch %d sequence %d: length %d, input says %d", i, j, len, want);
                if (len > mx) mx = len;
            }
            FZ_CHECK(mb->cu_seqlens[mb->n_seqs] == mb->rows && mb->max_seqlen == mx, "micro-batch %d: ends %d rows %lld max %d/%d",
                     i, mb->cu_seqlens[mb->n_seqs], (long long)mb->rows, mb->max_seqlen, mx);
            total_seqs += mb->n_seqs;
        }
        row += mb->rows;
    }
    FZ_CHECK(row == b.input.rows, "micro-batches cover %lld of %lld rows", (long long)row, (long long)b.input.rows);
    FZ_CHECK(!b.cu_seqlens || total_seqs == n, "micro-batches hold %d of %d sequences", total_seqs, n);
    FZ_CHECK(scale > 0.999 && scale < 1.001, "loss scales sum to %g", scale);
    if (b.cu_seqlens && b.split != PP_SPLIT_SEQS) {
        /* the balanced split is optimal, so never worse than equal sequence counts */
        pp_batch eq = b;
        pp_microbatch mbs_eq[MAX_M];
        int32_t cu_eq[MAX_SEQS + MAX_M];
        double got, base;
        FZ_CHECK(pp_batch_split(&eq, mbs_eq, cu_eq, &err) == PP_OK, "same batch twice: %s", err.msg);
        got = pp_batch_split_imbalance(&b, mbs);
        eq.split = PP_SPLIT_SEQS;
        FZ_CHECK(pp_batch_split(&eq, mbs_eq, cu_eq, &err) == PP_OK, "equal-count split: %s", err.msg);
        eq.split = b.split; /* measure both under the balanced policy's cost */
        base = pp_batch_split_imbalance(&eq, mbs_eq);
        FZ_CHECK(got <= base * (1 + 1e-9), "balanced split imbalance %.9g is worse than the equal-count split's %.9g", got,
                 base);
    }
    return 0;
}
