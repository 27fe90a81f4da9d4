#include "titan/train/hf_export.h"

#include <vector>

#include "titan/core/check.h"
#include "titan/core/device_services.h"

namespace titan::train {

namespace {

// A rank's run of an expert parameter, as the exchange reads it.
Tensor run_values(const nn::Param& run) {
  Tensor v = run.value.detach();
  TITAN_CHECK(v.dtype() == DType::F32 && v.is_contiguous(), "export: ", run.name, " is ", v.str(),
              "; the exchange of a run of experts reads contiguous f32 masters");
  return v;
}

// Expert groups are ep consecutive ranks; the logging rank (world rank 0) is rank 0 of the first.
bool in_logging_rank_expert_group(const dist::ParallelPlan& plan) {
  return plan.rank() - plan.expert_index() == 0;
}

}  // namespace

qwen3::WholeExperts experts_from_expert_group(const dist::ParallelPlan& plan) {
  TITAN_CHECK(plan.is_logging_rank(), "export: rank ", plan.rank(),
              " asked for every expert; the logging rank (0) alone writes the export");
  return [&plan](nn::Param& run) {
    dist::Communicator& group = plan.expert_group();
    const Tensor mine = run_values(run);
    Shape shape = mine.shape();
    shape[0] *= group.size();
    Tensor whole = Tensor::empty(shape, DType::F32, mine.device());
    // Rank r of the group holds run r: its segment lands at element r x run size, in run order.
    std::vector<int64_t> send(size_t(group.size()), 0), recv(size_t(group.size()), mine.numel());
    send[0] = mine.numel();
    group.all_to_all(mine.raw_data(), send, whole.raw_data(), recv, DType::F32,
                     device_services(mine.device()).context());
    return whole;
  };
}

void send_experts_for_export(const dist::ParallelPlan& plan, qwen3::Qwen3Model& model) {
  if (plan.ep() == 1 || !in_logging_rank_expert_group(plan)) return;
  TITAN_CHECK(!plan.is_logging_rank(), "export: the logging rank receives the experts; it sends none");
  dist::Communicator& group = plan.expert_group();
  for (nn::Param* run : qwen3::expert_params(model)) {
    const Tensor mine = run_values(*run);
    std::vector<int64_t> send(size_t(group.size()), 0), recv(size_t(group.size()), 0);
    send[0] = mine.numel();
    group.all_to_all(mine.raw_data(), send, nullptr, recv, DType::F32,
                     device_services(mine.device()).context());
  }
}

}  // namespace titan::train
