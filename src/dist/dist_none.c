/* The data-parallel API in a build without MPI (meson found no Open MPI, or -Dmpi=disabled):
   a process is a world of one that cannot join a job. Queries answer rank 0 of 1; every call
   that would communicate fails with MT_ERR_UNSUPPORTED saying how to get MPI, so a program
   written for mpirun compiles and links everywhere and says why it cannot run. */
#include "../tensor/tensor_impl.h"
#include "dist_decline.h"

static int no_mpi(const char *fn) {
    return mt_error_set(MT_ERR_UNSUPPORTED,
                        "%s: this mixtape was built without MPI (install libopenmpi-dev and "
                        "openmpi-bin, then reconfigure with -Dmpi=enabled)",
                        fn);
}

int mt_dist_init(void) {
    return no_mpi("mt_dist_init");
}
int mt_dist_finalize(void) {
    return 0; /* nothing was initialised */
}
bool mt_dist_is_initialized(void) {
    return false;
}
int mt_dist_rank(void) {
    return 0;
}
int mt_dist_world_size(void) {
    return 1;
}
int mt_dist_id_new(mt_dist_id *id) {
    (void)id;
    return no_mpi("mt_dist_id_new");
}
int mt_dist_init_thread(int rank, int world, const mt_dist_id *id) {
    (void)rank, (void)world, (void)id;
    return no_mpi("mt_dist_init_thread");
}
int mt_dist_barrier(void) {
    return no_mpi("mt_dist_barrier");
}
int mt_dist_set_timeout(double seconds) {
    (void)seconds;
    return no_mpi("mt_dist_set_timeout");
}
double mt_dist_timeout(void) {
    return 0;
}
int mt_all_reduce(mt_tensor *t, mt_reduce_op op) {
    (void)t, (void)op;
    return no_mpi("mt_all_reduce");
}
int mt_broadcast(mt_tensor *t, int root) {
    (void)t, (void)root;
    return no_mpi("mt_broadcast");
}
mt_tensor *mt_all_gather(const mt_tensor *t) {
    (void)t;
    no_mpi("mt_all_gather");
    return NULL;
}
mt_dist_work *mt_all_reduce_async(mt_tensor *t, mt_reduce_op op) {
    (void)t, (void)op;
    no_mpi("mt_all_reduce_async");
    return NULL;
}
mt_dist_work *mt_broadcast_async(mt_tensor *t, int root) {
    (void)t, (void)root;
    no_mpi("mt_broadcast_async");
    return NULL;
}
mt_dist_work *mt_all_gather_async(mt_tensor *out, const mt_tensor *t) {
    (void)out, (void)t;
    no_mpi("mt_all_gather_async");
    return NULL;
}
int mt_dist_wait(mt_dist_work *w) {
    (void)w;
    return no_mpi("mt_dist_wait");
}
bool mt_dist_work_done(mt_dist_work *w) {
    (void)w;
    return true;
}
mt_ddp *mt_ddp_new(mt_tensor *const *params, int n, const mt_ddp_opts *opts) {
    (void)params, (void)n, (void)opts;
    no_mpi("mt_ddp_new");
    return NULL;
}
int mt_ddp_wait(mt_ddp *d) {
    (void)d;
    return no_mpi("mt_ddp_wait");
}
int mt_ddp_set_no_sync(mt_ddp *d, bool on) {
    (void)d, (void)on;
    return no_mpi("mt_ddp_set_no_sync");
}
int mt_ddp_stats_get(const mt_ddp *d, mt_ddp_stats *out) {
    (void)d, (void)out;
    return no_mpi("mt_ddp_stats_get");
}
void mt_ddp_free(mt_ddp *d) {
    (void)d;
}
int mt_dist_all_reduce_decline(const char *op, int local) {
    (void)op;
    return local; /* no peers to keep paired */
}
