// The part of QATzip's C interface that kvcore uses, declared here because
// QATzip is loaded at run time (dlopen "libqatzip.so.3"), never linked, and its
// header is not packaged on most machines.
//
// Facts taken from QATzip's public header include/qatzip.h (API 2.3 to 2.5,
// releases v1.0.9 to v1.3.x, all with SONAME libqatzip.so.3); the layouts below
// are unchanged over that range. Only what kvcore calls is declared. Builds of
// QATzip with ERR_INJECTION append two pointers to the session parameter
// structs; kvcore passes those structs inside padded storage (ParamsStorage)
// so such a build cannot write past them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcore::qat::abi {

// Return codes (qatzip.h "QATzip Session Status definitions").
constexpr int QZ_OK = 0;
constexpr int QZ_DUPLICATE = 1;
constexpr int QZ_FORCE_SW = 2;
constexpr int QZ_PARAMS = -1;
constexpr int QZ_FAIL = -2;
constexpr int QZ_BUF_ERROR = -3;
constexpr int QZ_DATA_ERROR = -4;
constexpr int QZ_TIMEOUT = -5;
constexpr int QZ_INTEG = -100;
constexpr int QZ_NO_HW = 11;
constexpr int QZ_NO_MDRV = 12;
constexpr int QZ_NO_INST_ATTACH = 13;
constexpr int QZ_LOW_MEM = 14;
constexpr int QZ_LOW_DEST_MEM = 15;
constexpr int QZ_UNSUPPORTED_FMT = 16;
constexpr int QZ_NONE = 100;
constexpr int QZ_NOSW_NO_HW = -101;
constexpr int QZ_NOSW_NO_MDRV = -102;
constexpr int QZ_NOSW_NO_INST_ATTACH = -103;
constexpr int QZ_NOSW_LOW_MEM = -104;
constexpr int QZ_NO_SW_AVAIL = -105;
constexpr int QZ_NOSW_UNSUPPORTED_FMT = -116;
constexpr int QZ_NOT_SUPPORTED = -200;

// Extended return code bits (qzCompressExt / qzDecompressExt).
constexpr uint64_t QZ_SW_EXECUTION_MASK = 1u << 4;  // the request ran in software
constexpr uint64_t QZ_TIMEOUT_MASK = 1u << 8;       // the hardware request timed out

// Session parameter values.
constexpr int QZ_DYNAMIC_HDR = 0;  // QzHuffmanHdr_T
constexpr int QZ_DIR_BOTH = 2;     // QzDirection_T
constexpr int QZ_DEFLATE_RAW = 3;  // QzDataFormat_T: raw DEFLATE (RFC 1951), no header
constexpr int QZ_BUSY_POLLING = 1;  // QzPollingMode_T
constexpr unsigned char QZ_DEFLATE = 8;  // comp_algorithm

constexpr unsigned QZ_HW_BUFF_SZ = 64 * 1024;          // default hardware buffer (4xxx and older)
constexpr unsigned QZ_HW_BUFF_MAX_SZ = 512 * 1024;     // largest hw_buff_sz before Gen3
constexpr unsigned QZ_COMP_THRESHOLD_MINIMUM = 128;    // smallest input_sz_thrshold

constexpr int COMMON_MEM = 0;  // PinMem_T
constexpr int PINNED_MEM = 1;
constexpr int QZ_AUTO_SELECT_NUMA_NODE = -1;

// QzSession_T
struct QzSession {
    long hw_session_stat;
    int thd_sess_stat;
    void* internal;
    unsigned long total_in;
    unsigned long total_out;
};

// QzSessionParamsCommon_T (enums are int-sized in the C ABI)
struct QzSessionParamsCommon {
    int direction;
    unsigned int comp_lvl;
    unsigned char comp_algorithm;
    unsigned int max_forks;
    unsigned char sw_backup;  // bit 0: software backup; bit 1: software only
    unsigned int hw_buff_sz;
    unsigned int strm_buff_sz;
    unsigned int input_sz_thrshold;
    unsigned int req_cnt_thrshold;
    unsigned int wait_cnt_thrshold;
    int polling_mode;
    unsigned int is_sensitive_mode;
};

// QzSessionParamsDeflate_T
struct QzSessionParamsDeflate {
    QzSessionParamsCommon common_params;
    int huffman_hdr;
    int data_fmt;
};

// Padded storage for a parameter struct (see the note at the top).
struct ParamsStorage {
    QzSessionParamsDeflate p;
    unsigned char pad[64];
};

extern "C" {
using qzInit_fn = int (*)(QzSession*, unsigned char sw_backup);
using qzGetDefaultsDeflate_fn = int (*)(QzSessionParamsDeflate*);
using qzSetupSessionDeflate_fn = int (*)(QzSession*, QzSessionParamsDeflate*);
using qzCompress_fn = int (*)(QzSession*, const unsigned char* src, unsigned int* src_len, unsigned char* dest,
                              unsigned int* dest_len, unsigned int last);
using qzCompressExt_fn = int (*)(QzSession*, const unsigned char* src, unsigned int* src_len, unsigned char* dest,
                                 unsigned int* dest_len, unsigned int last, uint64_t* ext_rc);
using qzDecompress_fn = int (*)(QzSession*, const unsigned char* src, unsigned int* src_len, unsigned char* dest,
                                unsigned int* dest_len);
using qzDecompressExt_fn = int (*)(QzSession*, const unsigned char* src, unsigned int* src_len, unsigned char* dest,
                                   unsigned int* dest_len, uint64_t* ext_rc);
using qzTeardownSession_fn = int (*)(QzSession*);
using qzClose_fn = int (*)(QzSession*);
using qzMaxCompressedLength_fn = unsigned int (*)(unsigned int src_sz, QzSession*);
using qzMalloc_fn = void* (*)(size_t sz, int numa, int force_pinned);
using qzFree_fn = void (*)(void*);
using qzMemFindAddr_fn = int (*)(unsigned char*);
}

// Name of a QATzip return code ("QZ_NOSW_NO_HW"), or "QZ_<n>" for unknown ones.
const char* code_name(int rc);

}  // namespace kvcore::qat::abi
