/* Loader for the golden files written by tools/gen_golden.py (format described there): a
   whitespace-separated token stream, '#' starts a comment line. Depends only on libc and the
   dtype enum of mixtape.h. */
#ifndef MT_GOLDEN_READER_H
#define MT_GOLDEN_READER_H
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mixtape.h"

#define GOLDEN_MAX_INPUTS 8
#define GOLDEN_MAX_PARAMS 8

typedef struct {
    mt_dtype dt;
    bool requires_grad; /* inputs only */
    int ndim;
    int64_t shape[MT_MAX_DIMS];
    int64_t n;
    double *v; /* n values (integers and bools as doubles) */
} golden_tensor;

typedef struct {
    char key[32];
    int n;
    double v[MT_MAX_DIMS];
} golden_param;

typedef struct {
    char name[128];
    bool emulated;     /* low precision: FP32-then-round reference, not torch's own kernel */
    mt_dtype autocast; /* MT_DTYPE_COUNT: none */
    mt_dtype target;   /* cast destination; MT_DTYPE_COUNT: none */
    int nparams;
    golden_param params[GOLDEN_MAX_PARAMS];
    int nin;
    golden_tensor in[GOLDEN_MAX_INPUTS];
    golden_tensor out;
    bool has_cotangent;
    golden_tensor cotangent;
    int ngrad;
    int grad_input[GOLDEN_MAX_INPUTS];
    golden_tensor grad[GOLDEN_MAX_INPUTS];
} golden_case;

typedef struct {
    golden_case *cases;
    int n;
    char err[256];
} golden_file;

typedef struct {
    char *p;
    int line;
} golden_lexer;

/* Next token (NUL-terminated in place), or NULL at the end. */
static inline char *golden_token(golden_lexer *lx) {
    for (;;) {
        while (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\r' || *lx->p == '\n') {
            if (*lx->p == '\n') lx->line++;
            lx->p++;
        }
        if (*lx->p != '#') break;
        while (*lx->p && *lx->p != '\n') lx->p++;
    }
    if (!*lx->p) return NULL;
    char *t = lx->p;
    while (*lx->p && *lx->p != ' ' && *lx->p != '\t' && *lx->p != '\r' && *lx->p != '\n') lx->p++;
    if (*lx->p) {
        if (*lx->p == '\n') lx->line++;
        *lx->p++ = '\0';
    }
    return t;
}

static inline bool golden_dtype_parse(const char *s, mt_dtype *dt) {
    static const char *const names[] = {"f32", "f16", "bf16", "f64", "i64", "i32", "bool"};
    static const mt_dtype dts[] = {MT_F32, MT_F16, MT_BF16, MT_F64, MT_I64, MT_I32, MT_BOOL};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (s && strcmp(s, names[i]) == 0) {
            *dt = dts[i];
            return true;
        }
    return false;
}

static inline bool golden_number(golden_lexer *lx, double *out) {
    char *t = golden_token(lx), *end;
    if (!t) return false;
    errno = 0;
    *out = strtod(t, &end); /* hex floats, decimals, inf, nan */
    return *end == '\0' && end != t;
}

static inline bool golden_int(golden_lexer *lx, long long lo, long long hi, long long *out) {
    char *t = golden_token(lx), *end;
    if (!t) return false;
    *out = strtoll(t, &end, 10);
    return *end == '\0' && end != t && *out >= lo && *out <= hi;
}

/* <dtype> [<rg>] <ndim> <dims...> <values...> */
static inline bool golden_tensor_parse(golden_lexer *lx, golden_tensor *t, bool with_rg) {
    long long v;
    memset(t, 0, sizeof *t);
    if (!golden_dtype_parse(golden_token(lx), &t->dt)) return false;
    if (with_rg) {
        if (!golden_int(lx, 0, 1, &v)) return false;
        t->requires_grad = v;
    }
    if (!golden_int(lx, 0, MT_MAX_DIMS, &v)) return false;
    t->ndim = (int)v;
    t->n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (!golden_int(lx, 0, 1 << 20, &v)) return false;
        t->shape[i] = v;
        t->n *= v;
    }
    t->v = malloc((size_t)(t->n ? t->n : 1) * sizeof *t->v);
    if (!t->v) return false;
    for (int64_t i = 0; i < t->n; i++)
        if (!golden_number(lx, &t->v[i])) return false;
    return true;
}

static inline void golden_case_free(golden_case *c) {
    for (int i = 0; i < c->nin; i++) free(c->in[i].v);
    for (int i = 0; i < c->ngrad; i++) free(c->grad[i].v);
    free(c->out.v);
    free(c->cotangent.v);
}

