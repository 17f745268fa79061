// Character-level text for GPT training (nanoGPT's shakespeare_char): the vocabulary, the train/val split, and
// block batches drawn by a counter-based RNG so that every rank and every world size sees the same batches.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::data {

namespace detail {
using ddp::detail::cat;

// "'a' (0x61)", "'\n' (0x0A)", or "0xC3" for a byte that is not printable ASCII: how errors show a character.
inline std::string describe_byte(unsigned char c) {
  char buf[16];
  if (c == '\n')
    std::snprintf(buf, sizeof buf, "'\\n' (0x0A)");
  else if (c == '\t')
    std::snprintf(buf, sizeof buf, "'\\t' (0x09)");
  else if (c == '\r')
    std::snprintf(buf, sizeof buf, "'\\r' (0x0D)");
  else if (c >= 0x20 && c < 0x7F)
    std::snprintf(buf, sizeof buf, "'%c' (0x%02X)", c, c);
  else
    std::snprintf(buf, sizeof buf, "0x%02X", c);
  return buf;
}

// The high 64 bits of the 128-bit product a·b (portable; no __int128).
constexpr std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t const a_lo = a & 0xffffffffu, a_hi = a >> 32, b_lo = b & 0xffffffffu, b_hi = b >> 32;
  std::uint64_t const lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
  std::uint64_t const cross = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
  return hi_hi + (hi_lo >> 32) + (cross >> 32);
}

// Keeps the batcher's draws apart from other counter_u32 users with the same seed (dropout masks).
inline constexpr std::uint64_t kBlockBatcherStream = 0x7465787442617463ULL;  // "textBatc"

// Uniform in [0, bound), exactly (Lemire's multiply-shift with rejection, on 64-bit words), as a pure function
// of (seed, step, index): the k-th 64-bit word is counter_u32 elements 2k and 2k+1. A rejection happens with
// probability below bound / 2^64, so one word almost always suffices.
constexpr std::uint64_t counter_below(std::uint64_t seed, std::uint64_t step, std::int64_t index,
                                      std::uint64_t bound) noexcept {
  std::uint64_t const threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (std::int64_t k = 0;; ++k) {
    std::uint64_t const hi = ddp::detail::counter_u32(seed, step, index, 2 * k);
    std::uint64_t const lo = ddp::detail::counter_u32(seed, step, index, 2 * k + 1);
    std::uint64_t const r = (hi << 32) | lo;
    if (r * bound >= threshold) return mulhi64(r, bound);
  }
}
}  // namespace detail

// The sorted set of the distinct bytes of a text (as nanoGPT's shakespeare_char: `chars = sorted(set(data))`);
// id i stands for chars()[i]. Bytes, not Unicode code points: a multi-byte UTF-8 character is several ids.
// Immutable after construction; const members are safe to call from any number of threads.
class CharVocab {
 public:
  CharVocab() { index_.fill(-1); }
  explicit CharVocab(std::string_view text) {
    std::array<bool, 256> seen{};
    for (char c : text) seen[static_cast<unsigned char>(c)] = true;
    index_.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (seen[static_cast<std::size_t>(b)]) {
        index_[static_cast<std::size_t>(b)] = static_cast<std::int16_t>(chars_.size());
        chars_.push_back(static_cast<char>(b));
      }
  }

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(chars_.size()); }
  // The vocabulary in id order (ascending byte values).
  std::string const& chars() const noexcept { return chars_; }

  // The ids of `text`'s bytes. A byte outside the vocabulary is an ArgumentError naming it and its position.
  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
      auto const c = static_cast<unsigned char>(text[i]);
      std::int16_t const id = index_[c];
      if (id < 0)
        throw ArgumentError(detail::cat("CharVocab::encode: character ", detail::describe_byte(c), " at position ", i,
                                        " is not in the vocabulary of ", size(),
                                        " characters (built from another text?)"));
      ids[i] = id;
    }
    return ids;
  }

  // The text of `ids`. An id outside [0, size()) is an ArgumentError naming it and its position.
  std::string decode(std::span<std::int32_t const> ids) const {
    std::string text(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= size())
        throw ArgumentError(
            detail::cat("CharVocab::decode: id ", ids[i], " at position ", i, " is out of range [0, ", size(), ")"));
      text[i] = chars_[static_cast<std::size_t>(ids[i])];
    }
    return text;
  }

  friend bool operator==(CharVocab const& a, CharVocab const& b) noexcept { return a.chars_ == b.chars_; }

 private:
  std::string chars_;
  std::array<std::int16_t, 256> index_;  // byte -> id, -1 when absent
};

// nanoGPT's split: n = len(data); train = data[:int(n * (1 - val_fraction))], val = the rest.
struct TextCorpusOptions {
  double val_fraction = 0.1;    // in (0, 1); 0.1 gives nanoGPT's 90/10 split exactly (1 - 0.1 == 0.9 in double)
  std::int64_t block_size = 0;  // when > 0, each split must hold at least block_size + 1 characters (one block
                                // and its shifted targets); when 0, each split must be non-empty
};

