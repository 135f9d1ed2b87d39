#include "frame/format.h"

#include <string>

#include "checksum/checksum.h"

namespace kvcore::frame {
namespace {

constexpr size_t kFixedBytes = 24;  // magic .. n_elems
// magic u32 | version u8 | dtype u8 | ndim u8 | flags u8 | block_elems u32 | n_blocks u32 | n_elems u64

// A bounds-checked cursor over the frame bytes.
struct Reader {
    const uint8_t* p;
    size_t left;
    bool take(size_t n, const uint8_t** out) {
        if (n > left) return false;
        *out = p;
        p += n;
        left -= n;
        return true;
    }
};

}  // namespace

bool dtype_valid(uint8_t code) { return code >= 1 && code <= 7; }

unsigned dtype_size(DType dtype) {
    switch (dtype) {
        case DType::kUInt8:
        case DType::kInt8:
        case DType::kFloat8E4M3:
        case DType::kFloat8E5M2: return 1;
        case DType::kFloat16:
        case DType::kBFloat16: return 2;
        case DType::kFloat32: return 4;
    }
    return 0;
}

size_t header_size(size_t ndim, bool residual, uint32_t channels, uint32_t n_blocks) {
    return kFixedBytes + 8 * ndim + 4 + (residual ? channels : 0) + 4 * size_t(n_blocks) + 4;
}

namespace {

// Writes everything before the block table; returns the bytes written.
size_t write_description(const Header& h, uint8_t* dst) {
    uint8_t* p = dst;
    put_u32(p, kMagic);
    p[4] = kVersion;
    p[5] = static_cast<uint8_t>(h.dtype);
    p[6] = static_cast<uint8_t>(h.shape.size());
    p[7] = h.flags;
    put_u32(p + 8, h.block_elems);
    put_u32(p + 12, h.n_blocks);
    put_u64(p + 16, h.n_elems);
    p += kFixedBytes;
    for (uint64_t d : h.shape) {
        put_u64(p, d);
        p += 8;
    }
    put_u32(p, h.channels);
    p += 4;
    if (h.flags & kFlagResidual) {
        std::memcpy(p, h.residual.data(), h.channels);
        p += h.channels;
    }
    return size_t(p - dst);
}

}  // namespace

void bind_header(Header* h) {
    std::vector<uint8_t> buf(header_size(*h));
    h->binding = checksum64(buf.data(), write_description(*h, buf.data()));
}

void write_header(const Header& h, uint8_t* dst) {
    uint8_t* p = dst + write_description(h, dst);
    for (uint32_t s : h.block_sizes) {
        put_u32(p, s);
        p += 4;
    }
    put_u32(p, static_cast<uint32_t>(checksum64(dst, size_t(p - dst))));
}

Status parse_header(const uint8_t* frame, size_t size, Header* h, size_t* consumed) {
    Reader r{frame, size};
    const uint8_t* f;
    if (!r.take(kFixedBytes, &f)) return corrupt("frame too short for its header");
    if (get_u32(f) != kMagic) return corrupt("not a kvcore frame (bad magic)");
    if (f[4] != kVersion) return corrupt("unsupported frame version " + std::to_string(f[4]));
    if (!dtype_valid(f[5])) return corrupt("unknown dtype code " + std::to_string(f[5]));
    h->dtype = static_cast<DType>(f[5]);
    const unsigned ndim = f[6];
    if (ndim > kMaxDims) return corrupt("rank above " + std::to_string(kMaxDims));
    h->flags = f[7];
    if (h->flags & ~kKnownFlags) return corrupt("unknown header flags");
    h->block_elems = get_u32(f + 8);
    h->n_blocks = get_u32(f + 12);
    h->n_elems = get_u64(f + 16);
    const unsigned esize = dtype_size(h->dtype);
    if (h->block_elems == 0 || uint64_t(h->block_elems) * esize > kMaxBlockBytes)
        return corrupt("block size out of range");
    if (h->n_elems > (UINT64_MAX >> 4)) return corrupt("element count out of range");
    const uint64_t expected_blocks = (h->n_elems + h->block_elems - 1) / h->block_elems;
    if (expected_blocks != h->n_blocks) return corrupt("block count does not match element count");

    const uint8_t* dims;
    if (!r.take(8 * size_t(ndim), &dims)) return corrupt("frame too short for its shape");
    h->shape.assign(ndim, 0);
    unsigned __int128 product = 1;
    for (unsigned i = 0; i < ndim; ++i) {
        h->shape[i] = get_u64(dims + 8 * i);
        product *= h->shape[i];
        if (product > h->n_elems && h->n_elems != 0) return corrupt("shape does not match element count");
    }
    if (product != h->n_elems) return corrupt("shape does not match element count");

    const uint8_t* pp;
    if (!r.take(4, &pp)) return corrupt("frame too short for its header");
    h->channels = get_u32(pp);
    if (h->channels == 0 || h->channels > kMaxChannels) return corrupt("channel count out of range");
    if (h->n_elems % h->channels != 0 || h->block_elems % h->channels != 0)
        return corrupt("rows are not whole (channel count does not divide the sizes)");
    h->residual.clear();
    if (h->flags & kFlagResidual) {
        const uint8_t* res;
        if (!r.take(h->channels, &res)) return corrupt("frame too short for its residual table");
        h->residual.assign(res, res + h->channels);
    }

    h->binding = checksum64(frame, size - r.left);

    // The block table must fit before anything is allocated for it.
    if (size_t(h->n_blocks) > r.left / 4) return corrupt("frame too short for its block table");
    const uint8_t* table = nullptr;
    r.take(4 * size_t(h->n_blocks), &table);
    const uint8_t* sum;
    if (!r.take(4, &sum)) return corrupt("frame too short for its header checksum");
    if (get_u32(sum) != static_cast<uint32_t>(checksum64(frame, size_t(sum - frame))))
        return corrupt("header checksum mismatch");

    h->block_sizes.resize(h->n_blocks);
    uint64_t total = 0;
    for (uint32_t b = 0; b < h->n_blocks; ++b) {
        h->block_sizes[b] = get_u32(table + 4 * size_t(b));
        total += h->block_sizes[b];
    }
    if (total != r.left) return corrupt("block sizes do not add up to the frame size");
    *consumed = size - r.left;
    return Status::ok();
}

}  // namespace kvcore::frame
