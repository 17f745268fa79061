// ddp data: datasets, samplers, the DataLoader, metrics, the IDX / Fashion-MNIST readers and character-level text.
#pragma once

#include "ddp/data/dataset.hpp"
#include "ddp/data/fashion_mnist.hpp"
#include "ddp/data/global_batch_sampler.hpp"
#include "ddp/data/idx.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/data/metrics.hpp"
#include "ddp/data/sampler.hpp"
#include "ddp/data/text.hpp"
#include "ddp/data/text_blocks.hpp"
