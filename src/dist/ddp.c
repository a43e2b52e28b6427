/* mt_ddp: data-parallel gradient averaging with buckets and backward/communication overlap
   (see include/mixtape.h). CPU parameters: host buckets reduced through MPI on a duplicate of
   the process group's communicator, so a user's own collectives never interleave with a
   step's buckets. CUDA parameters: device buckets (flat tensors) filled and emptied by the
   library's own copy op and reduced by NCCL (average folded into the reduction), every step
   queued on the device stream in program order, so nothing waits for the device. How CPU
   buckets progress during backward (hooks or a communication thread): ddp_progress.c. */
#include <limits.h>
#include <stdlib.h>
#include "../math/half.h"
#include "../tensor/backend.h"
#include "ddp_impl.h"

#define DEFAULT_BUCKET_MB 25.0
#define DESC              10 /* per parameter: dtype, ndim, 8 dims */

static bool is_half(mt_dtype dt) {
    return dt == MT_F16 || dt == MT_BF16;
}
static size_t buf_esize(mt_dtype dt) {
    return is_half(dt) ? sizeof(float) : mt_dtype_size(dt);
}

/* ---- starting and progressing buckets from the hooks */

static int launch(mt_ddp *d, int i) {
    ddp_bucket *b = &d->buckets[i];
    b->launched = true;
    d->calls++;
    if (d->threaded) return 0; /* the thread starts it and stamps the time */
    b->start_time = mt_ddp_now();
    if (d->cuda) /* the average, in the bucket's type; queued, never waited for */
        return mt_dist_nccl_start(
            "mt_ddp", &(mt_dist_nccl_call){.t = b->dev, .root = -1, .reduce = MT_REDUCE_AVG});
    if (!d->mpi) { /* a world of one: the sum is the value */
        mt_ddp_mark_done(b, b->start_time);
        return 0;
    }
    int rc = mt_ddp_start_mpi(d, i);
    return rc != MPI_SUCCESS ? mt_dist_mpi_error("mt_ddp", rc) : 0;
}

/* Starts the buckets that are complete, in index order (every rank the same order), and
   lets MPI progress the ones in flight (or hands them to the communication thread). */
static int launch_ready(mt_ddp *d, bool in_backward) {
    int rc = 0, first = d->next;
    while (rc == 0 && d->next < d->nb &&
           d->buckets[d->next].n_ready == d->buckets[d->next].n_params) {
        rc = launch(d, d->next++);
        if (in_backward) d->calls_in_backward++;
    }
    if (d->threaded && d->next > first) mt_ddp_comm_hand_over(d, d->next);
    if (rc < 0 || d->threaded || d->cuda || !d->mpi) return rc;
    int count = 0;
    rc = mt_ddp_test_started(d, d->next, &count);
    if (rc != MPI_SUCCESS) return mt_dist_mpi_error("mt_ddp", rc);
    double t = mt_ddp_now();
    for (int k = 0; k < count; k++) mt_ddp_mark_done(&d->buckets[d->done_idx[k]], t);
    return 0;
}

static int status_or(int fallback) {
    return mt_last_status() ? (int)mt_last_status() : fallback;
}

/* p's slot of bucket b as a header of p's shape in *h, made on the stack: over the device
   bucket's storage, or over the host buffer through the storage *st. It holds no reference
   and must not outlive the bucket. Slots are row-major whatever p's layout (a channels-last
   parameter's gradient is copied in and out through the strided copy), so ranks whose
   parameters differ in layout still reduce matching elements. */
static void slot_header(const ddp_param *p, const ddp_bucket *b, mt_storage *st, mt_tensor *h) {
    if (b->dev) {
        mt_tensor_header_init(h, b->dev->storage, b->dev->dtype, p->t->ndim, p->t->shape, NULL,
                              p->offset);
        return;
    }
    *st = (mt_storage){
        .data = b->buf, .nbytes = (size_t)b->numel * buf_esize(b->dt), .device = MT_CPU};
    mt_tensor_header_init(h, st, is_half(b->dt) ? MT_F32 : b->dt, p->t->ndim, p->t->shape, NULL,
                          p->offset);
}

/* g (zeros when NULL) into p's slot of bucket b: the backend's own copy (converting F16/BF16
   to the FP32 bucket, any strides) or fill. Allocates nothing, so a gradient-ready hook
   cannot run out of memory. */
