// ddp data: datasets, samplers, the DataLoader, metrics and character-level text. The IDX / Fashion-MNIST readers
// (ddp/data/idx.hpp, fashion_mnist.hpp: zlib) are included by the jobs that read them.
#pragma once

#include "ddp/data/dataset.hpp"
#include "ddp/data/global_batch_sampler.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/data/metrics.hpp"
#include "ddp/data/sampler.hpp"
#include "ddp/data/text.hpp"
#include "ddp/data/text_blocks.hpp"
