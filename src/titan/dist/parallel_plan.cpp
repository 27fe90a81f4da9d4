#include "titan/dist/parallel_plan.h"

namespace titan::dist {

std::string ParallelPlan::describe() const {
  return std::to_string(world_size_) + (world_size_ == 1 ? " rank" : " ranks") + " (dp_replicate " +
         std::to_string(dp_replicate_) + " x dp_shard " + std::to_string(dp_shard_) + ")";
}

// One rank holds every parameter and the whole gradient: nothing to gather or reduce.
void ParallelPlan::gather_parameters(std::vector<nn::ParamBlock>&) const {}
void ParallelPlan::reduce_gradients(std::vector<nn::ParamBlock>&) const {}
double ParallelPlan::all_reduce_grad_norm_sq(double local_sum_sq) const { return local_sum_sq; }
void ParallelPlan::all_reduce_sum(std::span<double>) const {}

}  // namespace titan::dist
