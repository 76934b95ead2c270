#include "runtime/jit.h"

#include <charconv>

#include <fmt/format.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <cstdio>
#include <cstdlib>

#include "codegen/lowering.h"
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
      TensorSpec spec{t->dtype, t->shape, unit_strides(t->effective_strides())};
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

namespace {
std::atomic<uint64_t> g_nvrtc_compiles{0};

// Whether a kernel generated for `arch` must load on `dev` as PTX: the GPU runs CUBINs of its
// own major version up to its minor (arch-specific sm_90a: exactly 9.0) and JIT-compiles the
// PTX of older architectures. Throws for an architecture newer than the GPU.
bool loads_as_ptx(const std::string& kernel, const std::string& arch, const runtime::DeviceInfo& dev) {
  const codegen::Target t = codegen::Target::parse(arch);
  const int target_cc = t.sm(), device_cc = dev.cc_major * 10 + dev.cc_minor;
  if (target_cc > device_cc || (t.has_wgmma() && target_cc != device_cc))
    throw Error(fmt::format("kernel '{}' generated for {} cannot run on {} (compute capability {}.{}); generate it for {} or "
                            "an older architecture",
                            kernel, arch, dev.name, dev.cc_major, dev.cc_minor, dev.arch()));
  return target_cc / 10 != device_cc / 10;
}

// What tells compiled kernels apart in memory: the kernel object, the specialization, the config,
// the target. Appended, not formatted: every launch with a config computes it (about 1 µs with a
// dozen arguments, against 5 with spec_key's and to_json's formatting).
std::string memory_cache_key(const Kernel& k, const std::vector<ArgSpec>& specs, const Config& config, const std::string& arch,
                             bool start_early) {
  std::string key = k.name();
  char buf[24];
  auto number = [&](int64_t v) { key.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr); };
  key += '@';
  number(static_cast<int64_t>(reinterpret_cast<uintptr_t>(&k)));
  key += '|';
  key += spec_key(specs);
  key += '|';
  for (const auto& [name, v] : config.blocks) {
    key += name;
    key += '=';
    number(v);
    key += ',';
  }
  key += "w";
  number(config.num_warps);
  key += "s";
  number(config.num_stages);
  for (const auto& [name, v] : config.knobs) {
    key += ',';
    key += name;
    key += '=';
    number(v);
  }
  key += '|';
  key += arch;
  if (start_early) key += "|early";
  return key;
}
}  // namespace

uint64_t nvrtc_compile_count() { return g_nvrtc_compiles.load(std::memory_order_relaxed); }

