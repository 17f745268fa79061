// Checkpoints: rank 0 writes parameters, optimizer state and the training position atomically in a
// versioned, checksummed binary file; every rank loads and validates it, and a failure surfaces on all ranks.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/tensor/kernels.hpp"

namespace ddp {

static_assert(std::endian::native == std::endian::little,
              "ddp checkpoints are little-endian and written by memcpy; add byte swapping for this platform");

// File layout (all integers little-endian):
//   header (32 bytes): magic "DDPCKPT\0" | u32 version | u32 section count | u64 payload bytes |
//                      u32 CRC-32 of the payload | u32 CRC-32 of the header's first 28 bytes
//   payload: sections, each u32 tag (four characters) | u32 0 | u64 length | length bytes
//     META  u32 n, then n × (string key, i64 value): the TrainPosition fields
//     MODL  u32 element size, u32 n, then n × (string name, u32 rank, rank × i64 dims)  (model identity)
//     PARM  the parameters' values in registration order, numel elements each
//     OPTM  string kind, f64 lr, u32 n, n × i64 counters, u32 m, m × (string name, u64 n, n elements)
//     XTRA  optional: the caller's opaque bytes (e.g. the metrics so far); absent when empty
//   strings are u32 length + bytes. Unknown sections are skipped (readers of version 1 ignore additions).
inline constexpr char kCheckpointMagic[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '\0'};
inline constexpr std::uint32_t kCheckpointVersion = 1;
inline constexpr std::size_t kCheckpointHeaderBytes = 32;

// Where training stands when the checkpoint is taken. `epoch` is the epoch to run (or continue) next and
// `step` the number of its batches already done, i.e. the sampler position (DataLoader::from(step)).
struct TrainPosition {
  std::int64_t epoch = 0;
  std::int64_t step = 0;
  std::int64_t global_step = 0;      // optimizer steps taken since the start of training
  std::int64_t scheduler_epoch = 0;  // the LR scheduler's epoch counter
  std::int64_t world_size = 0;       // ranks that wrote it (a mid-epoch position is only valid for the same)
  std::int64_t global_batch = 0;     // samples per step over all ranks
  std::int64_t seed = 0;             // the sampler's shuffle seed
  friend bool operator==(TrainPosition const&, TrainPosition const&) = default;
};

// One parameter as stored: name, shape and values (registration order).
template <class T>
struct ParameterRecord {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<T> values;
};

// Everything a checkpoint holds, in memory.
template <class T>
struct CheckpointData {
  TrainPosition position;
  std::vector<ParameterRecord<T>> parameters;
  optim::OptimizerState<T> optimizer;
  std::string extra;  // the caller's bytes, stored as they are (e.g. MetricsLog::csv())
};

namespace detail {

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
    out_.append(reinterpret_cast<char const*>(v.data()), v.size_bytes());
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
    requires std::is_arithmetic_v<V>
  V get() {
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

inline std::string shape_string(std::vector<std::int64_t> const& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

inline std::string errno_text(int e) { return std::string(std::strerror(e)); }

// Writes bytes to `path` so that a reader sees either the old file or the complete new one, also after a
// crash: a temporary file in the same directory, write, fsync, rename over `path`, fsync the directory.
inline void write_file_atomically(std::filesystem::path const& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  fs::path const dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw IoError(ddp::detail::cat("cannot write checkpoint ", path.string(), ": directory ", dir.string(),
                                   " does not exist"));
  std::string tmpl = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0)
    throw IoError(ddp::detail::cat("cannot write checkpoint ", path.string(), ": creating a temporary file in ",
                                   dir.string(), " failed: ", errno_text(errno)));
  auto fail = [&](std::string_view what) {
    int const e = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmpl.c_str());
    throw IoError(ddp::detail::cat("cannot write checkpoint ", path.string(), ": ", what, " failed: ", errno_text(e)));
  };
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t const w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(ddp::detail::cat("writing ", bytes.size(), " bytes to ", tmpl));
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fchmod(fd, 0644) != 0) fail("fchmod");
  if (::fsync(fd) != 0) fail(ddp::detail::cat("fsync of ", tmpl));
  if (::close(fd) != 0) {
    fd = -1;
    fail(ddp::detail::cat("close of ", tmpl));
  }
  fd = -1;
  if (::rename(tmpl.c_str(), path.c_str()) != 0) fail(ddp::detail::cat("rename ", tmpl, " -> ", path.string()));
  int const dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd < 0) fail(ddp::detail::cat("opening directory ", dir.string(), " to fsync it"));
  int const rc = ::fsync(dfd);
  int const e = errno;
  ::close(dfd);
  if (rc != 0) {
    throw IoError(ddp::detail::cat("checkpoint ", path.string(), " was renamed into place but fsync of directory ",
                                   dir.string(), " failed: ", errno_text(e)));
  }
}

