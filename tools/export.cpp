// `tilejit export`: compiles library kernels ahead of time for chosen architectures and
// shapes and writes, into one directory, what an application needs to run them with the
// CUDA driver alone (see codegen/host_launcher.h for the launcher and the C API):
//
//   NAME.h, NAME.o           per kernel: the C header and the object (CUBINs + LLVM-emitted launcher)
//   lib<LIB>.a               every object in one static library
//   <LIB>.h                  includes every NAME.h, and a table {name, NAME_launchv, ...}
//   README.md                what is inside: kernels, specializations, configs, how to link
//   testdata/NAME.I.tjtd     with --test-data: inputs and CPU-reference outputs per specialization
//   NAME.ll                  with --emit-llvm: the launcher's LLVM IR before optimization
//
// Built into the `tilejit-export` program (it links LLVM; `tilejit export` runs it), so the
// `tilejit` program and libtilejit stay free of LLVM.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "autotune/cache.h"
#include "autotune/space.h"
#include "codegen/host_launcher.h"
#include "codegen/target.h"
#include "kernels/library.h"
#include "runtime/disk_cache.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "runtime/owned_tensor.h"
#include "runtime/reference.h"
#include "tools/commands.h"
#include "tools/problem.h"

namespace fs = std::filesystem;

namespace tj::tools {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

DType parse_dtype(const std::string& s, const char* what) {
  auto t = dtype_from_name(s);
  if (!t) throw Error(fmt::format("unknown {} '{}' (use f32, f16, bf16, e4m3 or e5m2)", what, s));
  return *t;
}

// One --shapes entry: [KERNEL:]DIMS|dynamic[@DTYPE]
struct ShapeSpec {
  std::string kernel;                 // empty: every kernel of that rank
  std::vector<int64_t> dims;          // empty with `dynamic`
  bool dynamic = false;
  std::optional<DType> dtype;
  std::string text;
};

ShapeSpec parse_shape_spec(const std::string& text) {
  ShapeSpec s;
  s.text = text;
  std::string rest = text;
  if (auto at = rest.find('@'); at != std::string::npos) {
    s.dtype = parse_dtype(rest.substr(at + 1), "dtype in --shapes");
    rest = rest.substr(0, at);
  }
  if (auto colon = rest.find(':'); colon != std::string::npos) {
    s.kernel = rest.substr(0, colon);
    rest = rest.substr(colon + 1);
  }
  for (const char* word : {"dynamic", "dyn"}) {
    const std::string w = word;
    if (rest == w || rest.rfind(w + "=", 0) == 0) {
      s.dynamic = true;
      rest = rest == w ? "" : rest.substr(w.size() + 1);   // dynamic=DIMS: the shape test data and tuning use
      break;
    }
  }
  if (s.dynamic && rest.empty()) return s;
  for (const std::string& part : split(rest, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v <= 0)
      throw Error(fmt::format("bad --shapes entry '{}': expected [KERNEL:]DIMS[@DTYPE] with positive dims, e.g. "
                              "attention:1,8,1024,128@bf16, or [KERNEL:]dynamic[=DIMS]",
                              text));
    s.dims.push_back(v);
  }
  if (s.dims.empty()) throw Error(fmt::format("bad --shapes entry '{}': no dims", text));
  return s;
}

// One specialization to export (before choosing archs).
struct Spec {
  kernels::Problem problem;           // concrete (for dynamic: the shape test data uses)
  std::vector<ArgSpec> specs;         // as traced (-1 dims when dynamic)
  bool dynamic = false;
  std::string key;
};

std::string describe_specs(const Kernel& k, const std::vector<ArgSpec>& specs) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& n = k.slots()[i].name;
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, TensorSpec>) {
            std::vector<std::string> dims;
            for (int64_t d : v.shape) dims.push_back(d < 0 ? "?" : std::to_string(d));
            parts.push_back(fmt::format("{}={}[{}]", n, name(v.dtype), fmt::join(dims, ",")));
          } else if constexpr (std::is_same_v<V, RuntimeScalar>) {
          } else if constexpr (std::is_same_v<V, bool>) {
            parts.push_back(fmt::format("{}={}", n, v ? 1 : 0));
          } else {
            parts.push_back(fmt::format("{}={}", n, v));
          }
        },
        specs[i]);
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

