#include "titan/train/hf_export.h"

#include <string>
#include <utility>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/device_services.h"

namespace titan::train {

namespace {

constexpr size_t kNone = ~size_t(0);

// A rank's run of an expert parameter, as the exchange reads it.
Tensor run_values(const nn::Param& run) {
  Tensor v = run.value.detach();
  TITAN_CHECK(v.dtype() == DType::F32 && v.is_contiguous(), "export: ", run.name, " is ", v.str(),
              "; the exchange of a run of experts reads contiguous f32 masters");
  return v;
}

std::string describe(const std::vector<ExportEvent>& events, size_t i) {
  if (i == events.size()) return "the end of the export";
  const ExportEvent& e = events[i];
  switch (e.kind) {
    case ExportEvent::Read:
      return "a read of " + e.param->name;
    case ExportEvent::Exchange:
      return "the runs of " + e.param->name;
    case ExportEvent::Gather:
      return "the gather of block " + std::to_string(e.block);
    case ExportEvent::Release:
      break;
  }
  return "the release of block " + std::to_string(e.block);
}

// One rank's way through the export's events. The logging rank (world rank 0) is in the first shard
// group (rank = replicate_index x dp_shard + shard_index) and the first expert group (ep consecutive
// ranks of it): the ranks of that shard group gather what its writer reads (a block of experts over
// the ranks holding the same run, all of them in that shard group), the ranks of that expert group
// exchange the experts, and the ranks of other replicas hold their slices alone meanwhile.
class EventRunner {
 public:
  EventRunner(const dist::ParallelPlan& plan, qwen3::Qwen3Model& model, dist::ShardedBlocks& sharding)
      : plan_(plan),
        sharding_(sharding),
        events_(export_events(model)),
        gathers_(plan.replicate_index() == 0),
        exchanges_(plan.ep() > 1 && plan.rank() - plan.expert_index() == 0) {}

  const std::vector<ExportEvent>& events() const { return events_; }

  // The logging rank: the events up to its writer's next read, which must be of `kind` and `param`.
  void reach(ExportEvent::Kind kind, const nn::Param& param) {
    while (next_ < events_.size() && !is_read(events_[next_])) collective(events_[next_++]);
    TITAN_CHECK(next_ < events_.size() && events_[next_].kind == kind && events_[next_].param == &param,
                "export: the writer reached ", kind == ExportEvent::Read ? "a read of " : "the runs of ",
                param.name, " where the export's events have ", describe(events_, next_),
                "; the other ranks follow the events (qwen3::export_reads must list the writer's reads)");
    ++next_;
  }
  // The logging rank, its writer done: the events left (the last release).
  void finish() {
    while (next_ < events_.size()) {
      TITAN_CHECK(!is_read(events_[next_]), "export: the writer ended before ", describe(events_, next_));
      collective(events_[next_++]);
    }
  }
  // Every other rank: all of them, as the logging rank's writer runs them.
  void take_part() {
    TITAN_CHECK(!plan_.is_logging_rank(), "export: the logging rank's events run as its writer reads");
    for (const ExportEvent& e : events_) {
      if (e.kind == ExportEvent::Exchange) {
        if (exchanges_) send(*e.param);
      } else if (e.kind != ExportEvent::Read) {
        collective(e);
      }
    }
  }

  void collective(const ExportEvent& e) {
    if (!gathers_) return;
    if (e.kind == ExportEvent::Gather) sharding_.gather_whole(e.block);
    if (e.kind == ExportEvent::Release) sharding_.release_whole(e.block);
  }

