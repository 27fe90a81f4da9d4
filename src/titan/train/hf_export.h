#pragma once
// The trainer's Hugging Face export of a model held by data-parallel ranks, streamed: the logging
// rank writes it (qwen3::export_hf_model) while the ranks of its shard group gather one block at a
// time in f32, the block of the tensor its writer has reached (dist::ShardedBlocks::gather_whole),
// released when the writer moves to another block; where experts are split over ranks
// (ParallelPlan::ep() > 1), the other ranks of its expert group send it their runs of each expert
// parameter as its writer reaches the layer's experts, each an all_to_all over the group in which
// only the logging rank receives. So no rank holds more than one block whole beside its slices, and
// the logging rank one MoE layer's whole experts beside that: a model that trains only sharded
// exports.
//
// Every rank runs the same list of events (export_events), made from the order the export reads the
// model (qwen3::export_reads): the logging rank from inside its writer's reads, the others in a
// loop, each joining the collectives of its groups. A rank that ran its gathers in another order
// than the exchanges around them would leave the others waiting, so the list is the one place the
// order is decided.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "titan/dist/parallel_plan.h"
#include "titan/dist/sharded_blocks.h"
#include "titan/models/qwen3/state_dict.h"

namespace titan::train {

struct ExportEvent {
  enum Kind : uint8_t {
    Gather,    // the ranks of the logging rank's shard group gather `block` whole
    Read,      // the logging rank's writer reads `param` (a tensor of it; no collective)
    Exchange,  // the logging rank's expert group sends it every run of `param` (split experts)
    Release,   // the ranks that gathered `block` free it
  } kind;
  size_t block;                      // the block gathered, released, or holding `param`
  const nn::Param* param = nullptr;  // Read, Exchange
};

// The export's events for `model` (any rank's: the list depends only on the model's shape): each
// read of qwen3::export_reads, its block gathered before it unless it is the block gathered last,
// which is released first; the last block gathered is released at the end.
std::vector<ExportEvent> export_events(qwen3::Qwen3Model& model);

// Every rank of `plan` alike, each with its part of `model` and the `sharding` that holds it: on
// the logging rank `write` exports, reading the model through the source it is given
// (qwen3::export_hf_model(..., source)); the other ranks take part in the collectives its reads
// need. On one process, and under DDP, every block is whole and nothing is gathered.
void export_from_ranks(const dist::ParallelPlan& plan, qwen3::Qwen3Model& model,
                       dist::ShardedBlocks& sharding,
                       const std::function<void(const qwen3::ExportSource& source)>& write);

// The logging rank's part of the export without writing anything (the planner's, on the meta
// device, as rank 0 of the planned mesh): every event in turn, holding what the writer holds beside
// the gathered block: a MoE layer's whole experts, until the next layer's arrive, when
// `whole_experts_held` (a CPU job's: the writer's host memory is the device's; a GPU job's are
// copied to the host as they arrive).
void rehearse_export(const dist::ParallelPlan& plan, qwen3::Qwen3Model& model, dist::ShardedBlocks& sharding,
                     bool whole_experts_held);

}  // namespace titan::train