static inline void golden_free(golden_file *f) {
    for (int i = 0; i < f->n; i++) golden_case_free(&f->cases[i]);
    free(f->cases);
    f->cases = NULL;
    f->n = 0;
}

/* Parses one case body after "case <name>", up to "end". */
static inline bool golden_case_parse(golden_lexer *lx, golden_case *c, const char **what) {
    char *t;
    long long v;
    while ((t = golden_token(lx)) && strcmp(t, "end") != 0) {
        *what = t;
        if (strcmp(t, "source") == 0) {
            char *s = golden_token(lx);
            if (!s) return false;
            c->emulated = strcmp(s, "emulated") == 0;
        } else if (strcmp(t, "autocast") == 0) {
            if (!golden_dtype_parse(golden_token(lx), &c->autocast)) return false;
        } else if (strcmp(t, "target") == 0) {
            if (!golden_dtype_parse(golden_token(lx), &c->target)) return false;
        } else if (strcmp(t, "param") == 0) {
            char *k = golden_token(lx);
            if (!k || c->nparams == GOLDEN_MAX_PARAMS || strlen(k) >= sizeof c->params[0].key)
                return false;
            golden_param *p = &c->params[c->nparams++];
            strcpy(p->key, k);
            if (!golden_int(lx, 0, MT_MAX_DIMS, &v)) return false;
            p->n = (int)v;
            for (int i = 0; i < p->n; i++)
                if (!golden_number(lx, &p->v[i])) return false;
        } else if (strcmp(t, "input") == 0) {
            if (c->nin == GOLDEN_MAX_INPUTS) return false;
            if (!golden_tensor_parse(lx, &c->in[c->nin++], true)) return false;
        } else if (strcmp(t, "output") == 0) {
            if (c->out.v || !golden_tensor_parse(lx, &c->out, false)) return false;
        } else if (strcmp(t, "cotangent") == 0) {
            if (c->has_cotangent || !golden_tensor_parse(lx, &c->cotangent, false)) return false;
            c->has_cotangent = true;
        } else if (strcmp(t, "grad") == 0) {
            if (c->ngrad == GOLDEN_MAX_INPUTS || !golden_int(lx, 0, GOLDEN_MAX_INPUTS - 1, &v))
                return false;
            c->grad_input[c->ngrad] = (int)v;
            if (!golden_tensor_parse(lx, &c->grad[c->ngrad++], false)) return false;
        } else {
            return false;
        }
    }
    *what = "end";
    return t != NULL && c->out.v != NULL;
}

/* Loads a golden file; 0, or -1 with a message in f->err. */
static inline int golden_load(const char *path, golden_file *f) {
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(f->err, sizeof f->err, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char *buf = NULL;
    long size = -1;
    if (fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
    if (size >= 0 && fseek(fp, 0, SEEK_SET) == 0) buf = malloc((size_t)size + 1);
    if (!buf || fread(buf, 1, (size_t)size, fp) != (size_t)size) {
        snprintf(f->err, sizeof f->err, "cannot read %s", path);
        free(buf);
        fclose(fp);
        return -1;
    }
    fclose(fp);
    buf[size] = '\0';
    golden_lexer lx = {buf, 1};
    int cap = 0;
    char *t;
    while ((t = golden_token(&lx))) {
        const char *what = t;
        if (strcmp(t, "case") != 0) goto bad;
        if (f->n == cap) {
            cap = cap ? 2 * cap : 16;
            golden_case *nc = realloc(f->cases, (size_t)cap * sizeof *nc);
            if (!nc) goto bad;
            f->cases = nc;
        }
        golden_case *c = &f->cases[f->n++];
        memset(c, 0, sizeof *c);
        c->autocast = c->target = MT_DTYPE_COUNT;
        char *name = golden_token(&lx);
        if (!name || strlen(name) >= sizeof c->name) goto bad;
        strcpy(c->name, name);
        if (!golden_case_parse(&lx, c, &what)) goto bad;
        continue;
    bad:
        snprintf(f->err, sizeof f->err, "%s:%d: malformed golden data near \"%s\"", path, lx.line,
                 what);
        free(buf);
        golden_free(f);
        return -1;
    }
    free(buf);
    return 0;
}

static inline const golden_param *golden_param_get(const golden_case *c, const char *key) {
    for (int i = 0; i < c->nparams; i++)
        if (strcmp(c->params[i].key, key) == 0) return &c->params[i];
    return NULL;
}
#endif
