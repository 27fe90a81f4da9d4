#include "titan/dist/expert_exchange.h"

#include <chrono>
#include <numeric>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"

namespace titan::dist {
namespace {

// Elements per rank of rows of `row_elements` elements each.
std::vector<int64_t> elements(std::span<const int64_t> rows, int64_t row_elements) {
  std::vector<int64_t> out(rows.begin(), rows.end());
  for (int64_t& c : out) c *= row_elements;
  return out;
}

int64_t total(std::span<const int64_t> rows) {
  return std::accumulate(rows.begin(), rows.end(), int64_t(0));
}

// Counts one all_to_all of `send_elements` (per destination rank) of `dtype` into `stats` (if any):
// the bytes to the other ranks, and the time from construction to destruction.
class Counted {
 public:
  Counted(CommStats* stats, const Communicator& group, std::span<const int64_t> send_elements, DType dtype)
      : stats_(stats), t0_(std::chrono::steady_clock::now()) {
    if (!stats_) return;
    int64_t elements = 0;
    for (size_t r = 0; r < send_elements.size(); ++r)
      if (int(r) != group.rank()) elements += send_elements[r];
    stats_->bytes_sent += elements * int64_t(dtype_size(dtype));
    stats_->all_to_all_bytes += elements * int64_t(dtype_size(dtype));
    ++stats_->collectives;
    ++stats_->all_to_alls;
    stats_->ring_steps += group.size() - 1;
  }
  ~Counted() {
    if (stats_)
      stats_->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  CommStats* stats_;
  std::chrono::steady_clock::time_point t0_;
};

// rows [sum(send), ...] -> [sum(recv), ...]: one all_to_all, no autograd.
Tensor move_rows(Communicator& group, CommStats* stats, const Tensor& rows_in, std::span<const int64_t> send,
                 std::span<const int64_t> recv) {
  const Tensor rows = rows_in.contiguous();
  Shape shape = rows.shape();
  // From the shape, not numel: a rank sending no rows still receives whole rows.
  int64_t row_elements = 1;
  for (size_t d = 1; d < shape.size(); ++d) row_elements *= shape[d];
  shape[0] = total(recv);
  Tensor out = Tensor::empty(shape, rows.dtype(), rows.device());
  const std::vector<int64_t> send_elements = elements(send, row_elements),
                             recv_elements = elements(recv, row_elements);
  const Counted counted(stats, group, send_elements, rows.dtype());
  group.all_to_all(rows.raw_data(), send_elements, out.raw_data(), recv_elements, rows.dtype(),
                   device_services(rows.device()).context());
  return out;
}

class CommunicatorExchange final : public nn::ExpertExchange {
 public:
  CommunicatorExchange(Communicator& group, CommStats* stats) : group_(group), stats_(stats) {}
  int size() const override { return group_.size(); }
  int rank() const override { return group_.rank(); }

  std::vector<int64_t> exchange_counts(std::span<const int64_t> send_counts) override {
    const size_t P = size_t(group_.size());
    TITAN_CHECK(!send_counts.empty() && send_counts.size() % P == 0, "expert exchange: ", send_counts.size(),
                " counts for a group of ", P, " ranks: the same number for every rank");
    std::vector<int64_t> recv(send_counts.size());
    const std::vector<int64_t> per_rank(P, int64_t(send_counts.size() / P));
    const Counted counted(stats_, group_, per_rank, DType::I64);
    group_.all_to_all(send_counts.data(), per_rank, recv.data(), per_rank, DType::I64, host_context());
    return recv;
  }

  Tensor exchange(const Tensor& rows, std::span<const int64_t> send_rows,
                  std::span<const int64_t> recv_rows) override {
    TITAN_CHECK(rows.dim() >= 1 && rows.size(0) == total(send_rows), "expert exchange: rows ", rows.str(),
                " do not match the ", total(send_rows), " rows the counts send");
    Tensor out = move_rows(group_, stats_, rows.detach(), send_rows, recv_rows);
    if (autograd::needs_grad({&rows})) {
      // The gradient rows go back the way the rows came. The spans die with this call: copies.
      const std::vector<int64_t> send(send_rows.begin(), send_rows.end()),
          recv(recv_rows.begin(), recv_rows.end());
      // A collective in the backward: every rank of the group must back-propagate through the
      // layer's output (autograd runs a node only when a gradient reaches it), as every rank of a
      // data-parallel step does through its loss.
      Communicator& group = group_;
      CommStats* stats = stats_;
      autograd::record("expert_exchange", {rows}, {&out},
                       [&group, stats, send, recv](const std::vector<Tensor>& g) {
                         return std::vector<Tensor>{move_rows(group, stats, g[0], recv, send)};
                       });
    }
    return out;
  }

 private:
  Communicator& group_;
  CommStats* stats_;
};

}  // namespace

std::unique_ptr<nn::ExpertExchange> expert_exchange(Communicator& group, CommStats* stats) {
  return std::make_unique<CommunicatorExchange>(group, stats);
}

}  // namespace titan::dist
