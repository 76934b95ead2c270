#pragma once
// The lowering interface: what every lowering tells the rest of tilejit about a traced kernel.
//
// A lowering turns a traced kernel into CUDA for a target. Besides lowering (try_lower), it may
// declare the config knobs it reads (knobs) and the config it would pick untuned
// (default_config); the JIT, the tuner and `tilejit show` ask these registries, never a lowering
// directly. Lowerings register at static initialization, in the order they are tried; the SIMT
// path (codegen/cuda_emitter.h) is the fallback and registers nothing here.
//
// Library kernels (kernels/) may register default configs of their own: their defaults come
// from measurements of the kernel, not from the lowering that compiles it.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "codegen/generated_kernel.h"
#include "codegen/target.h"
#include "dsl/config.h"
#include "dsl/ir.h"

namespace tj::codegen {

// A tunable a lowering exposes: its name in Config::knobs, its legal values (in an order
// where neighbours are similar: the search steps between adjacent values) and the value
// the lowering uses when the config does not set it.
struct Knob {
  std::string name;
  std::vector<int64_t> values;
  int64_t fallback = 0;
};

// Declares the knobs that apply to `f` on `arch` ("sm_90a", ...); may return nothing for
// kernels it does not lower.
using KnobProvider = std::function<std::vector<Knob>(const ir::Function& f, const std::string& arch)>;
// The config a lowering would pick for `f` on `arch` without tuning, or nothing.
using DefaultConfigProvider = std::function<std::optional<Config>(const ir::Function& f, const std::string& arch)>;

// Registers (or, with the same name, replaces) a provider. Thread-safe.
void register_knob_provider(const std::string& name, KnobProvider provider);
// Removes a provider (tests). Unknown names are ignored.
void unregister_knob_provider(const std::string& name);
// The knobs of every registered provider for `f` on `arch`, in registration order. A knob
// declared twice keeps its first declaration.
std::vector<Knob> registered_knobs(const ir::Function& f, const std::string& arch);

// Registers (or, with the same name, replaces) one. Thread-safe.
void register_default_config_provider(const std::string& name, DefaultConfigProvider provider);
// The config of `f` on `arch` when nothing was tuned: the first registered default-config
// provider's (in registration order) that answers, else the generic tensor-core lowering's for a
// kernel with dots (codegen/mma_config.h), else the SIMT path's for a streaming kernel
// (codegen/simt_config.h), else default_config(f) (64 for every tunable block).
Config untuned_config(const ir::Function& f, const std::string& arch);

// A lowering that takes whole kernels (e.g. a K-loop of dots on sm_90a) and emits tensor-core
// code for them. Lowerings are tried in registration order before the SIMT path; one that
// returns nothing leaves the kernel to the next.
struct PatternLowering {
  std::string name;
  // Empty when the kernel, config or target does not fit; throws tj::Error when it fits the
  // pattern but the config cannot work (explaining why).
  std::optional<GeneratedKernel> (*try_lower)(const ir::Function& f, const Config& cfg, const Target& t);
};
// Registers a lowering at static-initialization time; returns a dummy for `static const bool`.
bool register_lowering(PatternLowering l);
const std::vector<PatternLowering>& lowerings();

// Well-known knob names a lowering may register (nothing reads them until it does).
namespace knob_names {
inline constexpr const char* warp_specialize = "warp_specialize";   // 0/1: producer warp + consumers
inline constexpr const char* cluster = "cluster";                   // thread-block cluster size
inline constexpr const char* raster_group = "raster_group";         // program-id swizzle / L2 grouping
inline constexpr const char* fault = "__fault";                     // tests: 1 illegal address, 2 hang, 3 crash
}  // namespace knob_names

}  // namespace tj::codegen