// A text file as token ids: the vocabulary of the whole file, the first (1 - val_fraction) of the ids for
// training and the rest for validation. Immutable after loading; const members are thread-safe. Moving a corpus
// keeps its token buffer (spans from train()/val() stay valid); copying makes a new one.
class TextCorpus {
 public:
  // Reads the whole file. A missing, unreadable or empty file, or one too short for the split, is an IoError
  // naming the path; a bad option is an ArgumentError naming it.
  static TextCorpus load(std::filesystem::path const& path, TextCorpusOptions const& opts = {}) {
    check(opts);
    std::string const name = path.string();
    std::error_code ec;
    auto const st = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(st))
      throw IoError(detail::cat("TextCorpus::load: ", name, ": cannot open: no such file"));
    if (std::filesystem::is_directory(st))
      throw IoError(detail::cat("TextCorpus::load: ", name, ": cannot open: is a directory, not a text file"));
    std::ifstream f(path, std::ios::binary);
    if (!f) throw IoError(detail::cat("TextCorpus::load: ", name, ": cannot open (permissions?)"));
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (f.bad()) throw IoError(detail::cat("TextCorpus::load: ", name, ": read error"));
    if (text.empty())
      throw IoError(detail::cat("TextCorpus::load: ", name, ": the file is empty; a text corpus needs characters"));
    return build<IoError>(std::move(text), path, opts);
  }

  // A corpus of in-memory text (`name` stands for it in errors and path()); failures are ArgumentErrors.
  static TextCorpus from_text(std::string text, TextCorpusOptions const& opts = {},
                              std::filesystem::path name = "<text>") {
    check(opts);
    if (text.empty()) throw ArgumentError(detail::cat("TextCorpus::from_text: ", name.string(), ": the text is empty"));
    return build<ArgumentError>(std::move(text), std::move(name), opts);
  }

  CharVocab const& vocab() const noexcept { return vocab_; }
  std::filesystem::path const& path() const noexcept { return path_; }
  // Every token id of the file, train() then val().
  std::span<std::int32_t const> tokens() const noexcept { return ids_; }
  std::span<std::int32_t const> train() const noexcept { return tokens().first(static_cast<std::size_t>(n_train_)); }
  std::span<std::int32_t const> val() const noexcept { return tokens().subspan(static_cast<std::size_t>(n_train_)); }
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(ids_.size()); }

  friend std::ostream& operator<<(std::ostream& os, TextCorpus const& c) {
    return os << "TextCorpus{" << c.path_.string() << ": " << c.size() << " characters, vocabulary " << c.vocab_.size()
              << ", train " << c.train().size() << ", val " << c.val().size() << "}";
  }

 private:
  static void check(TextCorpusOptions const& opts) {
    if (!(opts.val_fraction > 0 && opts.val_fraction < 1))
      throw ArgumentError(
          detail::cat("TextCorpusOptions::val_fraction ", opts.val_fraction, " must lie in (0, 1) (nanoGPT: 0.1)"));
    if (opts.block_size < 0)
      throw ArgumentError(detail::cat("TextCorpusOptions::block_size ", opts.block_size, " is negative"));
  }

  template <class E>
  static TextCorpus build(std::string text, std::filesystem::path path, TextCorpusOptions const& opts) {
    auto const n = static_cast<std::int64_t>(text.size());
    // int(n * 0.9) in Python: the product in double, truncated.
    auto const n_train = static_cast<std::int64_t>(static_cast<double>(n) * (1.0 - opts.val_fraction));
    std::int64_t const need = opts.block_size > 0 ? opts.block_size + 1 : 1;
    if (n_train < need || n - n_train < need)
      throw E(detail::cat("TextCorpus: ", path.string(), ": ", n, " characters split into ", n_train, " train and ",
                          n - n_train, " validation characters (val_fraction ", opts.val_fraction,
                          "), but each split needs at least ", need,
                          opts.block_size > 0 ? detail::cat(" (block_size ", opts.block_size, " + 1)") : std::string(),
                          "; use a longer text or a smaller block_size"));
    TextCorpus c;
    c.vocab_ = CharVocab(text);
    c.ids_ = c.vocab_.encode(text);
    c.n_train_ = n_train;
    c.path_ = std::move(path);
    return c;
  }

  CharVocab vocab_;
  std::vector<std::int32_t> ids_;
  std::int64_t n_train_ = 0;
  std::filesystem::path path_;
};

struct BlockBatcherOptions {
  std::int64_t block_size = 0;  // T, the context length (required; nanoGPT's shakespeare_char CPU recipe: 64)
  std::uint64_t seed = 0;
};

