/* Scopes and the API boundary. A scope is a per-thread list of the tensors handed to the
   caller while it was innermost; mt_scope_end releases them. Only the outermost library call
   (depth 1) hands its result to a scope, so library code calling public ops gets plain owned
   references. */
#include <stdlib.h>
#include "tensor_impl.h"

typedef struct {
    mt_tensor **items;
    size_t len, cap;
} scope_frame;

static _Thread_local int api_depth;
static _Thread_local scope_frame *frames;
static _Thread_local int n_frames, cap_frames;

void mt_api_enter(void) { api_depth++; }

static void scope_track(mt_tensor *t) {
    scope_frame *f = &frames[n_frames - 1];
    if (f->len == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 64;
        mt_tensor **items = realloc(f->items, cap * sizeof *items);
        if (!items) { /* cannot track: keep the tensor alive rather than lose it */
            mt_error_set(MT_ERR_OOM, "mt_scope: out of memory tracking a result");
            return;
        }
        f->items = items;
        f->cap = cap;
    }
    f->items[f->len++] = t;
}

mt_tensor *mt_api_exit(mt_tensor *result) {
    if (--api_depth == 0 && result && n_frames > 0) scope_track(result);
    return result;
}

int mt_api_exit_status(int status) {
    api_depth--;
    return status;
}

void mt_scope_begin(void) {
    if (n_frames == cap_frames) {
        int cap = cap_frames ? cap_frames * 2 : 8;
        scope_frame *nf = realloc(frames, (size_t)cap * sizeof *nf);
        if (!nf) {
            mt_error_set(MT_ERR_OOM, "mt_scope_begin: out of memory");
            return;
        }
        for (int i = cap_frames; i < cap; i++) nf[i] = (scope_frame){0};
        frames = nf;
        cap_frames = cap;
    }
    frames[n_frames].len = 0;
    n_frames++;
}

void mt_scope_end(void) {
    if (n_frames == 0) return;
    scope_frame *f = &frames[n_frames - 1];
    /* release newest first: later results tend to depend on earlier ones */
    for (size_t i = f->len; i-- > 0;) mt_release(f->items[i]);
    f->len = 0;
    n_frames--;
    if (n_frames == 0) { /* free the thread's bookkeeping when fully unwound */
        for (int i = 0; i < cap_frames; i++) free(frames[i].items);
        free(frames);
        frames = NULL;
        cap_frames = 0;
    }
}

int mt_scope_depth(void) { return n_frames; }
