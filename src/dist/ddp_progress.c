/* How a CPU bucket's all-reduce advances while backward runs (mt_ddp_opts.progress). Open
   MPI (4.1, no asynchronous progress thread) only advances a non-blocking collective inside
   an MPI call of the same process, so a bucket started from a hook would mostly move when
   mt_ddp_wait waits for it. Two ways to give it MPI calls during backward:
   - hooks (default): every gradient-ready hook tests all buckets in flight with one
     MPI_Testsome (ddp.c's launch_ready). No thread and no extra core; the gaps between hooks
     (one layer's backward) are the granularity, and MPI's copies and sums run on the compute
     thread inside the hooks.
   - thread: a communication thread per mt_ddp owns the buckets' MPI calls (start and test),
     as torch's gloo and Paddle do; it naps 10-200 us between tests (cond_timedwait, so a
     newly handed bucket wakes it at once), because on a small machine the ranks' compute
     threads need the cores a spinning thread would take. Needs MPI_THREAD_MULTIPLE.
   Measured on the 2-core VM (README, data parallel table) the hooks win: there the thread
   competes with both ranks' compute threads for a core (ResNet-18 ran 20% slower with it),
   so they are the default. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "ddp_impl.h"

double mt_ddp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int mt_ddp_start_mpi(mt_ddp *d, int i) {
    ddp_bucket *b = &d->buckets[i];
    MPI_Datatype type = b->dt == MT_F64 ? MPI_DOUBLE : MPI_FLOAT;
    return MPI_Iallreduce(MPI_IN_PLACE, b->buf, (int)b->numel, type, MPI_SUM, d->comm, &d->reqs[i]);
}

int mt_ddp_test_started(mt_ddp *d, int n, int *count) {
    *count = 0;
    if (n == 0) return MPI_SUCCESS;
    int rc = MPI_Testsome(n, d->reqs, count, d->done_idx, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || *count == MPI_UNDEFINED) *count = 0;
    return rc;
}

void mt_ddp_mark_done(ddp_bucket *b, double t) {
    b->done = true;
    b->done_time = t;
}

/* ---- the communication thread */

static void comm_nap(ddp_comm *c, long idle) {
    /* a few immediate retests (a small bucket between two ranks completes in microseconds),
       then growing naps that a newly handed bucket or stop cuts short */
    if (idle < 8) return;
    long us = idle < 32 ? 10 : idle < 128 ? 50 : 200;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += us * 1000;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&c->wake, &c->mu, &ts);
}

static void *comm_main(void *arg) {
    mt_ddp *d = arg;
    ddp_comm *c = &d->comm_thread;
    long idle = 0;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        bool busy = c->started < c->queued || c->completed < c->started;
        if (!busy || c->mpi_error != MPI_SUCCESS || c->abandoned) {
            idle = 0;
            pthread_cond_wait(&c->wake, &c->mu);
            continue;
        }
        int rc, count = 0;
        if (c->started < c->queued) {
            int i = c->started;
            pthread_mutex_unlock(&c->mu);
            double t = mt_ddp_now();
            rc = mt_ddp_start_mpi(d, i);
            pthread_mutex_lock(&c->mu);
            d->buckets[i].start_time = t;
            if (rc == MPI_SUCCESS) c->started++;
            idle = 0;
        } else {
            int n = c->started;
            pthread_mutex_unlock(&c->mu);
            rc = mt_ddp_test_started(d, n, &count);
            double t = mt_ddp_now();
            pthread_mutex_lock(&c->mu);
            for (int k = 0; k < count; k++) mt_ddp_mark_done(&d->buckets[d->done_idx[k]], t);
            c->completed += count;
        }
        if (rc != MPI_SUCCESS) c->mpi_error = rc;
        if (count > 0 || rc != MPI_SUCCESS) pthread_cond_broadcast(&c->done);
        if (count > 0) idle = 0;
        if (c->started == c->queued && c->completed < c->started && count == 0) comm_nap(c, ++idle);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int mt_ddp_comm_start(mt_ddp *d) {
    ddp_comm *c = &d->comm_thread;
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc == 0) rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0 && (rc = pthread_mutex_init(&c->mu, NULL)) == 0) {
        if ((rc = pthread_cond_init(&c->wake, &attr)) == 0) {
            if ((rc = pthread_cond_init(&c->done, &attr)) == 0) {
                c->mpi_error = MPI_SUCCESS;
                if ((rc = pthread_create(&c->tid, NULL, comm_main, d)) == 0) d->threaded = true;
                if (rc) pthread_cond_destroy(&c->done);
            }
            if (rc) pthread_cond_destroy(&c->wake);
        }
        if (rc) pthread_mutex_destroy(&c->mu);
    }
    pthread_condattr_destroy(&attr);
    if (rc == 0) return 0;
    return mt_error_set(rc == EAGAIN || rc == ENOMEM ? MT_ERR_OOM : MT_ERR_STATE,
                        "mt_ddp_new: cannot start the communication thread: %s", strerror(rc));
}

void mt_ddp_comm_stop(mt_ddp *d) {
    ddp_comm *c = &d->comm_thread;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->tid, NULL);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->mu);
    d->threaded = false;
}

void mt_ddp_comm_hand_over(mt_ddp *d, int n) {
    ddp_comm *c = &d->comm_thread;
    pthread_mutex_lock(&c->mu);
    c->queued = n;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
}

int mt_ddp_comm_wait(mt_ddp *d, int n) {
    ddp_comm *c = &d->comm_thread;
    mt_dist_state *st = mt_dist_state_get();
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    double whole = (double)(time_t)st->timeout;
    dl.tv_sec += (time_t)whole;
    dl.tv_nsec += (long)((st->timeout - whole) * 1e9);
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    bool late = false;
    pthread_mutex_lock(&c->mu);
    if (c->abandoned) {
        pthread_mutex_unlock(&c->mu);
        return mt_error_set(MT_ERR_STATE, "mt_ddp_wait: an earlier step of this mt_ddp failed "
                                          "with all-reduces in flight");
    }
    int wait_rc = 0;
    while (c->completed < n && c->mpi_error == MPI_SUCCESS && !late && wait_rc != EINVAL) {
        wait_rc = pthread_cond_timedwait(&c->done, &c->mu, &dl);
        late = wait_rc == ETIMEDOUT && c->completed < n;
    }
    if (wait_rc == EINVAL && c->completed < n) late = true; /* no deadline: give up */
    int err = c->mpi_error;
    if (late) c->abandoned = true; /* the requests stay in flight; the world is broken */
    pthread_mutex_unlock(&c->mu);
    if (err != MPI_SUCCESS) return mt_dist_mpi_error("mt_ddp_wait", err);
    if (!late) return 0;
    char why[160];
    snprintf(why, sizeof why, "mt_ddp_wait timed out after %g s", st->timeout);
    mt_dist_mark_broken(why);
    return mt_error_set(MT_ERR_TIMEOUT,
                        "mt_ddp_wait: rank %d of %d waited %g s and a peer never joined (a rank "
                        "that died, hangs, or skipped this step); see mt_dist_set_timeout",
                        st->rank, st->world, st->timeout);
}

void mt_ddp_comm_reset(mt_ddp *d) {
    ddp_comm *c = &d->comm_thread;
    pthread_mutex_lock(&c->mu);
    if (!c->abandoned && c->mpi_error == MPI_SUCCESS && c->completed == c->started)
        c->queued = c->started = c->completed = 0;
    else /* a failed step left requests in flight: they are never reused */
        c->abandoned = true;
    pthread_mutex_unlock(&c->mu);
}