// One batch of blocks: x (B, T) holds the token ids as float values (exact below 2^24; the embedding layer reads
// them), y (B, T) the next-token targets, y[b][t] = x[b][t + 1] of the same text.
struct TokenBatch {
  Tensor<float> x;
  Tensor<std::int32_t> y;
  std::int64_t size() const { return x.size(0); }
};

// nanoGPT's get_batch over a token span: sequence b starts at a uniform offset in [0, n - T) and holds tokens
// [o, o + T) with targets [o + 1, o + T + 1). Offset `index` of step `step` is a pure function of (seed, step,
// index) (detail::counter_below, exactly uniform): bitwise identical on every rank, run and world size, and
// independent of call order, so rank r of R may take indices [r·B/R, (r+1)·B/R) of the global batch and a
// resumed run needs no sampler state. Draws with replacement, like torch.randint. Borrows the tokens (keep
// them alive); const members are thread-safe.
class BlockBatcher {
 public:
  BlockBatcher(std::span<std::int32_t const> tokens, BlockBatcherOptions const& opts)
      : tokens_(tokens), block_(opts.block_size), seed_(opts.seed) {
    if (block_ < 1)
      throw ArgumentError(detail::cat("BlockBatcher: BlockBatcherOptions::block_size ", block_, " must be positive"));
    if (size() <= block_)
      throw ShapeError(detail::cat("BlockBatcher: the token span holds ", size(), " tokens, not more than block_size ",
                                   block_, ": a block of T tokens and its targets need at least T + 1 = ", block_ + 1));
  }

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(tokens_.size()); }
  std::int64_t block_size() const noexcept { return block_; }
  std::uint64_t seed() const noexcept { return seed_; }
  // The number of distinct start offsets, n - T: offsets lie in [0, num_offsets()).
  std::int64_t num_offsets() const noexcept { return size() - block_; }

  // The start offset of sequence `index` of step `step`'s global batch.
  std::int64_t offset(std::uint64_t step, std::int64_t index) const {
    if (index < 0) throw ArgumentError(detail::cat("BlockBatcher::offset: index ", index, " is negative"));
    return static_cast<std::int64_t>(detail::counter_below(seed_ ^ detail::kBlockBatcherStream, step, index,
                                                           static_cast<std::uint64_t>(num_offsets())));
  }
  // The start offsets of step `step`'s global batch of `batch` sequences: offset(step, 0 .. batch-1).
  std::vector<std::int64_t> offsets(std::uint64_t step, std::int64_t batch) const {
    if (batch < 0) throw ArgumentError(detail::cat("BlockBatcher::offsets: batch ", batch, " is negative"));
    std::vector<std::int64_t> out(static_cast<std::size_t>(batch));
    for (std::int64_t i = 0; i < batch; ++i) out[static_cast<std::size_t>(i)] = offset(step, i);
    return out;
  }
  // Non-overlapping consecutive blocks covering the span, for a loss over a whole split: 0, T, 2T, ... while
  // o + T + 1 <= n. The last n - 1 - T·floor((n - 1) / T) targets (fewer than T) are left out.
  std::vector<std::int64_t> eval_offsets() const {
    std::vector<std::int64_t> out;
    out.reserve(static_cast<std::size_t>((size() - 1) / block_));
    for (std::int64_t o = 0; o + block_ + 1 <= size(); o += block_) out.push_back(o);
    return out;
  }

  // x (B, T) and y (B, T) of the sequences starting at `offsets` (each in [0, num_offsets()), else ArgumentError).
  TokenBatch batch(std::span<std::int64_t const> offsets) const {
    if (offsets.empty()) throw ArgumentError("BlockBatcher::batch: no offsets (a batch needs at least one sequence)");
    auto const b = static_cast<std::int64_t>(offsets.size());
    TokenBatch out{Tensor<float>(Shape{b, block_}), Tensor<std::int32_t>(Shape{b, block_})};
    for (std::int64_t i = 0; i < b; ++i) {
      std::int64_t const o = offsets[static_cast<std::size_t>(i)];
      if (o < 0 || o >= num_offsets())
        throw ArgumentError(detail::cat("BlockBatcher::batch: offset ", o, " at position ", i, " is outside [0, ",
                                        num_offsets(), ") (", size(), " tokens, block_size ", block_, ")"));
      std::int32_t const* src = tokens_.data() + o;
      float* x = out.x.data() + i * block_;
      std::int32_t* y = out.y.data() + i * block_;
      for (std::int64_t t = 0; t < block_; ++t) {
        x[t] = static_cast<float>(src[t]);
        y[t] = src[t + 1];
      }
    }
    return out;
  }

  friend std::ostream& operator<<(std::ostream& os, BlockBatcher const& b) {
    return os << "BlockBatcher{tokens=" << b.size() << ", block_size=" << b.block_ << ", seed=" << b.seed_ << "}";
  }

 private:
  std::span<std::int32_t const> tokens_;
  std::int64_t block_;
  std::uint64_t seed_;
};

}  // namespace ddp::data
