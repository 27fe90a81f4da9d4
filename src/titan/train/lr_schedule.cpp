#include "titan/train/lr_schedule.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "titan/core/check.h"

namespace titan::train {

std::string_view decay_type_name(DecayType t) {
  switch (t) {
    case DecayType::Linear:
      return "linear";
    case DecayType::Sqrt:
      return "sqrt";
    case DecayType::Cosine:
      return "cosine";
  }
  return "?";
}

DecayType decay_type_from_name(std::string_view name) {
  for (DecayType t : {DecayType::Linear, DecayType::Sqrt, DecayType::Cosine})
    if (decay_type_name(t) == name) return t;
  TITAN_FAIL("lr_scheduler.decay_type = '", name, "' is not one of linear, sqrt, cosine");
}

LrSchedule::LrSchedule(const LrScheduleConfig& c) : config_(c) {
  TITAN_CHECK(std::isfinite(c.lr) && c.lr >= 0, "optimizer.lr = ", c.lr, " must be finite and >= 0");
  TITAN_CHECK(c.steps >= 1, "training.steps = ", c.steps, " must be >= 1");
  TITAN_CHECK(c.warmup_steps >= 0, "lr_scheduler.warmup_steps = ", c.warmup_steps, " must be >= 0");
  TITAN_CHECK(c.warmup_steps <= c.steps, "lr_scheduler.warmup_steps = ", c.warmup_steps,
              " must not exceed training.steps = ", c.steps);
  if (c.decay_ratio)
    TITAN_CHECK(*c.decay_ratio >= 0 && *c.decay_ratio <= 1, "lr_scheduler.decay_ratio = ", *c.decay_ratio,
                " must be in [0, 1]");
  TITAN_CHECK(c.min_lr_factor >= 0 && c.min_lr_factor <= 1, "lr_scheduler.min_lr_factor = ", c.min_lr_factor,
              " must be in [0, 1]");

  warmup_ = c.warmup_steps;
  if (c.decay_ratio) {
    // Python's round(): nearest, ties to even; nearbyint does the same in the default rounding mode.
    decay_ = int64_t(std::nearbyint(double(c.steps) * *c.decay_ratio));
    if (warmup_ + decay_ > c.steps) {
      adjustment_ =
          detail::concat("warmup (", warmup_, ") + decay (", decay_, ") steps exceed training.steps (",
                         c.steps, "): decay shortened to ", c.steps - warmup_, " steps");
      decay_ = c.steps - warmup_;
    }
  } else {
    decay_ = c.steps - warmup_;
  }
  stable_ = c.steps + 1 - warmup_ - decay_;
}

double LrSchedule::factor(int64_t step) const {
  TITAN_CHECK(step >= 0 && step <= config_.steps, "lr schedule: step index ", step,
              " outside [0, training.steps = ", config_.steps, "]");
  if (step < warmup_) return double(step + 1) / double(warmup_);
  if (step < warmup_ + stable_) return 1.0;
  const double progress = double(step + 1 - warmup_ - stable_) / double(decay_);
  double f = 0;
  switch (config_.decay_type) {
    case DecayType::Linear:
      f = 1.0 - progress;
      break;
    case DecayType::Sqrt:
      f = 1.0 - std::sqrt(progress);
      break;
    case DecayType::Cosine:
      f = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      break;
  }
  return config_.min_lr_factor + (1.0 - config_.min_lr_factor) * f;
}

double LrSchedule::lr(int64_t step) const {
  return config_.lr * factor(step);
}

nlohmann::json LrSchedule::state_dict() const {
  return {{"type", "warmup_stable_decay"},
          {"lr", config_.lr},
          {"steps", config_.steps},
          {"warmup_steps", warmup_},
          {"stable_steps", stable_},
          {"decay_steps", decay_},
          {"decay_type", std::string(decay_type_name(config_.decay_type))},
          {"min_lr_factor", config_.min_lr_factor}};
}

std::string LrSchedule::diff_state(const nlohmann::json& saved) const {
  const nlohmann::json now = state_dict();
  std::ostringstream out;
  if (!saved.is_object()) return "saved lr schedule state is not a JSON object";
  for (const auto& [key, value] : now.items()) {
    auto it = saved.find(key);
    if (it == saved.end())
      out << (out.tellp() ? "; " : "") << key << " missing from the saved state";
    else if (*it != value)
      out << (out.tellp() ? "; " : "") << key << ": saved " << it->dump() << ", now " << value.dump();
  }
  return out.str();
}

}  // namespace titan::train
