/* The process's place in a data-parallel job: init from the launcher's environment (mpirun
   sets OMPI_COMM_WORLD_*; PMI/PMIx launchers set PMI_SIZE/PMIX_RANK), rank, world size,
   barrier, and the bounded wait that every collective of src/dist goes through. MPI cannot
   cancel a started collective, so a wait that times out leaves the request pending and the
   world refuses further collectives (a clear error each time instead of a hang). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include "dist_impl.h"

#define DEFAULT_TIMEOUT 300.0
/* the longest timeout: a deadline this far off still fits a timespec and a double's
   microseconds (an infinite one made the progress thread's timed wait fail at once) */
#define MAX_TIMEOUT 1e9
#define MAX_ORPHANS 64

static mt_dist_state process_state = {.rank = 0, .world = 1, .timeout = DEFAULT_TIMEOUT};
/* a thread that joined a world of threads (mt_dist_init_thread) has its own */
static _Thread_local mt_dist_state *thread_state;
/* requests abandoned by a timed-out wait; finalize gives them one more bounded chance */
static MPI_Request orphans[MAX_ORPHANS];
static int n_orphans;

mt_dist_state *mt_dist_state_get(void) {
    return thread_state ? thread_state : &process_state;
}

const char *mt_dist_device_str(mt_device d, char *buf, size_t cap) {
    if (d.type == MT_DEVICE_CUDA)
        snprintf(buf, cap, "cuda:%d", d.index);
    else
        snprintf(buf, cap, "cpu");
    return buf;
}

void mt_dist_mark_broken(const char *why) {
    mt_dist_state *st = mt_dist_state_get();
    if (st->broken) return;
    st->broken = true;
    snprintf(st->broken_why, sizeof st->broken_why, "%s", why);
}

int mt_dist_ready(const char *op) {
    mt_dist_state *st = mt_dist_state_get();
    if (!st->initialized) return mt_error_set(MT_ERR_STATE, "%s: call mt_dist_init first", op);
    if (st->finalized) return mt_error_set(MT_ERR_STATE, "%s: called after mt_dist_finalize", op);
    if (st->broken)
        return mt_error_set(MT_ERR_STATE,
                            "%s: the process group is unusable after an earlier failure (%s)", op,
                            st->broken_why);
    return 0;
}

int mt_dist_mpi_error(const char *op, int code) {
    mt_dist_state *st = mt_dist_state_get();
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(code, msg, &len);
    char why[160];
    snprintf(why, sizeof why, "%s: MPI error: %s", op, msg);
    mt_dist_mark_broken(why);
    return mt_error_set(MT_ERR_STATE, "%s: MPI failed on rank %d of %d: %s", op, st->rank,
                        st->world, msg);
}

static void pause_briefly(long spins) {
    /* spin briefly (a collective among ranks on one node completes in microseconds), then
       sleep in short, growing naps: a waiting rank must not take the core from the peer it
       waits for (ranks often share cores), and a nap of at most 200 us costs little */
    if (spins < 64) return;
    long us = spins < 128 ? 10 : spins < 256 ? 50 : 200;
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

int mt_dist_test_request(const char *op, MPI_Request *req, bool *done) {
    int flag = 0;
    int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mt_dist_mpi_error(op, rc);
    *done = flag != 0;
    return 0;
}

void mt_dist_orphan_request(MPI_Request *req) {
    if (*req != MPI_REQUEST_NULL && n_orphans < MAX_ORPHANS) orphans[n_orphans++] = *req;
}

int mt_dist_wait_request(const char *op, MPI_Request *req) {
    mt_dist_state *st = mt_dist_state_get();
    double deadline = MPI_Wtime() + st->timeout;
    for (long spins = 0;; spins++) {
        bool done = false;
        int rc = mt_dist_test_request(op, req, &done);
        if (rc < 0 || done) return rc;
        if (MPI_Wtime() > deadline) {
            mt_dist_orphan_request(req);
            char why[160];
            snprintf(why, sizeof why, "%s timed out after %g s", op, st->timeout);
            mt_dist_mark_broken(why);
            return mt_error_set(MT_ERR_TIMEOUT,
                                "%s: rank %d of %d waited %g s and a peer never joined (a rank "
                                "that died, hangs, or skipped this collective); see "
                                "mt_dist_set_timeout",
                                op, st->rank, st->world, st->timeout);
        }
        pause_briefly(spins);
    }
}

int mt_dist_agree(const char *op, MPI_Comm comm, const int64_t *vals, int n, int *bad, int64_t *lo,
                  int64_t *hi) {
    /* on the heap: after a timeout MPI may still write here, so the buffer is then leaked */
    int64_t *buf = mt_heap_alloc(2 * (size_t)n * sizeof *buf);
    if (!buf) return mt_error_set(MT_ERR_OOM, "%s: out of memory", op);
    for (int i = 0; i < n; i++) {
        buf[i] = vals[i];
        buf[n + i] = -vals[i];
    }
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, 2 * n, MPI_INT64_T, MPI_MAX, comm, &req);
    if (rc != MPI_SUCCESS) {
        free(buf);
        return mt_dist_mpi_error(op, rc);
    }
    rc = mt_dist_wait_request(op, &req);
    if (rc == MT_ERR_TIMEOUT) return rc;
    for (int i = 0; rc == 0 && i < n; i++)
        if (buf[i] != -buf[n + i]) {
            *bad = i;
            *lo = -buf[n + i];
            *hi = buf[i];
            rc = MT_ERR_SHAPE;
        }
    free(buf);
    return rc;
}

