#pragma once
// A world of `size` ranks for planning a data-parallel step on the `meta` device: this process is
// rank 0, the other ranks are imagined. A ParallelPlan and ShardedBlocks over it make exactly the
// calls they make in a real job (per-layer gathers, gradient reductions, the grad norm), so a meta
// step through them allocates what one rank of the real job allocates and counts what it sends:
// `titan plan` and the trainer's memory check use it.
//
// It moves no data:
//   buffers on the meta device      have none: every collective on them is a no-op;
//   host buffers (host_context():   the step's scalars (loss sums, the squared grad norm, flags,
//   no device services)             counts) keep this rank's values, as if the imagined ranks
//                                   contributed nothing: an all-reduce leaves them, an all-gather
//                                   fills this rank's slot, a reduce-scatter keeps this rank's part,
//                                   an all-to-all copies the segment this rank sends itself (segment
//                                   0 of send into segment 0 of recv) and leaves the others;
//   tensors on a real device        are refused with an error: a real step over imagined ranks
//                                   would silently train on one rank's data.
// A group split from it keeps this process as its rank 0, of the size the caller's mesh gives it
// (Communicator::split: the imagined ranks' colors are not known, the mesh's group sizes are).
#include <memory>

#include "titan/dist/communicator.h"

namespace titan::dist {

std::unique_ptr<Communicator> meta_world_communicator(int size);

}  // namespace titan::dist
