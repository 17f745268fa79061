// ReductionStage: the contract between DistributedDataParallel and its reduction policy's stage
// (R::template stage<T, S, C>: BucketReducer, ExactReducer, or a user's). DDP drives one round per step through it:
//   begin()                      a round starts: every parameter pending
//   mark_ready(i, has_grad)      during the round's last backward, parameter i's gradient is final (its own, or zeros
//                                the caller wrote); the stage may launch whatever is now complete
//   is_ready(i), all_ready()     whether i, or every parameter, was marked in this round
//   had_grad(i)                  whether i had a gradient on this rank when marked
//   end_micro_batch()            a micro-batch that is not the round's last ended (its gradients stay and add up)
//   finish(), finish(landed)     backward is over: everything reduced, checked and averaged; landed(b) (outcome.hpp)
//                                is called as bucket b's gradients become final, in plan order, until it returns false
//   outcome()                    the round's ReduceOutcome so far
//   plan()                       the bucket plan it drives
//   abandon()                    lets anything in flight complete, swallowing errors (a dropped round); no-throw
//   static reserve(plan, n, w)   the arena elements each of the n parameters leaves free after it (status words)
// and, where a composition needs them (checked where they are used):
//   shadow_round()               a round for a rank without a batch (ddp::join)
//   reduce_last_bucket_async(b)  the last bucket on the progress thread too (the overlapped update)
//   wire_bytes(), wire_state(), load_wire_state(s, from)   what its wire sends and keeps (describe(), checkpoints)
// check_reduction_stage<St, T, S>() names the first required member a stage lacks, in a static_assert;
// stage_wire_state() and load_stage_wire_state() reach the optional wire state of any stage.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/bucket/outcome.hpp"
#include "ddp/bucket/plan.hpp"
#include "ddp/bucket/wire.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/memory_space.hpp"

namespace ddp {

template <class St>
concept ReductionStage = requires(St& st, St const& cst, BucketPlan const& plan, std::size_t i, bool b) {
  { St::reserve(plan, i, 2) } -> std::same_as<std::vector<std::int64_t>>;
  st.begin();
  st.mark_ready(i, b);
  { cst.is_ready(i) } -> std::convertible_to<bool>;
  { cst.all_ready() } -> std::convertible_to<bool>;
  { cst.had_grad(i) } -> std::convertible_to<bool>;
  st.end_micro_batch();
  { st.finish() } -> std::same_as<ReduceOutcome const&>;
  { st.finish(NoLanding{}) } -> std::same_as<ReduceOutcome const&>;
  { cst.outcome() } -> std::same_as<ReduceOutcome const&>;
  { cst.plan() } -> std::same_as<BucketPlan const&>;
  st.abandon();
};

// A stage that can answer a round for a rank without a batch (ddp::join).
template <class St>
concept ShadowingStage = requires(St& st) {
  { st.shadow_round() } -> std::same_as<ReduceOutcome const&>;
};

namespace detail {

// One static_assert per member of ReductionStage, so that the compiler names the one a stage lacks. True when St is a
// ReductionStage.
template <class St>
constexpr bool check_reduction_stage() {
  constexpr bool reserve = requires(BucketPlan const& plan) {
    { St::reserve(plan, std::size_t{1}, 2) } -> std::same_as<std::vector<std::int64_t>>;
  };
  static_assert(reserve,
                "ReductionStage: R::stage has no static reserve(plan, parameters, world) returning "
                "std::vector<std::int64_t> (the arena elements each parameter leaves free after it)");
  static_assert(
      requires(St & st) { st.begin(); }, "ReductionStage: R::stage has no begin() (a round starts)");
  static_assert(
      requires(St & st) { st.mark_ready(std::size_t{0}, true); },
      "ReductionStage: R::stage has no mark_ready(i, has_grad) (parameter i's gradient is final)");
  static_assert(
      requires(St const& st) {
        { st.is_ready(std::size_t{0}) } -> std::convertible_to<bool>;
      },
      "ReductionStage: R::stage has no is_ready(i) const returning bool");
  static_assert(
      requires(St const& st) {
        { st.all_ready() } -> std::convertible_to<bool>;
      },
      "ReductionStage: R::stage has no all_ready() const returning bool");
  static_assert(
      requires(St const& st) {
        { st.had_grad(std::size_t{0}) } -> std::convertible_to<bool>;
      },
      "ReductionStage: R::stage has no had_grad(i) const returning bool");
  static_assert(
      requires(St & st) { st.end_micro_batch(); },
      "ReductionStage: R::stage has no end_micro_batch() (a micro-batch that is not the round's last ended)");
  static_assert(
      requires(St & st) {
        { st.finish() } -> std::same_as<ReduceOutcome const&>;
        { st.finish(NoLanding{}) } -> std::same_as<ReduceOutcome const&>;
      },
      "ReductionStage: R::stage has no finish() and finish(landed) returning ReduceOutcome const& (backward is over)");
  static_assert(
      requires(St const& st) {
        { st.outcome() } -> std::same_as<ReduceOutcome const&>;
      },
      "ReductionStage: R::stage has no outcome() const returning ReduceOutcome const&");
  static_assert(
      requires(St const& st) {
        { st.plan() } -> std::same_as<BucketPlan const&>;
      },
      "ReductionStage: R::stage has no plan() const returning BucketPlan const&");
  static_assert(
      requires(St & st) { st.abandon(); },
      "ReductionStage: R::stage has no abandon() (lets anything in flight complete; no-throw)");
  return ReductionStage<St>;
}

// ", N bytes a step" when the stage says what its wire sends per round, else "".
template <class St>
std::int64_t stage_wire_byte_count(St const& st) {
  if constexpr (requires { st.wire_bytes(); })
    return static_cast<std::int64_t>(st.wire_bytes());
  else
    return 0;
}
template <class St>
std::string stage_wire_bytes(St const& st) {
  if constexpr (requires { st.wire_bytes(); })
    return cat(", ", st.wire_bytes(), " bytes a step");
  else
    return {};
}

// ShadowingStage<St>, with a message naming what ddp::join needs. True when it holds.
template <class St>
constexpr bool check_shadowing_stage() {
  static_assert(ShadowingStage<St>,
                "ddp::join: this reduction's stage has no shadow_round() to answer a round for a rank without a "
                "batch (bucket/stage.hpp)");
  return true;
}

// What a stage's wire carries between rounds (empty for a stage without one), and loading it back (ArgumentError
// naming `policy` when a stage without one is given a state).
template <class St, class T>
WireState<T> stage_wire_state(St const& st) {
  if constexpr (requires { st.wire_state(); })
    return st.wire_state();
  else
    return {};
}
template <class St, class T>
void load_stage_wire_state(St& st, WireState<T> const& s, WireStateFrom from, std::string const& policy) {
  if constexpr (requires { st.load_wire_state(s, from); })
    st.load_wire_state(s, from);
  else if (!s.kind.empty())
    throw ArgumentError(
        cat("DistributedDataParallel: ", policy, " keeps no wire state, but a ", s.kind, " state was given to load"));
}

// check_reduction_stage<St>() where `check` holds (true otherwise, without instantiating anything of St).
template <class St, bool check>
inline constexpr bool reduction_stage_checked = true;
template <class St>
inline constexpr bool reduction_stage_checked<St, true> = check_reduction_stage<St>();

}  // namespace detail
}  // namespace ddp
