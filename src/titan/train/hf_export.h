#pragma once
// The trainer's Hugging Face export of a model whose experts are split over the ranks of expert
// groups (ParallelPlan::ep() > 1). The logging rank writes every expert (qwen3::export_hf_model with
// WholeExperts): the other ranks of its expert group send it their runs one parameter at a time as
// its writing reaches them, each an all_to_all over the group in which only the logging rank
// receives. It so holds one MoE layer's whole experts at a time beyond its model, and the others
// nothing beyond theirs.
#include "titan/dist/parallel_plan.h"
#include "titan/models/qwen3/state_dict.h"

namespace titan::train {

// On the logging rank: the WholeExperts that receives the other runs from its expert group.
qwen3::WholeExperts experts_from_expert_group(const dist::ParallelPlan& plan);

// On every other rank while the logging rank exports `model`'s: the ranks of its expert group send
// their run of each parameter of qwen3::expert_params, in that order (the order the export asks for
// them); the others, and every rank of a plan without expert parallelism, have nothing to send.
void send_experts_for_export(const dist::ParallelPlan& plan, qwen3::Qwen3Model& model);

}  // namespace titan::train
