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
#include <memory>
#include <span>
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
  std::uint64_t max_data_bytes = std::uint64_t{1} << 34;  // a header declaring more (16 GiB) is an IoError
};

struct LabelOptions {
  std::int32_t num_classes = 10;  // every kept label must lie in [0, num_classes)
  std::int64_t limit = 0;         // keep only the first `limit` labels (0: all); the whole file is still validated
  std::uint64_t max_data_bytes = std::uint64_t{1} << 34;  // a header declaring more (16 GiB) is an IoError
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

// The raw bytes of an IDX input, from a file or from memory, inflated when they start with the gzip magic
// (1f 8b). Reads are incremental: memory use is bounded by what the caller asks for, never by what a header
// declares. Concatenated gzip members are read as one stream (as gzip -d does); bytes after the last member that
// do not start another member are an IoError ("trailing garbage after the gzip stream"), as is corrupt deflate
// data, a CRC or length mismatch. Not thread-safe (one reader per source).
class IdxSource {
 public:
  explicit IdxSource(std::filesystem::path const& path) : name_(path.string()) {
    std::error_code ec;
    auto const st = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(st)) throw IoError(cat(name_, ": cannot open: no such file"));
    if (std::filesystem::is_directory(st)) throw IoError(cat(name_, ": cannot open: is a directory, not an IDX file"));
    errno = 0;
    file_.reset(std::fopen(name_.c_str(), "rb"));
    if (!file_) throw IoError(cat(name_, ": cannot open: ", std::strerror(errno)));
    if (std::filesystem::is_regular_file(st)) {
      raw_size_ = static_cast<std::uint64_t>(std::filesystem::file_size(path, ec));
      if (ec) raw_size_ = kUnknownSize;
    }
    start();
  }
  // An in-memory IDX file (plain or gzip); `name` stands for the file in errors. `bytes` must outlive the source.
  IdxSource(std::span<std::uint8_t const> bytes, std::string name)
      : name_(std::move(name)), mem_(bytes), raw_size_(bytes.size()) {
    start();
  }
  IdxSource(IdxSource const&) = delete;
  IdxSource& operator=(IdxSource const&) = delete;
  ~IdxSource() {
    if (inflating_) inflateEnd(&z_);
  }

  std::string const& name() const noexcept { return name_; }
  bool gzip() const noexcept { return gzip_; }
  // The size of the raw (possibly compressed) input when known (a regular file or memory), else kUnknownSize.
  std::uint64_t raw_size() const noexcept { return raw_size_; }
  static constexpr std::uint64_t kUnknownSize = ~std::uint64_t{0};

  // True once the input ended inside a gzip stream (a truncated .gz file); reads then return short.
  bool truncated_gzip() const noexcept { return truncated_gzip_; }

  // Reads up to n bytes; returns how many were read (fewer only at the end of the data, or of a truncated
  // gzip stream). Corrupt gzip data (bad deflate data, CRC or length mismatch) throws IoError naming the file.
  std::uint64_t read(void* dst, std::uint64_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    if (!gzip_) {
      std::uint64_t done = take_buffered(p, n);
      while (done < n) {
        std::size_t const got =
            raw_read(p + done, static_cast<std::size_t>(std::min<std::uint64_t>(n - done, 1u << 30)));
        if (got == 0) break;
        done += got;
      }
      return done;
    }
    std::uint64_t done = 0;
    while (done < n && !truncated_gzip_) {
      if (member_done_ && !next_member()) break;
      if (z_.avail_in == 0 && !fill(1)) {
        truncated_gzip_ = true;  // the input ended before the member's end (and its CRC-32 trailer)
        break;
      }
      auto const chunk = static_cast<uInt>(std::min<std::uint64_t>(n - done, 1u << 30));
      z_.next_out = p + done;
      z_.avail_out = chunk;
      int const rc = ::inflate(&z_, Z_NO_FLUSH);
      done += chunk - z_.avail_out;
      if (rc == Z_STREAM_END) {
        member_done_ = true;
      } else if (rc == Z_MEM_ERROR) {
        throw IoError(cat(name_, ": zlib could not allocate memory to inflate the gzip data"));
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw IoError(cat(name_, ": corrupt gzip data (zlib: ", z_.msg ? z_.msg : "unknown error", ")"));
      }
    }
    return done;
  }