inline std::string read_whole_file(std::filesystem::path const& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw IoError(ddp::detail::cat("checkpoint ", path.string(), " does not exist"));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError(ddp::detail::cat("cannot open checkpoint ", path.string(), ": ", errno_text(errno)));
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw IoError(ddp::detail::cat("error reading checkpoint ", path.string()));
  return bytes;
}

// Packs bytes into int64 words (zero-padded) for collectives, which move int64 but not bytes.
inline std::vector<std::int64_t> to_words(std::string_view s) {
  std::vector<std::int64_t> w((s.size() + 7) / 8, 0);
  if (!s.empty()) std::memcpy(w.data(), s.data(), s.size());
  return w;
}
inline std::string from_words(std::vector<std::int64_t> const& w, std::size_t n) {
  std::string s(n, '\0');
  if (n) std::memcpy(s.data(), w.data(), n);
  return s;
}

// Rank `root` has `status` (0 = ok) and `text` (the bytes on success, the error message otherwise); after
// the call every rank has both. Two broadcasts: (status, size), then the text as int64 words.
template <Communicator C>
void broadcast_outcome(C& comm, int root, std::int64_t& status, std::string& text) {
  std::vector<std::int64_t> head{status, static_cast<std::int64_t>(text.size())};
  comm.broadcast(head, root, CollectiveTag{"checkpoint.status"});
  status = head[0];
  auto words = comm.rank() == root ? to_words(text)
                                   : std::vector<std::int64_t>((static_cast<std::size_t>(head[1]) + 7) / 8);
  if (!words.empty()) comm.broadcast(words, root, CollectiveTag{"checkpoint.bytes"});
  text = from_words(words, static_cast<std::size_t>(head[1]));
}

// Error families a rank's local checkpoint step can end with.
enum class Failure : std::int64_t { kNone = 0, kIo = 1, kArgument = 2 };

[[noreturn]] inline void throw_failure(Failure kind, std::string const& message) {
  if (kind == Failure::kArgument) throw ArgumentError(message);
  throw IoError(message);
}

// Every rank reports its local outcome; if any rank failed, every rank throws the lowest failing rank's
// error (same family, same message, plus which rank reported it). All-reduce + broadcast: never a hang.
template <Communicator C>
void agree_or_throw(C& comm, Failure kind, std::string message) {
  int const me = comm.rank(), n = comm.world_size();
  if (n == 1) {
    if (kind != Failure::kNone) throw_failure(kind, message);
    return;
  }
  std::vector<std::int64_t> first{kind == Failure::kNone ? std::int64_t{n} : std::int64_t{me}};
  comm.all_reduce(first, ReduceOp::kMin, CollectiveTag{"checkpoint.agree"});
  int const root = static_cast<int>(first[0]);
  if (root == n) return;
  auto status = static_cast<std::int64_t>(kind);
  broadcast_outcome(comm, root, status, message);
  throw_failure(static_cast<Failure>(status),
                root == me ? message : ddp::detail::cat(message, " (reported by rank ", root, "; this is rank ", me, ")"));
}

// Runs f() and classifies what it throws.
template <class F>
Failure run_classified(F&& f, std::string& message) {
  try {
    f();
  } catch (ArgumentError const& e) {
    message = e.what();
    return Failure::kArgument;
  } catch (std::exception const& e) {
    message = e.what();
    return Failure::kIo;
  }
  return Failure::kNone;
}

}  // namespace detail

