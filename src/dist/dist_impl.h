/* State shared by the rooms of src/dist: the process's place in the job, the bounded wait
   every collective goes through, and the agreement check run before a collective. */
#ifndef MT_DIST_IMPL_H
#define MT_DIST_IMPL_H
#include <mpi.h>
#include "../tensor/tensor_impl.h"

typedef struct {
    bool initialized;
    bool finalized;
    bool mpi;     /* false: a world of one without a launcher (no MPI calls at all) */
    bool own_mpi; /* we called MPI_Init, so we call MPI_Finalize */
    bool broken;  /* a wait timed out or MPI failed: no further collectives */
    int rank, world;
    int thread_level; /* what MPI_Init_thread provided (MPI_THREAD_*) */
    MPI_Comm comm;    /* a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
    double timeout;   /* seconds */
    int live_works;   /* mt_dist_works with an MPI request not yet waited for */
    char broken_why[192];
    /* NCCL (nccl.c): the communicator, made by the first collective on a CUDA tensor */
    void *nccl_comm; /* ncclComm_t */
    int nccl_device;
    bool has_nccl_id; /* a rank of mt_dist_init_thread: the id its threads share */
    unsigned char nccl_id[128];
} mt_dist_state;

/* The calling thread's world: its own after mt_dist_init_thread, else the process's. */
mt_dist_state *mt_dist_state_get(void);

/* Marks the world unusable (the first reason is kept). */
void mt_dist_mark_broken(const char *why);

/* 0 when collectives may run; otherwise an error naming op (not initialised, broken). */
int mt_dist_ready(const char *op);

/* Turns an MPI error code into an mt error naming op, and marks the world broken. */
int mt_dist_mpi_error(const char *op, int code);

/* Waits for req with the process's deadline. On timeout the request is kept (its buffers
   must stay alive: the caller leaks them) and the world is marked broken. */
int mt_dist_wait_request(const char *op, MPI_Request *req);

/* Keeps a request that will not be waited for any more (a timed-out wait, buckets left in
   flight); finalize gives it one more bounded chance. The caller must not test or wait for
   *req again (the world is marked broken first, which refuses further collectives). */
void mt_dist_orphan_request(MPI_Request *req);

/* Non-blocking progress: *done becomes true when req has completed. */
int mt_dist_test_request(const char *op, MPI_Request *req, bool *done);

/* Checks that every rank of comm passes the same n values: one all-reduce of the values
   and their negations with MAX. On a mismatch returns MT_ERR_SHAPE on every rank, without
   setting an error (the caller words it), and writes the index of the first differing value
   and its min/max over the ranks. */
int mt_dist_agree(const char *op, MPI_Comm comm, const int64_t *vals, int n, int *bad, int64_t *lo,
                  int64_t *hi);

/* ---- NCCL (nccl.c); in a build without CUDA each fails with MT_ERR_UNSUPPORTED */
typedef struct {
    mt_tensor *t;         /* written in place (all_gather's output) */
    const mt_tensor *src; /* all_gather's input; NULL otherwise */
    int root;             /* broadcast's root; -1 otherwise */
    mt_reduce_op reduce;  /* all_reduce (src NULL, root -1) */
} mt_dist_nccl_call;
/* Queues the collective on the tensor's device stream (the communicator is made on first
   use); no host wait. MT_ERR_UNSUPPORTED naming op when NCCL cannot be loaded. */
int mt_dist_nccl_start(const char *op, const mt_dist_nccl_call *c);
/* A fresh unique id (128 bytes) for ranks that are threads of one process. */
int mt_dist_nccl_new_id(const char *op, unsigned char *id);
/* An error NCCL reported asynchronously on this world's communicator, as an mt error. */
int mt_dist_nccl_async_error(const char *op);
/* Loads NCCL (once); NULL when it loaded with every entry point, else why not ("cannot load
   ...", "NCCL lacks ...", "built without ..."). */
const char *mt_dist_nccl_load_error(void);
/* Later work on the compute stream of cuda:device waits for every collective queued so far
   on its communication stream (mt_dist_wait, mt_ddp_wait, the blocking collectives). */
int mt_dist_nccl_join(const char *op, int device);
void mt_dist_nccl_destroy(mt_dist_state *st);

/* "cpu" or "cuda:N" */
const char *mt_dist_device_str(mt_device d, char *buf, size_t cap);
#endif