  // Reads and discards up to `limit` bytes (decompressed, for gzip); returns how many there were.
  std::uint64_t skip(std::uint64_t limit) {
    std::vector<unsigned char> scratch(1u << 16);
    std::uint64_t total = 0;
    while (total < limit) {
      std::uint64_t const want = std::min<std::uint64_t>(scratch.size(), limit - total);
      std::uint64_t const got = read(scratch.data(), want);
      total += got;
      if (got < want) break;
    }
    return total;
  }

 private:
  static constexpr std::size_t kBufferBytes = std::size_t{1} << 16;

  // Looks at the first two bytes to choose between plain and gzip input.
  void start() {
    buf_.resize(kBufferBytes);
    fill(2);
    gzip_ = z_.avail_in >= 2 && z_.next_in[0] == 0x1f && z_.next_in[1] == 0x8b;
    if (!gzip_) return;
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK)  // 16 +: gzip wrapper only (no zlib or raw deflate)
      throw IoError(cat(name_, ": zlib could not allocate memory to inflate the gzip data"));
    inflating_ = true;
  }

  // Reads raw (compressed) bytes from the file or memory; 0 at the end.
  std::size_t raw_read(unsigned char* dst, std::size_t n) {
    if (!file_) {
      std::size_t const got = std::min(n, mem_.size() - mem_pos_);
      if (got) std::memcpy(dst, mem_.data() + mem_pos_, got);
      mem_pos_ += got;
      return got;
    }
    std::size_t const got = std::fread(dst, 1, n, file_.get());
    if (got < n && std::ferror(file_.get())) throw IoError(cat(name_, ": read error: ", std::strerror(errno)));
    return got;
  }

  // Makes at least k (<= kBufferBytes) raw bytes available at z_.next_in, unless the input ends first.
  bool fill(std::size_t k) {
    if (z_.avail_in >= k) return true;
    if (z_.avail_in > 0 && z_.next_in != buf_.data()) std::memmove(buf_.data(), z_.next_in, z_.avail_in);
    z_.next_in = buf_.data();
    while (z_.avail_in < k) {
      std::size_t const got = raw_read(buf_.data() + z_.avail_in, buf_.size() - z_.avail_in);
      if (got == 0) break;
      z_.avail_in += static_cast<uInt>(got);
    }
    return z_.avail_in >= k;
  }

  // Plain input: hands out the bytes start() looked at before reading on.
  std::uint64_t take_buffered(unsigned char* dst, std::uint64_t n) {
    auto const got = static_cast<std::size_t>(std::min<std::uint64_t>(n, z_.avail_in));
    if (got) std::memcpy(dst, z_.next_in, got);
    z_.next_in += got;
    z_.avail_in -= static_cast<uInt>(got);
    return got;
  }

  // After a member's end: false at the end of the input; true after starting the next member; IoError for
  // bytes that are not a gzip member.
  bool next_member() {
    if (!fill(1)) return false;
    if (!fill(2) || z_.next_in[0] != 0x1f || z_.next_in[1] != 0x8b) {
      std::uint64_t extra = z_.avail_in;
      for (unsigned char scratch[4096]; extra < (std::uint64_t{1} << 20);) {  // count some, not all
        std::size_t const got = raw_read(scratch, sizeof scratch);
        if (got == 0) break;
        extra += got;
      }
      throw IoError(
          cat(name_, ": trailing garbage after the gzip stream: ", extra >= (std::uint64_t{1} << 20) ? "at least " : "",
              extra, extra == 1 ? " byte that is not" : " bytes that are not", " a gzip member"));
    }
    if (inflateReset(&z_) != Z_OK) throw IoError(cat(name_, ": zlib could not restart inflation"));
    member_done_ = false;
    return true;
  }

  std::string name_;
  struct Closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file_;  // closed also when a constructor throws after opening it
  std::span<std::uint8_t const> mem_;
  std::size_t mem_pos_ = 0;
  std::uint64_t raw_size_ = kUnknownSize;
  std::vector<unsigned char> buf_;  // raw input not yet consumed: z_.next_in, z_.avail_in bytes
  z_stream z_{};
  bool gzip_ = false;
  bool inflating_ = false;
  bool member_done_ = false;
  bool truncated_gzip_ = false;
};

