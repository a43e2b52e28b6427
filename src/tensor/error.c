/* Sticky per-thread error: the first error of a thread is kept until mt_clear_error(), so a
   whole training step can run unchecked and be checked once. */
#include <stdarg.h>
#include <stdio.h>
#include "tensor_impl.h"

static _Thread_local mt_status err_status = MT_OK;
static _Thread_local char err_msg[512];

int mt_error_set(mt_status status, const char *fmt, ...) {
    if (err_status == MT_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err_msg, sizeof err_msg, fmt, ap);
        va_end(ap);
        err_status = status;
    }
    return (int)status;
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
