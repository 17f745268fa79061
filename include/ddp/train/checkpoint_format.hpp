// Checkpoint file format: the in-memory record (position, parameters, buffers, optimizer state, random
// generators) and its versioned, checksummed byte encoding. Pure functions of bytes; files and ranks are
// checkpoint.hpp's business (checkpoint_file.hpp, checkpoint_agree.hpp). The byte layer is checkpoint_bytes.hpp,
// the optimizer and local-rounds sections checkpoint_sections.hpp.
#pragma once

#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ddp/data/metrics.hpp"
#include "ddp/error.hpp"
#include "ddp/optim/grad_scaler.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/parallel/local_state.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/train/checkpoint_bytes.hpp"
#include "ddp/train/checkpoint_sections.hpp"

namespace ddp {

static_assert(std::endian::native == std::endian::little,
              "ddp checkpoints are little-endian and written by memcpy; add byte swapping for this platform");

// File layout (all integers little-endian). Everything is stored per parameter / buffer / generator by name
// and shape, never in an arena's layout: a checkpoint loads into any bucket plan and any world size.
//   header (32 bytes): magic "DDPCKPT\0" | u32 version | u32 section count | u64 payload bytes |
//                      u32 CRC-32 of the payload | u32 CRC-32 of the header's first 28 bytes
//   payload: sections, each u32 tag (four characters) | u32 0 | u64 length | length bytes
//     META  u32 n, then n × (string key, i64 value): the TrainPosition fields and "element_bytes" (sizeof T)
//     PARM  tensors: the model's parameters (frozen ones included), registration order
//     BUFS  tensors: the model's buffers (BatchNorm running statistics), registration order
//     OPTM  string kind, f64 lr, u32 b, b × string buffer name, u32 n,
//           n × (string name, shape, i64 steps, b × numel elements): per trainable parameter
//     RNGS  u32 g, g × string name, u32 ranks, ranks × g × (u64 state, u64 inc, f64 spare, u64 has_spare):
//           every rank's generators (Dropout), rank-major
//     XTRA  optional: the caller's opaque bytes (e.g. the metrics so far); absent when empty
//     SCAL  optional: the trainer's GradScaler: f64 scale, i64 growth tracker; absent without loss scaling
//     WIRE  optional: what the gradient wire carries between rounds (PowerSGD): string kind, u32 l, l × i64 layout,
//           u32 c, c × i64 counters, u32 ranks, u64 v, ranks × v elements (each rank's values, rank-major);
//           absent for a wire without state
//     ELOS  optional: the epoch's train loss so far, taken mid-epoch: u32 ranks, ranks × (i64 correct, i64 total,
//           f64 loss sum, f64 exact total, i64 exact count) (EpochLoss). Files written before 2026-12 have LOSS
//           instead, the same with an f64 step loss sum and an i64 step count first (read, those two dropped)
//     LOCL  optional: LocalSgd's or DiLoCo's replicas (LocalRoundsState): string kind, i64 replicas, i64 steps,
//           i64 syncs, i64 bytes, u32 p, p × (string name, i64 numel), u32 r, r × (p value arrays, optimizer state
//           as OPTM's), u32 k (0 or p) and k value arrays (DiLoCo's kept copy), u32 m (0 or p) and m arrays (its
//           momentum)
//   tensors: u32 n, n × (string name, shape, numel elements); shape: u32 rank, rank × i64 dims;
//   strings: u32 length + bytes. Unknown sections are skipped (a reader of version 2 ignores additions).
// Version 1 (until 2026-11) kept the optimizer's state as flat buffers in the writer's arena layout, which
// depends on the bucket plan; it is refused with a message (its state cannot be mapped back reliably).
inline constexpr char kCheckpointMagic[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '\0'};
inline constexpr std::uint32_t kCheckpointVersion = 2;
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

// The position a run resumes from: `saved` (read from checkpoint `file`) with this run's world size, global
// batch and seed (taken from `run`; its other fields are ignored), so that the run's next checkpoint describes
// itself. At an epoch boundary (saved.step == 0) anything may change. Mid-epoch, the sampler position must
// mean the same samples: global step s of an epoch takes positions [s·B, (s+1)·B) of the epoch's shuffled
// order on any world size (rank r has positions r, r + W, ...), so the global batch B and the seed must match
// (ArgumentError naming the file, the step and both values); the world size (and the bucket plan) may change.
inline TrainPosition resume_position(TrainPosition saved, TrainPosition const& run, std::string_view file) {
  if (saved.step > 0 && (saved.global_batch != run.global_batch || saved.seed != run.seed))
    throw ArgumentError(detail::cat("checkpoint ", file, " was taken at step ", saved.step,
                                    " of an epoch with global batch ", saved.global_batch, " and seed ", saved.seed,
                                    "; resuming mid-epoch needs the same two (this run: ", run.global_batch, ", ",
                                    run.seed, ")"));
  saved.world_size = run.world_size;
  saved.global_batch = run.global_batch;
  saved.seed = run.seed;
  return saved;
}

// One parameter or buffer as stored: name, shape and values.
template <class T>
struct TensorRecord {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<T> values;
  friend bool operator==(TensorRecord const&, TensorRecord const&) = default;
};
template <class T>
using ParameterRecord = TensorRecord<T>;

// The model's random generators on every rank that wrote the checkpoint: ranks[r][g] is rank r's generator
// names[g]. Ranks draw different streams (Dropout seeded with seed + rank), so each rank keeps its own.
struct GeneratorRecords {
  std::vector<std::string> names;
  std::vector<std::vector<GeneratorState>> ranks;
  friend bool operator==(GeneratorRecords const&, GeneratorRecords const&) = default;
};

// The gradient wire's state on every rank that wrote the checkpoint (WireState, bucket/wire.hpp, per rank):
// kind, layout and counters are the same on every rank; ranks[r] is rank r's values. Empty kind: none.
template <class T>
struct WireRecords {
  std::string kind{};
  std::vector<std::int64_t> layout{};
  std::vector<std::int64_t> counters{};
  std::vector<std::vector<T>> ranks{};
  friend bool operator==(WireRecords const&, WireRecords const&) = default;
};

// Everything a checkpoint holds, in memory.
template <class T>
struct CheckpointData {
  // Every member has a default initializer, so a designated initializer may name any subset of them
  // (GCC's -Wextra warns about omitted members that have none).
  TrainPosition position{};
  std::vector<TensorRecord<T>> parameters{};  // the model's named_parameters() (each shared one once)
  std::vector<TensorRecord<T>> buffers{};     // the model's named_buffers()
  optim::OptimizerState<T> optimizer{};
  GeneratorRecords generators{};
  std::string extra{};  // the caller's bytes, stored as they are (e.g. MetricsLog::csv())
  std::optional<optim::GradScalerState> loss_scale{};  // the trainer's GradScaler, under loss scaling
  WireRecords<T> wire{};                               // the gradient wire's state (PowerSGD), when it keeps one
  std::vector<EpochLoss> epoch_loss{};                 // every rank's share of the epoch's loss (mid-epoch only)
  std::optional<LocalRoundsState<T>> local{};          // LocalSgd's or DiLoCo's replicas and counters
};

namespace detail {

using optim::detail::shape_string;

template <class T>
void put_tensors(ByteWriter& s, std::vector<TensorRecord<T>> const& ts) {
  s.put(static_cast<std::uint32_t>(ts.size()));
  for (auto const& t : ts) {
    s.put_string(t.name);
    put_shape(s, t.shape);
    s.put_array(std::span<T const>(t.values));
  }
}

template <class T>
std::vector<TensorRecord<T>> get_tensors(ByteReader& r, char const* kind) {
  std::vector<TensorRecord<T>> ts;
  auto const n = r.get<std::uint32_t>();
  r.need_elements(n, 8, ddp::detail::cat(kind, " count"));  // each record: at least a name length and a rank
  ts.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    TensorRecord<T> t;
    t.name = r.get_string();
    auto const what = ddp::detail::cat(kind, " '", t.name, "'");
    auto const numel = get_shape(r, t.shape, what);
    get_values(r, t.values, numel, ddp::detail::cat(what, " ", shape_string(t.shape), " values"));
    ts.push_back(std::move(t));
  }
  r.expect_end();
  return ts;
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
    std::pair<char const*, std::int64_t> const kv[] = {{"epoch", p.epoch},
                                                       {"step", p.step},
                                                       {"global_step", p.global_step},
                                                       {"scheduler_epoch", p.scheduler_epoch},
                                                       {"world_size", p.world_size},
                                                       {"global_batch", p.global_batch},
                                                       {"seed", p.seed},
                                                       {"element_bytes", static_cast<std::int64_t>(sizeof(T))}};
    s.put(static_cast<std::uint32_t>(std::size(kv)));
    for (auto const& [k, v] : kv) {
      s.put_string(k);
      s.put(v);
    }
  });
  section(fourcc("PARM"), [&](detail::ByteWriter& s) { detail::put_tensors(s, c.parameters); });
  section(fourcc("BUFS"), [&](detail::ByteWriter& s) { detail::put_tensors(s, c.buffers); });
  section(fourcc("OPTM"), [&](detail::ByteWriter& s) { detail::put_optimizer_state(s, c.optimizer); });
  section(fourcc("RNGS"), [&](detail::ByteWriter& s) {
    auto const& g = c.generators;
    s.put(static_cast<std::uint32_t>(g.names.size()));
    for (auto const& n : g.names) s.put_string(n);
    s.put(static_cast<std::uint32_t>(g.ranks.size()));
    for (auto const& rank : g.ranks) {
      if (rank.size() != g.names.size())
        throw ArgumentError(ddp::detail::cat("checkpoint: a rank has ", rank.size(), " generator states for ",
                                             g.names.size(), " generator names"));
      for (auto const& st : rank) {
        s.put(st.state);
        s.put(st.inc);
        s.put(st.spare);
        s.put(static_cast<std::uint64_t>(st.has_spare));
      }
    }
  });
  if (!c.extra.empty()) section(fourcc("XTRA"), [&](detail::ByteWriter& s) { s.bytes() += c.extra; });
  if (c.loss_scale)
    section(fourcc("SCAL"), [&](detail::ByteWriter& s) {
      s.put(c.loss_scale->scale);
      s.put(c.loss_scale->growth_tracker);
    });
  if (!c.epoch_loss.empty())
    section(fourcc("ELOS"), [&](detail::ByteWriter& s) {
      s.put(static_cast<std::uint32_t>(c.epoch_loss.size()));
      for (auto const& l : c.epoch_loss) {
        s.put(l.train.correct);
        s.put(l.train.total);
        s.put(l.train.loss_sum);
        s.put(l.exact_total);
        s.put(l.exact_count);
      }
    });
  if (!c.wire.kind.empty())
    section(fourcc("WIRE"), [&](detail::ByteWriter& s) {
      auto const& w = c.wire;
      s.put_string(w.kind);
      for (auto const* v : {&w.layout, &w.counters}) {
        s.put(static_cast<std::uint32_t>(v->size()));
        for (auto x : *v) s.put(x);
      }
      std::size_t const per = w.ranks.empty() ? 0 : w.ranks[0].size();
      s.put(static_cast<std::uint32_t>(w.ranks.size()));
      s.put(static_cast<std::uint64_t>(per));
      for (auto const& r : w.ranks) {
        if (r.size() != per)
          throw ArgumentError(ddp::detail::cat("checkpoint: the ", w.kind, " wire state has ", r.size(),
                                               " values on one rank and ", per, " on rank 0"));
        s.put_array(std::span<T const>(r));
      }
    });
  if (c.local) section(fourcc("LOCL"), [&](detail::ByteWriter& s) { detail::put_local_state(s, *c.local); });
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

