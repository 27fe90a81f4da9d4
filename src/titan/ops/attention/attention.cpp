#include "titan/ops/attention/attention.h"

#include <string>
#include <vector>

#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/activation_grads.h"
#include "titan/ops/same_device.h"

namespace titan::ops {

void check_attention_shape(const AttentionShape& s, const char* who) {
  TITAN_CHECK(s.B > 0 && s.S > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0, who,
              ": every dimension must be positive, got B=", s.B, " S=", s.S, " Hq=", s.Hq, " Hkv=", s.Hkv,
              " D=", s.D);
  TITAN_CHECK(s.Hq % s.Hkv == 0, who, ": Hq=", s.Hq, " must be a multiple of Hkv=", s.Hkv);
}

namespace {

// One kernel call: `rows` rows of `length` tokens from flattened token `first`.
struct AttentionCall {
  int64_t first, rows, length;
};

// The kernel calls that compute attention over `documents` of rows shaped as `s`: one per document,
// except that consecutive rows holding one document each go in one call.
std::vector<AttentionCall> attention_calls(const AttentionShape& s, const DocumentSpans& documents) {
  if (documents.empty()) return {{0, s.B, s.S}};
  const std::vector<int64_t>& starts = documents.starts;
  std::vector<AttentionCall> calls;
  size_t next = 0;  // the first document of row b
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t row = b * s.S, row_end = row + s.S;
    TITAN_CHECK(next < starts.size() && starts[next] == row,
                "attention: document starts must include every row's first token (", row, " of row ", b,
                ", rows of ", s.S, " tokens) and increase; got ",
                next < starts.size() ? std::to_string(starts[next]) : std::string("none"), " there");
    size_t last = next + 1;  // one past the row's documents
    while (last < starts.size() && starts[last] < row_end) {
      TITAN_CHECK(starts[last] > starts[last - 1], "attention: document starts must increase; ", starts[last],
                  " follows ", starts[last - 1]);
      ++last;
    }
    if (last == next + 1 && !calls.empty() && calls.back().length == s.S &&
        calls.back().first + calls.back().rows * s.S == row)
      ++calls.back().rows;
    else
      for (size_t d = next; d < last; ++d)
        calls.push_back({starts[d], 1, (d + 1 < last ? starts[d + 1] : row_end) - starts[d]});
    next = last;
  }
  TITAN_CHECK(next == starts.size(), "attention: ", starts.size() - next, " document starts lie past the ",
              s.B, " rows of ", s.S, " tokens (first: ", starts[next], ")");
  return calls;
}

// The element `offset` elements into t's data.
void* at(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.raw_data()) + offset * int64_t(dtype_size(t.dtype()));
}

}  // namespace

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale,
                 const DocumentSpans& documents) {
  TITAN_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4,
              "attention: expected q [B, S, Hq, D], k and v [B, S, Hkv, D]; got q ", q_in.str(), ", k ", k_in.str(),
              ", v ", v_in.str());
  TITAN_CHECK(k_in.shape() == v_in.shape(), "attention: k ", k_in.str(), " and v ", v_in.str(), " differ");
  check_same_device("attention", {{"q", &q_in}, {"k", &k_in}, {"v", &v_in}});
  TITAN_CHECK(q_in.size(0) == k_in.size(0) && q_in.size(1) == k_in.size(1) && q_in.size(3) == k_in.size(3),
              "attention: q ", q_in.str(), " and k ", k_in.str(), " disagree on B, S or D");
  TITAN_CHECK(k_in.size(2) > 0 && q_in.size(2) % k_in.size(2) == 0, "attention: query heads (", q_in.size(2),
              ") must be a multiple of kv heads (", k_in.size(2), "); q ", q_in.str(), ", k ", k_in.str());
  TITAN_CHECK(q_in.dtype() == k_in.dtype() && q_in.dtype() == v_in.dtype(), "attention: dtypes differ: q ",
              q_in.str(), ", k ", k_in.str(), ", v ", v_in.str());
  Tensor q = q_in.contiguous().detach(), k = k_in.contiguous().detach(), v = v_in.contiguous().detach();
  AttentionShape s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), float(scale)};
  const DType stat = q.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const auto& kernel = kernels::kernel_for<AttentionKernel>("attention", q.device(), q.dtype());
  const KernelContext ctx = device_services(q.device()).context();
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({s.B, s.Hq, s.S}, stat, q.device());
  const std::vector<AttentionCall> calls = attention_calls(s, documents);
  // Pointers of call c into the [B, S, H, D] tensors (query-sized or kv-sized) and the lse.
  const int64_t q_token = s.Hq * s.D, kv_token = s.Hkv * s.D;
  auto shape_of = [s](const AttentionCall& c) {
    return AttentionShape{c.rows, c.length, s.Hq, s.Hkv, s.D, s.scale};
  };
  for (const AttentionCall& c : calls)
    kernel.forward(ctx, shape_of(c), at(q, c.first * q_token), at(k, c.first * kv_token),
                   at(v, c.first * kv_token), at(out, c.first * q_token), at(lse, c.first * s.Hq));
  if (autograd::needs_grad({&q_in, &k_in, &v_in})) {
    Tensor saved_out = out.detach();
    const ActivationGrads act(q, kernel.backward_bf16_grads != nullptr);
    autograd::record(
        "attention", {q_in, k_in, v_in}, {&out},
        [=, &kernel](const std::vector<Tensor>& g) {
          const DType gd = act.kernel_dtype();
          Tensor dout = act.upstream(g[0]);
          Tensor dq = Tensor::empty(q.shape(), gd, q.device()), dk = Tensor::empty(k.shape(), gd, q.device()),
                 dv = Tensor::empty(v.shape(), gd, q.device());
          const auto backward = act.native() ? kernel.backward_bf16_grads : kernel.backward;
          for (const AttentionCall& c : calls)
            backward(ctx, shape_of(c), at(q, c.first * q_token), at(k, c.first * kv_token),
                     at(v, c.first * kv_token), at(saved_out, c.first * q_token), at(lse, c.first * s.Hq),
                     at(dout, c.first * q_token), at(dq, c.first * q_token), at(dk, c.first * kv_token),
                     at(dv, c.first * kv_token));
          return std::vector<Tensor>{act.returned(dq), act.returned(dk), act.returned(dv)};
        },
        act.bf16());
  }
  return out;
}

}  // namespace titan::ops