// Serialises a checkpoint (header and payload) into bytes. Deterministic: the same data gives the same bytes.
template <class T>
std::string encode_checkpoint(CheckpointData<T> const& c) {
  using detail::fourcc;
  detail::ByteWriter payload;
  std::uint32_t sections = 0;
  auto section = [&](std::uint32_t tag, auto&& fill) {
    detail::ByteWriter s;
    fill(s);
    payload.put(tag);
    payload.put(std::uint32_t{0});
    payload.put(static_cast<std::uint64_t>(s.bytes().size()));
    payload.bytes() += s.bytes();
    ++sections;
  };
  auto const& p = c.position;
  section(fourcc("META"), [&](detail::ByteWriter& s) {
    std::pair<char const*, std::int64_t> const kv[] = {
        {"epoch", p.epoch},           {"step", p.step},   {"global_step", p.global_step},
        {"scheduler_epoch", p.scheduler_epoch}, {"world_size", p.world_size}, {"global_batch", p.global_batch},
        {"seed", p.seed}};
    s.put(static_cast<std::uint32_t>(std::size(kv)));
    for (auto const& [k, v] : kv) {
      s.put_string(k);
      s.put(v);
    }
  });
  section(fourcc("MODL"), [&](detail::ByteWriter& s) {
    s.put(static_cast<std::uint32_t>(sizeof(T)));
    s.put(static_cast<std::uint32_t>(c.parameters.size()));
    for (auto const& r : c.parameters) {
      s.put_string(r.name);
      s.put(static_cast<std::uint32_t>(r.shape.size()));
      for (auto d : r.shape) s.put(d);
    }
  });
  section(fourcc("PARM"), [&](detail::ByteWriter& s) {
    for (auto const& r : c.parameters) s.put_array(std::span<T const>(r.values));
  });
  section(fourcc("OPTM"), [&](detail::ByteWriter& s) {
    s.put_string(c.optimizer.kind);
    s.put(c.optimizer.lr);
    s.put(static_cast<std::uint32_t>(c.optimizer.counters.size()));
    for (auto v : c.optimizer.counters) s.put(v);
    s.put(static_cast<std::uint32_t>(c.optimizer.buffers.size()));
    for (auto const& b : c.optimizer.buffers) {
      s.put_string(b.name);
      s.put(static_cast<std::uint64_t>(b.data.size()));
      s.put_array(std::span<T const>(b.data));
    }
  });
  if (!c.extra.empty()) section(fourcc("XTRA"), [&](detail::ByteWriter& s) { s.bytes() += c.extra; });
  std::string const& body = payload.bytes();
  detail::ByteWriter h;
  h.bytes().append(kCheckpointMagic, sizeof(kCheckpointMagic));
  h.put(kCheckpointVersion);
  h.put(sections);
  h.put(static_cast<std::uint64_t>(body.size()));
  h.put(detail::crc32_of(body.data(), body.size()));
  h.put(detail::crc32_of(h.bytes().data(), h.bytes().size()));
  return h.bytes() + body;
}

