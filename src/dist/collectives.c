/* Collectives on CPU tensors through MPI, on CUDA tensors through NCCL (nccl.c): all-reduce
   (sum, max, avg), broadcast, all-gather, each blocking or started as an mt_dist_work. A CUDA
   collective is queued on the device stream, so its work is finished as soon as it exists.
   FP16/BF16 are reduced in FP32 on a staging buffer (widened before, rounded once after) because
   MPI has no half types; averaging divides the sum by the world size when the work finishes. Before
   each collective the ranks check they agree (mt_dist_agree), so a shape or dtype mismatch, or a
   call that failed its own checks on one rank, is an error on every rank instead of mismatched
   buffers. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "../math/half.h"
#include "dist_decline.h"
#include "dist_impl.h"

enum { KIND_ALL_REDUCE = 1, KIND_BROADCAST, KIND_ALL_GATHER };

struct mt_dist_work {
    const char *op;
    MPI_Request req;
    bool pending;        /* req is live */
    mt_tensor *t;        /* written in place (the output of all_gather) */
    mt_tensor *src;      /* all_gather's input */
    float *stage;        /* FP32 copy of a half tensor */
    mt_reduce_op reduce; /* all_reduce only */
    int kind;
    bool cuda; /* queued through NCCL: nothing left to do on the host */
};

static bool is_half(mt_dtype dt) {
    return dt == MT_F16 || dt == MT_BF16;
}

static MPI_Datatype mpi_type(mt_dtype dt) {
    switch (dt) {
    case MT_F32:
    case MT_F16:
    case MT_BF16:
        return MPI_FLOAT; /* halves travel as their FP32 staging copy */
    case MT_F64:
        return MPI_DOUBLE;
    case MT_I64:
        return MPI_INT64_T;
    case MT_I32:
        return MPI_INT32_T;
    default:
        return MPI_UINT8_T; /* MT_BOOL */
    }
}

/* Validates a tensor argument of a collective. */
static int check_tensor(const char *op, int arg, const mt_tensor *t) {
    char b[MT_SHAPE_BUF], d[32];
    if (!t) return mt_error_set(MT_ERR_NULL, "%s: arg %d: tensor is NULL", op, arg);
    mt_dist_state *st = mt_dist_state_get();
    if (t->device.type == MT_DEVICE_CPU && st->initialized && !st->mpi && st->world > 1)
        return mt_error_set(MT_ERR_UNSUPPORTED,
                            "%s: arg %d: a CPU tensor in a world of threads (mt_dist_init_thread), "
                            "which has no MPI; only CUDA tensors go through NCCL there",
                            op, arg);
    if (t->device.type != MT_DEVICE_CPU && t->device.type != MT_DEVICE_CUDA)
        return mt_error_set(MT_ERR_UNSUPPORTED, "%s: arg %d: tensors on %s are not supported", op,
                            arg, mt_dist_device_str(t->device, d, sizeof d));
    if (!mt_is_contiguous(t))
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg %d: tensor of shape %s is not contiguous; use mt_contiguous",
                            op, arg, mt_shape_str(t, b, sizeof b));
    if (t->numel > INT_MAX / 8)
        return mt_error_set(MT_ERR_UNSUPPORTED,
                            "%s: arg %d: %lld elements exceed one MPI message; split the tensor",
                            op, arg, (long long)t->numel);
    return mt_dist_ready(op);
}

/* Every rank must call the same collective on the same dtype and element count. A rank whose
   own checks failed (local < 0, its error set) still takes part, with its failure among the
   values it sends: the other ranks then fail too, rather than pairing this collective with
   that rank's next one (mismatched buffers, or the wrong tensors summed). Returns local on
   such a rank, whatever the others sent. */
static int agree(const char *op, int local, int kind, const mt_tensor *t, int64_t root,
                 int64_t reduce) {
    mt_dist_state *st = mt_dist_state_get();
    if (!st->mpi || !st->initialized || st->finalized || st->broken) return local;
    bool ok = local == 0;
    int64_t v[6] = {ok, kind, ok ? (int64_t)t->dtype : -1, ok ? t->numel : -1, root, reduce};
    int bad = 0;
    int64_t lo = 0, hi = 0;
    int rc = mt_dist_agree(op, st->comm, v, 6, &bad, &lo, &hi);
    if (!ok) return local;
    if (rc != MT_ERR_SHAPE) return rc;
    if (bad == 0)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: the call failed on another rank before the exchange (an "
                            "argument, or memory: that rank's error says why); nothing was "
                            "exchanged",
                            op);
    static const char *what[6] = {"", "collective", "dtype", "element count", "root", "reduce op"};
    char b[MT_SHAPE_BUF];
    return mt_error_set(MT_ERR_SHAPE,
                        "%s: the ranks disagree on the %s (this rank %d: shape %s %s, value %lld; "
                        "over the ranks it ranges %lld..%lld)",
                        op, what[bad], st->rank, mt_shape_str(t, b, sizeof b),
                        mt_dtype_name(t->dtype), (long long)v[bad], (long long)lo, (long long)hi);
}

