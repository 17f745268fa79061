// The train layer: basic_trainer, checkpoints, progress output and the metrics log.
#pragma once

#include "ddp/train/checkpoint.hpp"
#include "ddp/train/checkpoint_format.hpp"
#include "ddp/train/evaluate.hpp"
#include "ddp/train/metrics_log.hpp"
#include "ddp/train/progress.hpp"
#include "ddp/train/trainer.hpp"