  // On the logging rank: every run of `run` from its expert group, [E, ...] in run order; rank r of
  // the group holds run r: its segment lands at element r x run size.
  Tensor receive(const nn::Param& run) const {
    dist::Communicator& group = plan_.expert_group();
    const Tensor mine = run_values(run);
    Shape shape = mine.shape();
    shape[0] *= group.size();
    Tensor whole = Tensor::empty(shape, DType::F32, mine.device());
    std::vector<int64_t> send(size_t(group.size()), 0), recv(size_t(group.size()), mine.numel());
    send[0] = mine.numel();
    group.all_to_all(mine.raw_data(), send, whole.raw_data(), recv, DType::F32,
                     device_services(mine.device()).context());
    return whole;
  }

 private:
  static bool is_read(const ExportEvent& e) {
    return e.kind == ExportEvent::Read || e.kind == ExportEvent::Exchange;
  }
  // Another rank of the logging rank's expert group: its run of `run`, to the logging rank.
  void send(const nn::Param& run) const {
    dist::Communicator& group = plan_.expert_group();
    const Tensor mine = run_values(run);
    std::vector<int64_t> send(size_t(group.size()), 0), recv(size_t(group.size()), 0);
    send[0] = mine.numel();
    group.all_to_all(mine.raw_data(), send, nullptr, recv, DType::F32,
                     device_services(mine.device()).context());
  }

  const dist::ParallelPlan& plan_;
  dist::ShardedBlocks& sharding_;
  const std::vector<ExportEvent> events_;
  const bool gathers_, exchanges_;
  size_t next_ = 0;
};

}  // namespace

std::vector<ExportEvent> export_events(qwen3::Qwen3Model& model) {
  const std::vector<nn::ParamBlock>& blocks = model.blocks();
  auto block_of = [&](const nn::Param* p) {
    for (size_t b = 0; b < blocks.size(); ++b)
      if (blocks[b].holds(p)) return b;
    TITAN_FAIL("export: parameter ", p->name, " is in none of the model's blocks");
  };
  std::vector<ExportEvent> events;
  size_t held = kNone;
  for (const qwen3::ExportRead& r : qwen3::export_reads(model)) {
    const size_t b = block_of(r.param);
    if (b != held) {
      if (held != kNone) events.push_back({ExportEvent::Release, held});
      events.push_back({ExportEvent::Gather, b});
      held = b;
    }
    events.push_back({r.whole_experts ? ExportEvent::Exchange : ExportEvent::Read, b, r.param});
  }
  if (held != kNone) events.push_back({ExportEvent::Release, held});
  return events;
}

void export_from_ranks(const dist::ParallelPlan& plan, qwen3::Qwen3Model& model,
                       dist::ShardedBlocks& sharding,
                       const std::function<void(const qwen3::ExportSource& source)>& write) {
  EventRunner runner(plan, model, sharding);
  if (!plan.is_logging_rank()) return runner.take_part();
  qwen3::ExportSource source;
  source.before_read = [&runner](const nn::Param& p) { runner.reach(ExportEvent::Read, p); };
  if (plan.ep() > 1)
    source.whole_experts = [&runner](nn::Param& run) {
      runner.reach(ExportEvent::Exchange, run);
      return runner.receive(run);
    };
  write(source);
  runner.finish();
}

void rehearse_export(const dist::ParallelPlan& plan, qwen3::Qwen3Model& model, dist::ShardedBlocks& sharding,
                     bool whole_experts_held) {
  TITAN_CHECK(plan.is_logging_rank(), "export: rank ", plan.rank(),
              " rehearsed the export; the logging rank (0) alone writes it");
  EventRunner runner(plan, model, sharding);
  std::vector<Tensor> held;  // the writer's whole experts of a MoE layer (export_hf_model)
  size_t held_block = kNone;
  for (const ExportEvent& e : runner.events()) {
    if (e.kind == ExportEvent::Read) continue;
    if (e.kind != ExportEvent::Exchange) {
      runner.collective(e);
      continue;
    }
    if (e.block != held_block) held.clear();  // before the next layer's arrive
    held_block = e.block;
    Tensor whole = runner.receive(*e.param);
    if (whole_experts_held) held.push_back(std::move(whole));
  }
}

}  // namespace titan::train