static bool launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

static int read_timeout_env(void) {
    mt_dist_state *st = mt_dist_state_get();
    const char *env = getenv("MT_DIST_TIMEOUT");
    if (!env || !*env) return 0;
    char *end = NULL;
    double v = strtod(env, &end);
    if (!end || *end || !(v > 0 && v <= MAX_TIMEOUT))
        return mt_error_set(MT_ERR_INVALID,
                            "mt_dist_init: MT_DIST_TIMEOUT=%s is not a number of seconds in "
                            "(0, %g]",
                            env, MAX_TIMEOUT);
    st->timeout = v;
    return 0;
}

static int init_mpi(void) {
    mt_dist_state *st = mt_dist_state_get();
    int already = 0;
    MPI_Initialized(&already);
    int provided = MPI_THREAD_SINGLE;
    if (!already) {
        /* MULTIPLE: mt_ddp's communication thread (MT_DDP_PROGRESS_THREAD) tests its buckets
           while the main thread may call MPI for other collectives; a build of MPI that gives
           less still works for everything else, and mt_ddp_new refuses the thread then */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return mt_error_set(MT_ERR_STATE, "mt_dist_init: MPI_Init_thread failed");
        st->own_mpi = true;
    } else {
        MPI_Query_thread(&provided); /* the user's own MPI_Init*: its level */
    }
    st->thread_level = provided;
    /* errors come back as codes instead of aborting the job (MPI_ERRORS_ARE_FATAL) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &st->comm);
    if (rc != MPI_SUCCESS) return mt_dist_mpi_error("mt_dist_init", rc);
    MPI_Comm_rank(st->comm, &st->rank);
    MPI_Comm_size(st->comm, &st->world);
    st->mpi = true;
    return 0;
}

int mt_dist_init(void) {
    mt_dist_state *st = mt_dist_state_get();
    if (st->initialized && !st->finalized) return 0;
    if (st->finalized)
        return mt_error_set(MT_ERR_STATE,
                            "mt_dist_init: called after mt_dist_finalize (MPI cannot restart)");
    int rc = read_timeout_env();
    if (rc < 0) return rc;
    if (launched_by_mpi()) {
        rc = init_mpi();
        if (rc < 0) return rc;
    } else {
        const char *ws = getenv("WORLD_SIZE");
        if (ws && *ws && strcmp(ws, "1") != 0)
            return mt_error_set(MT_ERR_UNSUPPORTED,
                                "mt_dist_init: WORLD_SIZE=%s but no MPI launcher: the "
                                "torchrun-style rendezvous is not supported, launch the ranks "
                                "with mpirun -np N",
                                ws);
        st->rank = 0;
        st->world = 1;
    }
    st->initialized = true;
    return 0;
}

int mt_dist_finalize(void) {
    mt_dist_state *st = mt_dist_state_get();
    if (thread_state) {
        /* a rank of a world of threads: back to the process's world */
        mt_dist_nccl_destroy(st);
        free(st);
        thread_state = NULL;
        return 0;
    }
    if (!st->initialized || st->finalized) return 0;
    /* MPI_Finalize under a request still in flight crashes inside MPI; and the work, still
       the caller's, would be waited for after MPI has gone */
    if (st->live_works > 0)
        return mt_error_set(MT_ERR_STATE,
                            "mt_dist_finalize: %d collective(s) started with mt_*_async are still "
                            "in flight; mt_dist_wait for them first",
                            st->live_works);
    int rc = 0;
    mt_dist_nccl_destroy(st); /* before MPI goes: NCCL's bootstrap may use its network */
    if (st->mpi) {
        /* an orphaned collective must complete before MPI may shut down: one more bounded
           wait for each (a late peer may have joined since) */
        double deadline = MPI_Wtime() + st->timeout;
        for (int i = 0; i < n_orphans && rc == 0; i++) {
            bool done = false;
            for (long spins = 0; rc == 0 && !done; spins++) {
                rc = mt_dist_test_request("mt_dist_finalize", &orphans[i], &done);
                if (rc == 0 && !done && MPI_Wtime() > deadline)
                    rc = mt_error_set(MT_ERR_TIMEOUT,
                                      "mt_dist_finalize: a timed-out collective is still "
                                      "pending after %g s more; MPI is left running",
                                      st->timeout);
                pause_briefly(spins);
            }
        }
        if (rc == 0) {
            n_orphans = 0;
            MPI_Comm_free(&st->comm);
            if (st->own_mpi) MPI_Finalize();
        }
    }
    st->finalized = true;
    return rc;
}