// A validated IDX header.
struct IdxHeader {
  std::vector<std::uint32_t> dims;
  std::uint64_t header_bytes = 0;  // 4 + 4 · ndims
  std::uint64_t data_bytes = 0;    // product of dims (uint8 elements)
  std::string shape_text;          // "60000×28×28"
};

// No IDX header may declare more than this (a corrupt header, whatever the options say).
inline constexpr std::uint64_t kIdxMaxDataBytes = std::uint64_t{1} << 40;

// Reads and validates the header of a uint8 IDX file: magic 0x000008nn, nn == ndims (any of 1..4 when
// ndims == 0), no zero dimension, a product of dimensions that neither overflows nor exceeds `max_bytes`
// (`max_name` names the option that sets it in the error). `kind` and `dim_names` word the errors.
inline IdxHeader read_idx_header(IdxSource& src, int ndims, char const* kind, char const* dim_names,
                                 std::uint64_t max_bytes = kIdxMaxDataBytes, char const* max_name = nullptr) {
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
  std::array<unsigned char, 16> raw{};  // nd <= 4
  if (auto const got = src.read(raw.data(), 4 * static_cast<std::uint64_t>(nd)); got < 4 * std::uint64_t(nd))
    throw IoError(cat(name, ": truncated: the file ends ", 4 + got, " bytes in, inside the ", h.header_bytes,
                      "-byte IDX header"));
  for (int d = 0; d < nd; ++d) {
    std::uint32_t const v = be32(raw.data() + 4 * d);
    h.dims[static_cast<std::size_t>(d)] = v;
    h.shape_text += (d ? "×" : "") + std::to_string(v);
  }
  h.data_bytes = 1;
  for (int d = 0; d < nd; ++d) {
    std::uint32_t const v = h.dims[static_cast<std::size_t>(d)];
    if (v == 0)
      throw IoError(
          cat(name, ": header gives dimension ", d, " of ", dim_names, " as 0; ", kind, " must not be empty"));
    // The product of up to four 32-bit dimensions can overflow 64 bits: check before multiplying.
    if (h.data_bytes > kIdxMaxDataBytes / v)
      throw IoError(cat(name, ": header's dimensions ", h.shape_text, " ", dim_names,
                        " multiply to more than 1 TiB of data; the header is corrupt"));
    h.data_bytes *= v;
  }
  if (h.data_bytes > max_bytes)
    throw IoError(cat(name, ": header's dimensions ", h.shape_text, " ", dim_names, " declare ", h.data_bytes,
                      " bytes of data, more than the limit of ", max_bytes,
                      max_name ? cat(" (", max_name, "; raise it for a genuine file this large)") : std::string{}));
  return h;
}

// A validated IDX header and the bytes of its first `kept` items (item = one entry of dim 0).
struct IdxContents {
  IdxHeader header;
  std::vector<std::uint8_t> data;
  std::int64_t kept = 0;
};

// What read_idx_u8 reads and how the errors word it.
struct IdxRequest {
  int ndims = 0;
  char const* kind = "";
  char const* dim_names = "";
  std::int64_t keep = 0;  // items to keep (0: all)
  std::uint64_t max_bytes = kIdxMaxDataBytes;
  char const* max_name = nullptr;
};

