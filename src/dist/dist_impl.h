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
    MPI_Comm comm;  /* a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
    double timeout; /* seconds */
    char broken_why[192];
} mt_dist_state;

mt_dist_state *mt_dist_state_get(void);

/* 0 when collectives may run; otherwise an error naming op (not initialised, broken). */
int mt_dist_ready(const char *op);

/* Turns an MPI error code into an mt error naming op, and marks the world broken. */
int mt_dist_mpi_error(const char *op, int code);

/* Waits for req with the process's deadline. On timeout the request is kept (its buffers
   must stay alive: the caller leaks them) and the world is marked broken. */
int mt_dist_wait_request(const char *op, MPI_Request *req);

/* Non-blocking progress: *done becomes true when req has completed. */
int mt_dist_test_request(const char *op, MPI_Request *req, bool *done);

/* Checks that every rank of comm passes the same n values: one all-reduce of the values
   and their negations with MAX. On a mismatch returns MT_ERR_SHAPE on every rank, without
   setting an error (the caller words it), and writes the index of the first differing value
   and its min/max over the ranks. */
int mt_dist_agree(const char *op, MPI_Comm comm, const int64_t *vals, int n, int *bad, int64_t *lo,
                  int64_t *hi);

/* "cpu" or "cuda:N" */
const char *mt_dist_device_str(mt_device d, char *buf, size_t cap);
#endif
