/*
 * TEST DOUBLE of QATzip (libqatzip.so.3) -- not QATzip, not hardware.
 *
 * It exports the QATzip entry points kvcore loads with dlopen (csrc/qat/), with
 * QATzip's structure layouts and return codes, and implements raw DEFLATE
 * (QZ_DEFLATE_RAW) over zlib, so that kvcore's QAT binding can be tested on
 * machines without QAT: session life-cycle, error codes, splitting into
 * hardware-buffer pieces, and the fallback to software.
 *
 * Knobs and counters for the tests are the exported qzdouble_* functions
 * (called through ctypes). Built by tests/conftest.py:
 *     cc -shared -fPIC -O2 -o libqatzip_double.so qatzip_double.c -lz
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ---- QATzip ABI (layouts and codes as in QATzip's qatzip.h, API 2.3-2.5) ---- */
#define QZ_OK 0
#define QZ_DUPLICATE 1
#define QZ_PARAMS (-1)
#define QZ_FAIL (-2)
#define QZ_BUF_ERROR (-3)
#define QZ_DATA_ERROR (-4)
#define QZ_NO_HW 11
#define QZ_UNSUPPORTED_FMT 16
#define QZ_NOSW_NO_HW (-101)
#define QZ_SW_EXECUTION_MASK (1u << 4)
#define QZ_DEFLATE_GZIP_EXT 2
#define QZ_DEFLATE_RAW 3
#define PINNED_MEM 1
#define COMMON_MEM 0

typedef struct QzSession_S {
    signed long int hw_session_stat;
    int thd_sess_stat;
    void *internal;
    unsigned long total_in;
    unsigned long total_out;
} QzSession_T;

typedef struct QzSessionParamsCommon_S {
    int direction;
    unsigned int comp_lvl;
    unsigned char comp_algorithm;
    unsigned int max_forks;
    unsigned char sw_backup;
    unsigned int hw_buff_sz;
    unsigned int strm_buff_sz;
    unsigned int input_sz_thrshold;
    unsigned int req_cnt_thrshold;
    unsigned int wait_cnt_thrshold;
    int polling_mode;
    unsigned int is_sensitive_mode;
} QzSessionParamsCommon_T;

typedef struct QzSessionParamsDeflate_S {
    QzSessionParamsCommon_T common_params;
    int huffman_hdr;
    int data_fmt;
} QzSessionParamsDeflate_T;

/* ---- state of the double ---- */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_hardware = 1;        /* 0: behave as a machine without QAT */
static int g_sw_execution = 0;    /* 1: report QZ_SW_EXECUTION in ext_rc */
static int g_fail_op = 0;         /* 1 compress, 2 decompress, 3 init, 4 setup, 0 compress+decompress */
static int g_fail_rc = 0;
static long g_fail_count = 0;
static int g_initialized = 0;

static long g_init_calls, g_setup_calls, g_teardown_calls, g_close_calls, g_compress_calls, g_decompress_calls;
static long g_live_sessions, g_max_src_len, g_mallocs, g_frees;
static long g_last_init_sw_backup = -1;
static long g_last_comp_lvl = -1, g_last_data_fmt = -1, g_last_sw_backup = -1, g_last_hw_buff_sz = -1,
            g_last_thrshold = -1;

struct block { unsigned char *p; size_t n; };
static struct block g_blocks[256];

struct session { QzSessionParamsDeflate_T params; };

