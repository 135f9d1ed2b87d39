// Intel DSA descriptors and completion records, laid out as in the kernel's
// uapi header linux/idxd.h (struct dsa_hw_desc, struct dsa_completion_record).
// The header is not needed to build: the layouts are declared here with plain
// fields (no bitfields) and tests compare the bytes with the real header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvcore::dsa {

// Opcodes (enum dsa_opcode).
constexpr uint8_t kOpNoop = 0x00;
constexpr uint8_t kOpBatch = 0x01;
constexpr uint8_t kOpMemmove = 0x03;

// Descriptor flags (IDXD_OP_FLAG_*).
constexpr uint32_t kFlagFence = 0x0001;
constexpr uint32_t kFlagBlockOnFault = 0x0002;     // BOF
constexpr uint32_t kFlagCompletionAddrValid = 0x0004;  // CRAV
constexpr uint32_t kFlagRequestCompletion = 0x0008;    // RCR
constexpr uint32_t kFlagCacheControl = 0x0100;     // CC: write destination into the cache

// Completion status (enum dsa_completion_status); bit 7 of the status byte
// marks a page fault on a write (DSA_COMP_STATUS_WRITE).
constexpr uint8_t kStatusNone = 0x00;
constexpr uint8_t kStatusSuccess = 0x01;
constexpr uint8_t kStatusPageFaultNoBof = 0x03;
constexpr uint8_t kStatusPageFaultIr = 0x04;
constexpr uint8_t kStatusBatchFail = 0x05;
constexpr uint8_t kStatusBatchPageFault = 0x06;
constexpr uint8_t kStatusMask = 0x7f;
constexpr uint8_t kStatusWriteFault = 0x80;

// 64-byte work descriptor (struct dsa_hw_desc).
struct alignas(64) HwDesc {
    uint32_t pasid_priv;       // pasid:20, rsvd:11, priv:1 (bit 31)
    uint32_t flags_opcode;     // flags:24, opcode:8 (bits 24..31)
    uint64_t completion_addr;  // 32-byte aligned completion record
    uint64_t src_addr;         // MEMMOVE: source; BATCH: desc_list_addr
    uint64_t dst_addr;
    uint32_t xfer_size;        // MEMMOVE: bytes; BATCH: desc_count
    uint16_t int_handle;
    uint16_t rsvd1;
    uint8_t op_specific[24];
};
static_assert(sizeof(HwDesc) == 64, "DSA descriptor is 64 bytes");
static_assert(offsetof(HwDesc, completion_addr) == 8, "layout");
static_assert(offsetof(HwDesc, src_addr) == 16, "layout");
static_assert(offsetof(HwDesc, dst_addr) == 24, "layout");
static_assert(offsetof(HwDesc, xfer_size) == 32, "layout");
static_assert(offsetof(HwDesc, int_handle) == 36, "layout");
static_assert(offsetof(HwDesc, op_specific) == 40, "layout");

// 32-byte completion record (struct dsa_completion_record); the device writes
// it, software polls `status` (read it with load_status()).
struct alignas(32) CompletionRecord {
    uint8_t status;
    uint8_t result;
    uint16_t rsvd;
    uint32_t bytes_completed;
    uint64_t fault_addr;
    uint8_t op_specific[16];
};
static_assert(sizeof(CompletionRecord) == 32, "DSA completion record is 32 bytes");
static_assert(offsetof(CompletionRecord, bytes_completed) == 4, "layout");
static_assert(offsetof(CompletionRecord, fault_addr) == 8, "layout");

inline uint8_t load_status(const CompletionRecord* c) { return __atomic_load_n(&c->status, __ATOMIC_ACQUIRE); }

inline void reset(CompletionRecord* c) { std::memset(static_cast<void*>(c), 0, sizeof(*c)); }

inline void set_opcode_flags(HwDesc* d, uint8_t opcode, uint32_t flags) {
    d->flags_opcode = (flags & 0xffffffu) | (uint32_t(opcode) << 24);
}

// A MEMMOVE of size bytes from src to dst, reporting to comp.
inline void make_memmove(HwDesc* d, uint64_t src, uint64_t dst, uint32_t size, uint64_t comp, uint32_t flags) {
    std::memset(static_cast<void*>(d), 0, sizeof(*d));
    set_opcode_flags(d, kOpMemmove, flags);
    d->completion_addr = comp;
    d->src_addr = src;
    d->dst_addr = dst;
    d->xfer_size = size;
}

// A BATCH of `count` descriptors at list (64-byte aligned), reporting to comp.
inline void make_batch(HwDesc* d, uint64_t list, uint32_t count, uint64_t comp, uint32_t flags) {
    std::memset(static_cast<void*>(d), 0, sizeof(*d));
    set_opcode_flags(d, kOpBatch, flags);
    d->completion_addr = comp;
    d->src_addr = list;
    d->xfer_size = count;
}

inline uint8_t opcode_of(const HwDesc& d) { return uint8_t(d.flags_opcode >> 24); }
inline uint32_t flags_of(const HwDesc& d) { return d.flags_opcode & 0xffffffu; }

// Name of a completion status for error messages.
const char* status_name(uint8_t status);

}  // namespace kvcore::dsa