static int slot_write(const ddp_param *p, const ddp_bucket *b, const mt_tensor *g) {
    if (g && !mt_same_shape(g, p->t)) {
        char gs[MT_SHAPE_BUF], ps[MT_SHAPE_BUF];
        return mt_error_set(
            MT_ERR_STATE, "mt_ddp: parameter %d has a gradient of shape %s, its shape is %s",
            p->index, mt_shape_str(g, gs, sizeof gs), mt_shape_str(p->t, ps, sizeof ps));
    }
    mt_storage st;
    mt_tensor slot;
    slot_header(p, b, &st, &slot);
    const mt_backend *be = mt_backend_get(slot.device);
    return g ? be->copy(&slot, g) : be->fill(&slot, 0.0);
}

static int grad_ready(ddp_param *p);

/* A grad-ready hook runs as user code (outermost): library code again from here on. */
static int on_grad_ready(mt_tensor *leaf, void *user) {
    (void)leaf;
    mt_api_enter_at("mt_ddp");
    return mt_api_exit_status(grad_ready(user));
}

static int grad_ready(ddp_param *p) {
    mt_ddp *d = p->ddp;
    if (d->no_sync) return 0;
    if (p->ready)
        return mt_error_set(MT_ERR_STATE,
                            "mt_ddp: the gradient of parameter %d was ready twice before "
                            "mt_ddp_wait; call mt_ddp_wait after each backward, or use "
                            "mt_ddp_set_no_sync to accumulate",
                            p->index);
    int rc = mt_dist_ready("mt_ddp");
    if (d->first_grad_time == 0) d->first_grad_time = mt_ddp_now();
    ddp_bucket *b = &d->buckets[p->bucket];
    if (rc == 0) rc = slot_write(p, b, p->t->grad);
    if (rc < 0) return rc;
    p->ready = true;
    b->n_ready++;
    rc = d->no_overlap ? 0 : launch_ready(d, true);
    d->last_grad_time = mt_ddp_now();
    return rc;
}

/* ---- the copy out of the buckets: made, then written. Making can fail (out of memory) and
   changes nothing; writing cannot fail on the CPU and only by a device error on a GPU. */

/* g can take p's averaged gradient in place: p's dtype, and contiguous or dense in p's layout
   (a channels-last parameter's gradient). */
static bool grad_fits(const mt_tensor *g, const mt_tensor *p) {
    return g && g->dtype == p->dtype &&
           (mt_is_contiguous(g) || (mt_is_dense(g) && mt_same_strides(g, p)));
}

static void out_release(mt_ddp *d) {
    for (int i = 0; i < d->n; i++) {
        mt_tensor_unref(d->made[i]);
        d->made[i] = NULL;
    }
}

/* A new gradient, in the parameter's layout, for each parameter whose .grad does not fit. */
static int out_prepare(mt_ddp *d) {
    for (int i = 0; i < d->n; i++) {
        ddp_param *p = &d->params[i];
        if (grad_fits(p->t->grad, p->t)) continue;
        d->made[i] = mt_tensor_new_layout_of("mt_ddp_wait", p->t, p->t->dtype, p->t->device);
        if (!d->made[i]) return status_or(MT_ERR_OOM);
    }
    return 0;
}

/* The averaged bucket values (NCCL averaged device buckets already) into the gradient. */
static int out_write(const mt_ddp *d, const ddp_param *p, mt_tensor *g, int world) {
    const ddp_bucket *b = &d->buckets[p->bucket];
    if (b->dev) {
        mt_tensor slot;
        slot_header(p, b, NULL, &slot);
        return mt_tensor_overwrite(g, &slot);
    }
    int64_t n = p->t->numel;
    char *src = (char *)b->buf + p->offset * (int64_t)buf_esize(b->dt);
    if (!mt_is_contiguous(g)) { /* channels-last: average in the slot, copy out in g's layout */
        if (b->dt == MT_F64)
            for (int64_t i = 0; i < n; i++) ((double *)src)[i] /= (double)world;
        else
            for (int64_t i = 0; i < n; i++) ((float *)src)[i] /= (float)world;
        mt_storage st;
        mt_tensor slot;
        slot_header(p, b, &st, &slot);
        return mt_tensor_overwrite(g, &slot);
    }
    if (b->dt == MT_F64) {
        const double *s = (const double *)src;
        double *out = mt_tensor_data(g);
        for (int64_t i = 0; i < n; i++) out[i] = s[i] / (double)world;
    } else if (b->dt == MT_F32) {
        const float *s = (const float *)src;
        float *out = mt_tensor_data(g);
        for (int64_t i = 0; i < n; i++) out[i] = s[i] / (float)world;
    } else {
        const float *s = (const float *)src;
        uint16_t *out = mt_tensor_data(g);
        for (int64_t i = 0; i < n; i++)
            out[i] = b->dt == MT_F16 ? mt_f32_to_f16(s[i] / (float)world)
                                     : mt_f32_to_bf16(s[i] / (float)world);
    }
    mt_tensor_bump_version(g);
    return 0;
}

