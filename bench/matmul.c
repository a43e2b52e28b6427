/* mt_matmul against a direct cblas_sgemm call on the same buffers: 1024 x 1024 x 1024 F32,
   best of N repetitions each, interleaved so both see the same machine load. Prints the
   times and the ratio (mt_matmul / sgemm; 1.00 means no overhead). Also times the F16 and
   BF16 paths (FP32 panels) against the same sgemm.
   Usage: matmul [size] [reps] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include "bench_util.h"
#include "mixtape.h"

int main(int argc, char **argv) {
    if (argc > 1 && mt_bench_is_help(argv[1])) {
        printf("usage: %s [size 1..65536] [reps > 0]\n", argv[0]);
        return 0;
    }
    int size = 1024, reps = 10;
    if (argc > 3 || (argc > 1 && !mt_bench_parse_int(argv[0], "size", argv[1], 1, 65536, &size)) ||
        (argc > 2 && !mt_bench_parse_int(argv[0], "reps", argv[2], 1, 1000000, &reps))) {
        fprintf(stderr, "usage: %s [size 1..65536] [reps > 0]\n", argv[0]);
        return 2;
    }
    int64_t n = size;
    mt_manual_seed(1);
    mt_tensor *a = mt_randn(MT_SHAPE(n, n), MT_F32, MT_CPU);
    mt_tensor *b = mt_randn(MT_SHAPE(n, n), MT_F32, MT_CPU);
    mt_tensor *c = mt_empty(MT_SHAPE(n, n), MT_F32, MT_CPU);
    if (!a || !b || !c) {
        fprintf(stderr, "setup failed: %s\n", mt_last_error());
        return 1;
    }
    const float *pa = mt_data_ptr(a), *pb = mt_data_ptr(b);
    float *pc = mt_data_ptr(c);
    double best_mt = 1e30, best_blas = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* the first round warms caches and threads */
        double t0 = mt_bench_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, pa,
                    (int)n, pb, (int)n, 0.0f, pc, (int)n);
        double t1 = mt_bench_now_s();
        mt_tensor *y = mt_matmul(a, b);
        double t2 = mt_bench_now_s();
        if (!y) {
            fprintf(stderr, "mt_matmul failed: %s\n", mt_last_error());
            return 1;
        }
        mt_release(y);
        if (r > 0) {
            if (t1 - t0 < best_blas) best_blas = t1 - t0;
            if (t2 - t1 < best_mt) best_mt = t2 - t1;
        }
    }
    double gflop = 2.0 * (double)n * (double)n * (double)n * 1e-9;
    printf("matmul %lldx%lldx%lld f32, best of %d, %d threads\n", (long long)n, (long long)n,
           (long long)n, reps, mt_get_num_threads());
    printf("  cblas_sgemm  %9.3f ms  %7.1f GFLOP/s\n", best_blas * 1e3, gflop / best_blas);
    printf("  mt_matmul    %9.3f ms  %7.1f GFLOP/s\n", best_mt * 1e3, gflop / best_mt);
    printf("  ratio mt_matmul / sgemm = %.3f\n", best_mt / best_blas);

    const mt_dtype lows[] = {MT_F16, MT_BF16};
    for (int l = 0; l < 2; l++) {
        mt_tensor *al = mt_cast(a, lows[l]), *bl = mt_cast(b, lows[l]);
        double best = 1e30;
        for (int r = 0; r < reps + 1; r++) {
            double t0 = mt_bench_now_s();
            mt_tensor *y = mt_matmul(al, bl);
            double t1 = mt_bench_now_s();
            if (!y) {
                fprintf(stderr, "mt_matmul failed: %s\n", mt_last_error());
                return 1;
            }
            mt_release(y);
            if (r > 0 && t1 - t0 < best) best = t1 - t0;
        }
        printf("  mt_matmul %-4s %7.3f ms  %7.1f GFLOP/s  (%.3f x sgemm)\n", mt_dtype_name(lows[l]),
               best * 1e3, gflop / best, best / best_blas);
        mt_release(al);
        mt_release(bl);
    }
    mt_release(a);
    mt_release(b);
    mt_release(c);
    return 0;
}
