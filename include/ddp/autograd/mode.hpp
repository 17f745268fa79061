// Mode: training or evaluation, the switch that changes what dropout and batch norm compute
// (nn::Module::set_mode, basic_trainer). Unrelated to grad mode (NoGradGuard), which only stops recording.
#pragma once

namespace ddp {

enum class Mode { kTrain, kEval };

}  // namespace ddp
