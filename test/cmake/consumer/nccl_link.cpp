// Consumer of ddp::nccl: compiles and links the NCCL backend (running it needs a GPU per rank).
#include <ddp/comm/nccl.hpp>

#include <cstdio>

static_assert(ddp::AsyncCommunicator<ddp::NcclBackend>);

int main() { std::printf("consumer nccl: linked\n"); }
