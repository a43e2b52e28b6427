/* Strided iteration: coalesce dims, then split the flat index range across threads, each
   thread walking whole or partial rows of the innermost dim. */
#include <omp.h>
#include <string.h>
#include "cpu.h"

/* element sizes, inlined here: this runs for every kernel call */
static const int8_t elem_size[MT_DTYPE_COUNT] = {
    [MT_F32] = 4, [MT_F16] = 2, [MT_BF16] = 2, [MT_F64] = 8,
    [MT_I64] = 8, [MT_I32] = 4, [MT_BOOL] = 1,
};

static bool contiguous(const mt_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

void mt_cpu_iter_init(mt_cpu_iter *it, int nops, const mt_tensor *const *ts) {
    const mt_tensor *t0 = ts[0];
    it->nops = nops;
    it->numel = t0->numel;
    bool flat = true; /* the common case, all operands contiguous: one row */
    for (int k = 0; k < nops && flat; k++) flat = contiguous(ts[k]);
    /* a channels-last (NHWC) first operand: walk N, H, W, C, its memory order; operands
       with the same strides are then one row too */
    bool nhwc = !flat && t0->ndim == 4 && mt_is_channels_last(t0);
    static const int nchw_order[4] = {0, 1, 2, 3}, nhwc_order[4] = {0, 2, 3, 1};
    for (int k = 0; k < nops && nhwc; k++) {
        flat = true;
        for (int d = 0; d < 4 && flat; d++)
            flat = ts[k]->shape[d] == 1 || ts[k]->strides[d] == t0->strides[d];
        if (!flat) break;
    }
    if (flat) {
        it->ndim = 1;
        it->shape[0] = t0->numel;
        for (int k = 0; k < nops; k++) {
            int64_t es = elem_size[ts[k]->dtype];
            it->strides[k][0] = es;
            it->data[k] = (char *)ts[k]->storage->data + ts[k]->offset * es;
        }
        return;
    }
    int nd = 0;
    /* drop size-1 dims, then merge dim i into the previous kept dim when contiguous for all */
    for (int j = 0; j < t0->ndim; j++) {
        int d = t0->ndim == 4 ? (nhwc ? nhwc_order : nchw_order)[j] : j;
        if (t0->shape[d] == 1) continue;
        if (nd > 0) {
            bool merge = true;
            for (int k = 0; k < nops; k++) {
                int64_t es = (int64_t)mt_dtype_size(ts[k]->dtype);
                if (it->strides[k][nd - 1] != ts[k]->strides[d] * t0->shape[d] * es) {
                    merge = false;
                    break;
                }
            }
            if (merge) {
                it->shape[nd - 1] *= t0->shape[d];
                for (int k = 0; k < nops; k++)
                    it->strides[k][nd - 1] =
                        ts[k]->strides[d] * (int64_t)mt_dtype_size(ts[k]->dtype);
                continue;
            }
        }
        it->shape[nd] = t0->shape[d];
        for (int k = 0; k < nops; k++)
            it->strides[k][nd] = ts[k]->strides[d] * (int64_t)mt_dtype_size(ts[k]->dtype);
        nd++;
    }
    if (nd == 0) { /* a single element */
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++) it->strides[k][0] = (int64_t)mt_dtype_size(ts[k]->dtype);
        nd = 1;
    }
    it->ndim = nd;
    for (int k = 0; k < nops; k++) it->data[k] = (char *)mt_tensor_data(ts[k]);
}

/* Walks flat indices [begin, end). */
static void run_range(const mt_cpu_iter *it, mt_cpu_row_fn fn, void *ctx, int64_t begin,
                      int64_t end) {
    int nd = it->ndim, last = nd - 1;
    int64_t idx[MT_MAX_DIMS];
    int64_t rem = begin;
    for (int d = last; d >= 0; d--) {
        idx[d] = rem % it->shape[d];
        rem /= it->shape[d];
    }
    int64_t inner[MT_CPU_ITER_MAX];
    for (int k = 0; k < it->nops; k++) inner[k] = it->strides[k][last];
    int64_t pos = begin;
    while (pos < end) {
        char *ptrs[MT_CPU_ITER_MAX];
        for (int k = 0; k < it->nops; k++) {
            int64_t off = 0;
            for (int d = 0; d < nd; d++) off += idx[d] * it->strides[k][d];
            ptrs[k] = it->data[k] + off;
        }
        int64_t n = it->shape[last] - idx[last];
        if (n > end - pos) n = end - pos;
        fn(ptrs, inner, n, ctx);
        pos += n;
        idx[last] += n;
        for (int d = last; d > 0 && idx[d] == it->shape[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

void mt_cpu_iter_run(const mt_cpu_iter *it, mt_cpu_row_fn fn, void *ctx, int cost_per_elem) {
    int64_t total = it->numel;
    if (total == 0) return;
    int threads = 1;
    if (total * (cost_per_elem > 0 ? cost_per_elem : 1) < MT_CPU_PARALLEL_MIN ||
        (threads = mt_cpu_num_threads()) <= 1) {
        if (it->ndim == 1) { /* one row: no index arithmetic */
            char *ptrs[MT_CPU_ITER_MAX];
            int64_t inner[MT_CPU_ITER_MAX];
            for (int k = 0; k < it->nops; k++) {
                ptrs[k] = it->data[k];
                inner[k] = it->strides[k][0];
            }
            fn(ptrs, inner, total, ctx);
        } else {
            run_range(it, fn, ctx, 0, total);
        }
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        /* chunks aligned to 16 elements keep vector loops and cache lines whole */
        int64_t per = ((total + nt - 1) / nt + 15) & ~(int64_t)15;
        int64_t b = (int64_t)id * per, e = b + per < total ? b + per : total;
        if (b < e) run_range(it, fn, ctx, b, e);
    }
}

int mt_cpu_for_parts(mt_cpu_part_fn fn, void *ctx, int64_t n, int64_t work) {
    int nt = mt_cpu_num_threads();
    if (nt > n) nt = (int)n;
    if (nt <= 1 || work < MT_CPU_PARALLEL_MIN) return n > 0 ? fn(ctx, 0, n, 0) : 0;
    int failed = 0;
    int64_t per = (n + nt - 1) / nt;
#pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int p = 0; p < nt; p++) {
        int64_t b = (int64_t)p * per, e = b + per < n ? b + per : n;
        if (b < e && fn(ctx, b, e, p)) {
#pragma omp atomic write
            failed = 1;
        }
    }
    return failed;
}