// ---- the tuning cache --------------------------------------------------------------------------
//
// HOOK (autotune/cache.h): the tuned config for exporting `k` with `specs` to `arch`. Entries
// are stored per GPU (name + compute capability) and toolkit; export matches the kernel
// fingerprint, shape bucket and dtypes of the key, and a GPU whose compute capability builds
// for `arch` (cc 9.0 -> sm_90a, others sm_XY), the newest entry first. Dynamic-shape exports
// take the newest entry of any bucket traced with dynamic shapes. Nothing found: nullopt, and
// export uses the default config with a warning.
struct Tuned {
  Config config;
  std::string from;   // "tuned on NVIDIA H100 ... (bucket ...)"
};

std::string arch_of_device(const std::string& device) {
  static const std::regex cc_re(R"(\(cc (\d+)\.(\d+)\))");
  std::smatch m;
  if (!std::regex_search(device, m, cc_re)) return "";
  int major = std::stoi(m[1]), minor = std::stoi(m[2]);
  return major == 9 && minor == 0 ? "sm_90a" : fmt::format("sm_{}{}", major, minor);
}

std::optional<Tuned> tuned_for_export(const Kernel& k, const std::vector<ArgSpec>& specs, bool dynamic,
                                      const std::vector<ArgSpec>& concrete, const std::string& arch, std::string& why) {
  if (const char* off = std::getenv("TILEJIT_TUNING"); off && std::string_view(off) == "off") {
    why = "TILEJIT_TUNING=off";
    return std::nullopt;
  }
  autotune::TuningCache cache(autotune::TuningCache::default_path());
  if (!fs::exists(cache.path())) {
    why = fmt::format("no tuning cache at {}", cache.path().string());
    return std::nullopt;
  }
  autotune::TuningKey want = autotune::tuning_key(k, dynamic ? concrete : specs, dynamic, autotune::DeviceIdentity{});
  std::optional<autotune::TuningEntry> best;
  for (const autotune::TuningEntry& e : cache.entries()) {
    if (e.key.fingerprint != want.fingerprint || e.key.dtypes != want.dtypes) continue;
    if (dynamic ? e.key.bucket.rfind("dyn:", 0) != 0 : e.key.bucket != want.bucket) continue;
    if (arch_of_device(e.key.device) != arch) continue;
    if (!best || e.created > best->created) best = e;
  }
  if (!best) {
    why = fmt::format("no entry for {} (bucket {}) on a {} GPU in {}", k.name(), want.bucket, arch, cache.path().string());
    return std::nullopt;
  }
  return Tuned{best->config, fmt::format("tuned on {} ({}, bucket {})", best->key.device, best->key.toolkit, best->key.bucket)};
}

// ---- test data ---------------------------------------------------------------------------------

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void put_f64(std::string& out, double v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}
void put_bytes(std::string& out, const void* p, size_t n) {
  put_u64(out, n);
  out.append(static_cast<const char*>(p), n);
}

