/* A program that initialised MPI itself at MPI_THREAD_SERIALIZED before mt_dist_init (run
   as two MPI ranks): mt_ddp_new refuses the communication thread (MT_DDP_PROGRESS_THREAD
   needs MPI_THREAD_MULTIPLE) with a clear error and no hang, and the hooks' progress still
   averages the gradients; mt_dist_finalize leaves MPI to the program that started it. */
#include <mpi.h>
#include "dist_test_util.h"

static void test_thread_refused_hooks_work(void **state) {
    (void)state;
    int level = 0;
    MPI_Query_thread(&level);
    assert_true(level < MPI_THREAD_MULTIPLE);
    int W = mt_dist_world_size(), me = mt_dist_rank();
    mt_tensor *p = mt_full(MT_SHAPE(3), MT_F32, MT_CPU, 1.0);
    mt_set_requires_grad(p, true);
    assert_null(mt_ddp_new(&p, 1, &(mt_ddp_opts){.progress = MT_DDP_PROGRESS_THREAD}));
    assert_error(MT_ERR_UNSUPPORTED, "MT_DDP_PROGRESS_THREAD needs MPI_THREAD_MULTIPLE");
    mt_clear_error();
    mt_ddp *ddp = mt_ddp_new(&p, 1, NULL);
    assert_non_null(ddp);
    mt_scope_begin();
    assert_int_equal(mt_backward(mt_sum_all(mt_mul_scalar(p, me + 1.0)), NULL), 0);
    assert_int_equal(mt_ddp_wait(ddp), 0);
    double avg = (W + 1) / 2.0, want[3] = {avg, avg, avg}; /* the mean of 1..W */
    assert_tensor_close(mt_grad(p), want, 3, 0, 0);
    mt_scope_end();
    mt_ddp_free(ddp);
    mt_release(p);
}

int main(int argc, char **argv) {
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return 1;
    mt_test_dist_begin();
    const struct CMUnitTest tests[] = {
        MT_TEST_MULTI_RANK(test_thread_refused_hooks_work),
    };
    int failures = mt_test_dist_end(MT_RUN_TESTS(tests));
    MPI_Finalize();
    return failures;
}