/* Writes every gradient, then hands the new ones to their parameters. */
static int out_install(mt_ddp *d, int world) {
    int rc = 0;
    for (int i = 0; rc == 0 && i < d->n; i++) {
        ddp_param *p = &d->params[i];
        rc = out_write(d, p, d->made[i] ? d->made[i] : p->t->grad, world);
    }
    for (int i = 0; rc == 0 && i < d->n; i++) {
        ddp_param *p = &d->params[i];
        if (!d->made[i]) continue;
        mt_tensor_unref(p->t->grad);
        p->t->grad = d->made[i];
        d->made[i] = NULL;
    }
    return rc;
}

static void reset_step(mt_ddp *d) {
    for (int i = 0; i < d->n; i++) d->params[i].ready = false;
    for (int i = 0; i < d->nb; i++) {
        ddp_bucket *b = &d->buckets[i];
        b->n_ready = 0;
        b->launched = b->done = false;
        b->start_time = b->done_time = 0;
    }
    if (d->threaded) mt_ddp_comm_reset(d);
    d->reduced = false;
    d->next = 0;
    d->calls = d->calls_in_backward = 0;
    d->first_grad_time = d->last_grad_time = 0;
}

/* Waits (bounded) for the buckets still in flight; the main thread's MPI calls. */
static int wait_started(mt_ddp *d) {
    for (int i = 0; i < d->next; i++) {
        if (d->reqs[i] == MPI_REQUEST_NULL) continue;
        int rc = mt_dist_wait_request("mt_ddp_wait", &d->reqs[i]);
        if (rc == MT_ERR_TIMEOUT) d->reqs[i] = MPI_REQUEST_NULL; /* orphaned by the wait */
        if (rc < 0) return rc;
        mt_ddp_mark_done(&d->buckets[i], mt_ddp_now());
    }
    return 0;
}

/* The last step's trace into the statistics. */
static void record_step(mt_ddp *d, double wait_begin) {
    mt_ddp_stats *s = &d->stats;
    s->allreduce_calls = d->calls;
    s->started_in_backward = d->calls_in_backward;
    s->wait_seconds = mt_ddp_now() - wait_begin;
    s->wait_begin_time = wait_begin;
    s->steps++;
    s->first_grad_time = d->first_grad_time;
    s->last_grad_time = d->last_grad_time;
    s->first_start_time = d->nb ? d->buckets[0].start_time : 0;
    s->first_done_time = d->nb ? d->buckets[0].done_time : 0;
    s->last_done_time = 0;
    s->done_in_backward = 0;
    for (int i = 0; i < d->nb; i++) {
        const ddp_bucket *b = &d->buckets[i];
        if (b->done_time > s->last_done_time) s->last_done_time = b->done_time;
        if (b->done && d->last_grad_time > 0 && b->done_time <= d->last_grad_time)
            s->done_in_backward++;
    }
}

/* Parameters no gradient reached this step take part with the gradient they hold (one
   accumulated under no_sync: torch's reducer copies a defined .grad too), or zeros. */
static int fill_unready(mt_ddp *d) {
    for (int i = 0; i < d->n; i++) {
        ddp_param *p = &d->params[i];
        if (p->ready) continue;
        int rc = slot_write(p, &d->buckets[p->bucket], p->t->grad);
        if (rc < 0) return rc;
        p->ready = true;
        d->buckets[p->bucket].n_ready++;
    }
    return 0;
}

