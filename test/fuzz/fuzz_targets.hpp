// What the fuzzers (and their regression test) run on one input: the bytes go through the same parsing code
// the library runs on files (decode_idx_* is read_idx_*'s reader over memory; decode_checkpoint is what
// read_checkpoint_file and load_checkpoint decode with). A ddp::Error is a correct answer to any input; a
// crash, a sanitizer report, another exception or a huge allocation is a bug.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/data/idx.hpp"
#include "ddp/error.hpp"
#include "ddp/train/checkpoint_format.hpp"

namespace ddp::fuzz {

// Runs f; a ddp::Error counts as a (correct) rejection. Returns true when f accepted the input.
template <class F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (ddp::Error const&) {
    return false;
  }
}

// `data` as a gzip file (one member), so that mutations of the content reach the gzip path with valid streams
// (mutating compressed bytes mostly stops at a CRC or deflate error).
inline std::vector<std::uint8_t> gzip_of(std::span<std::uint8_t const> data) {
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) return {};
  std::vector<std::uint8_t> out(deflateBound(&z, static_cast<uLong>(data.size())));
  z.next_in = const_cast<Bytef*>(data.data());
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  int const rc = deflate(&z, Z_FINISH);
  out.resize(rc == Z_STREAM_END ? z.total_out : 0);
  deflateEnd(&z);
  return out;
}

// The IDX reader on one input: images and labels (all of the file, and the first item only) and the header alone.
inline int idx_input(std::span<std::uint8_t const> data) {
  int ok = 0;
  ok += accepts([&] { (void)decode_idx_images(data, "fuzz-input", {}); });
  ok += accepts(
      [&] { (void)decode_idx_images(data, "fuzz-input", {.normalize_mean = 0, .normalize_std = 1, .limit = 1}); });
  ok += accepts([&] { (void)decode_idx_labels(data, "fuzz-input", {.num_classes = 256}); });
  ok += accepts([&] { (void)decode_idx_labels(data, "fuzz-input", {.limit = 1}); });
  ok += accepts([&] {
    detail::IdxSource src(data, "fuzz-input");
    (void)detail::read_idx_header(src, 0, "uint8 IDX files", "dimensions");
  });
  return ok;
}

// The IDX reader on `data` as it is and gzip-compressed.
inline int idx_one(std::span<std::uint8_t const> data) {
  auto const gz = gzip_of(data);
  return idx_input(data) + idx_input(gz);
}

// `bytes` with the header's magic, payload length and both checksums made consistent, so that mutations reach
// the sections instead of stopping at a checksum (as a file written by a buggy or hostile writer would).
inline std::string with_consistent_header(std::string_view bytes) {
  std::string b(bytes);
  if (b.size() < kCheckpointHeaderBytes) return b;
  std::memcpy(b.data(), kCheckpointMagic, sizeof kCheckpointMagic);
  std::uint64_t const payload = b.size() - kCheckpointHeaderBytes;
  std::memcpy(b.data() + 16, &payload, 8);
  std::uint32_t const payload_crc = detail::crc32_of(b.data() + kCheckpointHeaderBytes, payload);
  std::memcpy(b.data() + 24, &payload_crc, 4);
  std::uint32_t const header_crc = detail::crc32_of(b.data(), kCheckpointHeaderBytes - 4);
  std::memcpy(b.data() + 28, &header_crc, 4);
  return b;
}

// The checkpoint decoder on `data` as it is and with a consistent header, for float and double elements.
inline int checkpoint_one(std::span<std::uint8_t const> data) {
  std::string_view const raw(reinterpret_cast<char const*>(data.data()), data.size());
  std::string const fixed = with_consistent_header(raw);
  int ok = 0;
  for (std::string_view bytes : {raw, std::string_view(fixed)}) {
    ok += accepts([&] { (void)decode_checkpoint<float>(bytes, "fuzz-input"); });
    ok += accepts([&] { (void)decode_checkpoint<double>(bytes, "fuzz-input"); });
  }
  return ok;
}

}  // namespace ddp::fuzz
