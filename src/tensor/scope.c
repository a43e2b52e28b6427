/* Scopes and the API boundary. A scope is a per-thread list of the tensors handed to the
   caller while it was innermost; mt_scope_end releases them. Only the outermost library call
   (depth 1) hands its result to a scope, so library code calling public ops gets plain owned
   references. */
#include <stdlib.h>
#include <threads.h>
#include "tensor_impl.h"

typedef struct {
    mt_tensor **items;
    size_t len, cap;
} scope_frame;

static _Thread_local int api_depth;
static _Thread_local const char *api_entry;       /* the outermost public function */
static _Thread_local const char *api_backward_op; /* the node whose backward is running */
static _Thread_local scope_frame *frames;
static _Thread_local int n_frames, cap_frames;
static _Thread_local int lost_frames; /* scopes whose begin failed: their end does nothing */
/* The bookkeeping stays allocated between steps (a training loop opens a scope per step)
   and is freed when the thread exits. */
static _Thread_local bool registered;
static tss_t frames_key;
static bool frames_key_ok;
static once_flag frames_once = ONCE_FLAG_INIT;

static void frames_free(void *unused) {
    (void)unused;
    for (int i = 0; i < cap_frames; i++) free(frames[i].items);
    free(frames);
    frames = NULL;
    n_frames = cap_frames = 0;
}
static void frames_init(void) {
    frames_key_ok = tss_create(&frames_key, frames_free) == thrd_success;
}

void mt_api_enter_at(const char *entry) {
    if (api_depth++ == 0) api_entry = entry;
}

const char *mt_api_entry(void) {
    return api_depth > 0 ? api_entry : NULL;
}
const char *mt_api_backward_op(void) {
    return api_depth > 0 ? api_backward_op : NULL;
}
void mt_api_set_backward_op(const char *op_name) {
    api_backward_op = op_name;
}

mt_api_outer mt_api_callback_begin(void) {
    mt_api_outer outer = {api_depth, api_entry, api_backward_op};
    api_depth = 0;
    api_entry = api_backward_op = NULL;
    return outer;
}

void mt_api_callback_end(mt_api_outer outer) {
    api_depth = outer.depth;
    api_entry = outer.entry;
    api_backward_op = outer.backward_op;
}

/* Room for one more result in the innermost frame; false (with the OOM error) when it
   cannot grow. */
static bool frame_room(void) {
    scope_frame *f = &frames[n_frames - 1];
    if (f->len < f->cap) return true;
    size_t cap = f->cap ? f->cap * 2 : 64;
    mt_tensor **items = mt_heap_realloc(f->items, cap * sizeof *items);
    if (!items) {
        mt_error_set(MT_ERR_OOM, "mt_scope: out of memory tracking a result");
        return false;
    }
    f->items = items;
    f->cap = cap;
    return true;
}

int mt_scope_reserve(void) {
    if (api_depth != 1 || n_frames == 0) return 0; /* the result goes to no scope */
    return frame_room() ? 0 : MT_ERR_OOM;
}

/* False when the scope cannot grow: the caller then gets NULL (and the OOM error) rather than
   a tensor nobody would release. */
static bool scope_track(mt_tensor *t) {
    if (!frame_room()) return false;
    scope_frame *f = &frames[n_frames - 1];
    f->items[f->len++] = t;
    atomic_fetch_add_explicit(&t->scope_refs, 1, memory_order_relaxed);
    return true;
}

bool mt_scope_untrack(mt_tensor *t) {
    for (int k = n_frames; k-- > 0;) {
        scope_frame *f = &frames[k];
        for (size_t i = f->len; i-- > 0;) {
            if (f->items[i] != t) continue;
            f->items[i] = NULL;
            atomic_fetch_sub_explicit(&t->scope_refs, 1, memory_order_relaxed);
            return true;
        }
    }
    return false;
}

/* Checked mode: a tensor the user retained inside the scope and still holds when it ends is
   reported (it outlives the scope: release it, or hand it out with mt_scope_end_keep). */
static void report_kept(const mt_tensor *t) {
    if (atomic_load_explicit(&t->user_refs, memory_order_relaxed) <= 0) return;
    char buf[MT_SHAPE_BUF];
    mt_ownership_report(false,
                        "mt_scope_end: a %s tensor made by %s was retained in this scope and is "
                        "still held: release it, or hand it out with mt_scope_end_keep",
                        mt_shape_str(t, buf, sizeof buf), t->made_by ? t->made_by : "?");
}

mt_tensor *mt_api_exit(mt_tensor *result) {
    if (--api_depth == 0) api_backward_op = NULL;
    if (api_depth != 0 || !result) return result;
    /* inside a scope that could not open and no other: nothing would release the result
       (the caller counts on the scope), so the call fails; mt_scope_begin's error is
       pending */
    bool untracked = n_frames == 0 && lost_frames > 0;
    if (untracked || (n_frames > 0 && !scope_track(result))) {
        mt_tensor_unref(result);
        return NULL;
    }
    return result;
}

int mt_api_exit_status(int status) {
    if (--api_depth == 0) api_backward_op = NULL;
    return status;
}

void mt_scope_begin(void) {
    if (lost_frames) { /* inside a scope that could not open: keep the nesting balanced */
        lost_frames++;
        return;
    }
    if (!registered) {
        call_once(&frames_once, frames_init);
        registered = frames_key_ok && tss_set(frames_key, &frames_key) == thrd_success;
    }
    if (n_frames == cap_frames) {
        int cap = cap_frames ? cap_frames * 2 : 8;
        scope_frame *nf = mt_heap_realloc(frames, (size_t)cap * sizeof *nf);
        if (!nf) {
            mt_error_set(MT_ERR_OOM, "mt_scope_begin: out of memory");
            lost_frames = 1;
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
    if (lost_frames) {
        lost_frames--;
        return;
    }
    if (n_frames == 0) return;
    scope_frame *f = &frames[n_frames - 1];
    /* release newest first: later results tend to depend on earlier ones */
    bool checked = mt_ownership_checked();
    for (size_t i = f->len; i-- > 0;) {
        mt_tensor *t = f->items[i];
        if (!t) continue; /* released by the user already (mt_scope_untrack) */
        atomic_fetch_sub_explicit(&t->scope_refs, 1, memory_order_relaxed);
        if (checked) report_kept(t);
        mt_tensor_unref(t);
    }
    f->len = 0;
    if (f->cap > 4096) { /* do not keep a huge list for the rest of the thread */
        free(f->items);
        f->items = NULL;
        f->cap = 0;
    }
    n_frames--;
    if (n_frames == 0 && !registered) frames_free(NULL); /* no exit hook: free now */
}

mt_tensor *mt_scope_end_keep(mt_tensor *keep) {
    if (keep) mt_tensor_ref(keep);
    mt_scope_end();
    /* handed on like an op result made now: to the enclosing scope, or to the caller */
    if (keep && n_frames > 0 && !scope_track(keep)) {
        mt_tensor_unref(keep);
        return NULL;
    }
    return keep;
}

int mt_scope_depth(void) {
    return n_frames + lost_frames;
}
