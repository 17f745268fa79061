// The optim layer: Optimizer concept, SGD, Adam, AdamW and learning-rate schedules.
#pragma once

#include "ddp/optim/adam.hpp"
#include "ddp/optim/lr_scheduler.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/optim/sgd.hpp"
