// The nn layer: Model concept, layers, containers and the flat parameter arena.
#pragma once

#include "ddp/nn/clip_grad.hpp"
#include "ddp/nn/gpt.hpp"
#include "ddp/nn/init.hpp"
#include "ddp/nn/layers.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/nn/parameter_arena.hpp"
#include "ddp/nn/sequential.hpp"
#include "ddp/nn/sync_batch_norm.hpp"
#include "ddp/nn/transformer.hpp"
