#pragma once
// bench_dsl's case group "backward": the attention backward written as user code
// (examples::attention_bwd_delta / _dkdv / _dq), timed as one pass of its three kernels after a
// forward that saves the LSE, and checked against float64 gradients.
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "bench/common/timing.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "runtime/memory.h"

namespace tj::bench_dsl {

struct BenchContext {
  const runtime::DeviceInfo& dev;
  bench::Spinner& spinner;
  runtime::Stream& stream;
  runtime::DeviceBuffer& flush;   // written before each sample: the L2 holds none of the inputs
  std::ostream& jsonl;
  int reps = 20, warmup = 3;
};

// D 128, H 16, S 1k / 4k / 16k with B·S = 16k (quick: S 4k), causal and not. Paths: the
// kernels' untuned configs (three kernels, fused, and the FP8 backward: attention_backward with
// fp8 after the FP8 forward, its row's time the two FP8 kernels', the call's with its quantizers
// as "api"), then one more per `also` (label, "+JSON" over the untuned config of the dK / dV and
// the dQ kernels; a label starting "fp8": of the FP8 kernels, "fp8 kv" / "fp8 q": of one of them).
// Rows whose name lacks `name_has` are skipped.
void bench_backward(BenchContext& ctx, bool quick, const std::string& name_has,
                    const std::vector<std::pair<std::string, std::string>>& also);

}  // namespace tj::bench_dsl
