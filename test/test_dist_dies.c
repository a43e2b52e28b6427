/* A rank that dies: run as two MPI ranks under `mpirun --enable-recovery` (so that mpirun
   lets the survivor run on instead of killing the job), rank 1 is killed (SIGKILL) right
   after joining. The survivor's collectives end in a bounded MT_ERR_TIMEOUT, later ones are
   refused with MT_ERR_STATE, and mt_dist_finalize gives up after one more bounded wait:
   errors on the surviving rank, never a hang. */
#include <signal.h>
#include <time.h>
#include "dist_test_util.h"

#define TIMEOUT_S 1.0

static void test_survivor_gets_errors(void **state) {
    (void)state;
    assert_int_equal(mt_dist_set_timeout(TIMEOUT_S), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(mt_dist_barrier(), MT_ERR_TIMEOUT);
    assert_error(MT_ERR_TIMEOUT, "mt_dist_barrier: rank 0 of 2 waited 1 s and a peer never joined");
    mt_tensor *t = mt_ones(MT_SHAPE(3), MT_F32, MT_CPU);
    assert_int_equal(mt_all_reduce(t, MT_REDUCE_SUM), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "unusable after an earlier failure (mt_dist_barrier timed out");
    mt_release(t);
    assert_int_equal(mt_dist_finalize(), MT_ERR_TIMEOUT);
    assert_error(MT_ERR_TIMEOUT, "a timed-out collective is still pending");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    assert_true(took < 10 * TIMEOUT_S); /* bounded: two waits of TIMEOUT_S and some slack */
}

int main(void) {
    mt_test_dist_begin();
    if (mt_dist_world_size() > 1 && mt_dist_rank() == 1) raise(SIGKILL);
    const struct CMUnitTest tests[] = {
        MT_TEST_MULTI_RANK(test_survivor_gets_errors),
    };
    int failures = MT_RUN_TESTS(tests);
    /* after the death finalize has already given up (checked above); alone it just ends */
    if (mt_dist_world_size() == 1 && mt_dist_finalize() < 0) return 1;
    return failures ? 1 : 0;
}
