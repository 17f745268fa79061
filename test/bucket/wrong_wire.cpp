// Compiled by compile_fail_test.sh: a user's wire format (bucket/wire.hpp) that lacks a member must fail to compile
// where DistributedDataParallel instantiates the bucket reducer over it, with a message naming the member. With
// DDP_WIRE_WITHOUT_BUFFER_NUMEL the wire has no buffer_numel(); without it, the wire (a float wire that averages the
// gradients in place, seeing gradients only) compiles. With DDP_WIRE_NOT_SPECIALISED the policy names a tag that has
// no BucketWire specialisation.
#include "ddp/ddp.hpp"

struct PlainTag {
  static constexpr std::string_view policy_name = "PlainReduction";
};

template <>
class ddp::BucketWire<float, PlainTag, ddp::HostSpace> {
 public:
  using value_type = float;
  using config = ddp::NoWireConfig;
  static constexpr bool single_collective = true;

  BucketWire(std::vector<ddp::WireBucket> layout, int /*world*/, config = {}) : layout_(std::move(layout)) {}
#if !defined(DDP_WIRE_WITHOUT_BUFFER_NUMEL)
  std::int64_t buffer_numel(std::size_t /*b*/) const noexcept { return 0; }
#endif
  ddp::WirePiece<float, ddp::HostSpace> pack(std::size_t b, float* grads, ddp::Participation,
                                             ddp::HostSpan<float> /*buffer*/) {
    return {ddp::HostSpan<float>(grads, static_cast<std::size_t>(layout_[b].grads)), ddp::ReduceOp::kAvg, "bucket"};
  }
  std::optional<ddp::WirePiece<float, ddp::HostSpace>> unpack(std::size_t, float*, ddp::HostSpan<float>) {
    return std::nullopt;
  }
  std::int64_t bytes() const noexcept { return 0; }

 private:
  std::vector<ddp::WireBucket> layout_;
};

#if defined(DDP_WIRE_NOT_SPECIALISED)
struct UnknownTag {  // a tag no BucketWire specialisation names
  static constexpr std::string_view policy_name = "UnknownReduction";
};
using PlainReduction = ddp::WireReduction<UnknownTag>;
#else
using PlainReduction = ddp::WireReduction<PlainTag>;
#endif

void build(ddp::ThreadsBackend& comm, ddp::Generator& g) {
  ddp::nn::Linear model(4, 2, g);
  ddp::DistributedDataParallel<ddp::nn::Linear, ddp::ThreadsBackend, ddp::SizeCapped, PlainReduction> ddp(model, comm);
}
