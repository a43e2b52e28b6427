/* The parts of mt_ddp that ddp.c (buckets, hooks, mt_ddp_wait) and ddp_progress.c (how CPU
   buckets' all-reduces are started and progressed) share. */
#ifndef MT_DDP_IMPL_H
#define MT_DDP_IMPL_H
#include <pthread.h>
#include "dist_impl.h"

typedef struct mt_ddp mt_ddp;

typedef struct {
    mt_ddp *ddp;
    mt_tensor *t;
    int index, bucket, hook;
    int64_t offset; /* in elements of its bucket */
    bool ready;     /* its gradient is in the bucket this step */
} ddp_param;

typedef struct {
    mt_dtype dt; /* of the parameters; the buffer is FP32 for FP16/BF16 */
    void *buf;
    int64_t numel;
    int n_params, n_ready;
    bool launched; /* started, or handed to the communication thread, this step */
    bool done;     /* its all-reduce was seen complete this step (written by who tests it) */
    double start_time, done_time;
    mt_tensor *dev; /* CUDA parameters: the bucket on their device (buf unused) */
} ddp_bucket;

/* The communication thread's side (MT_DDP_PROGRESS_THREAD); every field under mu. The
   thread alone calls MPI on the buckets and writes their start/done fields and d->reqs;
   the main thread reads them once `completed` says so. */
typedef struct {
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t wake;  /* to the thread: buckets handed over, or stop */
    pthread_cond_t done;  /* to mt_ddp_wait: buckets completed, or an MPI error */
    int queued;           /* buckets [0, queued) are handed over this step */
    int started;          /* of those, started by the thread */
    int completed;        /* of those, seen complete */
    int mpi_error;        /* the first MPI error code the thread met; MPI_SUCCESS: none */
    bool stop, abandoned; /* abandoned: mt_ddp_wait timed out, the thread stops testing */
} ddp_comm;

struct mt_ddp {
    ddp_param *params;
    mt_tensor **made; /* per parameter, during mt_ddp_wait: the new gradient it writes (NULL:
                         the parameter's own .grad fits) */
    int n;
    ddp_bucket *buckets;
    int nb, next;      /* buckets [0, next) are started (or handed over) this step */
    MPI_Request *reqs; /* per bucket; MPI_REQUEST_NULL when not in flight */
    int *done_idx;     /* MPI_Testsome's output */
    MPI_Comm comm;
    bool mpi, no_overlap, no_sync, leak_buffers;
    bool cuda;     /* the parameters are on one CUDA device: buckets there, through NCCL */
    bool threaded; /* a communication thread runs (comm_thread) */
    ddp_comm comm_thread;
    bool reduced; /* this step's all-reduces are complete: a wait that failed after them
                     (out of memory in the copy out) is retried from the copy out */
    int64_t calls, calls_in_backward;
    double first_grad_time, last_grad_time;
    mt_ddp_stats stats;
};

/* Seconds on CLOCK_MONOTONIC (the clock of mt_ddp_stats). */
double mt_ddp_now(void);

/* Bucket i's non-blocking sum over the ranks (the average is taken on copy-out) into
   d->reqs[i]; an MPI code, so that the communication thread can hand it over instead of
   raising it. */
int mt_ddp_start_mpi(mt_ddp *d, int i);

/* One MPI call tests the first n buckets' requests (MPI_REQUEST_NULL ones are skipped and
   completed ones become so); their indices land in d->done_idx. An MPI code. */
int mt_ddp_test_started(mt_ddp *d, int n, int *count);

void mt_ddp_mark_done(ddp_bucket *b, double t);

/* The communication thread (MT_DDP_PROGRESS_THREAD): started by mt_ddp_new (sets
   d->threaded), stopped and joined by the destroy. */
int mt_ddp_comm_start(mt_ddp *d);
void mt_ddp_comm_stop(mt_ddp *d);
/* Buckets [0, n) to the thread. */
void mt_ddp_comm_hand_over(mt_ddp *d, int n);
/* Until the thread has seen buckets [0, n) complete, bounded by the world's timeout. */
int mt_ddp_comm_wait(mt_ddp *d, int n);
/* A step's end: the counters back to 0, or, when a failed step left requests in flight,
   the thread is told to leave them (they are never reused). */
void mt_ddp_comm_reset(mt_ddp *d);
#endif