/* Returns the injected failure code for op (and uses one), or 0. */
static int take_failure(int op) {
    int rc = 0;
    pthread_mutex_lock(&g_lock);
    if (g_fail_count > 0 && (g_fail_op == op || (g_fail_op == 0 && (op == 1 || op == 2)))) {
        rc = g_fail_rc;
        g_fail_count--;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

#define COUNT(var) do { pthread_mutex_lock(&g_lock); var++; pthread_mutex_unlock(&g_lock); } while (0)

/* ---- knobs and counters for the tests ---- */
void qzdouble_reset(void) {
    pthread_mutex_lock(&g_lock);
    g_hardware = 1;
    g_sw_execution = 0;
    g_fail_op = g_fail_rc = 0;
    g_fail_count = 0;
    g_init_calls = g_setup_calls = g_teardown_calls = g_close_calls = g_compress_calls = g_decompress_calls = 0;
    g_max_src_len = g_mallocs = g_frees = 0;
    g_last_comp_lvl = g_last_data_fmt = g_last_sw_backup = g_last_hw_buff_sz = g_last_thrshold = -1;
    g_last_init_sw_backup = -1;
    pthread_mutex_unlock(&g_lock);
}
void qzdouble_set_hardware(int present) { g_hardware = present; }
void qzdouble_set_sw_execution(int on) { g_sw_execution = on; }
/* The next `count` calls of op (1 compress, 2 decompress, 3 qzInit, 4 setup,
 * 0 compress or decompress) return rc without doing anything. */
void qzdouble_fail(int op, int rc, long count) {
    pthread_mutex_lock(&g_lock);
    g_fail_op = op;
    g_fail_rc = rc;
    g_fail_count = count;
    pthread_mutex_unlock(&g_lock);
}
long qzdouble_stat(const char *name) {
    long v = -1;
    pthread_mutex_lock(&g_lock);
    if (!strcmp(name, "init_calls")) v = g_init_calls;
    else if (!strcmp(name, "setup_calls")) v = g_setup_calls;
    else if (!strcmp(name, "teardown_calls")) v = g_teardown_calls;
    else if (!strcmp(name, "close_calls")) v = g_close_calls;
    else if (!strcmp(name, "compress_calls")) v = g_compress_calls;
    else if (!strcmp(name, "decompress_calls")) v = g_decompress_calls;
    else if (!strcmp(name, "live_sessions")) v = g_live_sessions;
    else if (!strcmp(name, "max_src_len")) v = g_max_src_len;
    else if (!strcmp(name, "mallocs")) v = g_mallocs;
    else if (!strcmp(name, "frees")) v = g_frees;
    else if (!strcmp(name, "last_init_sw_backup")) v = g_last_init_sw_backup;
    else if (!strcmp(name, "last_comp_lvl")) v = g_last_comp_lvl;
    else if (!strcmp(name, "last_data_fmt")) v = g_last_data_fmt;
    else if (!strcmp(name, "last_sw_backup")) v = g_last_sw_backup;
    else if (!strcmp(name, "last_hw_buff_sz")) v = g_last_hw_buff_sz;
    else if (!strcmp(name, "last_input_sz_thrshold")) v = g_last_thrshold;
    else if (!strcmp(name, "pending_failures")) v = g_fail_count;
    pthread_mutex_unlock(&g_lock);
    return v;
}

/* ---- QATzip entry points ---- */
int qzInit(QzSession_T *sess, unsigned char sw_backup) {
    int rc;
    if (sess == NULL) return QZ_PARAMS;
    pthread_mutex_lock(&g_lock);
    g_init_calls++;
    g_last_init_sw_backup = sw_backup;
    pthread_mutex_unlock(&g_lock);
    if ((rc = take_failure(3)) != 0) return rc;
    if (!g_hardware) {
        sess->hw_session_stat = QZ_NO_HW;
        return (sw_backup & 1) ? QZ_NO_HW : QZ_NOSW_NO_HW;
    }
    pthread_mutex_lock(&g_lock);
    rc = g_initialized ? QZ_DUPLICATE : QZ_OK;
    g_initialized = 1;
    pthread_mutex_unlock(&g_lock);
    sess->hw_session_stat = QZ_OK;
    return rc;
}

int qzGetDefaultsDeflate(QzSessionParamsDeflate_T *d) {
    if (d == NULL) return QZ_PARAMS;
    memset(d, 0, sizeof(*d));
    d->common_params.direction = 2;
    d->common_params.comp_lvl = 1;
    d->common_params.comp_algorithm = 8;
    d->common_params.max_forks = 3;
    d->common_params.sw_backup = 1;
    d->common_params.hw_buff_sz = 64 * 1024;
    d->common_params.strm_buff_sz = 64 * 1024;
    d->common_params.input_sz_thrshold = 1024;
    d->common_params.req_cnt_thrshold = 32;
    d->common_params.wait_cnt_thrshold = 8;
    d->huffman_hdr = 0;
    d->data_fmt = QZ_DEFLATE_GZIP_EXT;
    return QZ_OK;
}

int qzSetupSessionDeflate(QzSession_T *sess, QzSessionParamsDeflate_T *params) {
    int rc;
    unsigned hw;
    struct session *s;
    if (sess == NULL || params == NULL) return QZ_PARAMS;
    COUNT(g_setup_calls);
    if ((rc = take_failure(4)) != 0) return rc;
    if (sess->internal != NULL) return QZ_DUPLICATE;
    hw = params->common_params.hw_buff_sz;
    if (params->common_params.comp_lvl < 1 || params->common_params.comp_lvl > 9 || hw < 1024 ||
        hw > 512 * 1024 || (hw & (hw - 1)) != 0 || params->common_params.input_sz_thrshold < 128 ||
        params->data_fmt < 0 || params->data_fmt > QZ_DEFLATE_RAW || params->common_params.comp_algorithm != 8 ||
        params->common_params.sw_backup > 1 || params->huffman_hdr < 0 || params->huffman_hdr > 1 ||
        params->common_params.strm_buff_sz < 1024 || params->common_params.strm_buff_sz > 2 * 1024 * 1024 - 5 * 1024 ||
        params->common_params.direction < 0 || params->common_params.direction > 2)
        return QZ_PARAMS;
    if (!g_hardware && !(params->common_params.sw_backup & 1)) return QZ_NOSW_NO_HW;
    s = calloc(1, sizeof(*s));
    if (s == NULL) return QZ_FAIL;
    s->params = *params;
    sess->internal = s;
    pthread_mutex_lock(&g_lock);
    g_live_sessions++;
    g_last_comp_lvl = params->common_params.comp_lvl;
    g_last_data_fmt = params->data_fmt;
    g_last_sw_backup = params->common_params.sw_backup;
    g_last_hw_buff_sz = params->common_params.hw_buff_sz;
    g_last_thrshold = params->common_params.input_sz_thrshold;
    pthread_mutex_unlock(&g_lock);
    return QZ_OK;
}

int qzCompressExt(QzSession_T *sess, const unsigned char *src, unsigned int *src_len, unsigned char *dest,
                  unsigned int *dest_len, unsigned int last, uint64_t *ext_rc) {
    struct session *s;
    z_stream z;
    int rc, zrc;
    if (ext_rc) *ext_rc = 0;
    if (sess == NULL || src_len == NULL || dest_len == NULL || sess->internal == NULL) return QZ_PARAMS;
    s = sess->internal;
    pthread_mutex_lock(&g_lock);
    g_compress_calls++;
    if ((long)*src_len > g_max_src_len) g_max_src_len = *src_len;
    pthread_mutex_unlock(&g_lock);
    if ((rc = take_failure(1)) != 0) {
        *src_len = 0;
        *dest_len = 0;
        return rc;
    }
    if (s->params.data_fmt != QZ_DEFLATE_RAW || !last) return QZ_UNSUPPORTED_FMT;
    if (*src_len < s->params.common_params.input_sz_thrshold && !(s->params.common_params.sw_backup & 1))
        return QZ_FAIL; /* QATzip sends small inputs to software, which is off */
    memset(&z, 0, sizeof(z));
    if (deflateInit2(&z, (int)s->params.common_params.comp_lvl, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return QZ_FAIL;
    z.next_in = (unsigned char *)src;
    z.avail_in = *src_len;
    z.next_out = dest;
    z.avail_out = *dest_len;
    zrc = deflate(&z, Z_FINISH);
    deflateEnd(&z);
    if (zrc != Z_STREAM_END) {
        *src_len = 0;
        *dest_len = 0;
        return QZ_BUF_ERROR;
    }
    *dest_len = (unsigned)z.total_out;
    sess->total_in += *src_len;
    sess->total_out += *dest_len;
    if (ext_rc && g_sw_execution) *ext_rc |= QZ_SW_EXECUTION_MASK;
    return QZ_OK;
}

int qzCompress(QzSession_T *sess, const unsigned char *src, unsigned int *src_len, unsigned char *dest,
               unsigned int *dest_len, unsigned int last) {
    return qzCompressExt(sess, src, src_len, dest, dest_len, last, NULL);
}

int qzDecompressExt(QzSession_T *sess, const unsigned char *src, unsigned int *src_len, unsigned char *dest,
                    unsigned int *dest_len, uint64_t *ext_rc) {
    struct session *s;
    z_stream z;
    int rc, zrc;
    if (ext_rc) *ext_rc = 0;
    if (sess == NULL || src_len == NULL || dest_len == NULL || sess->internal == NULL) return QZ_PARAMS;
    s = sess->internal;
    COUNT(g_decompress_calls);
    if ((rc = take_failure(2)) != 0) {
        *src_len = 0;
        *dest_len = 0;
        return rc;
    }
    if (s->params.data_fmt != QZ_DEFLATE_RAW) return QZ_UNSUPPORTED_FMT;
    memset(&z, 0, sizeof(z));
    if (inflateInit2(&z, -15) != Z_OK) return QZ_FAIL;
    z.next_in = (unsigned char *)src;
    z.avail_in = *src_len;
    z.next_out = dest;
    z.avail_out = *dest_len;
    zrc = inflate(&z, Z_FINISH);
    inflateEnd(&z);
    *src_len = (unsigned)z.total_in;
    *dest_len = (unsigned)z.total_out;
    if (zrc == Z_STREAM_END) {
        if (ext_rc && g_sw_execution) *ext_rc |= QZ_SW_EXECUTION_MASK;
        return QZ_OK;
    }
    if (zrc == Z_BUF_ERROR && z.avail_out == 0) return QZ_BUF_ERROR;
    return QZ_DATA_ERROR;
}

int qzDecompress(QzSession_T *sess, const unsigned char *src, unsigned int *src_len, unsigned char *dest,
                 unsigned int *dest_len) {
    return qzDecompressExt(sess, src, src_len, dest, dest_len, NULL);
}

int qzTeardownSession(QzSession_T *sess) {
    if (sess == NULL) return QZ_PARAMS;
    COUNT(g_teardown_calls);
    if (sess->internal != NULL) {
        free(sess->internal);
        sess->internal = NULL;
        pthread_mutex_lock(&g_lock);
        g_live_sessions--;
        pthread_mutex_unlock(&g_lock);
    }
    return QZ_OK;
}

int qzClose(QzSession_T *sess) {
    if (sess == NULL) return QZ_PARAMS;
    COUNT(g_close_calls);
    return QZ_OK;
}

unsigned int qzMaxCompressedLength(unsigned int src_sz, QzSession_T *sess) {
    (void)sess;
    return 9 * src_sz / 8 + 1024;
}

void *qzMalloc(size_t sz, int numa, int force_pinned) {
    unsigned char *p;
    int i;
    (void)numa;
    p = malloc(sz);
    if (p == NULL || force_pinned != PINNED_MEM) return p;
    pthread_mutex_lock(&g_lock);
    for (i = 0; i < 256; i++)
        if (g_blocks[i].p == NULL) {
            g_blocks[i].p = p;
            g_blocks[i].n = sz;
            break;
        }
    g_mallocs++;
    pthread_mutex_unlock(&g_lock);
    return p;
}

void qzFree(void *m) {
    int i;
    pthread_mutex_lock(&g_lock);
    for (i = 0; i < 256; i++)
        if (g_blocks[i].p == m) {
            g_blocks[i].p = NULL;
            g_frees++;
        }
    pthread_mutex_unlock(&g_lock);
    free(m);
}

int qzMemFindAddr(unsigned char *a) {
    int i, found = COMMON_MEM;
    pthread_mutex_lock(&g_lock);
    for (i = 0; i < 256; i++)
        if (g_blocks[i].p != NULL && a >= g_blocks[i].p && a < g_blocks[i].p + g_blocks[i].n) found = PINNED_MEM;
    pthread_mutex_unlock(&g_lock);
    return found;
}
