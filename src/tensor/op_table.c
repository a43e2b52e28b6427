#include "op_table.h"
#include <string.h>

static const char *const op_names[MT_OP_COUNT] = {
#define MT_OP(id, name, rule, saves, fused) [MT_OP_##id] = #name,
#include "ops.def"
#undef MT_OP
};

/* the names users see in messages, "mt_add": static, so a backend names its op without
   formatting a string on every call */
static const char *const op_api_names[MT_OP_COUNT] = {
#define MT_OP(id, name, rule, saves, fused) [MT_OP_##id] = "mt_" #name,
#include "ops.def"
#undef MT_OP
};

static const mt_amp_rule op_rules[MT_OP_COUNT] = {
#define MT_OP(id, name, rule, saves, fused) [MT_OP_##id] = MT_RULE_##rule,
#include "ops.def"
#undef MT_OP
};

static const mt_op_saves op_saves[MT_OP_COUNT] = {
#define MT_OP(id, name, rule, saves, fused) [MT_OP_##id] = MT_SAVES_##saves,
#include "ops.def"
#undef MT_OP
};

static const int op_fused_backward[MT_OP_COUNT] = {
#define MT_OP(id, name, rule, saves, fused) [MT_OP_##id] = MT_OP_##fused,
#include "ops.def"
#undef MT_OP
};

const char *mt_op_name(mt_op_id op) {
    return (unsigned)op < MT_OP_COUNT ? op_names[op] : "?";
}

const char *mt_op_api_name(mt_op_id op) {
    return (unsigned)op < MT_OP_COUNT ? op_api_names[op] : "mt_?";
}

mt_amp_rule mt_op_rule(mt_op_id op) {
    return (unsigned)op < MT_OP_COUNT ? op_rules[op] : MT_RULE_NONE;
}

mt_op_saves mt_op_saved(mt_op_id op) {
    return (unsigned)op < MT_OP_COUNT ? op_saves[op] : MT_SAVES_OWN;
}

int mt_op_fused_backward(mt_op_id op) {
    return (unsigned)op < MT_OP_COUNT ? op_fused_backward[op] : MT_OP_NONE;
}

int mt_op_lookup(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < MT_OP_COUNT; i++)
        if (strcmp(op_names[i], name) == 0) return i;
    return -1;
}
