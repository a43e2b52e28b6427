/* Checkpoints: the state dict and safetensors files (round trip of every dtype, metadata,
   atomic save, every kind of bad file, a seeded mutation fuzz loop over the loader). Training
   state and files from Python: test_checkpoint.c. */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test_util.h"

/* ---------------------------------------------------------------- helpers */

typedef struct {
    char dir[64];
    char path[128];
} tmpdir;

/* In /dev/shm where there is one: the fuzz loop rewrites a file 5000 times, which on a busy
   disk costs seconds of waiting and tests nothing more. */
static void tmp_open(tmpdir *t) {
    snprintf(t->dir, sizeof t->dir, "%s/mt_state_XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    assert_non_null(mkdtemp(t->dir));
    snprintf(t->path, sizeof t->path, "%s/ckpt.safetensors", t->dir);
}

static int tmp_count(const tmpdir *t) {
    DIR *d = opendir(t->dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) /* temporaries start with a dot: counted */
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void tmp_close(tmpdir *t) {
    DIR *d = opendir(t->dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[400];
        snprintf(p, sizeof p, "%s/%s", t->dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(t->dir);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n ? *n : 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* A safetensors file from a header string and data bytes; hlen_override (when not ~0)
   replaces the true header length. */
static void write_st(const char *path, const char *header, const void *data, size_t dlen,
                     uint64_t hlen_override) {
    size_t hl = strlen(header);
    uint64_t len = hlen_override != ~(uint64_t)0 ? hlen_override : hl;
    size_t n = 8 + hl + dlen;
    unsigned char *b = malloc(n);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(len >> (8 * i));
    memcpy(b + 8, header, hl);
    if (dlen) memcpy(b + 8 + hl, data, dlen);
    write_bytes(path, b, n);
    free(b);
}

/* Checks that t (any device) holds exactly these bytes. */
static void assert_bytes(const mt_tensor *t, const void *want, size_t n) {
    assert_int_equal((size_t)mt_numel(t) * mt_dtype_size(mt_dtype_of(t)), n);
    unsigned char *got = malloc(n ? n : 1);
    assert_non_null(got);
    assert_int_equal(mt_copy_to_host(t, got, n), 0);
    assert_memory_equal(got, want, n);
    free(got);
}

static bool same_device(mt_device a, mt_device b) {
    return a.type == b.type && a.index == b.index;
}

/* ---------------------------------------------------------------- round trip */

static void test_roundtrip_every_dtype(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    tmpdir td;
    tmp_open(&td);
    const float f32[6] = {1.5f, -2.25f, 3e-38f, INFINITY, -0.0f, 6};
    const uint16_t f16[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x8000};
    const uint16_t bf16[4] = {0x3f80, 0xbf80, 0x7f7f, 0x0001};
    const double f64[3] = {1.0 / 3.0, -1e300, 5e-324};
    const int64_t i64[3] = {INT64_MIN, -1, INT64_MAX};
    const int32_t i32[5] = {INT32_MIN, 0, 7, -7, INT32_MAX};
    const uint8_t b8[4] = {1, 0, 0, 1};
    struct {
        const char *name;
        mt_dtype dt;
        const void *data;
        int ndim;
        int64_t shape[3];
        size_t bytes;
    } cases[] = {
        {"a.f32", MT_F32, f32, 2, {2, 3}, sizeof f32},
        {"b.f16", MT_F16, f16, 3, {1, 2, 3}, sizeof f16},
        {"c.bf16", MT_BF16, bf16, 1, {4}, sizeof bf16},
        {"d.f64", MT_F64, f64, 1, {3}, sizeof f64},
        {"e.i64", MT_I64, i64, 2, {3, 1}, sizeof i64},
        {"f.i32", MT_I32, i32, 1, {5}, sizeof i32},
        {"g.bool", MT_BOOL, b8, 2, {2, 2}, sizeof b8},
        {"h.scalar", MT_F64, f64, 0, {0}, sizeof(double)},
        {"i.empty", MT_F32, f32, 2, {0, 3}, 0},
    };
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    mt_state *s = mt_state_new();
    assert_non_null(s);
    for (int i = 0; i < nc; i++) {
        mt_tensor *t = mt_from_data(cases[i].data, cases[i].dt, cases[i].ndim, cases[i].shape, dev);
        assert_non_null(t);
        assert_int_equal(mt_state_put(s, cases[i].name, t), 0);
        mt_release(t); /* the state holds its own reference */
    }
    /* a transposed (non-contiguous) view is written in logical order */
    mt_tensor *base = mt_from_data(f32, MT_F32, MT_SHAPE(2, 3), dev);
    mt_tensor *tr = mt_transpose(base, 0, 1);
    assert_int_equal(mt_state_put(s, "j.transposed", tr), 0);
    assert_int_equal(mt_state_save(s, td.path), 0);
    assert_int_equal(tmp_count(&td), 1); /* no temporary left behind */

    mt_device targets[2] = {MT_CPU, dev};
    for (int k = 0; k < (same_device(dev, MT_CPU) ? 1 : 2); k++) {
        mt_state *r = mt_state_load(td.path, targets[k]);
        assert_non_null(r);
        assert_int_equal(mt_state_count(r), nc + 1);
        for (int i = 0; i < nc; i++) {
            assert_string_equal(mt_state_name(r, i), cases[i].name); /* order kept */
            mt_tensor *t = mt_state_get(r, cases[i].name);
            assert_non_null(t);
            assert_int_equal(mt_dtype_of(t), cases[i].dt);
            assert_true(same_device(mt_device_of(t), targets[k]));
            assert_int_equal(mt_ndim(t), cases[i].ndim);
            for (int d = 0; d < cases[i].ndim; d++)
                assert_int_equal(mt_dim(t, d), cases[i].shape[d]);
            assert_bytes(t, cases[i].data, cases[i].bytes);
            mt_release(t);
        }
        mt_tensor *t = mt_state_get(r, "j.transposed");
        const float want[6] = {f32[0], f32[3], f32[1], f32[4], f32[2], f32[5]};
        assert_int_equal(mt_dim(t, 0), 3);
        assert_bytes(t, want, sizeof want);
        mt_release(t);
        mt_state_free(r);
    }
    mt_release(tr);
    mt_release(base);
    mt_state_free(s);
    tmp_close(&td);
}

static void test_metadata(void **state) {
    (void)state;
    tmpdir td;
    tmp_open(&td);
    mt_state *s = mt_state_new();
    assert_null(mt_state_get_meta(s, "format"));
    assert_int_equal(mt_state_set_meta(s, "format", "pt"), 0);
    assert_int_equal(mt_state_set_meta(s, "step", "12"), 0);
    assert_int_equal(mt_state_set_meta(s, "step", "13"), 0); /* replaced */
    assert_int_equal(mt_state_set_meta(s, "note", "quote \" backslash \\ newline \n \xc3\xa9"), 0);
    assert_int_equal(mt_state_meta_count(s), 3);
    /* a state of metadata only is a valid file (empty data buffer) */
    assert_int_equal(mt_state_save(s, td.path), 0);
    mt_state *r = mt_state_load(td.path, mt_test_device());
    assert_non_null(r);
    assert_int_equal(mt_state_count(r), 0);
    assert_int_equal(mt_state_meta_count(r), 3);
    assert_string_equal(mt_state_meta_key(r, 0), "format");
    assert_string_equal(mt_state_get_meta(r, "step"), "13");
    assert_string_equal(mt_state_get_meta(r, "note"), "quote \" backslash \\ newline \n \xc3\xa9");
    assert_null(mt_state_get_meta(r, "absent"));
    assert_int_equal(mt_last_status(), MT_OK);
    mt_state_free(r);
    mt_state_free(s);
    tmp_close(&td);
}

static void test_map_api(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_state *s = mt_state_new();
    mt_tensor *a = mt_ones(MT_SHAPE(2), MT_F32, dev), *b = mt_zeros(MT_SHAPE(3), MT_F32, dev);
    assert_int_equal(mt_state_put(s, "x", a), 0);
    assert_int_equal(mt_state_put(s, "y", a), 0);
    assert_int_equal(mt_state_put(s, "x", b), 0); /* replaces, keeps the position */
    assert_int_equal(mt_state_count(s), 2);
    assert_string_equal(mt_state_name(s, 0), "x");
    assert_null(mt_state_name(s, 2));
    assert_null(mt_state_name(s, -1));
    mt_tensor *g = mt_state_get(s, "x");
    assert_ptr_equal(g, b);
    mt_release(g);
    assert_true(mt_state_contains(s, "y"));
    assert_false(mt_state_contains(s, "z"));
    /* a get inside a scope belongs to the scope */
    mt_scope_begin();
    assert_non_null(mt_state_get(s, "y"));
    mt_scope_end();

    assert_null(mt_state_get(s, "z"));
    assert_error(MT_ERR_INVALID, "mt_state_get: no entry named 'z'");
    assert_int_equal(mt_state_put(s, "", a), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_state_put: arg 2: name is empty");
    assert_int_equal(mt_state_put(s, "__metadata__", a), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "reserved");
    assert_int_equal(mt_state_put(s, "bad\xff", a), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "not valid UTF-8");
    assert_int_equal(mt_state_put(s, "w", NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_state_put: arg 3");
    assert_int_equal(mt_state_put(NULL, "w", a), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_state_put: arg 1");
    assert_int_equal(mt_state_put(s, NULL, a), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_state_put: arg 2");
    assert_int_equal(mt_state_set_meta(s, "k", NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_state_set_meta: arg 3");
    assert_int_equal(mt_state_set_meta(s, "k", "\xc0\x80"), MT_ERR_INVALID); /* overlong */
    assert_error(MT_ERR_INVALID, "not valid UTF-8");
    assert_int_equal(mt_state_count(s), 2);
    assert_int_equal(mt_state_count(NULL), -1);
    assert_int_equal(mt_state_save(NULL, "x"), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_state_save: arg 1");
    assert_int_equal(mt_state_save(s, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_state_save: arg 2");
    assert_null(mt_state_load(NULL, dev));
    assert_error(MT_ERR_NULL, "mt_state_load: arg 1");
    assert_null(mt_state_load("/nonexistent/x.safetensors", dev));
    assert_error(MT_ERR_INVALID, "mt_state_load: /nonexistent/x.safetensors: cannot open");
    assert_null(mt_state_load("/tmp", dev));
    assert_error(MT_ERR_INVALID, "/tmp: not a regular file");
    mt_state_free(NULL);
    mt_release(a);
    mt_release(b);
    mt_state_free(s);
}

static void test_save_atomic(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    tmpdir td;
    tmp_open(&td);
    mt_state *s = mt_state_new();
    mt_tensor *a = mt_full(MT_SHAPE(4), MT_F32, dev, 2.0);
    mt_state_put(s, "a", a);
    write_bytes(td.path, "old contents", 12);
    assert_int_equal(mt_state_save(s, td.path), 0); /* replaces the old file */
    assert_int_equal(tmp_count(&td), 1);
    mt_state *r = mt_state_load(td.path, dev);
    assert_non_null(r);
    mt_state_free(r);
    /* a directory that does not exist: an error, and nothing is written anywhere */
    char bad[200];
    snprintf(bad, sizeof bad, "%s/missing/ckpt.safetensors", td.dir);
    assert_int_equal(mt_state_save(s, bad), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "cannot create a temporary file");
    /* the target is a directory, or a FIFO: refused, nothing replaced, no temporary left;
       loading a FIFO is refused at once rather than waiting for a writer */
    char sub[200];
    snprintf(sub, sizeof sub, "%s/sub", td.dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    char inner[260];
    snprintf(inner, sizeof inner, "%s/f", sub);
    write_bytes(inner, "x", 1);
    assert_int_equal(mt_state_save(s, sub), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "exists and is not a regular file");
    assert_int_equal(tmp_count(&td), 2); /* the checkpoint and sub/, no temporary */
    unlink(inner);
    rmdir(sub);
    char fifo[200];
    snprintf(fifo, sizeof fifo, "%s/fifo", td.dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mt_state_save(s, fifo), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "exists and is not a regular file");
    struct stat st;
    assert_true(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
    assert_null(mt_state_load(fifo, dev));
    assert_error(MT_ERR_INVALID, "not a regular file");
    unlink(fifo);
    /* a file replaced keeps its permissions */
    assert_int_equal(chmod(td.path, 0600), 0);
    assert_int_equal(mt_state_save(s, td.path), 0);
    assert_true(stat(td.path, &st) == 0 && (st.st_mode & 0777) == 0600);
    /* a symbolic link is replaced like any name, never followed (whoever made it would
       choose what gets overwritten): the file it points to keeps its contents */
    char link[200];
    snprintf(link, sizeof link, "%s/link", td.dir);
    assert_int_equal(symlink(td.path, link), 0);
    mt_tensor *three = mt_full(MT_SHAPE(4), MT_F32, dev, 3.0);
    mt_state_put(s, "a", three);
    assert_int_equal(mt_state_save(s, link), 0);
    assert_true(lstat(link, &st) == 0 && S_ISREG(st.st_mode));
    const char *files[2] = {td.path, link};
    for (int i = 0; i < 2; i++) {
        r = mt_state_load(files[i], dev);
        mt_tensor *got = mt_state_get(r, "a");
        assert_tensor_close(
            got, i ? ((const double[]){3, 3, 3, 3}) : ((const double[]){2, 2, 2, 2}), 4, 0, 0);
        mt_release(got);
        mt_state_free(r);
    }
    unlink(link);
    mt_release(three);
    /* a file name as long as a directory allows (255 bytes): the temporary fits too */
    char longname[400];
    int at = snprintf(longname, sizeof longname, "%s/", td.dir);
    memset(longname + at, 'n', 255);
    longname[at + 255] = 0;
    assert_int_equal(mt_state_save(s, longname), 0);
    assert_int_equal(tmp_count(&td), 2);
    unlink(longname);
    /* refused while an error is pending: the tensors may be half made */
    mt_error_set(MT_ERR_SHAPE, "earlier failure");
    assert_int_equal(mt_state_save(s, td.path), MT_ERR_STATE);
    assert_error(MT_ERR_SHAPE, "earlier failure");
    mt_release(a);
    mt_state_free(s);
    tmp_close(&td);
}

/* ---------------------------------------------------------------- bad files */

typedef struct {
    const char *what, *header;
    size_t data_len;
    uint64_t hlen; /* ~0: the true length */
    mt_status status;
    const char *needle;
} bad_case;

#define TRUE_LEN (~(uint64_t)0)
#define E8       "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"

static const bad_case bad_cases[] = {
    {"header length beyond the file", E8, 8, 1000, MT_ERR_INVALID, "does not fit the file"},
    {"huge header length", E8, 8, ~(uint64_t)0 - 1, MT_ERR_INVALID, "does not fit the file"},
    {"zero header length", E8, 8, 0, MT_ERR_INVALID, "header length 0"},
    {"malformed JSON", "{\"t\":{\"dtype\":\"F32\",", 8, TRUE_LEN, MT_ERR_INVALID, "malformed JSON"},
    {"trailing garbage", E8 "xx", 8, TRUE_LEN, MT_ERR_INVALID, "unexpected bytes after"},
    {"not an object", "[1,2]", 0, TRUE_LEN, MT_ERR_INVALID, "not an object"},
    {"entry not an object", "{\"t\":3}", 0, TRUE_LEN, MT_ERR_INVALID, "'t' is not a JSON object"},
    {"unknown dtype", "{\"t\":{\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
     TRUE_LEN, MT_ERR_DTYPE, "dtype 'F8'"},
    {"dtype not a string", "{\"t\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_DTYPE, "not a string"},
    {"missing field", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, TRUE_LEN, MT_ERR_INVALID,
     "lacks its 'data_offsets'"},
    {"unknown field", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
     TRUE_LEN, MT_ERR_INVALID, "unknown field 'x'"},
    {"field twice",
     "{\"t\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_INVALID, "field 'dtype' twice"},
    {"negative dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_SHAPE, "shape[0] is not a non-negative integer"},
    {"fractional dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_SHAPE, "shape[0]"},
    {"huge shape overflows",
     "{\"t\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_SHAPE, "byte size overflows"},
    {"too many dims",
     "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
     TRUE_LEN, MT_ERR_UNSUPPORTED, "9 dimensions"},
    {"byte size mismatch", "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_SHAPE, "make 12 bytes but data_offsets [0, 8] hold 8"},
    {"offsets out of order", "{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
     TRUE_LEN, MT_ERR_INVALID, "out of order"},
    {"offsets past the data", "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
     8, TRUE_LEN, MT_ERR_INVALID, "run past the 8 bytes of data"},
    {"offsets not a pair", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
     TRUE_LEN, MT_ERR_INVALID, "data_offsets is not [begin, end]"},
    {"overlapping offsets",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, TRUE_LEN, MT_ERR_INVALID, "overlaps"},
    {"gap between tensors",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
     12, TRUE_LEN, MT_ERR_INVALID, "a gap"},
    {"data not covered", E8, 16, TRUE_LEN, MT_ERR_INVALID, "cover 8 of the 16 bytes"},
    {"data without tensors", "{}", 4, TRUE_LEN, MT_ERR_INVALID, "follow a header with no tensor"},
    {"duplicate names",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, TRUE_LEN, MT_ERR_INVALID, "'a' appears twice"},
    {"bool out of range", "{\"t\":{\"dtype\":\"BOOL\",\"shape\":[8],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_INVALID, "BOOL byte 0 is 7"},
    {"metadata not strings", "{\"__metadata__\":{\"k\":1}}", 0, TRUE_LEN, MT_ERR_INVALID,
     "metadata 'k' is not a UTF-8 string"},
    {"metadata not an object", "{\"__metadata__\":[]}", 0, TRUE_LEN, MT_ERR_INVALID,
     "'__metadata__' is not an object"},
    {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, TRUE_LEN, MT_ERR_INVALID,
     "'__metadata__' appears twice"},
    {"metadata key twice", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, TRUE_LEN,
     MT_ERR_INVALID, "metadata 'k' appears twice"},
    {"name not UTF-8", "{\"\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_INVALID, "not valid UTF-8"},
    {"raw control byte in a name",
     "{\"a\x01\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, TRUE_LEN,
     MT_ERR_INVALID, "raw control byte 0x01 at byte 3"},
    {"raw tab in a name", "{\"a\tb\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     TRUE_LEN, MT_ERR_INVALID, "raw control byte 0x09"},
    {"NUL escape in a name",
     "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, TRUE_LEN,
     MT_ERR_INVALID, "\\u0000 (NUL) in a string at byte 3"},
    {"NUL escape in metadata", "{\"__metadata__\":{\"k\":\"x\\u0000\"}}", 0, TRUE_LEN,
     MT_ERR_INVALID, "(NUL) in a string"},
    {"empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, TRUE_LEN,
     MT_ERR_INVALID, "an entry has an empty name"},
};

static void test_bad_files(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    tmpdir td;
    tmp_open(&td);
    unsigned char data[16];
    memset(data, 7, sizeof data);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        write_st(td.path, c->header, data, c->data_len, c->hlen);
        int64_t live = mt_live_tensors();
        mt_state *s = mt_state_load(td.path, dev);
        if (s) fail_msg("case '%s' loaded", c->what);
        if (mt_last_status() != c->status || !strstr(mt_last_error(), c->needle) ||
            !strstr(mt_last_error(), td.path))
            fail_msg("case '%s': error %s \"%s\" (wanted %s mentioning \"%s\" and the path)",
                     c->what, mt_status_name(mt_last_status()), mt_last_error(),
                     mt_status_name(c->status), c->needle);
        assert_int_equal(mt_live_tensors(), live);
        mt_clear_error();
    }
    /* truncated files: empty, shorter than the length field, cut inside header and data */
    write_st(td.path, E8, data, 8, TRUE_LEN);
    size_t full = 0;
    unsigned char *b = read_bytes(td.path, &full);
    const size_t cuts[] = {0, 5, 20, full - 1};
    const char *needles[] = {"truncated: 0 bytes", "truncated: 5 bytes", "does not fit the file",
                             "run past the 7 bytes of data"};
    for (int i = 0; i < 4; i++) {
        write_bytes(td.path, b, cuts[i]);
        assert_null(mt_state_load(td.path, dev));
        assert_error(MT_ERR_INVALID, needles[i]);
    }
    /* and the intact file loads */
    write_bytes(td.path, b, full);
    mt_state *s = mt_state_load(td.path, dev);
    assert_non_null(s);
    mt_state_free(s);
    /* a raw NUL inside a name (invalid JSON; cJSON alone would cut the name there) */
    unsigned char *nul = malloc(full);
    memcpy(nul, b, full);
    assert_int_equal(nul[10], 't'); /* the header starts at byte 8 with {" */
    nul[10] = 0;
    write_bytes(td.path, nul, full);
    assert_null(mt_state_load(td.path, dev));
    assert_error(MT_ERR_INVALID, "raw control byte 0x00 at byte 2");
    free(nul);
    /* escapes that are not a NUL still load: an escaped backslash before "u0000", a quote */
    write_st(td.path,
             "{\"a\\\\u0000\\\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data,
             8, TRUE_LEN);
    s = mt_state_load(td.path, dev);
    assert_non_null(s);
    assert_true(mt_state_contains(s, "a\\u0000\""));
    mt_state_free(s);
    free(b);
    tmp_close(&td);
}

/* A tensor at a data offset that is not a multiple of its element size still loads (the
   loader stages it in aligned memory rather than reading a misaligned double). */
static void test_misaligned_data(void **state) {
    (void)state;
    tmpdir td;
    tmp_open(&td);
    unsigned char data[1 + 16];
    const double v[2] = {1.25, -3.5};
    data[0] = 1;
    memcpy(data + 1, v, sizeof v);
    write_st(td.path,
             "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[1,17]}}",
             data, sizeof data, TRUE_LEN);
    mt_state *s = mt_state_load(td.path, mt_test_device());
    assert_non_null(s);
    mt_tensor *d = mt_state_get(s, "d");
    assert_bytes(d, v, sizeof v);
    mt_release(d);
    mt_state_free(s);
    tmp_close(&td);
}

/* ---------------------------------------------------------------- fuzz */

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* One mutation of a valid file: bit flips, a truncation, a new header length, a digit of the
   header changed (shapes and offsets), or bytes of the header overwritten with JSON tokens. */
static size_t mutate(unsigned char *b, size_t n, size_t cap, uint64_t *rng) {
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    switch (rng_next(rng) % 6) {
    case 0: /* bit flips anywhere */
        for (int k = 1 + (int)(rng_next(rng) % 4); k > 0; k--) {
            size_t at = rng_next(rng) % n;
            b[at] ^= (unsigned char)(1u << (rng_next(rng) % 8));
        }
        return n;
    case 1: /* truncation */
        return rng_next(rng) % n;
    case 2: { /* header length: nearby, random, or huge */
        uint64_t r = rng_next(rng);
        uint64_t len = r % 3 == 0   ? hlen + (rng_next(rng) % 17) - 8
                       : r % 3 == 1 ? rng_next(rng) % (n + 16)
                                    : rng_next(rng);
        for (int i = 0; i < 8; i++) b[i] = (unsigned char)(len >> (8 * i));
        return n;
    }
    case 3:
    case 4: { /* a digit of the header (dims and offsets) becomes another digit */
        for (int tries = 0; tries < 64; tries++) {
            size_t at = 8 + rng_next(rng) % hlen;
            if (at < n && b[at] >= '0' && b[at] <= '9') {
                b[at] = (unsigned char)('0' + rng_next(rng) % 10);
                break;
            }
        }
        return n;
    }
    default: { /* JSON tokens dropped into the header */
        static const char *tok[] = {"\"",    "{",       "}",      "[",
                                    "]",     ",",       ":",      "-1",
                                    "1e308", "\\u0000", "\"F8\"", "99999999999999999999"};
        const char *t = tok[rng_next(rng) % (sizeof tok / sizeof tok[0])];
        size_t tl = strlen(t), at = 8 + rng_next(rng) % hlen;
        if (at + tl <= n && at + tl <= cap) memcpy(b + at, t, tl);
        return n;
    }
    }
}

static void test_fuzz_loader(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    tmpdir td;
    tmp_open(&td);
    /* the seed file: several dtypes, a 0-d and an empty tensor, metadata */
    mt_state *s = mt_state_new();
    mt_tensor *t[5] = {mt_arange(0, 6, 1, MT_F32, MT_CPU), mt_arange(0, 4, 1, MT_F16, MT_CPU),
                       mt_scalar(3, MT_I64, MT_CPU), mt_zeros(MT_SHAPE(0, 2), MT_BF16, MT_CPU),
                       mt_ones(MT_SHAPE(2, 2), MT_BOOL, MT_CPU)};
    const char *names[5] = {"w", "h", "step", "empty", "mask"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(mt_state_put(s, names[i], t[i]), 0);
        mt_release(t[i]);
    }
    mt_state_set_meta(s, "format", "pt");
    assert_int_equal(mt_state_save(s, td.path), 0);
    mt_state_free(s);
    size_t n = 0;
    unsigned char *seed = read_bytes(td.path, &n);
    unsigned char *buf = malloc(n);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int loaded = 0, rejected = 0;
    const int iters = 5000;
    int64_t live = mt_live_tensors();
    for (int it = 0; it < iters; it++) {
        memcpy(buf, seed, n);
        size_t m = n;
        for (int k = 1 + (int)(rng_next(&rng) % 3); k > 0 && m > 8; k--)
            m = mutate(buf, m, n, &rng);
        write_bytes(td.path, buf, m);
        mt_state *r = mt_state_load(td.path, dev);
        if (r) {
            loaded++;
            /* whatever loaded must be readable in full */
            for (int i = 0; i < mt_state_count(r); i++) {
                mt_tensor *x = mt_state_get(r, mt_state_name(r, i));
                size_t nb = (size_t)mt_numel(x) * mt_dtype_size(mt_dtype_of(x));
                void *h = malloc(nb ? nb : 1);
                assert_int_equal(mt_copy_to_host(x, h, nb), 0);
                free(h);
                mt_release(x);
            }
            mt_state_free(r);
            assert_int_equal(mt_last_status(), MT_OK);
        } else {
            rejected++;
            if (strncmp(mt_last_error(), "mt_state_load: ", 15) != 0)
                fail_msg("iteration %d: error \"%s\" does not name the loader", it,
                         mt_last_error());
            mt_clear_error();
        }
        assert_int_equal(mt_live_tensors(), live);
    }
    printf("# fuzz: %d mutated files, %d loaded, %d rejected\n", iters, loaded, rejected);
    assert_true(rejected > iters / 2); /* the mutations do hit the checks */
    free(buf);
    free(seed);
    tmp_close(&td);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_roundtrip_every_dtype), MT_TEST(test_metadata),  MT_TEST(test_map_api),
        MT_TEST(test_save_atomic),           MT_TEST(test_bad_files), MT_TEST(test_misaligned_data),
        MT_TEST(test_fuzz_loader),
    };
    return MT_RUN_TESTS(tests);
}