// Reads a uint8 IDX input with `ndims` dimensions, keeping the first `keep` items. Validates the header
// (read_idx_header) and that the data size equals the header's product exactly (reading a gzip input to its
// end, which also checks its CRC). Memory grows with the data that actually arrives (at most twice what has
// arrived), so a small file whose header declares a huge size fails as truncated without allocating it.
inline IdxContents read_idx_u8(IdxSource& src, IdxRequest const& req) {
  IdxContents out;
  out.header = read_idx_header(src, req.ndims, req.kind, req.dim_names, req.max_bytes, req.max_name);
  IdxHeader const& h = out.header;
  std::uint64_t const items = h.dims[0];
  std::uint64_t const item_bytes = h.data_bytes / items;
  std::uint64_t const kept =
      req.keep > 0 ? std::min<std::uint64_t>(items, static_cast<std::uint64_t>(req.keep)) : items;
  constexpr std::uint64_t kCountExtra = std::uint64_t{1} << 20;  // trailing bytes counted before giving up
  auto const size_error = [&](std::uint64_t found) {
    bool const short_data = found < h.data_bytes || src.truncated_gzip();
    std::string extra;
    if (found > h.data_bytes)
      extra = cat(" (", found - h.data_bytes >= kCountExtra ? "at least " : "", found - h.data_bytes, " extra bytes)");
    if (src.gzip())
      extra += src.truncated_gzip() ? "; the gzip stream ends early (file cut short)" : " after decompression";
    return IoError(cat(src.name(), ": ", short_data ? "truncated" : "trailing garbage", ": header says ", h.shape_text,
                       " = ", h.data_bytes, " bytes of data, found ", found, extra));
  };
  bool const sized = !src.gzip() && src.raw_size() != IdxSource::kUnknownSize;
  if (sized && src.raw_size() != h.header_bytes + h.data_bytes)
    throw size_error(src.raw_size() < h.header_bytes ? 0 : src.raw_size() - h.header_bytes);

  std::uint64_t const want = kept * item_bytes;
  std::uint64_t found = 0;
  while (found < want) {  // grow geometrically from 1 MiB, only as far as data arrives
    std::uint64_t const chunk = std::min(want - found, std::max<std::uint64_t>(found, std::uint64_t{1} << 20));
    out.data.resize(static_cast<std::size_t>(found + chunk));
    std::uint64_t const got = src.read(out.data.data() + found, chunk);
    found += got;
    if (got < chunk) throw size_error(found);
  }
  if (!sized) {  // read on to the end: the rest of the data, then one byte more (there must be none)
    found += src.skip(h.data_bytes - want + kCountExtra);
    if (found != h.data_bytes || src.truncated_gzip()) throw size_error(found);
  }
  out.kept = static_cast<std::int64_t>(kept);
  return out;
}

inline void check_limit(std::int64_t limit, char const* who) {
  if (limit < 0) throw ArgumentError(cat(who, ": limit = ", limit, " must be >= 0 (0 keeps everything)"));
}

inline Tensor<float> idx_images(IdxSource& src, ImageOptions const& opts) {
  check_limit(opts.limit, "read_idx_images");
  if (!(opts.normalize_std > 0) || !std::isfinite(opts.normalize_std) || !std::isfinite(opts.normalize_mean))
    throw ArgumentError(cat("read_idx_images: normalize_std = ", opts.normalize_std,
                            ", normalize_mean = ", opts.normalize_mean, ": std must be finite and > 0, mean finite"));
  auto const idx = read_idx_u8(src, {.ndims = 3,
                                     .kind = "images",
                                     .dim_names = "(N, rows, cols)",
                                     .keep = opts.limit,
                                     .max_bytes = opts.max_data_bytes,
                                     .max_name = "ImageOptions::max_data_bytes"});
  std::int64_t const rows = idx.header.dims[1], cols = idx.header.dims[2];
  Tensor<float> x(Shape{idx.kept, 1, rows, cols});
  float const mean = static_cast<float>(opts.normalize_mean), stdev = static_cast<float>(opts.normalize_std);
  for (std::size_t i = 0; i < idx.data.size(); ++i)
    x[static_cast<std::int64_t>(i)] = (static_cast<float>(idx.data[i]) / 255.0f - mean) / stdev;
  return x;
}