const CompiledKernel& compile(const Kernel& k, const std::vector<ArgSpec>& specs, const Config& config,
                              const CompileRequest& request) {
  std::string arch = request.arch;
  if (arch.empty()) {
    if (!runtime::driver().available())
      throw Error(fmt::format("no GPU to compile for ({}); name an architecture such as sm_90a",
                              runtime::driver().unavailable_reason()));
    arch = runtime::current_device().arch();
  }
  const bool load_ptx = request.load && loads_as_ptx(k.name(), arch, runtime::current_device());
  const bool need_ptx = request.want_ptx || load_ptx;
  const std::string memory_key = memory_cache_key(k, specs, config, arch, request.start_early);
  Caches& c = caches();
  CompiledKernel* found = nullptr;
  {
    std::lock_guard lock(c.mutex);
    auto it = c.compiled.find(memory_key);
    if (it != c.compiled.end() && !(need_ptx && it->second->ptx.empty())) found = it->second.get();
  }
  if (!found) {
    // Compile without holding the lock: the tuner compiles candidates on several threads.
    auto ck = std::make_unique<CompiledKernel>();
    ck->ir = k.trace(specs);
    check_config(ck->ir, config);
    ck->config = config;
    ck->arch = arch;
    ck->generated = codegen::generate_cuda(ck->ir, config, codegen::Target::parse(arch), request.start_early);
    std::string key = compile_key(ck->generated.source, arch);
    // The PTX a load on a newer GPU needs is cached beside the CUBIN, under its own key.
    std::string ptx_key = compile_key(ck->generated.source, arch + "+ptx");
    runtime::DiskCache disk(runtime::DiskCache::default_dir());
    std::optional<std::string> cached = request.want_ptx ? std::nullopt : disk.get(key);
    std::optional<std::string> cached_ptx = cached && load_ptx ? disk.get(ptx_key) : std::nullopt;
    if (cached && (!load_ptx || cached_ptx)) {
      ck->cubin.assign(cached->begin(), cached->end());
      if (cached_ptx) ck->ptx = std::move(*cached_ptx);
      ck->from_disk_cache = true;
    } else {
      runtime::CompileOptions opts;
      opts.arch = arch;
      opts.want_ptx = need_ptx;
      opts.headers = device_headers();
      auto result = runtime::compile_cuda(ck->generated.source, ck->generated.name + ".cu", opts);
      g_nvrtc_compiles.fetch_add(1, std::memory_order_relaxed);
      ck->cubin = std::move(result.cubin);
      ck->ptx = std::move(result.ptx);
      ck->compile_ms = result.milliseconds;
      disk.put(key, std::string_view(ck->cubin.data(), ck->cubin.size()));
      if (load_ptx) disk.put(ptx_key, ck->ptx);
    }
    std::lock_guard lock(c.mutex);
    auto& slot = c.compiled[memory_key];
    // Entries are never erased (references stay valid); a racing compile of the same key
    // keeps the first result.
    if (!slot) slot = std::move(ck);
    else if (need_ptx && slot->ptx.empty()) slot->ptx = std::move(ck->ptx);
    found = slot.get();
  }
  CompiledKernel& ck = *found;
  std::lock_guard lock(c.mutex);
  if (request.load && !ck.module) {
    // PTX goes to cuModuleLoadData as NUL-terminated text.
    auto module = load_ptx ? std::make_unique<runtime::Module>(std::string_view(ck.ptx.c_str(), ck.ptx.size() + 1))
                           : std::make_unique<runtime::Module>(ck.cubin);
    CUfunction fn = module->function(ck.generated.entry);
    if (ck.generated.dynamic_smem_bytes > 48 * 1024) {
      const auto& dev = runtime::current_device();
      if (ck.generated.dynamic_smem_bytes > static_cast<size_t>(dev.max_smem_per_block_optin))
        throw Error(fmt::format("kernel '{}' needs {} bytes of shared memory with config {}; {} allows {}", k.name(),
                                ck.generated.dynamic_smem_bytes, config.to_json(), dev.name, dev.max_smem_per_block_optin));
    }
    runtime::Module::opt_in_shared_bytes(fn, ck.generated.dynamic_smem_bytes);
    ck.resident_blocks = runtime::max_active_blocks_per_sm(fn, ck.generated.threads, ck.generated.dynamic_smem_bytes);
    ck.function = fn;
    ck.module = std::move(module);
  }
  return ck;
}

namespace {

// Packs one argument per kernel parameter exactly as the generated signature expects:
// tensors as tj::dev::TensorArg<R> {data, shape[R], stride[R]}, scalars as float, then the
// TMA descriptors and (persistent kernels) the program count.
struct PackedArgs {
  std::vector<std::vector<int64_t>> tensors;
  std::vector<float> scalars;
  std::vector<CUtensorMap> maps;
  long long programs = 0;
  std::vector<void*> pointers;
};

CUtensorMapDataType tma_type(DType t) {
  switch (t) {
    case DType::f32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case DType::f16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::bf16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::i32: return CU_TENSOR_MAP_DATA_TYPE_INT32;
    default: return CU_TENSOR_MAP_DATA_TYPE_UINT8;   // fp8: raw bytes
  }
}

}  // namespace

