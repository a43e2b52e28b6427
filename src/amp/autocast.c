/* Per-thread autocast state: a stack of regions (nesting; an inner region may disable or
   switch dtype) and the thread's custom white/black lists. */
#include <string.h>
#include "autocast.h"

#define MAX_NESTING 64

typedef struct {
    bool enabled;
    mt_dtype low;
    mt_amp_level level;
} region;

static _Thread_local region regions[MAX_NESTING];
static _Thread_local int depth;
static _Thread_local int base;     /* regions below are suspended (mt_autocast_suspend) */
static _Thread_local int overflow; /* regions opened past MAX_NESTING (counted, not stored) */
static _Thread_local signed char custom[MT_OP_COUNT]; /* +1 white, -1 black, 0 none */

void mt_autocast_begin(mt_dtype low, mt_amp_level level) {
    if (depth == MAX_NESTING) {
        overflow++;
        mt_error_set(MT_ERR_STATE, "mt_autocast_begin: regions nest at most %d deep", MAX_NESTING);
        return;
    }
    bool ok = low == MT_F16 || low == MT_BF16;
    if (!ok && low != MT_F32)
        mt_error_set(
            MT_ERR_DTYPE,
            "mt_autocast_begin: arg 1: low dtype must be f16 or bf16 (f32 disables), got %s",
            mt_dtype_name(low));
    if (level != MT_AMP_O1 && level != MT_AMP_O2) {
        mt_error_set(MT_ERR_INVALID, "mt_autocast_begin: arg 2: level %d is not O1 or O2",
                     (int)level);
        ok = false;
    }
    regions[depth++] = (region){ok, ok ? low : MT_F32, level};
}

void mt_autocast_end(void) {
    if (overflow) {
        overflow--;
        return;
    }
    if (depth == base) {
        mt_error_set(MT_ERR_STATE, "mt_autocast_end: no autocast region is open");
        return;
    }
    depth--;
    if (depth == 0) mt_cast_cache_clear();
}

mt_autocast_token mt_autocast_suspend(void) {
    mt_autocast_token token = {base, depth, overflow};
    base = depth;
    overflow = 0;
    return token;
}

void mt_autocast_resume(mt_autocast_token token) {
    /* regions opened during the suspension and left open are dropped with it */
    base = token.base;
    depth = token.depth;
    overflow = token.overflow;
}

/* A region past MAX_NESTING could not open: like any region whose begin failed, it is a
   disabled one until its end. */
bool mt_autocast_active(void) {
    return overflow == 0 && depth > base && regions[depth - 1].enabled;
}
bool mt_autocast_enabled(void) {
    return mt_autocast_active();
}
mt_dtype mt_autocast_dtype(void) {
    return mt_autocast_active() ? regions[depth - 1].low : MT_F32;
}

int mt_autocast_set_lists(const char *const *white, const char *const *black) {
    signed char next[MT_OP_COUNT] = {0};
    for (int pass = 0; pass < 2; pass++) {
        const char *const *list = pass == 0 ? white : black;
        for (int i = 0; list && list[i]; i++) {
            int op = mt_op_lookup(list[i]);
            if (op < 0)
                return mt_error_set(MT_ERR_INVALID,
                                    "mt_autocast_set_lists: arg %d: unknown op \"%s\"", pass + 1,
                                    list[i]);
            if (mt_op_rule((mt_op_id)op) == MT_RULE_FIXED)
                return mt_error_set(MT_ERR_INVALID,
                                    "mt_autocast_set_lists: arg %d: \"%s\" is a cast, copy or "
                                    "view: its dtype is the call's own, autocast never changes it",
                                    pass + 1, list[i]);
            if (pass == 1 && next[op] == 1)
                return mt_error_set(
                    MT_ERR_INVALID,
                    "mt_autocast_set_lists: op \"%s\" is in both the white and the black list",
                    list[i]);
            next[op] = pass == 0 ? 1 : -1;
        }
    }
    memcpy(custom, next, sizeof custom);
    return 0;
}

mt_dtype mt_autocast_decide(mt_op_id op, mt_dtype widest) {
    if (!mt_autocast_active() || !mt_dtype_is_floating(widest) || widest == MT_F64) return widest;
    const region *r = &regions[depth - 1];
    mt_amp_rule rule = mt_op_rule(op);
    if (custom[op] > 0)
        rule = MT_RULE_LOWER;
    else if (custom[op] < 0)
        rule = MT_RULE_FP32;
    else if (r->level == MT_AMP_O2 && (rule == MT_RULE_PROMOTE || rule == MT_RULE_LOWER))
        rule = MT_RULE_LOWER; /* O2: everything low but the FP32 list and the black list */
    switch (rule) {
    case MT_RULE_LOWER:
        return r->low;
    case MT_RULE_FP32:
        return MT_F32;
    case MT_RULE_PROMOTE:
    case MT_RULE_NONE:
    case MT_RULE_FIXED: /* never in the custom lists */
    case MT_RULE_MIXED: /* the activation's dtype; parameters: mt_dispatch_mixed */
        return widest;
    }
    return widest;
}

mt_dtype mt_autocast_compute_dtype(const char *op_name, mt_dtype in) {
    if (!op_name) {
        mt_error_set(MT_ERR_NULL, "mt_autocast_compute_dtype: arg 1: op name is NULL");
        return in;
    }
    int op = mt_op_lookup(op_name);
    if (op < 0) {
        mt_error_set(MT_ERR_INVALID, "mt_autocast_compute_dtype: unknown op \"%s\"", op_name);
        return in;
    }
    return mt_autocast_decide((mt_op_id)op, in);
}
