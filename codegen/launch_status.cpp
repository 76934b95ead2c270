#include "codegen/launch_status.h"

namespace tj::codegen {

const char* status_message(LaunchStatus s) {
  switch (s) {
    case LaunchStatus::success: return "success";
    case LaunchStatus::invalid_argument: return "invalid argument (a NULL tensor, a negative dimension, a wrong argument kind or count, or memory that is not on the GPU)";
    case LaunchStatus::dtype: return "no exported specialization takes these element types or ranks";
    case LaunchStatus::shape: return "no exported specialization for these shapes or flags";
    case LaunchStatus::alignment: return "a tensor's data or strides are not aligned as the kernel needs";
    case LaunchStatus::unsupported_device: return "no CUBIN for the current GPU's architecture";
    case LaunchStatus::no_context: return "no current CUDA context on the calling thread";
    case LaunchStatus::cuda: return "a CUDA driver call failed";
    case LaunchStatus::too_large: return "the problem needs more thread blocks than one launch allows";
    case LaunchStatus::too_many_contexts: return "more CUDA contexts than the launcher tracks";
  }
  return "unknown tj_status";
}

}  // namespace tj::codegen