inline Tensor<std::int32_t> idx_labels(IdxSource& src, LabelOptions const& opts) {
  check_limit(opts.limit, "read_idx_labels");
  if (opts.num_classes < 1 || opts.num_classes > 256)
    throw ArgumentError(cat("read_idx_labels: num_classes = ", opts.num_classes, " must be in [1, 256]"));
  auto const idx = read_idx_u8(src, {.ndims = 1,
                                     .kind = "labels",
                                     .dim_names = "(N)",
                                     .keep = opts.limit,
                                     .max_bytes = opts.max_data_bytes,
                                     .max_name = "LabelOptions::max_data_bytes"});
  Tensor<std::int32_t> y(Shape{idx.kept});
  for (std::int64_t i = 0; i < idx.kept; ++i) {
    std::int32_t const v = idx.data[static_cast<std::size_t>(i)];
    if (v >= opts.num_classes)
      throw IoError(cat(src.name(), ": label ", v, " at index ", i, " is outside [0, ", opts.num_classes,
                        ") (LabelOptions::num_classes)"));
    y[i] = v;
  }
  return y;
}

}  // namespace detail

// Images from an IDX file with magic 0x00000803 (uint8, N × rows × cols), plain or gzip, as float (N, 1, rows,
// cols) = (x / 255 - mean) / std computed in float, as torchvision's ToTensor + Normalize. Any defect of the
// file (missing, not readable, bad magic, dtype other than uint8, wrong number of dimensions, a zero dimension,
// sizes that overflow or exceed ImageOptions::max_data_bytes, data shorter or longer than the header says,
// corrupt gzip, bytes after the gzip stream) throws IoError naming the file and the defect; never a crash, and
// memory grows only with data actually read. With a limit, only the first images are converted but the whole
// file is still read and checked. Deterministic; O(file).
inline Tensor<float> read_idx_images(std::filesystem::path const& path, ImageOptions const& opts = {}) {
  detail::IdxSource src(path);
  return detail::idx_images(src, opts);
}
// read_idx_images on an IDX file's bytes (plain or gzip) held in memory; `name` stands for the file in errors.
inline Tensor<float> decode_idx_images(std::span<std::uint8_t const> bytes, std::string name,
                                       ImageOptions const& opts = {}) {
  detail::IdxSource src(bytes, std::move(name));
  return detail::idx_images(src, opts);
}

// Labels from an IDX file with magic 0x00000801 (uint8, N) as int32 class ids (N); each kept label must be in
// [0, num_classes) (IoError naming the file, index and value). Same file validation as read_idx_images.
inline Tensor<std::int32_t> read_idx_labels(std::filesystem::path const& path, LabelOptions const& opts = {}) {
  detail::IdxSource src(path);
  return detail::idx_labels(src, opts);
}
// read_idx_labels on an IDX file's bytes held in memory; `name` stands for the file in errors.
inline Tensor<std::int32_t> decode_idx_labels(std::span<std::uint8_t const> bytes, std::string name,
                                              LabelOptions const& opts = {}) {
  detail::IdxSource src(bytes, std::move(name));
  return detail::idx_labels(src, opts);
}

// The dimensions an IDX file's header declares (uint8 data, 1 to 4 dims), reading only the header: cheap,
// but it does not check the data size (read_idx_images / read_idx_labels do). IoError for a bad header.
inline std::vector<std::int64_t> read_idx_dims(std::filesystem::path const& path) {
  detail::IdxSource src(path);
  auto const h = detail::read_idx_header(src, 0, "uint8 IDX files", "dimensions");
  return {h.dims.begin(), h.dims.end()};
}

}  // namespace ddp
