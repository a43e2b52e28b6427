/* Operator statistics (Paddle's collect_operator_stats) and the numeric checker (Paddle's
   TensorChecker). Both hang off mt_dispatch_done and cost one branch when off.
   Statistics are global (atomic counters, any thread may record); the checker's result is
   per thread, because the first bad op of one training thread says nothing about another. */
#include <stdatomic.h>
#include <string.h>
#include "../tensor/backend.h"
#include "autocast.h"

atomic_bool mt_amp_stats_on, mt_amp_check_on;

/* ------------------------------------------------------------------ statistics */

static atomic_llong counts[MT_OP_COUNT][MT_DTYPE_COUNT];

void mt_amp_stats_record(mt_op_id op, mt_dtype compute) {
    if ((unsigned)op >= MT_OP_COUNT || (unsigned)compute >= MT_DTYPE_COUNT) return;
    atomic_fetch_add_explicit(&counts[op][compute], 1, memory_order_relaxed);
}

void mt_amp_stats_enable(bool on) {
    atomic_store_explicit(&mt_amp_stats_on, on, memory_order_relaxed);
}

void mt_amp_stats_reset(void) {
    for (int op = 0; op < MT_OP_COUNT; op++)
        for (int dt = 0; dt < MT_DTYPE_COUNT; dt++)
            atomic_store_explicit(&counts[op][dt], 0, memory_order_relaxed);
}

int64_t mt_amp_stats_count(const char *op_name, mt_dtype compute) {
    int op = mt_op_lookup(op_name);
    if (op < 0) {
        mt_error_set(MT_ERR_INVALID, "mt_amp_stats_count: arg 1: unknown op \"%s\"",
                     op_name ? op_name : "(null)");
        return -1;
    }
    if ((unsigned)compute >= MT_DTYPE_COUNT) {
        mt_error_set(MT_ERR_DTYPE, "mt_amp_stats_count: arg 2: invalid dtype %d", (int)compute);
        return -1;
    }
    return atomic_load_explicit(&counts[op][compute], memory_order_relaxed);
}

/* The floating columns in print order; integer and bool computes go to "other". */
static const mt_dtype columns[] = {MT_F32, MT_F16, MT_BF16, MT_F64};
#define N_COLUMNS ((int)(sizeof columns / sizeof columns[0]))

int mt_amp_stats_print(FILE *f) {
    if (!f) return mt_error_set(MT_ERR_NULL, "mt_amp_stats_print: arg 1: FILE is NULL");
    /* one snapshot, so the table is consistent while other threads keep recording */
    long long snap[MT_OP_COUNT][N_COLUMNS + 1];
    int name_w = 2, rows = 0;
    for (int op = 0; op < MT_OP_COUNT; op++) {
        long long total = 0;
        memset(snap[op], 0, sizeof snap[op]);
        for (int dt = 0; dt < MT_DTYPE_COUNT; dt++) {
            long long c = atomic_load_explicit(&counts[op][dt], memory_order_relaxed);
            int col = N_COLUMNS;
            for (int k = 0; k < N_COLUMNS; k++)
                if (columns[k] == (mt_dtype)dt) col = k;
            snap[op][col] += c;
            total += c;
        }
        if (total == 0) continue;
        rows++;
        int w = (int)strlen(mt_op_name((mt_op_id)op));
        if (w > name_w) name_w = w;
    }
    fprintf(f, "mixtape operator statistics: calls per compute dtype\n");
    fprintf(f, "%-*s", name_w, "op");
    for (int k = 0; k < N_COLUMNS; k++) fprintf(f, " %10s", mt_dtype_name(columns[k]));
    fprintf(f, " %10s\n", "other");
    for (int op = 0; op < MT_OP_COUNT; op++) {
        long long total = 0;
        for (int k = 0; k <= N_COLUMNS; k++) total += snap[op][k];
        if (total == 0) continue;
        fprintf(f, "%-*s", name_w, mt_op_name((mt_op_id)op));
        for (int k = 0; k <= N_COLUMNS; k++) fprintf(f, " %10lld", snap[op][k]);
        fputc('\n', f);
    }
    if (rows == 0) fprintf(f, "(no calls recorded)\n");
    if (ferror(f)) return mt_error_set(MT_ERR_INVALID, "mt_amp_stats_print: write failed");
    return 0;
}

/* ------------------------------------------------------------------ numeric checker */

static _Thread_local bool failed;
static _Thread_local char report[512];

void mt_amp_check_numerics(bool on) {
    atomic_store_explicit(&mt_amp_check_on, on, memory_order_relaxed);
}
bool mt_amp_numerics_failed(void) {
    return failed;
}
const char *mt_amp_numerics_report(void) {
    return failed ? report : "";
}

void mt_amp_numerics_reset(void) {
    failed = false;
    report[0] = '\0';
}

/* Appends "f16 [2, 3]" (or "none") to report at *len, never past its end. */
static void append_tensor(size_t *len, const mt_tensor *t) {
    if (*len >= sizeof report) return;
    char shape[MT_SHAPE_BUF];
    int w = t ? snprintf(report + *len, sizeof report - *len, "%s %s", mt_dtype_name(t->dtype),
                         mt_shape_str(t, shape, sizeof shape))
              : snprintf(report + *len, sizeof report - *len, "none");
    if (w > 0) *len += (size_t)w;
}

static void append_text(size_t *len, const char *s) {
    if (*len >= sizeof report) return;
    int w = snprintf(report + *len, sizeof report - *len, "%s", s);
    if (w > 0) *len += (size_t)w;
}

void mt_amp_check_output(mt_op_id op, const mt_tensor *out, mt_tensor *const *inputs, int n) {
    /* only the first failure is kept: later ones are usually its consequences */
    if (failed || !out || !mt_dtype_is_floating(out->dtype) || out->numel == 0) return;
    const mt_backend *be = mt_backend_get(out->device);
    if (!be || !be->has_nonfinite) return;
    bool bad = false;
    /* a diagnostic: a kernel failure here (out of memory for its flag) is not the caller's
       error, so it is not reported, nor left behind as the thread's pending error */
    bool clean = mt_last_status() == MT_OK;
    int rc = be->has_nonfinite(out, &bad);
    if (rc != 0 && clean) mt_clear_error();
    if (rc != 0 || !bad) return;
    size_t len = 0;
    append_text(&len, "mt_");
    append_text(&len, mt_op_name(op));
    append_text(&len, ": output ");
    append_tensor(&len, out);
    append_text(&len, " has inf/nan; inputs: ");
    for (int i = 0; i < n; i++) {
        if (i) append_text(&len, ", ");
        append_tensor(&len, inputs ? inputs[i] : NULL);
    }
    if (n == 0) append_text(&len, "none");
    failed = true;
}