int mt_dist_all_reduce_decline(const char *op, int local) {
    return agree(op, local, KIND_ALL_REDUCE, NULL, 0, 0);
}

static mt_dist_work *work_new(const char *op, int kind, mt_tensor *t) {
    mt_dist_work *w = mt_heap_calloc(1, sizeof *w);
    if (!w) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory", op);
        return NULL;
    }
    w->op = op;
    w->kind = kind;
    w->t = mt_tensor_ref(t);
    return w;
}

/* w's MPI request is no longer this work's to wait for (complete, or orphaned after a
   timeout): it stops counting as in flight for mt_dist_finalize. */
static void work_settle(mt_dist_work *w) {
    if (!w->pending) return;
    w->pending = false;
    mt_dist_state_get()->live_works--;
}

static void work_free(mt_dist_work *w) {
    mt_tensor_unref(w->t);
    mt_tensor_unref(w->src);
    free(w->stage);
    free(w);
}

static float *stage_from(const mt_tensor *t) {
    float *s = mt_heap_alloc((size_t)(t->numel ? t->numel : 1) * sizeof *s);
    if (!s) return NULL;
    const uint16_t *h = mt_tensor_data(t);
    for (int64_t i = 0; i < t->numel; i++)
        s[i] = t->dtype == MT_F16 ? mt_f16_to_f32(h[i]) : mt_bf16_to_f32(h[i]);
    return s;
}

/* The reduced values back into t: rounded once for halves, divided for avg. */
static void finish_all_reduce(mt_dist_work *w, int world) {
    mt_tensor *t = w->t;
    bool avg = w->reduce == MT_REDUCE_AVG;
    if (w->stage) {
        uint16_t *h = mt_tensor_data(t);
        for (int64_t i = 0; i < t->numel; i++) {
            float v = avg ? w->stage[i] / (float)world : w->stage[i];
            h[i] = t->dtype == MT_F16 ? mt_f32_to_f16(v) : mt_f32_to_bf16(v);
        }
    } else if (avg && t->dtype == MT_F32) {
        float *f = mt_tensor_data(t);
        for (int64_t i = 0; i < t->numel; i++) f[i] /= (float)world;
    } else if (avg) {
        double *f = mt_tensor_data(t);
        for (int64_t i = 0; i < t->numel; i++) f[i] /= (double)world;
    }
}

/* Queues w's collective through NCCL; w, or NULL (freed) with the error set. */
static mt_dist_work *start_nccl(mt_dist_work *w, const mt_dist_nccl_call *c) {
    w->cuda = true;
    if (mt_dist_nccl_start(w->op, c) == 0) return w;
    work_free(w);
    return NULL;
}

static int start(mt_dist_work *w, int rc) {
    if (rc != MPI_SUCCESS) return mt_dist_mpi_error(w->op, rc);
    w->pending = true;
    mt_dist_state_get()->live_works++;
    return 0;
}

static int all_reduce_check(const char *fn, const mt_tensor *t, mt_reduce_op op) {
    int rc = check_tensor(fn, 1, t);
    if (rc < 0) return rc;
    if (op != MT_REDUCE_SUM && op != MT_REDUCE_MAX && op != MT_REDUCE_AVG)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 2: %d is not an mt_reduce_op", fn, (int)op);
    if (op == MT_REDUCE_AVG && !mt_dtype_is_floating(t->dtype))
        return mt_error_set(MT_ERR_DTYPE, "%s: arg 2: avg of %s tensors is not defined; use sum",
                            fn, mt_dtype_name(t->dtype));
    return 0;
}