/* Starts what is left and waits (bounded) for every bucket's all-reduce. */
static int reduce_all(mt_ddp *d) {
    int rc = launch_ready(d, false);
    if (rc == 0) rc = d->threaded ? mt_ddp_comm_wait(d, d->next) : wait_started(d);
    if (rc == MT_ERR_TIMEOUT || (rc < 0 && d->threaded))
        d->leak_buffers = true; /* MPI may still write into them */
    if (rc == 0 && d->cuda)     /* the copies out of the buckets after their all-reduces */
        rc = mt_dist_nccl_join("mt_ddp_wait", d->params[0].t->device.index);
    return rc;
}

/* A failure before the all-reduces (filling the buckets) or after them (making the copy
   out) changes no gradient and keeps the step: calling mt_ddp_wait again finishes it. A
   failed collective ends the step (the ranks no longer agree on it). */
static int ddp_wait(mt_ddp *d) {
    if (!d) return mt_error_set(MT_ERR_NULL, "mt_ddp_wait: arg 1: ddp is NULL");
    if (d->no_sync) return 0;
    int rc = mt_dist_ready("mt_ddp_wait");
    if (rc < 0) return rc;
    double t0 = mt_ddp_now();
    if (!d->reduced) {
        rc = fill_unready(d);
        if (rc < 0) return rc;
        rc = reduce_all(d);
        if (rc < 0) {
            reset_step(d);
            return rc;
        }
        d->reduced = true;
    }
    rc = out_prepare(d);
    if (rc == 0) rc = out_install(d, mt_dist_world_size());
    out_release(d);
    if (rc < 0) return rc;
    record_step(d, t0);
    reset_step(d);
    return 0;
}

int mt_ddp_wait(mt_ddp *d) {
    mt_api_enter(); /* errors inside read "mt_ddp_wait: ..." */
    return mt_api_exit_status(ddp_wait(d));
}

/* Local checks of the parameter list; 0 or an error (set, on this rank only). */
static int check_local(mt_tensor *const *params, int n) {
    const char *fn = "mt_ddp_new";
    if (!params && n > 0) return mt_error_set(MT_ERR_NULL, "%s: arg 1: params is NULL", fn);
    if (n < 0) return mt_error_set(MT_ERR_INVALID, "%s: arg 2: n = %d is negative", fn, n);
    char dev[32];
    for (int i = 0; i < n; i++) {
        mt_tensor *t = params[i];
        if (!t) return mt_error_set(MT_ERR_NULL, "%s: arg 1: parameter %d is NULL", fn, i);
        char dev0[32];
        if (t->device.type != params[0]->device.type || t->device.index != params[0]->device.index)
            return mt_error_set(MT_ERR_DEVICE,
                                "%s: parameter %d is on %s, parameter 0 on %s: one device per rank",
                                fn, i, mt_dist_device_str(t->device, dev, sizeof dev),
                                mt_dist_device_str(params[0]->device, dev0, sizeof dev0));
        if (t->device.type != MT_DEVICE_CPU && t->device.type != MT_DEVICE_CUDA)
            return mt_error_set(MT_ERR_UNSUPPORTED, "%s: parameter %d is on %s", fn, i,
                                mt_dist_device_str(t->device, dev, sizeof dev));
        if (!mt_is_dense(t))
            return mt_error_set(MT_ERR_INVALID,
                                "%s: parameter %d is not dense (contiguous or channels-last)", fn,
                                i);
        if (t->grad_fn || !t->requires_grad)
            return mt_error_set(MT_ERR_STATE, "%s: parameter %d must be a leaf that requires grad",
                                fn, i);
        if (t->numel > INT_MAX / 8)
            return mt_error_set(MT_ERR_UNSUPPORTED, "%s: parameter %d has too many elements (%lld)",
                                fn, i, (long long)t->numel);
        for (int j = 0; j < i; j++)
            if (params[j] == t)
                return mt_error_set(MT_ERR_INVALID, "%s: parameter %d is parameter %d again", fn, i,
                                    j);
    }
    return 0;
}

/* Every rank must hold the same parameters: first the count and whether each rank's list
   passed its local checks, then dtype and shape of each. Errors are raised on every rank. */
