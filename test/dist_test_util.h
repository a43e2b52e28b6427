/* What the tests that run as several MPI ranks share: joining the job, one TAP stream
   (rank 0's; the other ranks write theirs to stderr, where failures still show, and their
   exit status still fails the run through mpirun), and the world's size and rank. */
#ifndef MT_DIST_TEST_UTIL_H
#define MT_DIST_TEST_UTIL_H
#include <unistd.h>
#include "test_util.h"

static inline void mt_test_dist_begin(void) {
    if (mt_dist_init() < 0) mt_test_bail_out("mt_dist_init failed: %s", mt_last_error());
    if (mt_dist_rank() != 0) dup2(2, 1);
    printf("# rank %d of %d\n", mt_dist_rank(), mt_dist_world_size());
}

static inline int mt_test_dist_end(int failures) {
    if (mt_dist_finalize() < 0) {
        fprintf(stderr, "# mt_dist_finalize: %s\n", mt_last_error());
        return 1;
    }
    return failures ? 1 : 0;
}

/* Registers fn only where the world has at least two ranks. */
#define MT_TEST_MULTI_RANK(fn)                                                                     \
    (mt_dist_world_size() > 1 ? (struct CMUnitTest)MT_TEST(fn)                                     \
                              : MT_TEST_SKIPPED(fn, "needs 2 ranks (mpirun -np 2)"))
/* Registers fn only where the process is a world of its own. */
#define MT_TEST_ONE_RANK(fn, why)                                                                  \
    (mt_dist_world_size() == 1 ? (struct CMUnitTest)MT_TEST(fn) : MT_TEST_SKIPPED(fn, why))
#endif