static mt_dist_work *all_reduce_async(mt_tensor *t, mt_reduce_op op) {
    const char *fn = "mt_all_reduce";
    mt_dist_state *st = mt_dist_state_get();
    /* everything that can fail on this rank alone comes before the agreement */
    int rc = all_reduce_check(fn, t, op);
    mt_dist_work *w = rc == 0 ? work_new(fn, KIND_ALL_REDUCE, t) : NULL;
    if (rc == 0 && !w) rc = MT_ERR_OOM;
    if (rc == 0 && st->mpi && t->device.type == MT_DEVICE_CPU && is_half(t->dtype) &&
        !(w->stage = stage_from(t)))
        rc = mt_error_set(MT_ERR_OOM, "%s: out of memory for the FP32 staging buffer", fn);
    if (agree(fn, rc, KIND_ALL_REDUCE, t, 0, op) < 0) {
        if (w) work_free(w);
        return NULL;
    }
    w->reduce = op;
    if (t->device.type == MT_DEVICE_CUDA)
        return start_nccl(w, &(mt_dist_nccl_call){.t = t, .root = -1, .reduce = op});
    if (!st->mpi) return w; /* a world of one: the sum of one value is itself */
    void *buf = w->stage ? (void *)w->stage : mt_tensor_data(t);
    /* a bool sum is a logical or, and max of 0/1 is exactly that */
    MPI_Op mop = op == MT_REDUCE_MAX || t->dtype == MT_BOOL ? MPI_MAX : MPI_SUM;
    if (start(w, MPI_Iallreduce(MPI_IN_PLACE, buf, (int)t->numel, mpi_type(t->dtype), mop, st->comm,
                                &w->req)) < 0) {
        work_free(w);
        return NULL;
    }
    return w;
}

mt_dist_work *mt_all_reduce_async(mt_tensor *t, mt_reduce_op op) {
    mt_api_enter_at("mt_all_reduce"); /* errors inside read "mt_all_reduce: ..." */
    mt_dist_work *r = all_reduce_async(t, op);
    mt_api_exit_status(0);
    return r;
}

static mt_dist_work *broadcast_async(mt_tensor *t, int root) {
    const char *fn = "mt_broadcast";
    mt_dist_state *st = mt_dist_state_get();
    int rc = check_tensor(fn, 1, t);
    if (rc == 0 && (root < 0 || root >= st->world))
        rc = mt_error_set(MT_ERR_INVALID, "%s: arg 2: root %d is not a rank of a world of %d", fn,
                          root, st->world);
    mt_dist_work *w = rc == 0 ? work_new(fn, KIND_BROADCAST, t) : NULL;
    if (rc == 0 && !w) rc = MT_ERR_OOM;
    if (agree(fn, rc, KIND_BROADCAST, t, root, 0) < 0) {
        if (w) work_free(w);
        return NULL;
    }
    if (t->device.type == MT_DEVICE_CUDA)
        return start_nccl(w, &(mt_dist_nccl_call){.t = t, .root = root});
    if (!st->mpi) return w;
    size_t nbytes = (size_t)t->numel * mt_dtype_size(t->dtype);
    if (start(w, MPI_Ibcast(mt_tensor_data(t), (int)nbytes, MPI_BYTE, root, st->comm, &w->req)) <
        0) {
        work_free(w);
        return NULL;
    }
    return w;
}

mt_dist_work *mt_broadcast_async(mt_tensor *t, int root) {
    mt_api_enter_at("mt_broadcast"); /* errors inside read "mt_broadcast: ..." */
    mt_dist_work *r = broadcast_async(t, root);
    mt_api_exit_status(0);
    return r;
}

static int all_gather_check(const char *fn, const mt_tensor *out, const mt_tensor *t) {
    int rc = check_tensor(fn, 1, out);
    if (rc == 0) rc = check_tensor(fn, 2, t);
    if (rc == 0) rc = mt_check_same_device(fn, out, t);
    if (rc < 0) return rc;
    mt_dist_state *st = mt_dist_state_get();
    char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
    bool fits = out->dtype == t->dtype && out->ndim == t->ndim + 1 && out->shape[0] == st->world;
    for (int d = 0; fits && d < t->ndim; d++) fits = out->shape[d + 1] == t->shape[d];
    if (!fits)
        return mt_error_set(
            MT_ERR_SHAPE, "%s: arg 1: out is %s %s, expected [%d, ...%s] %s for a world of %d", fn,
            mt_shape_str(out, b1, sizeof b1), mt_dtype_name(out->dtype), st->world,
            mt_shape_str(t, b2, sizeof b2), mt_dtype_name(t->dtype), st->world);
    return 0;
}

