#include "runtime/jit.h"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "codegen/device_library.h"
#include "codegen/target.h"
#include "runtime/device.h"
#include "runtime/disk_cache.h"
#include "runtime/driver.h"
#include "runtime/hash.h"
#include "runtime/nvrtc.h"
#include "runtime/reference.h"

namespace tj {

namespace {

std::string spec_key(const std::vector<ArgSpec>& specs) {
  std::string key;
  for (const auto& s : specs) {
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, TensorSpec>) key += fmt::format("T{}[{}]", name(v.dtype), fmt::join(v.shape, ","));
          else if constexpr (std::is_same_v<T, RuntimeScalar>) key += "S";
          else key += fmt::format("H{}", v);
        },
        s);
    key += ';';
  }
  return key;
}

std::vector<std::pair<std::string, std::string>> device_headers() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : codegen::device_library()) out.emplace_back(f.name, f.contents);
  return out;
}

struct Caches {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<CompiledKernel>> compiled;   // by memory key
};
Caches& caches() {
  static Caches c;
  return c;
}

}  // namespace

std::string compile_key(const std::string& cuda_source, const std::string& arch) {
  static const std::string library_hash = [] {
    runtime::Hasher h;
    for (const auto& f : codegen::device_library()) h.field(f.name).field(f.contents);
    return h.hex();
  }();
  runtime::Hasher h;
  h.field("tilejit-cubin-v1").field(arch).field(std::to_string(runtime::nvrtc_version())).field(library_hash).field(cuda_source);
  return h.hex();
}

std::vector<ArgSpec> specs_for(const Kernel& k, const std::vector<Arg>& args, bool dynamic_shapes) {
  const auto& slots = k.slots();
  if (args.size() != slots.size())
    throw Error(fmt::format("kernel '{}' takes {} arguments, {} were given", k.name(), slots.size(), args.size()));
  std::vector<ArgSpec> specs;
  for (size_t i = 0; i < args.size(); ++i) {
    const Slot& s = slots[i];
    auto wrong = [&](const char* got) {
      return Error(fmt::format("kernel '{}': argument {} ('{}') must be {}, got {}", k.name(), i, s.name, name(s.kind), got));
    };
    const Arg& a = args[i];
    if (s.is_tensor()) {
      const auto* t = std::get_if<TensorView>(&a);
      if (!t) throw wrong("a number");
      if (t->rank() == 0) throw Error(fmt::format("kernel '{}': tensor '{}' has rank 0", k.name(), s.name));
      if (!t->strides.empty() && t->strides.size() != t->shape.size())
        throw Error(fmt::format("kernel '{}': tensor '{}' has {} strides for {} dims", k.name(), s.name, t->strides.size(), t->rank()));
      for (int64_t d : t->shape)
        if (d < 0) throw Error(fmt::format("kernel '{}': tensor '{}' has a negative dimension", k.name(), s.name));
      TensorSpec spec{t->dtype, t->shape};
      if (dynamic_shapes) std::fill(spec.shape.begin(), spec.shape.end(), -1);
      specs.push_back(spec);
    } else if (s.kind == SlotKind::scalar_f32) {
      if (const auto* d = std::get_if<double>(&a)) specs.push_back(RuntimeScalar{static_cast<float>(*d)});
      else if (const auto* n = std::get_if<int64_t>(&a)) specs.push_back(RuntimeScalar{static_cast<float>(*n)});
      else throw wrong(std::holds_alternative<bool>(a) ? "a bool" : "a tensor");
    } else if (s.kind == SlotKind::host_bool) {
      if (const auto* b = std::get_if<bool>(&a)) specs.push_back(*b);
      else throw wrong("something else");
    } else if (s.kind == SlotKind::host_int) {
      if (const auto* n = std::get_if<int64_t>(&a)) specs.push_back(*n);
      else throw wrong("something else");
    } else {
      if (const auto* d = std::get_if<double>(&a)) specs.push_back(*d);
      else if (const auto* n = std::get_if<int64_t>(&a)) specs.push_back(static_cast<double>(*n));
      else throw wrong("something else");
    }
  }
  return specs;
}

