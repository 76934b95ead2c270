#pragma once
// What the context-parallel attentions share: NCCL results as tj::Error, a communicator's rank and
// size, device scratch kept across calls, views into a byte buffer (the shards' slots), and the
// stream-ordered copies, fills and waits around the transfers.
#include <cuda.h>
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

int64_t round_up(int64_t x, int64_t m);

// A [shape] view of `dt` at byte `offset` of a device buffer (a slot's tensors, 256 bytes apart).
TensorView byte_view(const DeviceTensor& bytes, int64_t offset, DType dt, std::vector<int64_t> shape);

// In stream order: dst = src (contiguous, the same bytes); t = 0; the stream waits for e.
void copy_async(const TensorView& dst, const TensorView& src, CUstream stream);
void zero_async(const TensorView& t, CUstream stream);
void wait_event(CUstream stream, CUevent e);

}  // namespace tj::dist