// What the 32-byte header says, once validated.
struct CheckpointHeader {
  std::uint32_t version = 0;
  std::uint32_t sections = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t payload_crc = 0;
};

namespace detail {

// Validates a checkpoint's header (the first min(32, file size) bytes of `head`) against the file's size
// `file_bytes`: magic, header checksum, version, and that the payload length it announces is what follows.
// Lets a reader reject a file after reading 32 bytes of it. Throws IoError naming `file`.
inline CheckpointHeader check_checkpoint_header(std::string_view head, std::uint64_t file_bytes,
                                                std::string const& file) {
  auto err = [&](auto const&... what) { return IoError(ddp::detail::cat("checkpoint ", file, ": ", what...)); };
  if (file_bytes < kCheckpointHeaderBytes || head.size() < kCheckpointHeaderBytes) {
    if (head.size() >= sizeof(kCheckpointMagic) && std::memcmp(head.data(), kCheckpointMagic, 8) != 0)
      throw err("wrong magic number: this is not a ddp checkpoint");
    throw err("truncated: the file has ", file_bytes, " bytes, less than the ", kCheckpointHeaderBytes, "-byte header");
  }
  if (std::memcmp(head.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0)
    throw err("wrong magic number: this is not a ddp checkpoint");
  ByteReader h(head.substr(8, kCheckpointHeaderBytes - 8), file, "header");
  CheckpointHeader out;
  out.version = h.get<std::uint32_t>();
  out.sections = h.get<std::uint32_t>();
  out.payload_bytes = h.get<std::uint64_t>();
  out.payload_crc = h.get<std::uint32_t>();
  auto const header_crc = h.get<std::uint32_t>();
  if (crc32_of(head.data(), kCheckpointHeaderBytes - 4) != header_crc)
    throw err("the header's checksum does not match: the file is corrupted");
  if (out.version == 1)
    throw err("format version 1 is no longer read (this build reads version ", kCheckpointVersion,
              "): version 1 stored the optimizer state in the writing run's bucket layout, which cannot be mapped "
              "back to parameters reliably; resume from a checkpoint written by this version, or start over");
  if (out.version != kCheckpointVersion)
    throw err("unsupported version ", out.version, " (this build reads version ", kCheckpointVersion, ")");
  std::uint64_t const have = file_bytes - kCheckpointHeaderBytes;
  if (have < out.payload_bytes)
    throw err("truncated: the header announces ", out.payload_bytes, " payload bytes but only ", have, " follow it");
  if (have > out.payload_bytes)
    throw err(have - out.payload_bytes, " unexpected bytes after the ", out.payload_bytes, "-byte payload");
  return out;
}

}  // namespace detail

// Parses and validates bytes read from `file` (named in every error): magic, version, header checksum,
// length (truncation), payload checksum (corruption), then each section: every count and length is checked
// against the bytes that remain before anything is allocated for it, counters (epochs, steps) must lie in
// [0, 2^53], the learning rate must be finite in [0, 1e6]. Throws IoError; never reads out of bounds, and
// allocates at most a bounded multiple of bytes.size() (under 30×, e.g. optimizer entries of empty tensors)
// plus 24 MiB (2^20 ranks without generators). The same code reads files (read_checkpoint_file) and bytes from
// anywhere else (the fuzzer, a broadcast).
template <class T>
CheckpointData<T> decode_checkpoint(std::string_view bytes, std::string const& file) {
  using detail::fourcc;
  auto err = [&](auto const&... what) { return IoError(ddp::detail::cat("checkpoint ", file, ": ", what...)); };
  auto const header = detail::check_checkpoint_header(bytes.substr(0, kCheckpointHeaderBytes), bytes.size(), file);
  std::uint32_t const nsections = header.sections;
  std::string_view const payload = bytes.substr(kCheckpointHeaderBytes);
  if (detail::crc32_of(payload.data(), payload.size()) != header.payload_crc)
    throw err("checksum mismatch (CRC-32 of the payload): the file is corrupted");

  // Split into sections.
  struct Section {
    std::uint32_t tag;
    std::string_view body;
  };
  std::vector<Section> secs;
  std::unordered_set<std::uint32_t> tags;
  detail::ByteReader r(payload, file, "table");
  r.need_elements(nsections, 16, "section count");  // each section has a 16-byte head
  for (std::uint32_t i = 0; i < nsections; ++i) {
    auto const tag = r.get<std::uint32_t>();
    if (auto const reserved = r.get<std::uint32_t>(); reserved != 0)
      throw err("section ", detail::fourcc_name(tag), " has ", reserved, " in its reserved field (must be 0)");
    auto const len = r.get<std::uint64_t>();
    if (len > r.remaining())
      throw err("section ", detail::fourcc_name(tag), " claims ", len, " bytes but only ", r.remaining(), " remain");
    if (!tags.insert(tag).second) throw err("section ", detail::fourcc_name(tag), " appears twice");
    std::size_t const at = payload.size() - r.remaining();
    secs.push_back({tag, payload.substr(at, len)});
    r.skip(len);
  }
  r.expect_end();
  auto find = [&](char const(&name)[5]) -> detail::ByteReader {
    for (auto const& s : secs)
      if (s.tag == fourcc(name)) return detail::ByteReader(s.body, file, name);
    throw err("required section ", name, " is missing");
  };
  auto has = [&](char const(&name)[5]) { return tags.contains(fourcc(name)); };

  CheckpointData<T> c;
  {
    detail::ByteReader s = find("META");
    auto const n = s.get<std::uint32_t>();
    s.need_elements(n, 12, "entry count");  // each entry: a string length and a value
    std::unordered_map<std::string, std::int64_t> kv;
    for (std::uint32_t i = 0; i < n; ++i) {
      auto k = s.get_string();
      auto const v = s.get<std::int64_t>();
      if (!kv.emplace(k, v).second) s.fail("entry '", k, "' appears twice");
    }
    s.expect_end();
    auto raw = [&](char const* key) {
      if (auto const it = kv.find(key); it != kv.end()) return it->second;
      throw err("META has no '", key, "' entry");
    };
    auto get = [&](char const* key, std::int64_t max = kCheckpointMaxCounter) {
      return detail::checked_count(s, ddp::detail::cat("'", key, "'"), raw(key), max);
    };
    auto const elem = get("element_bytes", 16);
    if (elem != static_cast<std::int64_t>(sizeof(T)))
      throw err("values are stored with ", elem, "-byte elements, this model uses ", sizeof(T), "-byte elements");
    c.position = {.epoch = get("epoch"),
                  .step = get("step"),
                  .global_step = get("global_step"),
                  .scheduler_epoch = get("scheduler_epoch"),
                  .world_size = get("world_size", kCheckpointMaxRanks),
                  .global_batch = get("global_batch"),
                  .seed = raw("seed")};  // any value is a seed
  }
  {
    detail::ByteReader s = find("PARM");
    c.parameters = detail::get_tensors<T>(s, "parameter");
  }
  {
    detail::ByteReader s = find("BUFS");
    c.buffers = detail::get_tensors<T>(s, "buffer");
  }
  {
    detail::ByteReader s = find("OPTM");
    c.optimizer = detail::get_optimizer_state<T>(s);
    s.expect_end();
  }
  {
    detail::ByteReader s = find("RNGS");
    auto& g = c.generators;
    auto const ng = s.get<std::uint32_t>();
    s.need_elements(ng, 4, "generator count");
    for (std::uint32_t i = 0; i < ng; ++i) g.names.push_back(s.get_string());
    auto const nr = detail::checked_count(s, "the number of ranks", s.get<std::uint32_t>(), kCheckpointMaxRanks);
    s.need_elements(static_cast<std::uint64_t>(nr) * ng, 32, "generator states (ranks × generators)");
    g.ranks.resize(nr);
    for (auto& rank : g.ranks)
      for (std::uint32_t i = 0; i < ng; ++i) {
        GeneratorState st;
        st.state = s.get<std::uint64_t>();
        st.inc = s.get<std::uint64_t>();
        st.spare = s.get<double>();
        auto const has_spare = s.get<std::uint64_t>();
        if (has_spare > 1 || (has_spare == 1 && !std::isfinite(st.spare)))
          s.fail("generator '", g.names[i], "' has a bad spare normal value (has_spare = ", has_spare,
                 ", spare = ", st.spare, ")");
        st.has_spare = has_spare == 1;
        rank.push_back(st);
      }
    s.expect_end();
  }
  for (auto const& sec : secs)
    if (sec.tag == fourcc("XTRA")) c.extra = std::string(sec.body);
  if (has("SCAL")) {
    detail::ByteReader s = find("SCAL");
    optim::GradScalerState st{.scale = s.get<double>(), .growth_tracker = s.get<std::int64_t>()};
    if (!(std::isfinite(st.scale) && st.scale > 0) || st.growth_tracker < 0)
      s.fail("loss scale ", st.scale, " with growth tracker ", st.growth_tracker,
             " (the scale must be positive and finite, the tracker >= 0)");
    s.expect_end();
    c.loss_scale = st;
  }
  if (has("ELOS") || has("LOSS")) {
    bool const old = !has("ELOS");  // LOSS: two leading step fields, no longer kept
    detail::ByteReader s = find(old ? "LOSS" : "ELOS");
    auto const nr = detail::checked_count(s, "the number of ranks", s.get<std::uint32_t>(), kCheckpointMaxRanks);
    s.need_elements(nr, old ? 56 : 40, "epoch loss records");
    for (std::int64_t rank = 0; rank < nr; ++rank) {
      EpochLoss l;
      if (old && (!std::isfinite(s.get<double>()) || s.get<std::int64_t>() < 0))
        s.fail("rank ", rank, "'s step loss sum or step count is invalid");
      l.train.correct = detail::checked_count(s, "correct", s.get<std::int64_t>());
      l.train.total = detail::checked_count(s, "total", s.get<std::int64_t>());
      l.train.loss_sum = s.get<double>();
      l.exact_total = s.get<double>();
      l.exact_count = detail::checked_count(s, "exact count", s.get<std::int64_t>());
      if (!std::isfinite(l.train.loss_sum) || !std::isfinite(l.exact_total))
        s.fail("rank ", rank, "'s epoch loss is not finite");
      c.epoch_loss.push_back(l);
    }
    s.expect_end();
  }
  if (has("WIRE")) {
    detail::ByteReader s = find("WIRE");
    auto& w = c.wire;
    w.kind = s.get_string();
    if (w.kind.empty()) s.fail("the wire state has no kind");
    for (auto [v, what] : {std::pair{&w.layout, "layout"}, std::pair{&w.counters, "counters"}}) {
      auto const n = s.get<std::uint32_t>();
      s.need_elements(n, 8, ddp::detail::cat("the wire state's ", what));
      v->resize(n);
      for (auto& x : *v) x = s.get<std::int64_t>();
    }
    auto const nr = detail::checked_count(s, "the number of ranks", s.get<std::uint32_t>(), kCheckpointMaxRanks);
    auto const per = s.get<std::uint64_t>();
    if (nr == 0) s.fail("the wire state is held by no rank");
    s.need_elements(per, sizeof(T), "the wire state's values per rank");
    s.need_elements(static_cast<std::uint64_t>(nr) * per, sizeof(T), "the wire state's values");
    w.ranks.resize(static_cast<std::size_t>(nr));
    for (auto& values : w.ranks) {
      values.resize(static_cast<std::size_t>(per));
      s.get_array(values.data(), values.size());
    }
    s.expect_end();
  }
  if (has("LOCL")) {
    detail::ByteReader s = find("LOCL");
    c.local = detail::get_local_state<T>(s);
    s.expect_end();
  }
  return c;
}

}  // namespace ddp
