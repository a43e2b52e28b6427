/* A rank that dies in the middle of a data-parallel job: run as two MPI ranks under `mpirun
   --enable-recovery` (the survivor runs on), with the buckets progressed from the hooks
   (argument "hooks") or by the communication thread ("thread"). Both ranks make the mt_ddp,
   then rank 1 is killed; the survivor's step ends in a bounded MT_ERR_TIMEOUT from
   mt_ddp_wait, the next one is refused, mt_ddp_free returns (the thread is stopped and
   joined, the buckets MPI may still write are kept), and mt_dist_finalize gives up after one
   more bounded wait. */
#include <signal.h>
#include <string.h>
#include <time.h>
#include "dist_test_util.h"

#define TIMEOUT_S 1.0

static mt_ddp_progress progress;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_survivor_gets_errors(void **state) {
    (void)state;
    mt_tensor *p[2] = {mt_full(MT_SHAPE(64), MT_F32, MT_CPU, 1.0),
                       mt_full(MT_SHAPE(32), MT_F32, MT_CPU, 1.0)};
    for (int k = 0; k < 2; k++) mt_set_requires_grad(p[k], true);
    mt_ddp *ddp = mt_ddp_new(p, 2, &(mt_ddp_opts){.per_parameter = true, .progress = progress});
    assert_non_null(ddp);
    if (mt_dist_rank() == 1) raise(SIGKILL);
    assert_int_equal(mt_dist_set_timeout(TIMEOUT_S), 0);
    double t0 = seconds();
    mt_scope_begin();
    mt_tensor *loss = mt_add(mt_sum_all(p[0]), mt_sum_all(p[1]));
    assert_int_equal(mt_backward(loss, NULL), 0); /* the hooks start the buckets */
    assert_int_equal(mt_ddp_wait(ddp), MT_ERR_TIMEOUT);
    assert_error(MT_ERR_TIMEOUT, "rank 0 of 2 waited 1 s and a peer never joined");
    mt_clear_error();
    /* the world is broken: the next step's hooks and wait are refused */
    assert_int_equal(mt_backward(mt_sum_all(p[0]), NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "unusable after an earlier failure");
    mt_clear_error();
    assert_int_equal(mt_ddp_wait(ddp), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_ddp_wait: the process group is unusable");
    mt_clear_error();
    mt_scope_end();
    mt_ddp_free(ddp);
    mt_release(p[0]);
    mt_release(p[1]);
    assert_int_equal(mt_dist_finalize(), MT_ERR_TIMEOUT);
    assert_error(MT_ERR_TIMEOUT, "a timed-out collective is still pending");
    assert_true(seconds() - t0 < 10 * TIMEOUT_S); /* two waits of TIMEOUT_S and some slack */
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "hooks") != 0 && strcmp(argv[1], "thread") != 0)) {
        fprintf(stderr, "usage: test_ddp_dies hooks|thread\n");
        return 2;
    }
    progress = strcmp(argv[1], "thread") == 0 ? MT_DDP_PROGRESS_THREAD : MT_DDP_PROGRESS_HOOKS;
    mt_test_dist_begin();
    const struct CMUnitTest tests[] = {
        MT_TEST_MULTI_RANK(test_survivor_gets_errors),
    };
    int failures = MT_RUN_TESTS(tests);
    /* after the death finalize has already given up (checked above); alone it just ends */
    if (mt_dist_world_size() == 1 && mt_dist_finalize() < 0) return 1;
    return failures ? 1 : 0;
}
