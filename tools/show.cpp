// `tilejit show`: what the compiler makes of a kernel — its IR, CUDA source or PTX.
#include <fmt/format.h>

#include "codegen/knob.h"
#include "codegen/target.h"
#include "dsl/ir.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "tools/attention.h"
#include "tools/problem.h"

namespace tj::tools {

int show(const ProblemOptions& given, bool ir, bool ptx) {
  const ProblemOptions o = as_run_takes_it(given, "showing it");
  ResolvedProblem r = resolve(o);
  if (ir) {
    fmt::print("{}", ir::print(r.ir));
    return 0;
  }
  CompileRequest req;
  req.arch = default_arch(o.arch);
  req.want_ptx = ptx;
  req.load = false;
  const CompiledKernel& ck = compile(r.entry->get(), r.specs, r.config, req);
  if (ptx) fmt::print("{}", ck.ptx);
  else {
    fmt::print("// tilejit: kernel {} for {}, config {}\n// lowering: {}; {} threads, {} bytes of dynamic shared memory\n",
               r.entry->name, ck.arch, r.config.to_json(), ck.generated.lowering, ck.generated.threads,
               ck.generated.dynamic_smem_bytes);
    for (const std::string& note : ck.generated.notes) fmt::print("// on the SIMT path: {}\n", note);
    fmt::print("{}", ck.generated.source);
  }
  return 0;
}

int show_knobs(const ProblemOptions& given) {
  const ProblemOptions o = as_run_takes_it(given, "showing it");
  ResolvedProblem r = resolve(o);
  CompileRequest req;
  req.arch = default_arch(o.arch);
  req.load = false;
  const CompiledKernel& ck = compile(r.entry->get(), r.specs, r.config, req);
  // The pattern lowerings register under their own names; the emitter's table covers the SIMT
  // path and the generic tensor-core lowering, and its `lowering` / `mma` knobs apply to every kernel.
  std::vector<std::string> tables = {"emitter"};
  if (codegen::knob_table(ck.generated.lowering)) tables.insert(tables.begin(), ck.generated.lowering);
  fmt::print("kernel {} for {}: lowering {}, config {}\n", r.entry->name, ck.arch, ck.generated.lowering, r.config.to_json());
  for (const std::string& name : tables) {
    const auto table = codegen::knob_table(name);
    fmt::print("\n{} knobs:\n", name);
    for (const codegen::KnobSpec* k : table->knobs) {
      const auto set = r.config.knobs.find(k->name);
      fmt::print("  {:<20} default {}{}\n      {}\n", k->name, k->default_doc,
                 set != r.config.knobs.end() ? fmt::format("; this config: {}", set->second) : std::string(), k->doc);
    }
  }
  return 0;
}

}  // namespace tj::tools
