#include "gpu_run.h"

#include "autotune/launch.h"
#include "runtime/driver.h"
#include "runtime/reference.h"

namespace tj_test {

using namespace tj;

HostTensor random_tensor(DType dt, std::vector<int64_t> shape, std::mt19937& rng, double scale) {
  HostTensor t(dt, std::move(shape));
  std::normal_distribution<double> n(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, n(rng));
  return t;
}

BothRuns run_reference_and_gpu(const Kernel& k, std::vector<HostTensor>& tensors, const std::vector<Arg>& tail, size_t out,
                               const std::optional<Config>& config, const std::string& arch, bool keep_out) {
  std::vector<Arg> host_args, dev_args;
  std::vector<DeviceTensor> dev;
  dev.reserve(tensors.size());
  if (!keep_out) tensors[out].fill_bytes(0xFF);
  for (auto& t : tensors) {
    host_args.push_back(t.view());
    dev.push_back(DeviceTensor::from_host(t));
  }
  for (auto& d : dev) dev_args.push_back(d.view());
  for (const auto& a : tail) {
    host_args.push_back(a);
    dev_args.push_back(a);
  }
  const auto specs = specs_for(k, host_args, false);
  const ir::Function f = k.trace(specs);
  const Config cfg = config ? *config : default_config(f);
  run_reference(f, cfg, param_values(k, host_args));
  LaunchOptions opts;
  opts.config = cfg;
  opts.arch = arch;   // "": the GPU's own; an older one loads as PTX
  launch(k, dev_args, opts);
  runtime::synchronize();
  CompileRequest req;
  req.load = false;
  req.arch = arch;
  return BothRuns{tensors[out], dev[out].to_host(), compile(k, specs, cfg, req).generated.lowering};
}

}  // namespace tj_test