const CompiledKernel& compile(const Kernel& k, const std::vector<ArgSpec>& specs, const Config& config,
                              const CompileRequest& request) {
  std::string arch = request.arch;
  if (arch.empty()) {
    if (!runtime::driver().available())
      throw Error(fmt::format("no GPU to compile for ({}); name an architecture such as sm_90a",
                              runtime::driver().unavailable_reason()));
    arch = runtime::current_device().arch();
  }
  std::string memory_key = fmt::format("{}@{}|{}|{}|{}", k.name(), static_cast<const void*>(&k), spec_key(specs),
                                       config.to_json(), arch);
  Caches& c = caches();
  CompiledKernel* found = nullptr;
  {
    std::lock_guard lock(c.mutex);
    auto it = c.compiled.find(memory_key);
    if (it != c.compiled.end() && !(request.want_ptx && it->second->ptx.empty())) found = it->second.get();
  }
  if (!found) {
    // Compile without holding the lock: the tuner compiles candidates on several threads.
    auto ck = std::make_unique<CompiledKernel>();
    ck->ir = k.trace(specs);
    check_config(ck->ir, config);
    ck->config = config;
    ck->arch = arch;
    ck->generated = codegen::generate_cuda(ck->ir, config, codegen::Target::parse(arch));
    std::string key = compile_key(ck->generated.source, arch);
    runtime::DiskCache disk(runtime::DiskCache::default_dir());
    std::optional<std::string> cached = request.want_ptx ? std::nullopt : disk.get(key);
    if (cached) {
      ck->cubin.assign(cached->begin(), cached->end());
      ck->from_disk_cache = true;
    } else {
      runtime::CompileOptions opts;
      opts.arch = arch;
      opts.want_ptx = request.want_ptx;
      opts.headers = device_headers();
      auto result = runtime::compile_cuda(ck->generated.source, ck->generated.name + ".cu", opts);
      ck->cubin = std::move(result.cubin);
      ck->ptx = std::move(result.ptx);
      ck->compile_ms = result.milliseconds;
      disk.put(key, std::string_view(ck->cubin.data(), ck->cubin.size()));
    }
    std::lock_guard lock(c.mutex);
    auto& slot = c.compiled[memory_key];
    // Entries are never erased (references stay valid); a racing compile of the same key
    // keeps the first result.
    if (!slot) slot = std::move(ck);
    else if (request.want_ptx && slot->ptx.empty()) slot->ptx = std::move(ck->ptx);
    found = slot.get();
  }
  CompiledKernel& ck = *found;
  std::lock_guard lock(c.mutex);
  if (request.load && !ck.module) {
    auto module = std::make_unique<runtime::Module>(ck.cubin);
    CUfunction fn = module->function(ck.generated.entry);
    if (ck.generated.dynamic_smem_bytes > 48 * 1024) {
      const auto& dev = runtime::current_device();
      if (ck.generated.dynamic_smem_bytes > static_cast<size_t>(dev.max_smem_per_block_optin))
        throw Error(fmt::format("kernel '{}' needs {} bytes of shared memory with config {}; {} allows {}", k.name(),
                                ck.generated.dynamic_smem_bytes, config.to_json(), dev.name, dev.max_smem_per_block_optin));
      runtime::Module::set_max_dynamic_shared_bytes(fn, ck.generated.dynamic_smem_bytes);
    }
    ck.function = fn;
    ck.module = std::move(module);
  }
  return ck;
}

namespace {

// Packs one argument per kernel parameter exactly as the generated signature expects:
// tensors as tj::dev::TensorArg<R> {data, shape[R], stride[R]}, scalars as float.
struct PackedArgs {
  std::vector<std::vector<int64_t>> tensors;
  std::vector<float> scalars;
  std::vector<void*> pointers;
};

PackedArgs pack(const Kernel& k, const ir::Function& f, const std::vector<Arg>& args) {
  PackedArgs p;
  p.tensors.reserve(args.size());
  p.scalars.reserve(args.size());
  size_t param = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const Slot& s = k.slots()[i];
    if (s.is_tensor()) {
      const auto& t = std::get<TensorView>(args[i]);
      if (t.device != Device::cuda)
        throw Error(fmt::format("kernel '{}': tensor '{}' is in host memory; launch needs device memory", k.name(), s.name));
      if (t.data == nullptr && t.numel() > 0)
        throw Error(fmt::format("kernel '{}': tensor '{}' has no data pointer", k.name(), s.name));
      std::vector<int64_t> words;
      words.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data)));
      words.insert(words.end(), t.shape.begin(), t.shape.end());
      const auto& st = t.effective_strides();
      words.insert(words.end(), st.begin(), st.end());
      p.tensors.push_back(std::move(words));
      p.pointers.push_back(p.tensors.back().data());
      ++param;
    } else if (s.kind == SlotKind::scalar_f32) {
      const Arg& a = args[i];
      p.scalars.push_back(std::holds_alternative<double>(a) ? static_cast<float>(std::get<double>(a))
                                                            : static_cast<float>(std::get<int64_t>(a)));
      p.pointers.push_back(&p.scalars.back());
      ++param;
    }
  }
  if (param != f.params.size()) throw Error("internal error: argument packing does not match the kernel's parameters");
  return p;
}

}  // namespace

void launch(const Kernel& k, const std::vector<Arg>& args, const LaunchOptions& options) {
  auto specs = specs_for(k, args, options.dynamic_shapes);
  Config config;
  if (options.config) {
    config = *options.config;
  } else {
    // The default for this specialization (the tuner fills in tuned configs later).
    config = default_config(k.trace(specs));
  }
  const CompiledKernel& ck = compile(k, specs, config, CompileRequest{});
  std::vector<ArgValue> shapes;
  for (const Arg& a : args) {
    if (const auto* t = std::get_if<TensorView>(&a)) shapes.emplace_back(*t);
    else if (const auto* d = std::get_if<double>(&a)) shapes.emplace_back(static_cast<float>(*d));
    else if (const auto* n = std::get_if<int64_t>(&a)) shapes.emplace_back(static_cast<float>(*n));
    else shapes.emplace_back(0.0f);
  }
  // Host values are not parameters: keep only tensors and runtime scalars.
  std::vector<ArgValue> param_args;
  for (size_t i = 0; i < args.size(); ++i)
    if (!k.slots()[i].is_host()) param_args.push_back(shapes[i]);
  LaunchShape shape = launch_shape(ck.ir, ck.config, param_args);
  if (shape.programs == 0) return;
  if (shape.programs > 0x7fffffffLL)
    throw Error(fmt::format("kernel '{}' needs {} programs; at most 2^31-1 fit one launch", k.name(), shape.programs));
  PackedArgs packed = pack(k, ck.ir, args);
  runtime::launch(ck.function, runtime::Dim3(static_cast<unsigned>(shape.programs)),
                  runtime::Dim3(static_cast<unsigned>(ck.generated.threads)), ck.generated.dynamic_smem_bytes, options.stream,
                  packed.pointers.data());
}

}  // namespace tj
