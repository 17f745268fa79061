// Reader for IDX files (the MNIST / Fashion-MNIST format), plain or gzip, with strict validation.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp {

// read_idx_images: x / 255 (in float, as torchvision's ToTensor), then (x - mean) / std (as Normalize).
// mean = 0, std = 1 keeps x / 255. Defaults are Fashion-MNIST's training-set statistics.
struct ImageOptions {
  double normalize_mean = 0.2860;
  double normalize_std = 0.3530;
  std::int64_t limit = 0;  // keep only the first `limit` images (0: all); the whole file is still validated
};

struct LabelOptions {
  std::int32_t num_classes = 10;  // every kept label must lie in [0, num_classes)
  std::int64_t limit = 0;         // keep only the first `limit` labels (0: all); the whole file is still validated
};

namespace detail {

inline constexpr std::uint8_t kIdxUint8 = 0x08;

inline char const* idx_dtype_name(std::uint8_t t) noexcept {
  switch (t) {
    case 0x08:
      return "uint8";
    case 0x09:
      return "int8";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "unknown";
  }
}

inline std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

// Big-endian uint32 at p (IDX headers are big-endian).
inline std::uint32_t be32(unsigned char const* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

inline std::string hex8(std::uint8_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", v);
  return buf;
}

// An open IDX file. gzip input (magic 1f 8b) is inflated by zlib; zlib passes other files through unchanged.
class IdxSource {
 public:
  explicit IdxSource(std::filesystem::path const& path) : name_(path.string()) {
    std::error_code ec;
    auto const st = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(st)) throw IoError(cat(name_, ": cannot open: no such file"));
    if (std::filesystem::is_directory(st)) throw IoError(cat(name_, ": cannot open: is a directory, not an IDX file"));
    if (std::FILE* raw = std::fopen(name_.c_str(), "rb")) {
      unsigned char m[2] = {0, 0};
      std::size_t const got = std::fread(m, 1, 2, raw);
      std::fclose(raw);
      gzip_ = got == 2 && m[0] == 0x1f && m[1] == 0x8b;
    } else {
      throw IoError(cat(name_, ": cannot open: ", std::strerror(errno)));
    }
    if (!gzip_) plain_size_ = static_cast<std::uint64_t>(std::filesystem::file_size(path, ec));
    errno = 0;
    f_ = gzopen(name_.c_str(), "rb");
    if (!f_) throw IoError(cat(name_, ": cannot open: ", errno ? std::strerror(errno) : "zlib could not allocate"));
    gzbuffer(f_, 1u << 17);
  }
  IdxSource(IdxSource const&) = delete;
  IdxSource& operator=(IdxSource const&) = delete;
  ~IdxSource() {
    if (f_) gzclose(f_);
  }

  std::string const& name() const noexcept { return name_; }
  bool gzip() const noexcept { return gzip_; }
  std::uint64_t plain_size() const noexcept { return plain_size_; }

  // True once the input ended inside a gzip stream (a truncated .gz file); reads then return short.
  bool truncated_gzip() const noexcept { return truncated_gzip_; }

  // Reads up to n bytes; returns how many were read (fewer only at the end of the data, or of a truncated
  // gzip stream). Corrupt gzip data (bad deflate data, CRC or length mismatch) throws IoError naming the file.
  std::uint64_t read(void* dst, std::uint64_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    std::uint64_t done = 0;
    while (done < n) {
      auto const chunk = static_cast<unsigned>(std::min<std::uint64_t>(n - done, 1u << 30));
      int const got = gzread(f_, p + done, chunk);
      check();
      if (got > 0) done += static_cast<std::uint64_t>(got);
      if (got <= 0 || truncated_gzip_) break;
      if (static_cast<unsigned>(got) < chunk) break;
    }
    return done;
  }

  // Reads to the end, discarding; returns the number of bytes (decompressed, for gzip).
  std::uint64_t skip_to_end() {
    std::vector<unsigned char> scratch(1u << 17);
    std::uint64_t total = 0;
    for (;;) {
      std::uint64_t const got = read(scratch.data(), scratch.size());
      total += got;
      if (got < scratch.size()) return total;
    }
  }

 private:
  void check() {
    int err = Z_OK;
    char const* msg = gzerror(f_, &err);
    if (err == Z_OK) return;
    if (err == Z_BUF_ERROR) {
      truncated_gzip_ = true;
      return;
    }
    std::string_view text(msg ? msg : "unknown error");
    if (text.starts_with(name_ + ": ")) text.remove_prefix(name_.size() + 2);  // zlib prefixes the path
    if (err == Z_ERRNO) throw IoError(cat(name_, ": read error: ", std::strerror(errno)));
    throw IoError(cat(name_, ": corrupt ", gzip_ ? "gzip data" : "file", " (zlib: ", text, ")"));
  }

  std::string name_;
  gzFile f_ = nullptr;
  bool gzip_ = false;
  bool truncated_gzip_ = false;
  std::uint64_t plain_size_ = 0;
};

// A validated IDX header.
struct IdxHeader {
  std::vector<std::uint32_t> dims;
  std::uint64_t header_bytes = 0;  // 4 + 4 · ndims
  std::uint64_t data_bytes = 0;    // product of dims (uint8 elements)
  std::string shape_text;          // "60000×28×28"
};

// Reads and validates the header of a uint8 IDX file: magic 0x000008nn, nn == ndims (any of 1..4 when
// ndims == 0), no zero dimension, at most 1 TiB of data. `kind` and `dim_names` word the errors.
inline IdxHeader read_idx_header(IdxSource& src, int ndims, char const* kind, char const* dim_names) {
  auto const& name = src.name();
  std::string const expected_magic =
      ndims > 0 ? hex32((std::uint32_t{kIdxUint8} << 8) | static_cast<std::uint32_t>(ndims)) : "0x000008nn";

  std::array<unsigned char, 4> m{};
  if (auto const got = src.read(m.data(), 4); got < 4)
    throw IoError(cat(name, ": truncated: the file has ", got, " byte", got == 1 ? "" : "s",
                      src.gzip() ? " of data after decompression" : "", ", less than the 4-byte IDX magic number (",
                      expected_magic, " for ", kind, ")"));
  std::uint32_t const magic = be32(m.data());
  if (m[0] != 0 || m[1] != 0)
    throw IoError(cat(name, ": bad magic number ", hex32(magic), ": not an IDX file (expected ", expected_magic,
                      " for ", kind, ")"));
  if (m[2] != kIdxUint8)
    throw IoError(cat(name, ": magic number ", hex32(magic), " has dtype byte ", hex8(m[2]), " (", idx_dtype_name(m[2]),
                      "); only 0x08 (uint8) is supported (expected ", expected_magic, " for ", kind, ")"));
  if (ndims > 0 ? m[3] != ndims : (m[3] < 1 || m[3] > 4))
    throw IoError(cat(name, ": magic number ", hex32(magic), " says ", int(m[3]), " dimension", m[3] == 1 ? "" : "s",
                      ", but ", kind, " have ", ndims > 0 ? std::to_string(ndims) : std::string("1 to 4"), " ",
                      dim_names, " (expected magic ", expected_magic, ")"));

  IdxHeader h;
  int const nd = m[3];
  h.header_bytes = 4 + 4 * static_cast<std::uint64_t>(nd);
  h.dims.resize(static_cast<std::size_t>(nd));
  std::vector<unsigned char> raw(4 * static_cast<std::size_t>(nd));
  if (auto const got = src.read(raw.data(), raw.size()); got < raw.size())
    throw IoError(cat(name, ": truncated: the file ends ", 4 + got, " bytes in, inside the ", h.header_bytes,
                      "-byte IDX header"));
  constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 40;
  h.data_bytes = 1;
  for (int d = 0; d < nd; ++d) {
    std::uint32_t const v = be32(raw.data() + 4 * d);
    h.dims[static_cast<std::size_t>(d)] = v;
    h.shape_text += (d ? "×" : "") + std::to_string(v);
    if (v == 0)
      throw IoError(
          cat(name, ": header gives dimension ", d, " of ", dim_names, " as 0; ", kind, " must not be empty"));
    h.data_bytes *= v;
    if (h.data_bytes > kMaxBytes)
      throw IoError(cat(name, ": header's sizes (", h.shape_text, "...) exceed 1 TiB of data; the header is corrupt"));
  }
  return h;
}

// A validated IDX header and the bytes of its first `kept` items (item = one entry of dim 0).
struct IdxContents {
  IdxHeader header;
  std::vector<std::uint8_t> data;
  std::int64_t kept = 0;
};

// Reads a uint8 IDX file with `ndims` dimensions, keeping the first `keep` items (0: all). Validates the
// header (read_idx_header) and that the data size equals the header's product exactly (reading a gzip file
// to its end, which also checks its CRC).
inline IdxContents read_idx_u8(std::filesystem::path const& path, int ndims, char const* kind, char const* dim_names,
                               std::int64_t keep) {
  IdxSource src(path);
  IdxContents out;
  out.header = read_idx_header(src, ndims, kind, dim_names);
  IdxHeader const& h = out.header;
  std::uint64_t const items = h.dims[0];
  std::uint64_t const item_bytes = h.data_bytes / items;
  std::uint64_t const kept = keep > 0 ? std::min<std::uint64_t>(items, static_cast<std::uint64_t>(keep)) : items;
  auto const size_error = [&](std::uint64_t found) {
    bool const short_data = found < h.data_bytes || src.truncated_gzip();
    std::string extra = found > h.data_bytes ? cat(" (", found - h.data_bytes, " extra bytes)") : std::string{};
    if (src.gzip())
      extra += src.truncated_gzip() ? "; the gzip stream ends early (file cut short)" : " after decompression";
    return IoError(cat(src.name(), ": ", short_data ? "truncated" : "trailing garbage", ": header says ", h.shape_text,
                       " = ", h.data_bytes, " bytes of data, found ", found, extra));
  };
  if (!src.gzip() && src.plain_size() != h.header_bytes + h.data_bytes)
    throw size_error(src.plain_size() < h.header_bytes ? 0 : src.plain_size() - h.header_bytes);

  out.data.resize(static_cast<std::size_t>(kept * item_bytes));
  std::uint64_t found = src.read(out.data.data(), out.data.size());
  if (found < out.data.size()) throw size_error(found);
  if (src.gzip()) {
    found += src.skip_to_end();
    if (found != h.data_bytes || src.truncated_gzip()) throw size_error(found);
  }
  out.kept = static_cast<std::int64_t>(kept);
  return out;
}

inline void check_limit(std::int64_t limit, char const* who) {
  if (limit < 0) throw ArgumentError(cat(who, ": limit = ", limit, " must be >= 0 (0 keeps everything)"));
}

}  // namespace detail