// Parses and validates bytes read from `file` (named in every error): magic, version, header checksum,
// length (truncation), payload checksum (corruption), then each section. Throws IoError.
template <class T>
CheckpointData<T> decode_checkpoint(std::string_view bytes, std::string const& file) {
  using detail::fourcc;
  auto err = [&](auto const&... what) { return IoError(ddp::detail::cat("checkpoint ", file, ": ", what...)); };
  if (bytes.size() < kCheckpointHeaderBytes)
    throw err("truncated: the file has ", bytes.size(), " bytes, less than the ", kCheckpointHeaderBytes,
              "-byte header");
  if (std::memcmp(bytes.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0)
    throw err("wrong magic number: this is not a ddp checkpoint");
  detail::ByteReader h(bytes.substr(8, kCheckpointHeaderBytes - 8), file, "header");
  auto const version = h.get<std::uint32_t>();
  auto const nsections = h.get<std::uint32_t>();
  auto const payload_bytes = h.get<std::uint64_t>();
  auto const payload_crc = h.get<std::uint32_t>();
  auto const header_crc = h.get<std::uint32_t>();
  if (detail::crc32_of(bytes.data(), kCheckpointHeaderBytes - 4) != header_crc)
    throw err("the header's checksum does not match: the file is corrupted");
  if (version != kCheckpointVersion)
    throw err("unsupported version ", version, " (this build reads version ", kCheckpointVersion, ")");
  std::uint64_t const have = bytes.size() - kCheckpointHeaderBytes;
  if (have < payload_bytes)
    throw err("truncated: the header announces ", payload_bytes, " payload bytes but only ", have, " follow it");
  if (have > payload_bytes)
    throw err(have - payload_bytes, " unexpected bytes after the ", payload_bytes, "-byte payload");
  std::string_view const payload = bytes.substr(kCheckpointHeaderBytes);
  if (detail::crc32_of(payload.data(), payload.size()) != payload_crc)
    throw err("checksum mismatch (CRC-32 of the payload): the file is corrupted");

  // Split into sections.
  struct Section {
    std::uint32_t tag;
    std::string_view body;
  };
  std::vector<Section> secs;
  detail::ByteReader r(payload, file, "table");
  for (std::uint32_t i = 0; i < nsections; ++i) {
    auto const tag = r.get<std::uint32_t>();
    r.get<std::uint32_t>();
    auto const len = r.get<std::uint64_t>();
    if (len > r.remaining())
      throw err("section ", detail::fourcc_name(tag), " claims ", len, " bytes but only ", r.remaining(), " remain");
    std::size_t const at = payload.size() - r.remaining();
    secs.push_back({tag, payload.substr(at, len)});
    r.skip(len);
  }
  r.expect_end();
  auto find = [&](char const (&name)[5]) -> detail::ByteReader {
    for (auto const& s : secs)
      if (s.tag == fourcc(name)) return detail::ByteReader(s.body, file, name);
    throw err("required section ", name, " is missing");
  };

  CheckpointData<T> c;
  {
    detail::ByteReader s = find("META");
    auto const n = s.get<std::uint32_t>();
    std::vector<std::pair<std::string, std::int64_t>> kv;
    for (std::uint32_t i = 0; i < n; ++i) {
      auto k = s.get_string();
      kv.emplace_back(std::move(k), s.get<std::int64_t>());
    }
    s.expect_end();
    auto get = [&](char const* key) {
      for (auto const& [k, v] : kv)
        if (k == key) return v;
      throw err("META has no '", key, "' entry");
    };
    auto& p = c.position;
    p = {.epoch = get("epoch"),
         .step = get("step"),
         .global_step = get("global_step"),
         .scheduler_epoch = get("scheduler_epoch"),
         .world_size = get("world_size"),
         .global_batch = get("global_batch"),
         .seed = get("seed")};
  }
  {
    detail::ByteReader s = find("MODL");
    auto const elem = s.get<std::uint32_t>();
    if (elem != sizeof(T))
      throw err("parameters are stored with ", elem, "-byte elements, this model uses ", sizeof(T), "-byte elements");
    auto const n = s.get<std::uint32_t>();
    for (std::uint32_t i = 0; i < n; ++i) {
      ParameterRecord<T> rec;
      rec.name = s.get_string();
      auto const rank = s.get<std::uint32_t>();
      if (rank > 8) throw err("parameter '", rec.name, "' has rank ", rank, " (at most 8 supported)");
      for (std::uint32_t d = 0; d < rank; ++d) rec.shape.push_back(s.get<std::int64_t>());
      c.parameters.push_back(std::move(rec));
    }
    s.expect_end();
  }
  {
    detail::ByteReader s = find("PARM");
    for (auto& rec : c.parameters) {
      std::int64_t numel = 1;
      for (auto d : rec.shape) {
        if (d < 0) throw err("parameter '", rec.name, "' has a negative dimension");
        numel *= d;
      }
      rec.values.resize(static_cast<std::size_t>(numel));
      s.get_array(rec.values.data(), rec.values.size());
    }
    s.expect_end();
  }
  {
    detail::ByteReader s = find("OPTM");
    auto& o = c.optimizer;
    o.kind = s.get_string();
    o.lr = s.get<double>();
    auto const nc = s.get<std::uint32_t>();
    s.need(std::size_t{nc} * 8);
    o.counters.resize(nc);
    s.get_array(o.counters.data(), nc);
    auto const nb = s.get<std::uint32_t>();
    for (std::uint32_t i = 0; i < nb; ++i) {
      typename optim::OptimizerState<T>::Buffer b;
      b.name = s.get_string();
      auto const n = s.get<std::uint64_t>();
      if (n > s.remaining() / sizeof(T)) s.need(n * sizeof(T));
      b.data.resize(n);
      s.get_array(b.data.data(), n);
      o.buffers.push_back(std::move(b));
    }
    s.expect_end();
  }
  for (auto const& sec : secs)
    if (sec.tag == fourcc("XTRA")) c.extra = std::string(sec.body);
  return c;
}

// Writes bytes atomically (temp file, fsync, rename, fsync dir). Single process; see save_checkpoint for ranks.
template <class T>
void write_checkpoint_file(std::filesystem::path const& path, CheckpointData<T> const& c) {
  detail::write_file_atomically(path, encode_checkpoint(c));
}
// Reads and validates a checkpoint file (IoError naming the file on any problem). Single process.
template <class T>
CheckpointData<T> read_checkpoint_file(std::filesystem::path const& path) {
  return decode_checkpoint<T>(detail::read_whole_file(path), path.string());
}

// What an optimizer must offer to be checkpointed (every ddp::optim optimizer does).
template <class O, class T>
concept CheckpointableOptimizer = requires(O& o, O const& co, optim::OptimizerState<T> const& st) {
  { co.state() } -> std::same_as<optim::OptimizerState<T>>;
  o.load_state(st);
};

// The model, optimizer and position as a CheckpointData (host copies of the arena's values).
template <class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
CheckpointData<T> capture_checkpoint(nn::ParameterArena<T, S> const& arena, O const& opt, TrainPosition const& pos,
                                     std::string_view extra = {}) {
  CheckpointData<T> c{.position = pos, .parameters = {}, .optimizer = opt.state(), .extra = std::string(extra)};
  for (auto const& e : arena.entries()) {
    ParameterRecord<T> r{e.name, {}, std::vector<T>(static_cast<std::size_t>(e.numel))};
    for (int d = 0; d < e.shape.rank(); ++d) r.shape.push_back(e.shape[d]);
    Kernels<S>::to_host(e.numel, arena.values().data() + e.offset, r.values.data());
    c.parameters.push_back(std::move(r));
  }
  return c;
}

// Checks that `c` fits this model and optimizer: same parameters (names, shapes, in order), same optimizer
// kind, counter count and buffers (names, sizes). Throws ArgumentError naming the file and the difference.
template <class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
void check_checkpoint_fits(CheckpointData<T> const& c, nn::ParameterArena<T, S> const& arena, O const& opt,
                           std::string const& file) {
  auto err = [&](auto const&... what) {
    return ArgumentError(ddp::detail::cat("checkpoint ", file, " does not fit this model/optimizer: ", what...));
  };
  auto const& es = arena.entries();
  if (c.parameters.size() != es.size())
    throw err("it holds ", c.parameters.size(), " parameters, the model has ", es.size(),
              " (a different --model or architecture?)");
  for (std::size_t i = 0; i < es.size(); ++i) {
    std::vector<std::int64_t> dims;
    for (int d = 0; d < es[i].shape.rank(); ++d) dims.push_back(es[i].shape[d]);
    auto const& r = c.parameters[i];
    if (r.name != es[i].name || r.shape != dims)
      throw err("parameter ", i, " is '", r.name, "' ", detail::shape_string(r.shape), " in the file but '", es[i].name,
                "' ", detail::shape_string(dims), " in the model");
  }
  auto const mine = opt.state();
  auto const& st = c.optimizer;
  if (st.kind != mine.kind)
    throw err("its optimizer state is for '", st.kind, "' but the optimizer is '", mine.kind, "'");
  if (st.counters.size() != mine.counters.size())
    throw err("its ", st.kind, " state has ", st.counters.size(), " parameter counters, expected ",
              mine.counters.size());
  if (st.buffers.size() != mine.buffers.size())
    throw err("its ", st.kind, " state has ", st.buffers.size(), " buffers, expected ", mine.buffers.size());
  for (std::size_t b = 0; b < st.buffers.size(); ++b)
    if (st.buffers[b].name != mine.buffers[b].name || st.buffers[b].data.size() != mine.buffers[b].data.size())
      throw err(st.kind, " buffer ", b, " is '", st.buffers[b].name, "' with ", st.buffers[b].data.size(),
                " elements, expected '", mine.buffers[b].name, "' with ", mine.buffers[b].data.size());
}

// Copies a validated checkpoint into the arena's values and the optimizer.
template <class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
void restore_checkpoint(CheckpointData<T> const& c, nn::ParameterArena<T, S>& arena, O& opt) {
  auto const& es = arena.entries();
  for (std::size_t i = 0; i < es.size(); ++i)
    Kernels<S>::from_host(es[i].numel, c.parameters[i].values.data(), arena.values().data() + es[i].offset);
  opt.load_state(c.optimizer);
}

// Collective (every rank calls it): rank 0 captures the model and optimizer and writes `path` atomically;
// the outcome is agreed on, so a failed write throws the same IoError on every rank. `extra` (rank 0's) is
// stored as it is and handed back by load_checkpoint. Other ranks' state is
// not read: under DDP it equals rank 0's (bitwise, for the threads and MPI backends).
template <Communicator C, class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
void save_checkpoint(std::filesystem::path const& path, C& comm, nn::ParameterArena<T, S> const& arena, O const& opt,
                     TrainPosition const& pos, std::string_view extra = {}) {
  std::string message;
  auto const kind = comm.rank() != 0 ? detail::Failure::kNone : detail::run_classified([&] {
    write_checkpoint_file(path, capture_checkpoint(arena, opt, pos, extra));
  }, message);
  detail::agree_or_throw(comm, kind, message);
}

// Collective (every rank calls it): rank 0 reads `path` and checks its container (truncation, magic,
// version, checksums); the bytes or the error are broadcast; every rank then decodes them and checks that
// they fit its model and optimizer; only when all ranks agree are parameters and optimizer state restored.
// Any failure throws the same error on every rank (IoError for a bad file, ArgumentError for a model or
// optimizer mismatch), never a hang. Returns the training position stored in the file; `extra`, when given,
// receives the bytes save_checkpoint stored (empty if none).
template <Communicator C, class T, MemorySpace S, class O>
  requires CheckpointableOptimizer<O, T>
TrainPosition load_checkpoint(std::filesystem::path const& path, C& comm, nn::ParameterArena<T, S>& arena, O& opt,
                              std::string* extra = nullptr) {
  std::string const file = path.string();
  std::string text;
  auto kind = detail::Failure::kNone;
  if (comm.rank() == 0) {
    kind = detail::run_classified([&] {
      text = detail::read_whole_file(path);
      (void)decode_checkpoint<T>(text, file);  // container checks once, before shipping the bytes
    }, text);
  }
  if (comm.world_size() > 1) {
    auto status = static_cast<std::int64_t>(kind);
    detail::broadcast_outcome(comm, 0, status, text);
    kind = static_cast<detail::Failure>(status);
  }
  if (kind != detail::Failure::kNone)
    detail::throw_failure(kind, comm.rank() == 0 ? text : ddp::detail::cat(text, " (read by rank 0; this is rank ",
                                                                          comm.rank(), ")"));
  CheckpointData<T> c;
  std::string message;
  kind = detail::run_classified([&] {
    c = decode_checkpoint<T>(text, file);
    check_checkpoint_fits(c, arena, opt, file);
  }, message);
  detail::agree_or_throw(comm, kind, message);
  restore_checkpoint(c, arena, opt);
  if (extra) *extra = std::move(c.extra);
  return c.position;
}

}  // namespace ddp
