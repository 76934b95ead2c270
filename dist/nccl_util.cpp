#include "dist/nccl_util.h"

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/driver.h"

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

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

TensorView byte_view(const DeviceTensor& bytes, int64_t offset, DType dt, std::vector<int64_t> shape) {
  TensorView v;
  v.data = static_cast<char*>(bytes.view().data) + offset;
  v.dtype = dt;
  v.shape = std::move(shape);
  v.device = Device::cuda;
  return v;
}

void copy_async(const TensorView& dst, const TensorView& src, CUstream stream) {
  runtime::Driver& d = runtime::driver();
  d.check(d.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst.data), reinterpret_cast<CUdeviceptr>(src.data),
                              static_cast<size_t>(src.numel()) * size_bytes(src.dtype), stream),
          "cuMemcpyDtoDAsync");
}

void zero_async(const TensorView& t, CUstream stream) {
  runtime::Driver& d = runtime::driver();
  d.check(d.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(t.data), 0, static_cast<size_t>(t.numel()) * size_bytes(t.dtype), stream),
          "cuMemsetD8Async");
}

void wait_event(CUstream stream, CUevent e) {
  runtime::Driver& d = runtime::driver();
  d.check(d.cuStreamWaitEvent(stream, e, 0), "cuStreamWaitEvent");
}

}  // namespace tj::dist
