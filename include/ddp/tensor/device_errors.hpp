// Device errors: bad input a device kernel finds (a class id outside [0, classes); an embedding id outside the
// table; a gradient bucket reduced with another collective, found by DistributedDataParallel's static_graph
// check), reported on the host where it waits for the device anyway: after a copy to the host, after a reduction
// read on the host, or at check_device_errors(). The error is an ArgumentError naming the operation, the row (or
// position) and the value, as on host tensors, but a step no longer reads its inputs back to check them (a
// synchronisation per step), and, unlike a CUDA device-side assert, the context stays usable.
// Each host thread has one record in memory both sides see (CUDA: mapped pinned host memory, so the host reads
// it without a copy; CPU device systems: host memory). The first error since the last check wins; a kernel that
// finds one still runs to its end without reading out of bounds (its output holds NaN where the input was bad).
#pragma once

#include <cstdint>
#include <new>
#include <string>

#include "ddp/config.hpp"
#include "ddp/error.hpp"
#include "ddp/tensor/device_system.hpp"

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include "ddp/tensor/device_buffer.hpp"  // cuda_check
#endif

namespace ddp {

namespace detail {

// kClassId: an integer id outside [0, bound): a class of a loss, or a row of an embedding table.
enum class DeviceErrorKind : std::int32_t { kNone = 0, kClassId = 1, kBucketId = 2 };

// What a kernel writes: which check failed, for which operation, where, and the offending value.
struct DeviceErrorRecord {
  std::int32_t kind = 0;  // DeviceErrorKind; set first (atomically), then the rest
  std::int32_t op = 0;    // DeviceErrorOp
  std::int64_t row = 0;
  std::int64_t value = 0;
  std::int64_t bound = 0;
};

enum class DeviceErrorOp : std::int32_t { kCrossEntropy = 1, kNllLoss = 2, kBucketCheck = 3, kEmbedding = 4 };
inline char const* name(DeviceErrorOp op) noexcept {
  switch (op) {
    case DeviceErrorOp::kCrossEntropy:
      return "cross_entropy";
    case DeviceErrorOp::kNllLoss:
      return "nll_loss";
    case DeviceErrorOp::kBucketCheck:
      return "DistributedDataParallel";
    case DeviceErrorOp::kEmbedding:
      return "embedding";
  }
  return "a device kernel";
}

// Called by a device functor: records the error unless one is already recorded.
DDP_HOST_DEVICE inline void report_device_error(DeviceErrorRecord* rec, DeviceErrorKind kind, DeviceErrorOp op,
                                                std::int64_t row, std::int64_t value, std::int64_t bound) {
#if defined(__CUDA_ARCH__)
  if (atomicCAS(reinterpret_cast<int*>(&rec->kind), 0, static_cast<int>(kind)) != 0) return;
#else
  std::int32_t expected = 0;
  if (!__atomic_compare_exchange_n(&rec->kind, &expected, static_cast<std::int32_t>(kind), false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return;
#endif
  rec->op = static_cast<std::int32_t>(op);
  rec->row = row;
  rec->value = value;
  rec->bound = bound;
}

// This thread's record: `device` is what kernels write through, `host` what the host reads.
struct DeviceErrorSlot {
  DeviceErrorRecord* host = nullptr;
  DeviceErrorRecord* device = nullptr;
};

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
class DeviceErrorMemory {
 public:
  DeviceErrorMemory() {
    void* p = nullptr;
    cuda_check(cudaHostAlloc(&p, sizeof(DeviceErrorRecord), cudaHostAllocMapped), "cudaHostAlloc (device errors)");
    slot_.host = new (p) DeviceErrorRecord{};
    void* d = nullptr;
    cuda_check(cudaHostGetDevicePointer(&d, p, 0), "cudaHostGetDevicePointer (device errors)");
    slot_.device = static_cast<DeviceErrorRecord*>(d);
  }
  ~DeviceErrorMemory() { cudaFreeHost(slot_.host); }
  DeviceErrorMemory(DeviceErrorMemory const&) = delete;
  DeviceErrorMemory& operator=(DeviceErrorMemory const&) = delete;
  DeviceErrorSlot slot() const noexcept { return slot_; }

 private:
  DeviceErrorSlot slot_;
};
#else
class DeviceErrorMemory {
 public:
  DeviceErrorSlot slot() noexcept { return {&record_, &record_}; }

 private:
  DeviceErrorRecord record_{};
};
#endif

inline DeviceErrorSlot device_error_slot() {
  thread_local DeviceErrorMemory memory;
  return memory.slot();
}

}  // namespace detail

// Throws the first error a device kernel of this thread recorded since the last check (and clears it). Call it
// after the host has waited for those kernels (the device layer does so after every copy to the host and every
// reduction read on the host).
inline void check_device_errors() {
  detail::DeviceErrorRecord* rec = detail::device_error_slot().host;
  if (__atomic_load_n(&rec->kind, __ATOMIC_ACQUIRE) == 0) return;
  detail::DeviceErrorRecord const e = *rec;
  *rec = detail::DeviceErrorRecord{};
  auto const op = detail::name(static_cast<detail::DeviceErrorOp>(e.op));
  if (e.kind == static_cast<std::int32_t>(detail::DeviceErrorKind::kBucketId)) {
    // row: the bucket; value: the rank whose status slot is wrong; bound: what it holds, rounded (an id is
    // bucket + 1; 0: no id at all).
    std::string const sent = e.bound > 0 ? detail::cat("bucket ", e.bound - 1)
                             : e.bound == 0
                                 ? std::string(
                                       "no bucket id: its parameters with gradients differ from the first step's, "
                                       "which static_graph requires, or it reduced another collective")
                                 : std::string("not a bucket");
    throw DdpError(detail::cat(op, ": bucket ", e.row, " was reduced together with another collective: rank ", e.value,
                               " sent ", sent,
                               ". Ranks issued collectives in different orders, or the graph changed under "
                               "static_graph (found on the device; reported at the next host read)"));
  }
  if (e.op == static_cast<std::int32_t>(detail::DeviceErrorOp::kEmbedding)) {  // row: the id's position in ids
    throw ArgumentError(detail::cat(op, ": id ", e.value, " at position ", e.row, " is outside [0, ", e.bound,
                                    ") (the table has ", e.bound,
                                    " rows; found on the device; reported at the next host read)"));
  }
  throw ArgumentError(detail::cat(op, ": target ", e.value, " at row ", e.row, " is not a class id in [0, ", e.bound,
                                  ") (found on the device; reported at the next host read)"));
}

}  // namespace ddp