CUtensorMap encode_tma(const std::string& kernel, const std::string& param, const TensorView& t, const codegen::TmaOperand& op) {
  auto fail = [&](const std::string& why) {
    return Error(fmt::format("kernel '{}': tensor '{}' ({}) cannot be read with the tensor copy engine (TMA): {}", kernel,
                             param, t.describe(), why));
  };
  std::vector<int64_t> shape = t.shape, strides = t.effective_strides();
  std::vector<int> box = op.box;
  std::vector<int> elem_strides = op.element_strides.empty() ? std::vector<int>(box.size(), 1) : op.element_strides;
  if (box.size() != shape.size() || elem_strides.size() != box.size())
    throw fail("internal error: the box's or the traversal strides' rank differs from the tensor's");
  const int rank = static_cast<int>(shape.size());
  if (rank > 5) throw fail("more than 5 dims");
  const int64_t elem = size_bytes(t.dtype);
  if (strides.back() != 1) throw fail("the last dim must be contiguous (stride 1)");
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) throw fail("the base address must be 16-byte aligned");
  cuuint64_t dims[5], gstrides[5];
  cuuint32_t boxes[5], estrides[5];
  for (int j = 0; j < rank; ++j) {
    int d = rank - 1 - j;   // innermost first
    dims[j] = static_cast<cuuint64_t>(shape[d]);
    boxes[j] = static_cast<cuuint32_t>(box[d]);
    estrides[j] = static_cast<cuuint32_t>(elem_strides[d]);
    if (box[d] < 1 || box[d] > 256) throw fail(fmt::format("box size {} outside [1, 256]", box[d]));
    if (elem_strides[d] < 1 || elem_strides[d] > 8)
      throw fail(fmt::format("internal error: traversal stride {} outside [1, 8]", elem_strides[d]));
    if (j > 0) {
      int64_t bytes = strides[d] * elem;
      if (bytes % 16 != 0)
        throw fail(fmt::format("dim {} has a stride of {} bytes, not a multiple of 16 (pad the last dim to a multiple of {} "
                               "elements)",
                               d, bytes, 16 / elem));
      gstrides[j - 1] = static_cast<cuuint64_t>(bytes);
    }
  }
  auto swizzle = op.swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                 : op.swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                 : op.swizzle_bytes == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                          : CU_TENSOR_MAP_SWIZZLE_NONE;
  auto& drv = runtime::driver();
  auto encode = drv.require(drv.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled");
  CUtensorMap map;
  runtime::check(encode(&map, tma_type(t.dtype), static_cast<cuuint32_t>(rank), t.data, dims, gstrides, boxes, estrides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
                 "cuTensorMapEncodeTiled");
  return map;
}

void check_aligned16(const std::string& kernel, const std::string& param, const TensorView& t) {
  auto fail = [&](const std::string& why) {
    return Error(fmt::format("kernel '{}': tensor '{}' ({}) cannot be read in 16-byte pieces (cp.async): {}", kernel, param,
                             t.describe(), why));
  };
  const std::vector<int64_t> strides = t.effective_strides();
  const int64_t elem = size_bytes(t.dtype);
  const int rank = static_cast<int>(t.shape.size());
  if (rank == 0) return;
  if (t.shape.back() > 1 && strides.back() != 1)
    throw fail(fmt::format("the last dim must be contiguous (stride 1), got stride {}", strides.back()));
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) throw fail("the base address must be 16-byte aligned");
  for (int d = 0; d < rank - 1; ++d) {
    const int64_t bytes = strides[d] * elem;
    if (t.shape[d] > 1 && bytes % 16 != 0)
      throw fail(fmt::format("dim {} has a stride of {} bytes, not a multiple of 16 (pad the last dim to a multiple of {} "
                             "elements)",
                             d, bytes, 16 / elem));
  }
}

namespace {

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

// The argument slot of kernel parameter `param`: the param-th tensor/scalar parameter is the
// argument of the param-th non-host slot.
size_t slot_of_param(const Kernel& k, int param) {
  int seen = -1;
  for (size_t i = 0; i < k.slots().size(); ++i) {
    if (k.slots()[i].is_host()) continue;
    if (++seen == param) return i;
  }
  throw Error(fmt::format("internal error: kernel '{}' has no parameter {}", k.name(), param));
}

// Appends the TMA descriptors the lowering asked for.
void pack_tma(const Kernel& k, const CompiledKernel& ck, const std::vector<Arg>& args, PackedArgs& p) {
  p.maps.reserve(ck.generated.tma.size());
  for (const codegen::TmaOperand& op : ck.generated.tma) {
    const size_t i = slot_of_param(k, op.param);
    p.maps.push_back(encode_tma(k.name(), k.slots()[i].name, std::get<TensorView>(args[i]), op));
    p.pointers.push_back(&p.maps.back());
  }
}

// The layouts of the tensors the kernel reads in 16-byte pieces.
void check_aligned_operands(const Kernel& k, const CompiledKernel& ck, const std::vector<Arg>& args) {
  for (int param : ck.generated.aligned16_params) {
    const size_t i = slot_of_param(k, param);
    check_aligned16(k.name(), k.slots()[i].name, std::get<TensorView>(args[i]));
  }
}

}  // namespace

