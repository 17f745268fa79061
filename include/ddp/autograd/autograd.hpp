// The autograd layer: variables, backward, and every op family.
#pragma once

#include "ddp/autograd/backward.hpp"
#include "ddp/autograd/grad_check.hpp"
#include "ddp/autograd/mode.hpp"
#include "ddp/autograd/ops/activation.hpp"
#include "ddp/autograd/ops/batch_norm.hpp"
#include "ddp/autograd/ops/conv.hpp"
#include "ddp/autograd/ops/dropout.hpp"
#include "ddp/autograd/ops/elementwise.hpp"
#include "ddp/autograd/ops/linear.hpp"
#include "ddp/autograd/ops/loss.hpp"
#include "ddp/autograd/ops/reduce.hpp"
#include "ddp/autograd/ops/shape_ops.hpp"
#include "ddp/autograd/variable.hpp"
#include "ddp/tensor/host_kernels.hpp"