static mt_dist_work *all_gather_async(mt_tensor *out, const mt_tensor *t) {
    const char *fn = "mt_all_gather";
    mt_dist_state *st = mt_dist_state_get();
    int rc = all_gather_check(fn, out, t);
    mt_dist_work *w = rc == 0 ? work_new(fn, KIND_ALL_GATHER, out) : NULL;
    if (rc == 0 && !w) rc = MT_ERR_OOM;
    if (agree(fn, rc, KIND_ALL_GATHER, t, 0, 0) < 0) {
        if (w) work_free(w);
        return NULL;
    }
    w->src = mt_tensor_ref((mt_tensor *)t);
    if (t->device.type == MT_DEVICE_CUDA)
        return start_nccl(w, &(mt_dist_nccl_call){.t = out, .src = t, .root = -1});
    size_t nbytes = (size_t)t->numel * mt_dtype_size(t->dtype);
    if (!st->mpi) {
        memcpy(mt_tensor_data(out), mt_tensor_data(t), nbytes);
        return w;
    }
    if (start(w, MPI_Iallgather(mt_tensor_data(t), (int)nbytes, MPI_BYTE, mt_tensor_data(out),
                                (int)nbytes, MPI_BYTE, st->comm, &w->req)) < 0) {
        work_free(w);
        return NULL;
    }
    return w;
}

mt_dist_work *mt_all_gather_async(mt_tensor *out, const mt_tensor *t) {
    mt_api_enter_at("mt_all_gather"); /* errors inside read "mt_all_gather: ..." */
    mt_dist_work *r = all_gather_async(out, t);
    mt_api_exit_status(0);
    return r;
}

static int dist_wait(mt_dist_work *w) {
    if (!w) return mt_error_set(MT_ERR_NULL, "mt_dist_wait: arg 1: work is NULL");
    int rc = w->pending ? mt_dist_wait_request(w->op, &w->req) : 0;
    work_settle(w); /* complete, or orphaned for mt_dist_finalize's last wait */
    if (w->cuda) rc = mt_dist_nccl_join(w->op, w->t->device.index);
    if (w->cuda && rc == 0) rc = mt_dist_nccl_async_error(w->op);
    if (rc == MT_ERR_TIMEOUT) {
        /* MPI may still write into the buffers: they are left alive (leaked), the work
           header is freed */
        free(w);
        return rc;
    }
    if (rc == 0 && w->kind == KIND_ALL_REDUCE && !w->cuda)
        finish_all_reduce(w, mt_dist_state_get()->world);
    if (rc == 0) mt_tensor_bump_version(w->t);
    work_free(w);
    return rc;
}

int mt_dist_wait(mt_dist_work *w) {
    mt_api_enter(); /* errors inside read "mt_dist_wait: ..." */
    return mt_api_exit_status(dist_wait(w));
}

bool mt_dist_work_done(mt_dist_work *w) {
    if (!w) return false;
    if (!w->pending) return true;
    bool done = false;
    if (mt_dist_test_request(w->op, &w->req, &done) < 0) return false;
    if (done) work_settle(w);
    return done;
}

int mt_all_reduce(mt_tensor *t, mt_reduce_op op) {
    mt_api_enter(); /* a failure in the wait reads "mt_all_reduce: ..." too */
    mt_dist_work *w = mt_all_reduce_async(t, op);
    int rc = w ? mt_dist_wait(w) : (mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL);
    return mt_api_exit_status(rc);
}

int mt_broadcast(mt_tensor *t, int root) {
    mt_api_enter(); /* a failure in the wait reads "mt_broadcast: ..." too */
    mt_dist_work *w = mt_broadcast_async(t, root);
    int rc = w ? mt_dist_wait(w) : (mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL);
    return mt_api_exit_status(rc);
}

mt_tensor *mt_all_gather(const mt_tensor *t) {
    const char *fn = "mt_all_gather";
    mt_api_enter();
    int rc = check_tensor(fn, 1, t);
    if (rc == 0 && t->ndim + 1 > MT_MAX_DIMS)
        rc = mt_error_set(MT_ERR_SHAPE, "%s: arg 1: %d dims leave no room for the rank dim", fn,
                          t->ndim);
    mt_tensor *out = NULL;
    if (rc == 0) {
        int64_t shape[MT_MAX_DIMS + 1];
        shape[0] = mt_dist_world_size();
        memcpy(shape + 1, t->shape, (size_t)t->ndim * sizeof *shape);
        out = mt_tensor_new(fn, t->ndim + 1, shape, t->dtype, t->device);
        if (!out) rc = mt_last_status() ? (int)mt_last_status() : MT_ERR_OOM;
    }
    if (rc < 0) { /* the other ranks learn of it (agree), and fail too */
        agree(fn, rc, KIND_ALL_GATHER, t, 0, 0);
        return mt_api_exit(NULL);
    }
    mt_dist_work *w = mt_all_gather_async(out, t);
    if (!w || mt_dist_wait(w) < 0) {
        mt_tensor_unref(out);
        out = NULL;
    }
    return mt_api_exit(out);
}