LaunchGeometry launch_geometry(const CompiledKernel& ck, int64_t programs, int sm_count) {
  const codegen::GeneratedKernel& gk = ck.generated;
  LaunchGeometry g;
  g.programs = std::max<int64_t>(programs, 0);
  g.persistent = gk.persistent;
  const int64_t per_block = std::max(gk.programs_per_block, 1);
  int64_t blocks = (g.programs + per_block - 1) / per_block;
  const int per_sm = gk.blocks_per_sm > 0 ? gk.blocks_per_sm : ck.resident_blocks;
  if (gk.persistent) blocks = std::min<int64_t>(blocks, static_cast<int64_t>(std::max(sm_count, 1)) * std::max(per_sm, 1));
  if (gk.persistent && gk.max_blocks > 0) blocks = std::min<int64_t>(blocks, gk.max_blocks);
  const int64_t cluster = std::max(gk.cluster_x, 1);
  blocks = (blocks + cluster - 1) / cluster * cluster;   // blocks past the last program return at once
  if (blocks > 0x7fffffffLL)
    throw Error(fmt::format("kernel '{}' needs {} programs; at most 2^31-1 fit one launch", ck.ir.name, programs));
  g.grid = runtime::Dim3(static_cast<unsigned>(blocks));
  g.block = runtime::Dim3(static_cast<unsigned>(gk.threads));
  g.cluster = runtime::Dim3(static_cast<unsigned>(cluster));
  g.dynamic_smem = gk.dynamic_smem_bytes;
  return g;
}

std::vector<ArgValue> param_values(const Kernel& k, const std::vector<Arg>& args) {
  std::vector<ArgValue> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (k.slots()[i].is_host()) continue;   // host values are not parameters
    const Arg& a = args[i];
    if (const auto* t = std::get_if<TensorView>(&a)) out.emplace_back(*t);
    else if (const auto* d = std::get_if<double>(&a)) out.emplace_back(static_cast<float>(*d));
    else if (const auto* n = std::get_if<int64_t>(&a)) out.emplace_back(static_cast<float>(*n));
    else out.emplace_back(0.0f);
  }
  return out;
}

int64_t count_programs(const Kernel& k, const CompiledKernel& ck, const std::vector<Arg>& args) {
  return launch_shape(ck.ir, ck.config, param_values(k, args)).programs;
}

namespace {
struct Reports {
  std::mutex mutex;
  std::set<std::string> seen;
  std::vector<std::string> list;
};
Reports& reports() {
  static Reports r;
  return r;
}

// Once per kernel and note: no dot falls back to the SIMT path unannounced.
void report_simt_dots(const CompiledKernel& ck) {
  Reports& r = reports();
  std::lock_guard lock(r.mutex);
  for (const std::string& note : ck.generated.notes) {
    const std::string line = fmt::format("tilejit: kernel '{}': {} -- it stays on the SIMT path (no tensor cores)", ck.ir.name,
                                         note);
    if (!r.seen.insert(line).second) continue;
    r.list.push_back(line);
    if (!std::getenv("TILEJIT_QUIET")) std::fprintf(stderr, "%s\n", line.c_str());
  }
}
}  // namespace

std::vector<std::string> simt_dot_reports() {
  Reports& r = reports();
  std::lock_guard lock(r.mutex);
  return r.list;
}

void launch_compiled(const Kernel& k, const CompiledKernel& ck, const std::vector<Arg>& args, const LaunchGeometry& g,
                     const LaunchOptions& options) {
  if (!ck.generated.notes.empty()) report_simt_dots(ck);
  PackedArgs packed = pack(k, ck.ir, args);
  check_aligned_operands(k, ck, args);
  pack_tma(k, ck, args, packed);
  if (g.persistent) {
    packed.programs = g.programs;
    packed.pointers.push_back(&packed.programs);
  }
  runtime::launch(ck.function, g.grid, g.block, g.dynamic_smem, options.stream, packed.pointers.data(), g.cluster,
                  options.start_early && ck.generated.starts_early);
}

}  // namespace tj
