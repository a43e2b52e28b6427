/* The op enum, names and autocast rules, expanded from ops.def. */
#ifndef MT_TENSOR_OP_TABLE_H
#define MT_TENSOR_OP_TABLE_H
#include <stdbool.h>

typedef enum {
#define MT_OP(id, name, rule) MT_OP_##id,
#include "ops.def"
#undef MT_OP
    MT_OP_COUNT
} mt_op_id;

typedef enum { MT_RULE_NONE, MT_RULE_LOWER, MT_RULE_FP32, MT_RULE_PROMOTE } mt_amp_rule;

const char *mt_op_name(mt_op_id op); /* "add" */
mt_amp_rule mt_op_rule(mt_op_id op);
/* The op whose table name is `name`, or -1. */
int mt_op_lookup(const char *name);
#endif