static int check_ranks(MPI_Comm comm, mt_tensor *const *params, int n, int local_rc) {
    const char *fn = "mt_ddp_new";
    int64_t head[2] = {n, local_rc < 0};
    int bad = 0;
    int64_t lo = 0, hi = 0;
    int rc = mt_dist_agree(fn, comm, head, 2, &bad, &lo, &hi);
    if (local_rc < 0) return local_rc; /* this rank's own message says why */
    if (rc == MT_ERR_SHAPE && bad == 1)
        return mt_error_set(MT_ERR_STATE, "%s: another rank refused its parameter list", fn);
    if (rc == MT_ERR_SHAPE)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: the ranks have different numbers of parameters (this rank %d: "
                            "%d; over the ranks %lld..%lld)",
                            fn, mt_dist_rank(), n, (long long)lo, (long long)hi);
    if (rc < 0 || n == 0) return rc;
    int64_t *desc = mt_heap_calloc((size_t)n * DESC, sizeof *desc);
    if (!desc) return mt_error_set(MT_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; i < n; i++) {
        desc[i * DESC] = params[i]->dtype;
        desc[i * DESC + 1] = params[i]->ndim;
        for (int k = 0; k < params[i]->ndim; k++) desc[i * DESC + 2 + k] = params[i]->shape[k];
    }
    rc = mt_dist_agree(fn, comm, desc, n * DESC, &bad, &lo, &hi);
    free(desc);
    if (rc != MT_ERR_SHAPE) return rc;
    char b[MT_SHAPE_BUF];
    mt_tensor *t = params[bad / DESC];
    return mt_error_set(
        MT_ERR_SHAPE, "%s: parameter %d differs between the ranks (this rank %d: shape %s %s)", fn,
        bad / DESC, mt_dist_rank(), mt_shape_str(t, b, sizeof b), mt_dtype_name(t->dtype));
}

/* Reverse registration order (roughly the order backward makes gradients ready), one open
   bucket per dtype (as torch's bucket assignment: O2's FP32 norm parameters among FP16 ones
   do not cut the FP16 run into many small buckets), a new bucket when the size is reached. */
static int make_buckets(mt_ddp *d, double bucket_mb, bool per_parameter) {
    double cap_bytes = bucket_mb * 1024.0 * 1024.0; /* inf or huge: one bucket per dtype */
    size_t cap = cap_bytes < (double)SIZE_MAX ? (size_t)cap_bytes : SIZE_MAX;
    d->buckets = mt_heap_calloc((size_t)(d->n ? d->n : 1), sizeof *d->buckets);
    if (!d->buckets) return mt_error_set(MT_ERR_OOM, "mt_ddp_new: out of memory");
    int open[MT_DTYPE_COUNT];
    size_t open_bytes[MT_DTYPE_COUNT] = {0};
    for (int k = 0; k < MT_DTYPE_COUNT; k++) open[k] = -1;
    for (int i = d->n - 1; i >= 0; i--) {
        ddp_param *p = &d->params[i];
        mt_dtype dt = p->t->dtype;
        size_t bytes = (size_t)p->t->numel * buf_esize(dt);
        /* a bucket is one MPI message: its count must fit an int (check_local's limit) */
        if (open[dt] < 0 || per_parameter || open_bytes[dt] + bytes > cap ||
            d->buckets[open[dt]].numel + p->t->numel > INT_MAX / 8) {
            open[dt] = d->nb++;
            d->buckets[open[dt]].dt = dt;
            open_bytes[dt] = 0;
        }
        ddp_bucket *cur = &d->buckets[open[dt]];
        p->bucket = open[dt];
        p->offset = cur->numel;
        cur->numel += p->t->numel;
        cur->n_params++;
        open_bytes[dt] += bytes;
    }
    for (int i = 0; i < d->nb && d->cuda; i++) {
        ddp_bucket *b = &d->buckets[i];
        int64_t numel = b->numel ? b->numel : 1;
        b->dev = mt_tensor_new("mt_ddp_new", 1, &numel, is_half(b->dt) ? MT_F32 : b->dt,
                               d->params[0].t->device);
        if (!b->dev) return status_or(MT_ERR_OOM);
    }
    d->reqs = mt_heap_alloc((size_t)(d->nb ? d->nb : 1) * sizeof *d->reqs);
    d->done_idx = mt_heap_alloc((size_t)(d->nb ? d->nb : 1) * sizeof *d->done_idx);
    if (!d->reqs || !d->done_idx) return mt_error_set(MT_ERR_OOM, "mt_ddp_new: out of memory");
    for (int i = 0; i < d->nb; i++) d->reqs[i] = MPI_REQUEST_NULL;
    for (int i = 0; i < d->nb && !d->cuda; i++) {
        ddp_bucket *b = &d->buckets[i];
        b->buf = mt_heap_calloc((size_t)(b->numel ? b->numel : 1), buf_esize(b->dt));
        if (!b->buf) return mt_error_set(MT_ERR_OOM, "mt_ddp_new: out of memory for bucket %d", i);
    }
    return 0;
}

