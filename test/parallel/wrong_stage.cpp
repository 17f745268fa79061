// Compiled by compile_fail_test.sh: a reduction policy whose stage lacks a member of the round contract
// (bucket/stage.hpp) must fail to compile where DistributedDataParallel is instantiated, naming the member. With
// DDP_STAGE_WITHOUT_ABANDON the stage hides abandon(); without it, the same policy (AverageAllReduce's stage under
// another name) compiles.
#include "ddp/ddp.hpp"

struct MyReduction : ddp::AverageAllReduce {
  template <class T, ddp::MemorySpace S, ddp::AsyncCommunicator C>
  struct stage : ddp::BucketReducer<T, S, C> {
    using ddp::BucketReducer<T, S, C>::BucketReducer;
#if defined(DDP_STAGE_WITHOUT_ABANDON)
    void abandon() = delete;
#endif
  };
  std::string name() const { return "MyReduction"; }
};

void build(ddp::ThreadsBackend& comm, ddp::Generator& g) {
  ddp::nn::Linear model(4, 2, g);
  ddp::DistributedDataParallel<ddp::nn::Linear, ddp::ThreadsBackend, ddp::SizeCapped, MyReduction> ddp(model, comm);
}
