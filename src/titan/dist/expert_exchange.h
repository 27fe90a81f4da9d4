#pragma once
// nn::ExpertExchange over a communicator: the rows of expert-parallel MoE layers (nn/expert_parallel.h)
// travel in all_to_all collectives of the group's communicator, on the rows' device.
#include <memory>

#include "titan/dist/communicator.h"
#include "titan/nn/expert_parallel.h"

namespace titan::dist {

// `group` (the ranks sharing the experts) must outlive the exchange and every backward of a graph
// recorded through it (the backward's exchanges run over it). `stats`, when given (a step's
// communication, ShardedBlocks::stats), counts every exchange's bytes sent to other ranks and the
// time spent in it; it must outlive the exchange too.
std::unique_ptr<nn::ExpertExchange> expert_exchange(Communicator& group, CommStats* stats = nullptr);

}  // namespace titan::dist
