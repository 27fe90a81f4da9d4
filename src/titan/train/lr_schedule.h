#pragma once
// torchtitan's learning-rate schedule (components/lr_scheduler.py, linear_warmup_stable_decay, as a
// LambdaLR factor on the optimizer's lr): linear warmup, a stable plateau, then a decay to
// min_lr_factor over the last decay_ratio of the run.
//
// With T = steps, W = warmup_steps, D = round(T * decay_ratio) (ties to even, like Python's round;
// T - W when decay_ratio is unset; shortened to T - W when W + D > T) and S = T + 1 - W - D (one
// virtual step past the end, so the last trained step does not reach min_lr_factor), for the
// 0-based step index i:
//   i < W          warmup   (i + 1) / W                       (reaches 1 at i = W - 1)
//   i < W + S      stable   1
//   otherwise      decay    min + (1 - min) * f(p),  p = (i + 1 - W - S) / D  in (0, 1]
//                  f = 1 - p (linear), 1 - sqrt(p) (sqrt), (1 + cos(pi p)) / 2 (cosine)
// i is the number of optimizer steps already taken (LambdaLR's last_epoch): the training step
// logged as s (1-based) runs with factor(s - 1). i = T is the virtual step after the run.
//
// Differences from torchtitan: warmup_steps > steps is an error (torchtitan clamps with a
// warning), and an index outside [0, steps] is an error (torchtitan extrapolates).
//
// The schedule is stateless given the step: resuming needs only the step from the train state.
// state_dict() records the schedule's definition so a resume can tell whether it changed.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace titan::train {

enum class DecayType { Linear, Sqrt, Cosine };
std::string_view decay_type_name(DecayType t);          // "linear", "sqrt", "cosine"
DecayType decay_type_from_name(std::string_view name);  // error names lr_scheduler.decay_type

struct LrScheduleConfig {
  double lr = 8e-4;                          // optimizer.lr: the peak learning rate
  int64_t steps = 10000;                     // training.steps
  int64_t warmup_steps = 200;                // lr_scheduler.warmup_steps
  std::optional<double> decay_ratio{};       // lr_scheduler.decay_ratio, in [0, 1]; unset: decay after warmup
  DecayType decay_type = DecayType::Linear;  // lr_scheduler.decay_type
  double min_lr_factor = 0.0;                // lr_scheduler.min_lr_factor, in [0, 1]
};

class LrSchedule {
 public:
  // Validates the config; errors name the field (optimizer.lr, training.steps, lr_scheduler.*).
  explicit LrSchedule(const LrScheduleConfig& config);

  double factor(int64_t step) const;  // multiplier on config.lr for 0-based step index `step`
  double lr(int64_t step) const;      // config.lr * factor(step)

  int64_t warmup_steps() const { return warmup_; }
  int64_t stable_steps() const { return stable_; }  // includes the virtual step after the run
  int64_t decay_steps() const { return decay_; }
  // torchtitan's warning when warmup + decay exceeded the run and decay was shortened, else empty.
  const std::string& adjustment() const { return adjustment_; }

  // {"type": "warmup_stable_decay", "lr", "steps", "warmup_steps", "stable_steps", "decay_steps",
  //  "decay_type", "min_lr_factor"}: the definition, for the checkpoint's train state.
  nlohmann::json state_dict() const;
  // Empty when `saved` (a state_dict) describes this same schedule, else which fields differ and how.
  std::string diff_state(const nlohmann::json& saved) const;

 private:
  LrScheduleConfig config_;
  int64_t warmup_ = 0, stable_ = 0, decay_ = 0;
  std::string adjustment_;
};

}  // namespace titan::train
