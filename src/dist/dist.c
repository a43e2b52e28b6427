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
#define MAX_ORPHANS     64

static mt_dist_state state = {.rank = 0, .world = 1, .timeout = DEFAULT_TIMEOUT};
/* requests abandoned by a timed-out wait; finalize gives them one more bounded chance */
static MPI_Request orphans[MAX_ORPHANS];
static int n_orphans;

mt_dist_state *mt_dist_state_get(void) {
    return &state;
}

const char *mt_dist_device_str(mt_device d, char *buf, size_t cap) {
    if (d.type == MT_DEVICE_CUDA)
        snprintf(buf, cap, "cuda:%d", d.index);
    else
        snprintf(buf, cap, "cpu");
    return buf;
}

static void mark_broken(const char *why) {
    if (state.broken) return;
    state.broken = true;
    snprintf(state.broken_why, sizeof state.broken_why, "%s", why);
}

int mt_dist_ready(const char *op) {
    if (!state.initialized) return mt_error_set(MT_ERR_STATE, "%s: call mt_dist_init first", op);
    if (state.finalized) return mt_error_set(MT_ERR_STATE, "%s: called after mt_dist_finalize", op);
    if (state.broken)
        return mt_error_set(MT_ERR_STATE,
                            "%s: the process group is unusable after an earlier failure (%s)", op,
                            state.broken_why);
    return 0;
}

int mt_dist_mpi_error(const char *op, int code) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(code, msg, &len);
    char why[160];
    snprintf(why, sizeof why, "%s: MPI error: %s", op, msg);
    mark_broken(why);
    return mt_error_set(MT_ERR_STATE, "%s: MPI failed on rank %d of %d: %s", op, state.rank,
                        state.world, msg);
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

int mt_dist_wait_request(const char *op, MPI_Request *req) {
    double deadline = MPI_Wtime() + state.timeout;
    for (long spins = 0;; spins++) {
        bool done = false;
        int rc = mt_dist_test_request(op, req, &done);
        if (rc < 0 || done) return rc;
        if (MPI_Wtime() > deadline) {
            if (n_orphans < MAX_ORPHANS) orphans[n_orphans++] = *req;
            char why[160];
            snprintf(why, sizeof why, "%s timed out after %g s", op, state.timeout);
            mark_broken(why);
            return mt_error_set(MT_ERR_TIMEOUT,
                                "%s: rank %d of %d waited %g s and a peer never joined (a rank "
                                "that died, hangs, or skipped this collective); see "
                                "mt_dist_set_timeout",
                                op, state.rank, state.world, state.timeout);
        }
        pause_briefly(spins);
    }
}

int mt_dist_agree(const char *op, MPI_Comm comm, const int64_t *vals, int n, int *bad, int64_t *lo,
                  int64_t *hi) {
    /* on the heap: after a timeout MPI may still write here, so the buffer is then leaked */
    int64_t *buf = malloc(2 * (size_t)n * sizeof *buf);
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
    const char *env = getenv("MT_DIST_TIMEOUT");
    if (!env || !*env) return 0;
    char *end = NULL;
    double v = strtod(env, &end);
    if (!end || *end || !(v > 0))
        return mt_error_set(MT_ERR_INVALID,
                            "mt_dist_init: MT_DIST_TIMEOUT=%s is not a positive number of seconds",
                            env);
    state.timeout = v;
    return 0;
}

static int init_mpi(void) {
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return mt_error_set(MT_ERR_STATE, "mt_dist_init: MPI_Init_thread failed");
        state.own_mpi = true;
    }
    /* errors come back as codes instead of aborting the job (MPI_ERRORS_ARE_FATAL) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &state.comm);
    if (rc != MPI_SUCCESS) return mt_dist_mpi_error("mt_dist_init", rc);
    MPI_Comm_rank(state.comm, &state.rank);
    MPI_Comm_size(state.comm, &state.world);
    state.mpi = true;
    return 0;
}

int mt_dist_init(void) {
    if (state.initialized && !state.finalized) return 0;
    if (state.finalized)
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
        state.rank = 0;
        state.world = 1;
    }
    state.initialized = true;
    return 0;
}

int mt_dist_finalize(void) {
    if (!state.initialized || state.finalized) return 0;
    int rc = 0;
    if (state.mpi) {
        /* an orphaned collective must complete before MPI may shut down: one more bounded
           wait for each (a late peer may have joined since) */
        double deadline = MPI_Wtime() + state.timeout;
        for (int i = 0; i < n_orphans && rc == 0; i++) {
            bool done = false;
            for (long spins = 0; rc == 0 && !done; spins++) {
                rc = mt_dist_test_request("mt_dist_finalize", &orphans[i], &done);
                if (rc == 0 && !done && MPI_Wtime() > deadline)
                    rc = mt_error_set(MT_ERR_TIMEOUT,
                                      "mt_dist_finalize: a timed-out collective is still "
                                      "pending after %g s more; MPI is left running",
                                      state.timeout);
                pause_briefly(spins);
            }
        }
        if (rc == 0) {
            n_orphans = 0;
            MPI_Comm_free(&state.comm);
            if (state.own_mpi) MPI_Finalize();
        }
    }
    state.finalized = true;
    return rc;
}

bool mt_dist_is_initialized(void) {
    return state.initialized && !state.finalized;
}
int mt_dist_rank(void) {
    return state.rank;
}
int mt_dist_world_size(void) {
    return state.world;
}

int mt_dist_set_timeout(double seconds) {
    if (!(seconds > 0))
        return mt_error_set(MT_ERR_INVALID,
                            "mt_dist_set_timeout: arg 1: %g is not a positive number of seconds",
                            seconds);
    state.timeout = seconds;
    return 0;
}
double mt_dist_timeout(void) {
    return state.timeout;
}

int mt_dist_barrier(void) {
    const char *op = "mt_dist_barrier";
    int rc = mt_dist_ready(op);
    if (rc < 0 || !state.mpi) return rc;
    MPI_Request req;
    rc = MPI_Ibarrier(state.comm, &req);
    return rc != MPI_SUCCESS ? mt_dist_mpi_error(op, rc) : mt_dist_wait_request(op, &req);
}
