/* All-reduce of one FP32 tensor (default 788,000 elements: SimpleNet(512)'s gradients, 3 MiB)
   between the ranks of `mpirun -np N`: mt_all_reduce (agreement check + non-blocking
   all-reduce with a bounded wait) against Open MPI's blocking MPI_Allreduce and
   MPI_Iallreduce + MPI_Wait on the same buffer, 20 calls each, 3 rounds. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "bench_util.h"
#include "mixtape.h"

int main(int argc, char **argv) {
    bool help = argc > 1 && mt_bench_is_help(argv[1]);
    int elements = 788000;
    if (help || argc > 2 ||
        (argc > 1 &&
         !mt_bench_parse_int("allreduce", "elements", argv[1], 1, 1 << 28, &elements))) {
        fprintf(help ? stdout : stderr, "usage: mpirun -np N allreduce [elements 1..%d]\n",
                1 << 28);
        return help ? 0 : 2;
    }
    int64_t n = elements;
    if (mt_dist_init() < 0) {
        fprintf(stderr, "allreduce: %s\n", mt_last_error());
        return 1;
    }
    /* Without a launcher mt_dist_init makes a world of one with no MPI, and the MPI calls
       this program compares against would abort. */
    int mpi_up = 0;
    MPI_Initialized(&mpi_up);
    if (!mpi_up) {
        fprintf(stderr, "allreduce: no MPI job: run it under mpirun (mpirun -np 2 allreduce)\n");
        mt_dist_finalize();
        return 2;
    }
    enum { CALLS = 20 };
    mt_tensor *t = mt_ones(MT_SHAPE(n), MT_F32, MT_CPU);
    float *p = mt_data_ptr(t);
    for (int round = 0; round < 3; round++) {
        double ms[3];
        for (int k = 0; k < 3; k++) {
            mt_dist_barrier();
            double t0 = mt_bench_now_s();
            for (int i = 0; i < CALLS; i++) {
                if (k == 0) {
                    if (mt_all_reduce(t, MT_REDUCE_SUM) < 0) {
                        fprintf(stderr, "allreduce: %s\n", mt_last_error());
                        return 1;
                    }
                } else if (k == 1) {
                    MPI_Allreduce(MPI_IN_PLACE, p, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                } else {
                    MPI_Request r;
                    MPI_Iallreduce(MPI_IN_PLACE, p, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
                    MPI_Wait(&r, MPI_STATUS_IGNORE);
                }
            }
            ms[k] = 1e3 * (mt_bench_now_s() - t0) / CALLS;
        }
        printf("rank %d round %d: %lld floats: mt_all_reduce %.2f ms, MPI_Allreduce %.2f ms, "
               "MPI_Iallreduce+MPI_Wait %.2f ms\n",
               mt_dist_rank(), round, (long long)n, ms[0], ms[1], ms[2]);
    }
    mt_release(t);
    return mt_dist_finalize() < 0;
}