/* Rank 0's parameter values to every rank. */
static int broadcast_params(mt_ddp *d) {
    for (int i = 0; i < d->n && d->cuda; i++) {
        int rc =
            mt_dist_nccl_start("mt_ddp_new", &(mt_dist_nccl_call){.t = d->params[i].t, .root = 0});
        if (rc < 0) return rc;
        mt_tensor_bump_version(d->params[i].t);
    }
    if (d->cuda && d->n > 0) { /* the parameters are read and written by compute from here */
        int rc = mt_dist_nccl_join("mt_ddp_new", d->params[0].t->device.index);
        if (rc < 0) return rc;
    }
    for (int i = 0; i < d->n && d->mpi && !d->cuda; i++) {
        mt_tensor *t = d->params[i].t;
        MPI_Request req;
        int rc = MPI_Ibcast(mt_tensor_data(t), (int)(t->numel * (int64_t)mt_dtype_size(t->dtype)),
                            MPI_BYTE, 0, d->comm, &req);
        rc = rc != MPI_SUCCESS ? mt_dist_mpi_error("mt_ddp_new", rc)
                               : mt_dist_wait_request("mt_ddp_new", &req);
        if (rc < 0) return rc;
        mt_tensor_bump_version(t);
    }
    return 0;
}

static void ddp_destroy(mt_ddp *d) {
    if (d->threaded) mt_ddp_comm_stop(d);
    /* after mt_dist_finalize MPI has gone, and with it the communicator and any request */
    int mpi_gone = 0;
    if (d->mpi) MPI_Finalized(&mpi_gone);
    /* requests still in flight (a failed or unfinished step) go on writing into the buckets:
       MPI keeps them, and the buckets and the communicator are leaked */
    for (int i = 0; d->reqs && !mpi_gone && i < d->nb; i++)
        if (d->reqs[i] != MPI_REQUEST_NULL) {
            mt_dist_orphan_request(&d->reqs[i]);
            d->leak_buffers = true;
        }
    for (int i = 0; d->params && i < d->n; i++) {
        ddp_param *p = &d->params[i];
        if (p->hook > 0) mt_tensor_remove_grad_ready_hook(p->t, p->hook);
        mt_tensor_unref(p->t);
    }
    for (int i = 0; d->buckets && i < d->nb; i++) {
        mt_tensor_unref(d->buckets[i].dev);
        if (!d->leak_buffers) free(d->buckets[i].buf);
    }
    if (d->mpi && !mpi_gone && d->comm != MPI_COMM_NULL && !d->leak_buffers)
        MPI_Comm_free(&d->comm);
    free(d->buckets);
    free(d->reqs);
    free(d->done_idx);
    free(d->params);
    free(d->made);
    free(d);
}