// Images from an IDX file with magic 0x00000803 (uint8, N × rows × cols), plain or gzip, as float (N, 1, rows,
// cols) = (x / 255 - mean) / std computed in float, as torchvision's ToTensor + Normalize. Any defect of the
// file (missing, bad magic, dtype other than uint8, wrong number of dimensions, a zero dimension, data shorter
// or longer than the header says, corrupt gzip) throws IoError naming the file and the defect. With a limit,
// only the first images are converted but the whole file is still read and checked. Deterministic; O(file).
inline Tensor<float> read_idx_images(std::filesystem::path const& path, ImageOptions const& opts = {}) {
  detail::check_limit(opts.limit, "read_idx_images");
  if (!(opts.normalize_std > 0) || !std::isfinite(opts.normalize_std) || !std::isfinite(opts.normalize_mean))
    throw ArgumentError(detail::cat("read_idx_images: normalize_std = ", opts.normalize_std, ", normalize_mean = ",
                                    opts.normalize_mean, ": std must be finite and > 0, mean finite"));
  auto const idx = detail::read_idx_u8(path, 3, "images", "(N, rows, cols)", opts.limit);
  std::int64_t const rows = idx.header.dims[1], cols = idx.header.dims[2];
  Tensor<float> x(Shape{idx.kept, 1, rows, cols});
  float const mean = static_cast<float>(opts.normalize_mean), stdev = static_cast<float>(opts.normalize_std);
  for (std::size_t i = 0; i < idx.data.size(); ++i)
    x[static_cast<std::int64_t>(i)] = (static_cast<float>(idx.data[i]) / 255.0f - mean) / stdev;
  return x;
}

