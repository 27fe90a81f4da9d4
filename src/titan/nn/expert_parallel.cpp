#include "titan/nn/expert_parallel.h"

#include <algorithm>
#include <numeric>

#include "titan/core/check.h"
#include "titan/ops/embedding/embedding.h"

namespace titan::nn {

Tensor expert_parallel_experts(const Tensor& x, const Tensor& weights, const ops::ExpertIndices& routed,
                               const Tensor& w_gate, const Tensor& w_up, const Tensor& w_down,
                               ExpertExchange& group) {
  const Tensor& indices_on_device = routed.tensor();
  const int64_t P = group.size(), E = routed.num_experts();
  TITAN_CHECK(x.dim() == 2 && indices_on_device.dim() == 2 && indices_on_device.size(0) == x.size(0),
              "expert_parallel_experts: expected x [T, D] and indices [T, k]; got x ", x.str(), ", indices ",
              indices_on_device.str());
  TITAN_CHECK(w_gate.dim() == 3 && w_gate.size(0) * P == E, "expert_parallel_experts: ", E, " experts over ",
              P, " ranks: each holds ", E % P == 0 ? E / P : -1,
              (E % P == 0 ? "" : " (E must be a multiple of the ranks)"), "; this rank's w_gate is ",
              w_gate.str());
  const int64_t T = x.size(0), D = x.size(1), k = indices_on_device.size(1), n = T * k, local = E / P;

  std::vector<int64_t> slot_of_row(n), token_of_row(n), per_expert(E), send_rows(P), recv_per_expert;
  if (x.device() == Device::Meta) {
    // A plan (the meta device, dist/meta_world.h) has no routing to read, and its other ranks are
    // imagined: it assumes a balanced one, n / E rows per expert from every rank alike.
    for (int64_t e = 0; e < E; ++e) per_expert[e] = n / E + (e < n % E ? 1 : 0);
    recv_per_expert.resize(size_t(P * local));
    for (int64_t s = 0; s < P; ++s)
      for (int64_t j = 0; j < local; ++j)
        recv_per_expert[s * local + j] = per_expert[group.rank() * local + j];
  } else {
    // The routing order on the host: rows sorted by expert are rows grouped by destination rank.
    const Tensor indices = indices_on_device.to(Device::CPU);
    std::vector<int64_t> order(n), pos(n), offsets(E + 1);
    ops::moe_routing_order({T, D, 0, E, k}, indices.data<int64_t>(), order.data(), pos.data(),
                           offsets.data());
    for (int64_t r = 0; r < n; ++r) slot_of_row[r] = order[r], token_of_row[r] = order[r] / k;
    for (int64_t e = 0; e < E; ++e) per_expert[e] = offsets[e + 1] - offsets[e];
    // What each rank sends this one for each of its experts: the rows arrive from each source in
    // expert order, so these counts say every received row's expert.
    recv_per_expert = group.exchange_counts(per_expert);
  }
  for (int64_t p = 0; p < P; ++p)
    send_rows[p] =
        std::accumulate(per_expert.begin() + p * local, per_expert.begin() + (p + 1) * local, int64_t(0));
  std::vector<int64_t> recv_rows(P, 0), my_expert_of_row;
  for (int64_t s = 0; s < P; ++s)
    for (int64_t j = 0; j < local; ++j) {
      recv_rows[s] += recv_per_expert[s * local + j];
      my_expert_of_row.insert(my_expert_of_row.end(), recv_per_expert[s * local + j], j);
    }
  const int64_t received = int64_t(my_expert_of_row.size());

  // Out: each row of x once per slot, and its routing weight, to the rank of its expert. The
  // experts run the rows with their weights, as moe_experts does in one process: its backward scales
  // the output's gradient by the weight inside the kernel, after the kernel's own rounding of it
  // (bf16: dy rounded for the down GEMMs, then bf16(bf16(dy) * w)), and makes the weight's gradient
  // from dy and its GEMM. Weighting in moe_combine instead would hand the experts w * dy, rounded
  // once, and take the weight's gradient as dy . (the rounded output): other bits in bf16.
  const Tensor rows = ops::embedding(Tensor::from_vector(token_of_row, {n}).to(x.device()), x);
  const Tensor row_weights =
      ops::embedding(Tensor::from_vector(slot_of_row, {n}).to(x.device()), weights.reshape({n, 1}));
  const Tensor mine = group.exchange(rows, send_rows, recv_rows);
  const Tensor my_weights = group.exchange(row_weights, send_rows, recv_rows);
  const Tensor my_experts = Tensor::from_vector(my_expert_of_row, {received, 1}).to(x.device());
  const Tensor outputs = ops::moe_experts(mine, my_weights, my_experts, w_gate, w_up, w_down);
  // Back: the weighted outputs to the ranks of their tokens, in the order they were sent (routing
  // order), summed with weight 1 (exact in every dtype) in moe_experts' order and rounding points.
  const Tensor ones = Tensor::full({T, k}, 1.0, weights.dtype(), x.device());
  return ops::moe_combine(group.exchange(outputs, recv_rows, send_rows), ones, routed);
}

}  // namespace titan::nn
