// ddp umbrella: host tensors (Eigen), autograd, nn, optim and everything that needs no MPI/CUDA headers.
#pragma once

#include "ddp/autograd/autograd.hpp"
#include "ddp/comm/comm.hpp"
#include "ddp/config.hpp"
#include "ddp/data/data.hpp"
#include "ddp/error.hpp"
#include "ddp/nn/nn.hpp"
#include "ddp/optim/optim.hpp"
#include "ddp/parallel/parallel.hpp"
#include "ddp/tensor/host_kernels.hpp"
#include "ddp/tensor/random.hpp"
#include "ddp/tensor/tensor.hpp"
#include "ddp/trace/timeline.hpp"
#include "ddp/train/train.hpp"