// Labels from an IDX file with magic 0x00000801 (uint8, N) as int32 class ids (N); each kept label must be in
// [0, num_classes) (IoError naming the file, index and value). Same file validation as read_idx_images.
inline Tensor<std::int32_t> read_idx_labels(std::filesystem::path const& path, LabelOptions const& opts = {}) {
  detail::check_limit(opts.limit, "read_idx_labels");
  if (opts.num_classes < 1 || opts.num_classes > 256)
    throw ArgumentError(detail::cat("read_idx_labels: num_classes = ", opts.num_classes, " must be in [1, 256]"));
  auto const idx = detail::read_idx_u8(path, 1, "labels", "(N)", opts.limit);
  Tensor<std::int32_t> y(Shape{idx.kept});
  for (std::int64_t i = 0; i < idx.kept; ++i) {
    std::int32_t const v = idx.data[static_cast<std::size_t>(i)];
    if (v >= opts.num_classes)
      throw IoError(detail::cat(path.string(), ": label ", v, " at index ", i, " is outside [0, ", opts.num_classes,
                                ") (LabelOptions::num_classes)"));
    y[i] = v;
  }
  return y;
}

// The dimensions an IDX file's header declares (uint8 data, 1 to 4 dims), reading only the header: cheap,
// but it does not check the data size (read_idx_images / read_idx_labels do). IoError for a bad header.
inline std::vector<std::int64_t> read_idx_dims(std::filesystem::path const& path) {
  detail::IdxSource src(path);
  auto const h = detail::read_idx_header(src, 0, "uint8 IDX files", "dimensions");
  return {h.dims.begin(), h.dims.end()};
}

}  // namespace ddp