// The .tjtd format (little-endian), read by examples/embed/embed_example.c:
//   "TJTESTD1", u32 version (1), str kernel, str description, u32 nargs, then per argument
//   u32 kind: 0 tensor_in, 1 tensor_out, 2 tensor_inout, 3 runtime scalar, 4 integer/flag,
//             5 float value
//   tensors: u32 dtype, u32 rank, i64 shape[rank], f64 tolerance (relative to the largest
//            |expected|), u64 n + n input bytes (0 for outputs), u64 n + n expected bytes
//            (0 for inputs)
//   3 and 5: f64 value; 4: i64 value
// where str is u32 length + bytes.
std::string make_test_data(const kernels::LibraryEntry& entry, const Spec& spec, const Config& config, uint32_t seed,
                           std::string& description) {
  ResolvedProblem r;
  r.entry = &entry;
  r.problem = spec.problem;
  r.specs = entry.arguments(spec.problem);
  r.ir = entry.get().trace(r.specs);
  r.config = config;
  std::mt19937 rng(seed);
  HostArguments host = make_host_arguments(r, rng);
  std::vector<std::string> inputs;
  for (const auto& t : host.tensors) inputs.emplace_back(static_cast<const char*>(t.data()), t.size_bytes());
  std::vector<TensorView> views;
  for (const auto& t : host.tensors) views.push_back(t.view());
  run_reference(r.ir, r.config, reference_arguments(r, views));

  const Kernel& k = entry.get();
  description = describe_specs(k, r.specs);
  std::string out = "TJTESTD1";
  put_u32(out, 1);
  put_str(out, k.name());
  put_str(out, description + " (expected: the CPU reference executor)");
  put_u32(out, static_cast<uint32_t>(r.specs.size()));
  size_t ti = 0;
  for (size_t i = 0; i < r.specs.size(); ++i) {
    const Slot& slot = k.slots()[i];
    const ArgSpec& a = r.specs[i];
    if (const auto* t = std::get_if<TensorSpec>(&a)) {
      const HostTensor& h = host.tensors.at(ti);
      const std::string& in = inputs.at(ti);
      ++ti;
      const bool reads = slot.kind != SlotKind::tensor_out, writes = slot.kind != SlotKind::tensor_in;
      put_u32(out, slot.kind == SlotKind::tensor_in ? 0 : slot.kind == SlotKind::tensor_out ? 1 : 2);
      put_u32(out, static_cast<uint32_t>(t->dtype));
      put_u32(out, static_cast<uint32_t>(t->shape.size()));
      for (int64_t d : t->shape) put_u64(out, static_cast<uint64_t>(d));
      put_f64(out, writes ? default_tolerance(t->dtype) : 0.0);
      if (reads) put_bytes(out, in.data(), in.size());
      else put_u64(out, 0);
      if (writes) put_bytes(out, h.data(), h.size_bytes());
      else put_u64(out, 0);
    } else if (const auto* s = std::get_if<RuntimeScalar>(&a)) {
      put_u32(out, 3);
      put_f64(out, s->value);
    } else if (const auto* b = std::get_if<bool>(&a)) {
      put_u32(out, 4);
      put_u64(out, *b ? 1 : 0);
    } else if (const auto* n = std::get_if<int64_t>(&a)) {
      put_u32(out, 4);
      put_u64(out, static_cast<uint64_t>(*n));
    } else {
      put_u32(out, 5);
      put_f64(out, std::get<double>(a));
    }
  }
  return out;
}

void write_file(const fs::path& p, const std::string& bytes) {
  fs::path tmp = p;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(fmt::format("cannot write {}", tmp.string()));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw Error(fmt::format("cannot write {}", tmp.string()));
  }
  fs::rename(tmp, p);
}

// Everything compiled for one kernel.
struct KernelExport {
  const kernels::LibraryEntry* entry = nullptr;
  std::vector<Spec> specs;
  struct Variant {
    size_t spec = 0;
    std::string arch;
    const CompiledKernel* compiled = nullptr;
    std::string note;
  };
  std::vector<Variant> variants;
  std::vector<std::string> test_files;
};

}  // namespace

void add_export_options(CLI::App* cmd, ExportOptions& o) {
  cmd->add_option("kernels", o.kernels, "library kernels to export (vector_add, softmax, attention, ...)")->required();
  cmd->add_option("--arch", o.archs, "architectures, comma-separated, e.g. sm_90a,sm_80")->capture_default_str();
  cmd->add_option("--shapes", o.shapes,
                  "specializations: [KERNEL:]DIMS[@DTYPE] (e.g. attention:1,8,1024,128@bf16 vector_add:4096) or "
                  "[KERNEL:]dynamic[=DIMS] (any shape; DIMS: the shape its test data and tuned config use, default "
                  "the kernel's default shape); an entry without KERNEL applies to kernels of that rank; a kernel "
                  "with no entry gets its default shape");
  cmd->add_option("--dtype", o.dtypes, "input element types, comma-separated (f32, f16, bf16, e4m3, e5m2)")
      ->capture_default_str();
  cmd->add_option("--out-dtype", o.out_dtype, "output element type (default: the input's; bf16 for fp8)");
  cmd->add_flag("--causal", o.causal, "attention: the causal variant only");
  cmd->add_flag("--non-causal", o.non_causal, "attention: the non-causal variant only (the default)");
  cmd->add_flag("--both", o.both, "attention: causal and non-causal variants");
  cmd->add_option("--config", o.config, "force this config JSON for every specialization (default: the tuning cache's)");
  cmd->add_option("-o,--output", o.out_dir, "output directory")->required();
  cmd->add_option("--lib", o.lib_name, "name of the static library and the aggregate header")->capture_default_str();
  cmd->add_flag("--test-data", o.test_data,
                "also write inputs and CPU-reference outputs per specialization (testdata/, for examples/embed)");
  cmd->add_option("--test-data-max-flops", o.test_data_max_flops,
                  "skip test data for problems larger than this (the CPU reference is slow)")
      ->capture_default_str();
  cmd->add_flag("--emit-llvm", o.emit_llvm, "also write each launcher's LLVM IR (NAME.ll)");
  cmd->add_flag("-q,--quiet", o.quiet, "print only warnings and errors");
}

