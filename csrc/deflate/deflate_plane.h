// Plane method "deflate" (method id 4 in the frame, docs/FORMAT.md): a byte
// plane coded as raw DEFLATE (RFC 1951) in independent pieces, each no larger
// than QAT's hardware buffer, so that QAT hardware (QATzip, qat/) and software
// (ISA-L igzip) write the same kind of stream and any inflater (zlib, libdeflate,
// ISA-L, QAT) reads it.
//
// Payload (all integers little-endian):
//   u32 piece_count
//   piece_count x { u32 original_bytes, u32 compressed_bytes }
//   the pieces, concatenated in order
// Every piece is one complete raw DEFLATE stream (ends with a final block) that
// decodes to exactly original_bytes. Pieces hold 1 to kMaxPieceBytes original
// bytes (the writer uses kPieceBytes); the original sizes sum to the plane size
// and the compressed sizes to the payload size minus the table.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "frame/codec.h"

namespace kvcore::deflate {

constexpr uint32_t kPieceBytes = 64 * 1024;        // QATzip's default hardware buffer (QZ_HW_BUFF_SZ)
constexpr uint32_t kMaxPieceBytes = 512 * 1024;    // largest piece a reader accepts (QZ_HW_BUFF_MAX_SZ)
constexpr uint32_t kQatMinPieceBytes = 128;        // QATzip's smallest input threshold; smaller pieces: software

// What the encoder did, piece by piece.
struct EncodeReport {
    uint32_t pieces = 0;
    uint32_t qat_pieces = 0;       // compressed by QAT hardware
    uint32_t software_pieces = 0;  // compressed by ISA-L
    uint32_t stored_pieces = 0;    // written as stored blocks (compression would expand them)
    uint32_t fallback_pieces = 0;  // QAT was asked for (auto) but the piece went to software
};

// Largest payload deflate_plane_encode() writes for n input bytes.
size_t deflate_plane_bound(size_t n);

// Codes n bytes at src into dst (capacity cap; cap >= deflate_plane_bound(n)
// always suffices). backend: kSoftware = ISA-L; kQat = QAT hardware, required
// (kUnsupported when absent; pieces under kQatMinPieceBytes use ISA-L); kAuto =
// QAT for pieces of at least qat::min_bytes() when hardware is present, ISA-L
// otherwise or when a QAT call fails. level: 1 (fastest) to 9, as in zlib and
// QATzip (ISA-L maps 1 -> its level 1, 2-5 -> 2, 6-9 -> 3); 0 = ISA-L level 0.
// threads: pieces coded in parallel on the default pool (0 = all, 1 = caller only).
Status deflate_plane_encode(const uint8_t* src, size_t n, frame::Backend backend, int level, uint8_t* dst,
                            size_t cap, size_t* written, EncodeReport* report = nullptr, unsigned threads = 1);

// Decodes a payload of src_size bytes into exactly n bytes at dst. The whole
// table is validated before any piece is decoded; any inconsistency, invalid
// DEFLATE data, a piece that does not end exactly at its compressed size or
// does not produce exactly its original size gives kCorruptFrame.
// backend kQat / kAuto: pieces go to QAT when present; a piece QAT does not
// decode is decoded (and judged) by ISA-L.
Status deflate_plane_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t n,
                            frame::Backend backend = frame::Backend::kSoftware, unsigned threads = 1);

}  // namespace kvcore::deflate
