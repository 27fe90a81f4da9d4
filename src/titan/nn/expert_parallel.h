#pragma once
// Expert parallelism (torchtitan's parallelism.expert_parallel_degree): the experts of each MoE
// layer are split over a group of P ranks, rank p holding experts [p * E/P, (p+1) * E/P) whole, and
// every rank routing its own tokens. A token's (token, slot) rows travel to the ranks holding their
// experts, which run and weight them, and the outputs travel back to be summed where the token
// lives: forward, one all-to-all of counts (per expert) and three of rows (the rows, their routing
// weights, the outputs back), backward three of gradients, instead of gathering every expert's
// weights on every rank as FSDP does.
#include <cstdint>
#include <span>
#include <vector>

#include "titan/core/tensor.h"
#include "titan/ops/moe/moe.h"

namespace titan::nn {

// The group of ranks that shares the experts (dist/expert_exchange.h implements it over a
// communicator). Every rank of the group must make the same calls in the same order.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int size() const = 0;  // P
  virtual int rank() const = 0;  // this rank's place in the group

  // Counts of rows, m per rank (m = send_counts.size() / size()): send_counts[p * m + j] is what this
  // rank sends rank p under heading j; returns what each rank sends this one, m per source rank,
  // packed by source.
  virtual std::vector<int64_t> exchange_counts(std::span<const int64_t> send_counts) = 0;
  // rows [sum(send_rows), ...] packed by destination rank -> [sum(recv_rows), ...] packed by
  // source rank, on rows' device in rows' dtype. Differentiable: the backward sends the gradient
  // rows back the way they came, so every rank of the group must back-propagate through it.
  virtual Tensor exchange(const Tensor& rows, std::span<const int64_t> send_rows,
                          std::span<const int64_t> recv_rows) = 0;
};

// ops::moe_experts(x, weights, indices, all experts) for this rank's tokens, when the experts are
// split over `group`: w_gate, w_up [E/P, F, D] and w_down [E/P, D, F] are this rank's experts (E =
// indices.num_experts(), a multiple of P); x [T, D], weights and indices [T, k] this rank's tokens.
// The rows of x and their routing weights go to their experts' ranks in routing order (sorted by
// expert) after the rows per expert (so a receiver knows each row's expert without being sent it),
// each rank runs what it received through its experts (ops::moe_experts with one expert and its
// weight per row, so its kernels round as they do in one process, backward too), and the weighted
// outputs come back to be summed (ops::moe_combine, weight 1). The forward and the gradients are
// moe_experts' exactly (with its reference kernels, and its default ones but for f32's fused
// multiply-add; the token gradients within the reassociation of their sums with the reference
// kernels); the expert weights' gradients are this rank's experts' over every rank's tokens.
// The routing is read on the host (the exchange sizes are counts of it). On the meta device (a
// plan over dist/meta_world.h) there is no routing to read: a balanced one is assumed, every expert
// getting the same share of every rank's rows.
Tensor expert_parallel_experts(const Tensor& x, const Tensor& weights, const ops::ExpertIndices& indices,
                               const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                               ExpertExchange& group);

}  // namespace titan::nn
