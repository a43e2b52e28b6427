/* Sticky per-thread error: the first error of a thread is kept until mt_clear_error(), so a
   whole training step can run unchecked and be checked once. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "tensor_impl.h"

static _Thread_local mt_status err_status = MT_OK;
static _Thread_local char err_msg[512];

/* "<entry>: [in the backward of mt_<op>: ]" when the error is raised inside a public call
   whose name the message does not already start with. */
static size_t context_prefix(const char *msg, char *buf, size_t cap) {
    const char *entry = mt_api_entry(), *bw = mt_api_backward_op();
    if (!entry) return 0;
    size_t len = strlen(entry);
    if (!bw && strncmp(msg, entry, len) == 0 && msg[len] == ':') return 0;
    int n = bw ? snprintf(buf, cap, "%s: in the backward of mt_%s: ", entry, bw)
               : snprintf(buf, cap, "%s: ", entry);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

int mt_error_set(mt_status status, const char *fmt, ...) {
    if (err_status == MT_OK) {
        char msg[sizeof err_msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        size_t n = context_prefix(msg, err_msg, sizeof err_msg);
        /* "in the backward of mt_sum: mt_sum: ..." says the op once */
        const char *bw = mt_api_backward_op(), *body = msg;
        if (n && bw && strncmp(msg, "mt_", 3) == 0 && strncmp(msg + 3, bw, strlen(bw)) == 0 &&
            strncmp(msg + 3 + strlen(bw), ": ", 2) == 0)
            body = msg + 3 + strlen(bw) + 2;
        snprintf(err_msg + n, sizeof err_msg - n, "%s", body);
        err_status = status;
    }
    return (int)status;
}

const char *mt_version(void) {
    return MT_VERSION_STRING;
}

mt_status mt_last_status(void) {
    return err_status;
}
const char *mt_last_error(void) {
    return err_status == MT_OK ? "" : err_msg;
}

void mt_clear_error(void) {
    err_status = MT_OK;
    err_msg[0] = '\0';
}

const char *mt_status_name(mt_status s) {
    switch (s) {
    case MT_OK:
        return "ok";
    case MT_ERR_INVALID:
        return "invalid argument";
    case MT_ERR_SHAPE:
        return "shape mismatch";
    case MT_ERR_DTYPE:
        return "dtype not supported";
    case MT_ERR_DEVICE:
        return "device mismatch or unavailable";
    case MT_ERR_OOM:
        return "out of memory";
    case MT_ERR_STATE:
        return "invalid state";
    case MT_ERR_UNSUPPORTED:
        return "unsupported";
    case MT_ERR_NULL:
        return "NULL argument";
    case MT_ERR_INTERNAL:
        return "internal error";
    case MT_ERR_TIMEOUT:
        return "timed out";
    }
    return "unknown status";
}

char *mt_dims_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

char *mt_shape_str(const mt_tensor *t, char *buf, size_t cap) {
    return mt_dims_str(t->ndim, t->shape, buf, cap);
}