bool mt_dist_is_initialized(void) {
    mt_dist_state *st = mt_dist_state_get();
    return st->initialized && !st->finalized;
}
int mt_dist_rank(void) {
    mt_dist_state *st = mt_dist_state_get();
    return st->rank;
}
int mt_dist_world_size(void) {
    mt_dist_state *st = mt_dist_state_get();
    return st->world;
}

int mt_dist_set_timeout(double seconds) {
    mt_dist_state *st = mt_dist_state_get();
    if (!(seconds > 0 && seconds <= MAX_TIMEOUT))
        return mt_error_set(MT_ERR_INVALID,
                            "mt_dist_set_timeout: arg 1: %g is not a number of seconds in (0, %g]",
                            seconds, MAX_TIMEOUT);
    st->timeout = seconds;
    return 0;
}
double mt_dist_timeout(void) {
    mt_dist_state *st = mt_dist_state_get();
    return st->timeout;
}

int mt_dist_barrier(void) {
    mt_dist_state *st = mt_dist_state_get();
    const char *op = "mt_dist_barrier";
    int rc = mt_dist_ready(op);
    if (rc == 0 && !st->mpi && st->world > 1)
        return mt_error_set(MT_ERR_UNSUPPORTED,
                            "%s: a world of threads (mt_dist_init_thread) has "
                            "no MPI to meet through",
                            op);
    if (rc < 0 || !st->mpi) return rc;
    MPI_Request req;
    rc = MPI_Ibarrier(st->comm, &req);
    return rc != MPI_SUCCESS ? mt_dist_mpi_error(op, rc) : mt_dist_wait_request(op, &req);
}

int mt_dist_id_new(mt_dist_id *id) {
    const char *fn = "mt_dist_id_new";
    if (!id) return mt_error_set(MT_ERR_NULL, "%s: arg 1: id is NULL", fn);
    _Static_assert(sizeof id->bytes == sizeof process_state.nccl_id, "an NCCL unique id");
    unsigned char tmp[sizeof id->bytes];
    int rc = mt_dist_nccl_new_id(fn, tmp);
    if (rc == 0) memcpy(id->bytes, tmp, sizeof tmp);
    return rc;
}

int mt_dist_init_thread(int rank, int world, const mt_dist_id *id) {
    const char *fn = "mt_dist_init_thread";
    if (!id) return mt_error_set(MT_ERR_NULL, "%s: arg 3: id is NULL", fn);
    if (world < 1 || rank < 0 || rank >= world)
        return mt_error_set(MT_ERR_INVALID, "%s: rank %d is not a rank of a world of %d", fn, rank,
                            world);
    if (thread_state)
        return mt_error_set(MT_ERR_STATE,
                            "%s: this thread is already rank %d of %d; mt_dist_finalize first", fn,
                            thread_state->rank, thread_state->world);
    mt_dist_state *st = mt_heap_calloc(1, sizeof *st);
    if (!st) return mt_error_set(MT_ERR_OOM, "%s: out of memory", fn);
    st->initialized = true;
    st->rank = rank;
    st->world = world;
    st->comm = MPI_COMM_NULL;
    st->timeout = process_state.timeout;
    st->has_nccl_id = true;
    memcpy(st->nccl_id, id->bytes, sizeof st->nccl_id);
    thread_state = st;
    return 0;
}