int export_kernels(const ExportOptions& o) {
  if (o.kernels.empty()) throw Error("export: name at least one kernel");
  if (o.out_dir.empty()) throw Error("export: name an output directory with -o");
  const std::vector<std::string> archs = split(o.archs, ',');
  if (archs.empty()) throw Error("export: name at least one architecture with --arch, e.g. sm_90a");
  for (const auto& a : archs) codegen::Target::parse(a);
  const std::vector<std::string> dtype_names = split(o.dtypes, ',');
  if (dtype_names.empty()) throw Error("export: --dtype is empty");
  std::vector<DType> dtypes;
  for (const auto& d : dtype_names) dtypes.push_back(parse_dtype(d, "--dtype"));
  std::optional<DType> out_dtype;
  if (!o.out_dtype.empty()) out_dtype = parse_dtype(o.out_dtype, "--out-dtype");
  if (int(o.causal) + int(o.non_causal) + int(o.both) > 1)
    throw Error("export: --causal, --non-causal and --both choose attention's mask variants: give at most one");
  const std::vector<bool> causal_values = o.both ? std::vector<bool>{false, true} : std::vector<bool>{o.causal};
  std::vector<ShapeSpec> shape_specs;
  for (const auto& s : o.shapes) shape_specs.push_back(parse_shape_spec(s));
  std::set<std::string> kernel_names(o.kernels.begin(), o.kernels.end());
  for (const auto& s : shape_specs) {
    if (!s.kernel.empty() && !kernel_names.count(s.kernel))
      throw Error(fmt::format("export: --shapes entry '{}' names kernel '{}', which is not being exported", s.text, s.kernel));
  }
  if (!o.config.empty()) (void)Config::from_json(o.config);   // bad JSON fails before any work
  auto say = [&](const std::string& line) {
    if (!o.quiet) std::cout << line << "\n";
  };
  auto warn = [&](const std::string& line) { std::cerr << "tilejit export: warning: " << line << "\n"; };

  std::vector<KernelExport> exports;
  std::set<std::string> seen_kernels;
  for (const std::string& kname : o.kernels) {
    if (!seen_kernels.insert(kname).second) continue;
    KernelExport ke;
    ke.entry = &kernels::find(kname);
    const Kernel& k = ke.entry->get();
    const size_t rank = ke.entry->default_shape.size();
    std::vector<const ShapeSpec*> mine;
    for (const auto& s : shape_specs) {
      if (!s.kernel.empty() ? s.kernel == kname : ((s.dynamic && s.dims.empty()) || s.dims.size() == rank))
        mine.push_back(&s);
    }
    ShapeSpec fallback;
    if (mine.empty()) {
      fallback.dims = ke.entry->default_shape;
      fallback.text = "default";
      mine.push_back(&fallback);
      say(fmt::format("{}: no --shapes entry for it; exporting its default shape [{}]", kname,
                      fmt::join(ke.entry->default_shape, ",")));
    }
    std::set<std::string> keys;
    for (const ShapeSpec* s : mine) {
      std::vector<DType> dts = s->dtype ? std::vector<DType>{*s->dtype} : dtypes;
      for (DType dt : dts) {
        for (bool causal : causal_values) {
          Spec spec;
          spec.problem.dtype = dt;
          spec.problem.out_dtype = out_dtype;
          spec.problem.causal = causal;
          spec.problem.shape = s->dims.empty() ? ke.entry->default_shape : s->dims;
          spec.dynamic = s->dynamic;
          try {
            spec.specs = ke.entry->arguments(spec.problem);
          } catch (const Error& e) {
            throw Error(fmt::format("export: --shapes entry '{}' for {}: {}", s->text, kname, e.what()));
          }
          // The exported launcher picks a variant by dtypes and dims only, so its kernels take any
          // strides: none compiled in.
          for (auto& a : spec.specs)
            if (auto* t = std::get_if<TensorSpec>(&a)) {
              t->strides.clear();
              if (spec.dynamic) std::fill(t->shape.begin(), t->shape.end(), -1);
            }
          spec.key = spec_key(spec.specs);
          if (keys.insert(spec.key).second) ke.specs.push_back(std::move(spec));
        }
      }
    }
    for (size_t si = 0; si < ke.specs.size(); ++si) {
      const Spec& spec = ke.specs[si];
      for (const std::string& arch : archs) {
        KernelExport::Variant v;
        v.spec = si;
        v.arch = arch;
        Config config;
        std::string why;
        std::optional<Tuned> tuned;
        try {
          tuned = tuned_for_export(k, spec.specs, spec.dynamic, ke.entry->arguments(spec.problem), arch, why);
        } catch (const std::exception& e) {
          why = fmt::format("cannot read the tuning cache: {}", e.what());
        }
        if (tuned) {
          config = tuned->config;
          v.note = tuned->from;
        } else {
          config = autotune::untuned_config(k.trace(spec.specs), arch);
          v.note = "default config";
          if (o.config.empty())
            warn(fmt::format("{} {} on {}: no tuned config ({}); using the default config {}", kname,
                             describe_specs(k, spec.specs), arch, why, config.to_json()));
        }
        if (!o.config.empty()) {   // --config's entries over it
          config = Config::from_json(o.config, config);
          v.note = "--config over the " + v.note;
        }
        CompileRequest req;
        req.arch = arch;
        req.load = false;
        try {
          v.compiled = &compile(k, spec.specs, config, req);
        } catch (const std::exception& e) {
          throw Error(fmt::format("export: {} {} on {} with config {}: {}", kname, describe_specs(k, spec.specs), arch,
                                  config.to_json(), e.what()));
        }
        say(fmt::format("{}: {} {} -> {} ({} threads, {} B shared, {} lowering, CUBIN {} bytes{})", kname,
                        describe_specs(k, spec.specs), arch, v.compiled->generated.entry, v.compiled->generated.threads,
                        v.compiled->generated.dynamic_smem_bytes, v.compiled->generated.lowering, v.compiled->cubin.size(),
                        v.compiled->from_disk_cache ? ", cached" : ""));
        ke.variants.push_back(std::move(v));
      }
    }
    exports.push_back(std::move(ke));
  }

  fs::path dir(o.out_dir);
  fs::create_directories(dir);
  codegen::HostLauncherOptions hopts;
  std::vector<std::pair<std::string, std::string>> objects;
  std::vector<std::string> headers;
  std::string readme_kernels;
  for (KernelExport& ke : exports) {
    const Kernel& k = ke.entry->get();
    codegen::LauncherKernel lk;
    lk.name = k.name();
    lk.slots = k.slots();
    for (const auto& v : ke.variants) {
      codegen::LauncherVariant lv;
      lv.ir = &v.compiled->ir;
      lv.config = &v.compiled->config;
      lv.kernel = &v.compiled->generated;
      lv.arch = v.arch;
      lv.cubin = std::string_view(v.compiled->cubin.data(), v.compiled->cubin.size());
      lv.specs = ke.specs[v.spec].specs;
      lv.note = v.note;
      lk.variants.push_back(std::move(lv));
    }
    const std::string cname = codegen::c_identifier(k.name());
    std::string object = codegen::emit_launcher_object(lk, hopts);
    write_file(dir / (cname + ".o"), object);
    write_file(dir / (cname + ".h"), codegen::emit_launcher_header(lk, hopts));
    if (o.emit_llvm) write_file(dir / (cname + ".ll"), codegen::emit_launcher_ir(lk, hopts));
    objects.emplace_back(cname + ".o", std::move(object));
    headers.push_back(cname);
    readme_kernels += fmt::format("### {}\n\n```\n{}```\n\n", k.name(), codegen::describe_variants(lk));

    if (o.test_data) {
      fs::create_directories(dir / "testdata");
      for (size_t si = 0; si < ke.specs.size(); ++si) {
        const Spec& spec = ke.specs[si];
        const double flops = ke.entry->flops(spec.problem);
        if (flops > o.test_data_max_flops) {
          warn(fmt::format("{} {}: no test data ({:.3g} flops is more than --test-data-max-flops {:.3g})", k.name(),
                           describe_specs(k, spec.specs), flops, o.test_data_max_flops));
          continue;
        }
        const Config* cfg = nullptr;
        for (const auto& v : ke.variants)
          if (v.spec == si) cfg = &v.compiled->config;
        std::string description;
        std::string bytes = make_test_data(*ke.entry, spec, *cfg, static_cast<uint32_t>(1234 + si), description);
        std::string file = fmt::format("{}.{}.tjtd", cname, si);
        write_file(dir / "testdata" / file, bytes);
        ke.test_files.push_back(file + ": " + description);
        say(fmt::format("{}: test data {} ({})", k.name(), file, description));
      }
    }
  }
  const std::string lib = codegen::c_identifier(o.lib_name);
  write_file(dir / ("lib" + lib + ".a"), codegen::write_static_library(objects));

  // The aggregate header: every kernel header and a table for generic drivers.
  std::string agg = fmt::format(
      "/* {lib}.h: every kernel of this `tilejit export`, and a table of them. Generated; do not edit. */\n"
      "#ifndef TILEJIT_EXPORT_LIB_{LIB}_H\n#define TILEJIT_EXPORT_LIB_{LIB}_H\n\n",
      fmt::arg("lib", lib), fmt::arg("LIB", [&] {
        std::string u = lib;
        for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return u;
      }()));
  for (const auto& h : headers) agg += fmt::format("#include \"{}.h\"\n", h);
  agg += fmt::format(
      "\ntypedef struct {lib}_kernel {{\n"
      "  const char* name;\n"
      "  tj_status (*launchv)(CUstream stream, const tj_arg* args, int32_t nargs);\n"
      "  tj_status (*load)(void);\n"
      "  const char* (*last_error)(void);\n"
      "  const char* (*specializations)(void);\n"
      "}} {lib}_kernel;\n\n"
      "static const {lib}_kernel {lib}_kernels[] = {{\n",
      fmt::arg("lib", lib));
  for (size_t i = 0; i < exports.size(); ++i) {
    const std::string n = headers[i];
    agg += fmt::format("  {{\"{}\", {}_launchv, {}_load, {}_last_error, {}_specializations}},\n", exports[i].entry->name, n,
                       n, n, n);
  }
  agg += fmt::format("}};\nenum {{ {lib}_kernel_count = {n} }};\n\n#endif\n", fmt::arg("lib", lib),
                     fmt::arg("n", exports.size()));
  write_file(dir / (lib + ".h"), agg);

  // README
  std::string files;
  for (const auto& h : headers) files += fmt::format("- `{0}.h`, `{0}.o`: the C API and the object (CUBINs + launcher)\n", h);
  std::string tests;
  for (const auto& ke : exports)
    for (const auto& t : ke.test_files) tests += "- `testdata/" + t + "`\n";
  std::string readme = fmt::format(
      R"(# tilejit export

Generated by `tilejit export` (tilejit {ver}) for {archs}. Everything here runs with the CUDA
driver alone: no NVRTC, no tilejit library, no C++ runtime.

## Files

{files}- `lib{lib}.a`: every object above in one static library
- `{lib}.h`: includes every header, plus `{lib}_kernels[]` (name, `NAME_launchv`, ...) for generic drivers
{testdata}
## Using it

```c
#include "{first}.h"
/* with a CUDA context current on this thread: */
tj_status s = {first}_launch(stream, /* tensors as const tj_tensor*, scalars, flags */ ...);
if (s != TJ_SUCCESS) fprintf(stderr, "%s\n", {first}_last_error());
```

```sh
cc -I<this dir> -I/usr/local/cuda/include app.c <this dir>/lib{lib}.a -L/usr/local/cuda/lib64/stubs -lcuda
```

`tj_tensor` is `{{data, dtype, rank, shape, strides}}` (strides in elements, NULL: row-major);
`NAME_launch_dlpack` takes `DLTensor*` (no copies). Errors come back as `tj_status`;
`NAME_last_error()` says what failed. Each launch checks dtypes, ranks and shapes, picks the
specialization (static shapes must match exactly; `?` dims take any size) and the CUBIN for the
GPU, loads the module once per CUDA context, computes the grid and launches.

## Kernels and specializations

{kernels})",
      fmt::arg("ver", hopts.tilejit_version), fmt::arg("archs", fmt::join(archs, ", ")), fmt::arg("files", files),
      fmt::arg("lib", lib),
      fmt::arg("testdata", tests.empty() ? std::string()
                                         : "- test data (inputs and CPU-reference outputs; format in tools/export.cpp):\n" + tests),
      fmt::arg("first", headers.front()), fmt::arg("kernels", readme_kernels));
  write_file(dir / "README.md", readme);
  say(fmt::format("wrote {} (lib{}.a, {}.h, README.md, {} kernel{})", dir.string(), lib, lib, exports.size(),
                  exports.size() == 1 ? "" : "s"));
  return 0;
}

}  // namespace tj::tools
