// The optim layer: Optimizer concept, SGD, Adam, AdamW, learning-rate schedules and the run-time Schedule choice,
// and dynamic loss scaling (GradScaler).
#pragma once

#include "ddp/optim/adam.hpp"
#include "ddp/optim/grad_scaler.hpp"
#include "ddp/optim/lr_scheduler.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/schedule.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/optim/shard.hpp"
