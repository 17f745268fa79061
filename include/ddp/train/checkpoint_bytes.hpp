// The checkpoint format's byte layer: little-endian values, strings and arrays appended to a byte string
// (ByteWriter) and read back bounds-checked (ByteReader: running off the end, or a count larger than the bytes left,
// is an IoError naming the file and the section, before anything is allocated for it); shapes and value arrays in
// that encoding; CRC-32 (zlib) and the four-character section tags. Pure functions of bytes
// (train/checkpoint_format.hpp puts sections together from them).
#pragma once

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/error.hpp"

namespace ddp::detail {

inline std::uint32_t crc32_of(void const* data, std::size_t n) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  auto const* p = static_cast<Bytef const*>(data);
  while (n > 0) {  // zlib takes uInt lengths
    uInt const chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = ::crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

inline std::uint32_t fourcc(char const (&s)[5]) {
  std::uint32_t v = 0;
  std::memcpy(&v, s, 4);
  return v;
}
inline std::string fourcc_name(std::uint32_t v) {
  std::string s(4, '?');
  std::memcpy(s.data(), &v, 4);
  for (auto& c : s)
    if (c < 32 || c > 126) c = '?';
  return s;
}

// Appends little-endian values to a byte string.
class ByteWriter {
 public:
  template <class V>
  requires std::is_arithmetic_v<V>
  void put(V v) {
    char b[sizeof(V)];
    std::memcpy(b, &v, sizeof(V));
    out_.append(b, sizeof(V));
  }
  void put_string(std::string_view s) {
    put(static_cast<std::uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  template <class V>
  void put_array(std::span<V const> v) {
    if (!v.empty()) out_.append(reinterpret_cast<char const*>(v.data()), v.size_bytes());
  }
  std::string& bytes() noexcept { return out_; }

 private:
  std::string out_;
};

// Reads what ByteWriter wrote, bounds-checked: running off the end is an IoError naming file and section.
class ByteReader {
 public:
  ByteReader(std::string_view bytes, std::string const& file, std::string section)
      : b_(bytes), file_(file), section_(std::move(section)) {}
  template <class V>
  requires std::is_arithmetic_v<V> V get() {
    need(sizeof(V));
    V v;
    std::memcpy(&v, b_.data() + pos_, sizeof(V));
    pos_ += sizeof(V);
    return v;
  }
  std::string get_string() {
    auto const n = get<std::uint32_t>();
    need(n);
    std::string s(b_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  template <class V>
  void get_array(V* out, std::size_t count) {
    if (count > (b_.size() - pos_) / sizeof(V)) need(b_.size() - pos_ + 1);
    if (count == 0) return;  // `out` may be null (an empty vector's data()): memcpy must not see it
    std::memcpy(out, b_.data() + pos_, count * sizeof(V));
    pos_ += count * sizeof(V);
  }
  void skip(std::size_t n) {
    need(n);
    pos_ += n;
  }
  std::size_t remaining() const noexcept { return b_.size() - pos_; }
  void need(std::size_t n) const {
    if (n > b_.size() - pos_)
      throw IoError(ddp::detail::cat("checkpoint ", file_, ": section ", section_, " is malformed: it ends at byte ",
                                     b_.size(), " but its content needs more (read position ", pos_, ", need ", n,
                                     " more); the file was not written by this version of ddp"));
  }
  // count elements of `size` bytes follow (no overflow for any count); checked before anything is allocated
  // for them. `what` names the elements in the error.
  void need_elements(std::uint64_t count, std::size_t size, std::string_view what) const {
    if (count > remaining() / size)
      fail(what, ": ", count, " × ", size, " bytes announced, but only ", remaining(), " bytes remain");
  }
  template <class... Ts>
  [[noreturn]] void fail(Ts const&... what) const {
    throw IoError(ddp::detail::cat("checkpoint ", file_, ": section ", section_, ": ", what...));
  }
  void expect_end() const {
    if (pos_ != b_.size())
      throw IoError(ddp::detail::cat("checkpoint ", file_, ": section ", section_, " has ", b_.size() - pos_,
                                     " unexpected trailing bytes"));
  }

 private:
  std::string_view b_;
  std::string const& file_;
  std::string section_;
  std::size_t pos_ = 0;
};

inline void put_shape(ByteWriter& s, std::vector<std::int64_t> const& shape) {
  s.put(static_cast<std::uint32_t>(shape.size()));
  for (auto d : shape) s.put(d);
}

// Reads a shape and returns its element count; `what` names the owner in errors.
inline std::int64_t get_shape(ByteReader& r, std::vector<std::int64_t>& shape, std::string const& what) {
  auto const rank = r.get<std::uint32_t>();
  if (rank > 8) r.fail(what, " has rank ", rank, " (at most 8 supported)");
  std::int64_t numel = 1;
  for (std::uint32_t d = 0; d < rank; ++d) {
    auto const n = r.get<std::int64_t>();
    if (n < 0 || (n > 0 && numel > (std::int64_t{1} << 48) / n)) r.fail(what, " has a bad dimension ", n);
    shape.push_back(n);
    numel *= n;
  }
  return numel;
}
template <class T>
void get_values(ByteReader& r, std::vector<T>& v, std::int64_t numel, std::string_view what) {
  r.need_elements(static_cast<std::uint64_t>(numel), sizeof(T), what);
  v.resize(static_cast<std::size_t>(numel));
  r.get_array(v.data(), v.size());
}

}  // namespace ddp::detail
