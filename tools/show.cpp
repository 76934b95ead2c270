// `tilejit show`: what the compiler makes of a kernel — its IR, CUDA source or PTX.
#include <fmt/format.h>

#include "codegen/target.h"
#include "dsl/ir.h"
#include "runtime/device.h"
#include "runtime/driver.h"
#include "tools/problem.h"

namespace tj::tools {

int show(const ProblemOptions& o, bool ir, bool ptx) {
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

}  // namespace tj::tools
