/* tests/tp_data.h - the TP collectives' test data and sequential reference, shared by
   tests/test_tp.c (threads) and tests/test_tp_mpi.c (MPI). Include after pipeline.h. */
#ifndef PP_TESTS_TP_DATA_H
#define PP_TESTS_TP_DATA_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 8
#define MAXC 1001
static const pp_dtype DTYPES[4] = {PP_F32, PP_F64, PP_F16, PP_BF16};
static const size_t COUNTS[] = {0, 1, 3, 7, 64, 1001};
#define NCOUNTS (sizeof COUNTS / sizeof COUNTS[0])

/* Rank r's element j: magnitudes from 2^-12 to 2^12 and both signs, so the order of a sum shows. */
static double value(int r, size_t j) {
    uint32_t h = (uint32_t)(r * 2654435761u) ^ (uint32_t)(j * 40503u + 977u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((h & 1) ? -1.0 : 1.0) * ldexp(1.0 + (double)(h >> 8 & 0xffff) / 65536.0, (int)(h >> 24) % 25 - 12);
}

static void fill(void* buf, pp_dtype dt, int r, size_t n) {
    size_t j;
    for (j = 0; j < n; j++) {
        double v = value(r, j);
        if (dt == PP_F32) ((float*)buf)[j] = (float)v;
        if (dt == PP_F64) ((double*)buf)[j] = v;
        if (dt == PP_F16) ((uint16_t*)buf)[j] = pp_f32_to_f16((float)v);
        if (dt == PP_BF16) ((uint16_t*)buf)[j] = pp_f32_to_bf16((float)v);
    }
}

/* The sequential reference: element j of the sum over TP ranks 0..n-1 of the members' inputs. */
static void reference(void* out, pp_dtype dt, const int* member_seed, int n, size_t count) {
    unsigned char(*in)[MAXC * 8] = (unsigned char(*)[MAXC * 8])malloc(sizeof *in * MAXN); /* threads call it too */
    size_t j;
    int r;
    if (!in) {
        memset(out, 0xff, count * pp_dtype_size(dt)); /* matches nothing: the check fails */
        return;
    }
    for (r = 0; r < n; r++) fill(in[r], dt, member_seed[r], count);
    for (j = 0; j < count; j++) {
        if (dt == PP_F64) {
            double a = ((double*)in[0])[j];
            for (r = 1; r < n; r++) a += ((double*)in[r])[j];
            ((double*)out)[j] = a;
        } else if (dt == PP_F32) {
            float a = ((float*)in[0])[j];
            for (r = 1; r < n; r++) a += ((float*)in[r])[j];
            ((float*)out)[j] = a;
        } else {
            float a = dt == PP_F16 ? pp_f16_to_f32(((uint16_t*)in[0])[j]) : pp_bf16_to_f32(((uint16_t*)in[0])[j]);
            for (r = 1; r < n; r++)
                a += dt == PP_F16 ? pp_f16_to_f32(((uint16_t*)in[r])[j]) : pp_bf16_to_f32(((uint16_t*)in[r])[j]);
            ((uint16_t*)out)[j] = dt == PP_F16 ? pp_f32_to_f16(a) : pp_f32_to_bf16(a);
        }
    }
    free(in);
}

#endif