static mt_ddp *ddp_new(mt_tensor *const *params, int n, const mt_ddp_opts *opts) {
    const char *fn = "mt_ddp_new";
    mt_ddp_opts o = opts ? *opts : (mt_ddp_opts){0};
    if (mt_dist_ready(fn) < 0) return NULL;
    if (!(o.bucket_mb >= 0)) {
        mt_error_set(MT_ERR_INVALID, "%s: bucket_mb %g must be >= 0", fn, o.bucket_mb);
        return NULL;
    }
    if (o.bucket_mb == 0) o.bucket_mb = DEFAULT_BUCKET_MB;
    if (o.progress != MT_DDP_PROGRESS_HOOKS && o.progress != MT_DDP_PROGRESS_THREAD) {
        mt_error_set(MT_ERR_INVALID, "%s: progress %d is not an mt_ddp_progress", fn,
                     (int)o.progress);
        return NULL;
    }
    mt_dist_state *st = mt_dist_state_get();
    /* a world of threads has no MPI: CUDA parameters only, and the agreement checks are
       left to NCCL (the emulator's fake refuses mismatched broadcasts) */
    bool on_cuda = params && n > 0 && params[0] && params[0]->device.type == MT_DEVICE_CUDA;
    if (!st->mpi && st->world > 1 && !on_cuda) {
        mt_error_set(MT_ERR_UNSUPPORTED,
                     "%s: CPU parameters in a world of threads "
                     "(mt_dist_init_thread), which has no MPI",
                     fn);
        return NULL;
    }
    /* a thread is of use where MPI carries CPU buckets; every rank has the same MPI, so
       this local refusal is the same on every rank */
    bool thread = o.progress == MT_DDP_PROGRESS_THREAD && st->mpi && !on_cuda;
    if (thread && st->thread_level < MPI_THREAD_MULTIPLE) {
        mt_error_set(MT_ERR_UNSUPPORTED,
                     "%s: progress MT_DDP_PROGRESS_THREAD needs MPI_THREAD_MULTIPLE, but MPI "
                     "provides level %d (initialised before mt_dist_init with less?); use "
                     "MT_DDP_PROGRESS_HOOKS",
                     fn, st->thread_level);
        return NULL;
    }
    mt_ddp *d = mt_heap_calloc(1, sizeof *d);
    if (!d) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory", fn);
        return NULL;
    }
    d->mpi = st->mpi;
    d->cuda = on_cuda;
    d->comm = MPI_COMM_NULL;
    d->no_overlap = o.no_overlap;
    int rc = 0;
    if (d->mpi) {
        rc = MPI_Comm_dup(st->comm, &d->comm);
        rc = rc != MPI_SUCCESS ? mt_dist_mpi_error(fn, rc) : 0;
    }
    int local = rc == 0 ? check_local(params, n) : rc;
    if (rc == 0 && d->mpi) rc = check_ranks(d->comm, params, n, local);
    if (rc == 0) rc = local;
    if (rc == 0 && (!(d->params = mt_heap_calloc((size_t)(n ? n : 1), sizeof *d->params)) ||
                    !(d->made = mt_heap_calloc((size_t)(n ? n : 1), sizeof *d->made))))
        rc = mt_error_set(MT_ERR_OOM, "%s: out of memory", fn);
    for (int i = 0; rc == 0 && i < n; i++, d->n++)
        d->params[i] = (ddp_param){.ddp = d, .t = mt_tensor_ref(params[i]), .index = i};
    if (rc == 0) rc = make_buckets(d, o.bucket_mb, o.per_parameter);
    if (rc == 0) rc = broadcast_params(d);
    if (rc == 0 && thread) rc = mt_ddp_comm_start(d);
    for (int i = 0; rc == 0 && i < n; i++) {
        int h = mt_tensor_register_grad_ready_hook(params[i], on_grad_ready, &d->params[i]);
        if (h < 0) rc = h;
        d->params[i].hook = h;
    }
    if (rc < 0) {
        ddp_destroy(d);
        return NULL;
    }
    d->stats.buckets = d->nb;
    return d;
}

mt_ddp *mt_ddp_new(mt_tensor *const *params, int n, const mt_ddp_opts *opts) {
    mt_api_enter(); /* errors inside read "mt_ddp_new: ..." */
    mt_ddp *r = ddp_new(params, n, opts);
    mt_api_exit_status(0);
    return r;
}

int mt_ddp_set_no_sync(mt_ddp *d, bool on) {
    if (!d) return mt_error_set(MT_ERR_NULL, "mt_ddp_set_no_sync: arg 1: ddp is NULL");
    for (int i = 0; on && i < d->n; i++)
        if (d->params[i].ready)
            return mt_error_set(MT_ERR_STATE, "mt_ddp_set_no_sync: a step's gradients are being "
                                              "reduced; call mt_ddp_wait first");
    d->no_sync = on;
    return 0;
}

int mt_ddp_stats_get(const mt_ddp *d, mt_ddp_stats *out) {
    if (!d) return mt_error_set(MT_ERR_NULL, "mt_ddp_stats_get: arg 1: ddp is NULL");
    if (!out) return mt_error_set(MT_ERR_NULL, "mt_ddp_stats_get: arg 2: out is NULL");
    *out = d->stats;
    return 0;
}

void mt_ddp_free(mt_ddp *d) {
    if (d) ddp_destroy(d);
}
