#include "dist/nccl_util.h"

#include <fmt/format.h>

#include "core/error.h"

namespace tj::dist {

void nccl_check(ncclResult_t r, const char* who, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw Error(fmt::format("{}: {}: {} ({})", who, what, ncclGetErrorString(r), ncclGetLastError(nullptr)));
}

RankOf rank_of(ncclComm_t comm, const char* who) {
  if (!comm) throw Error(fmt::format("{}: no communicator (null ncclComm_t)", who));
  RankOf r;
  nccl_check(ncclCommCount(comm, &r.ranks), who, "ncclCommCount");
  nccl_check(ncclCommUserRank(comm, &r.rank), who, "ncclCommUserRank");
  return r;
}

void ensure_tensor(std::optional<DeviceTensor>& t, DType dt, const std::vector<int64_t>& shape) {
  if (!t || t->dtype() != dt || t->shape() != shape) t.emplace(dt, shape);
}

}  // namespace tj::dist
