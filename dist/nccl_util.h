#pragma once
// What the context-parallel attentions share: NCCL results as tj::Error, a communicator's rank and
// size, and device scratch kept across calls.
#include <nccl.h>

#include <optional>
#include <vector>

#include "runtime/owned_tensor.h"

namespace tj::dist {

// Throws tj::Error "<who>: <what>: <NCCL's error> (<its last message>)" unless r is ncclSuccess
// (or ncclInProgress, a non-blocking communicator's).
void nccl_check(ncclResult_t r, const char* who, const char* what);

struct RankOf {
  int rank = 0, ranks = 1;
};
// The calling rank and the communicator's size; throws tj::Error for a null communicator.
RankOf rank_of(ncclComm_t comm, const char* who);

// t, reallocated when its dtype or shape differ (never shrunk in place: a new shape is a new tensor).
void ensure_tensor(std::optional<DeviceTensor>& t, DType dt, const std::vector<int64_t>& shape);

}  // namespace tj::dist
