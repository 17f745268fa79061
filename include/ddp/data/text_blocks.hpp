// TextBlocks: a token stream as a Dataset (dataset.hpp) whose sample i is the block of T tokens starting at offset
// i, with its next-token targets, so basic_trainer's samplers (shuffled epochs, DistributedSampler, the global
// batches of deterministic mode) draw language-model batches as they draw images.
#pragma once

#include <cstdint>
#include <span>

#include "ddp/data/dataset.hpp"
#include "ddp/data/text.hpp"

namespace ddp::data {

// size() = n - T samples (every start offset with a full block and targets); collate(idx) = BlockBatcher::batch:
// x (B, T) token ids as float values, y (B, T) int32 targets. Borrows the tokens (keep them alive); const members
// are thread-safe, so the threads backend's ranks can share one.
class TextBlocks {
 public:
  using target_type = std::int32_t;
  TextBlocks(std::span<std::int32_t const> tokens, BlockBatcherOptions const& opts) : blocks_(tokens, opts) {}

  std::int64_t size() const noexcept { return blocks_.num_offsets(); }
  Batch<std::int32_t> collate(std::span<std::int64_t const> idx) const {
    TokenBatch b = blocks_.batch(idx);
    return {std::move(b.x), std::move(b.y)};
  }
  BlockBatcher const& blocks() const noexcept { return blocks_; }

 private:
  BlockBatcher blocks_;
};
static_assert(Dataset<TextBlocks>);

}  // namespace ddp::data
