// Knob pin_waits (codegen/emit_mma.cpp, device pin_above_wait in mma.cuh): the tiles the threads
// compute between two wgmma waits are pinned above the second, so that ptxas cannot sink them
// below it (it did: the README attention's P.V wait landed before the softmax's exp2s, and the
// P.V wgmma overlapped nothing).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "kernels/attention_backward.h"
#include "codegen/cuda_emitter.h"
#include "codegen/lowering.h"
#include "dsl/kernel.h"
#include "examples/kernels/user_kernels.h"
#include "tests/nvrtc_testing.h"

using namespace tj;

namespace {

ir::Function readme_attention(DType t, bool causal) {
  const std::vector<int64_t> shape = {2, 4, 1024, 128};
  const TensorSpec x{t, shape}, o{DType::bf16, shape};
  return examples::readme_attention().trace({x, x, x, o, RuntimeScalar{0.125f}, causal});
}

codegen::GeneratedKernel generate(const ir::Function& f, int pin) {
  Config c = codegen::untuned_config(f, "sm_90a");
  c.knobs["pin_waits"] = pin;
  return codegen::generate_cuda(f, c, codegen::Target::parse("sm_90a"));
}

// nvdisasm from TILEJIT_NVDISASM, the CUDA toolkit or PATH (the toolkit of this project's CI
// machine has none: the SASS checks then skip with a message).
std::string find_nvdisasm() {
  std::vector<std::string> candidates;
  if (const char* e = std::getenv("TILEJIT_NVDISASM")) candidates.push_back(e);
  if (const char* h = std::getenv("CUDA_HOME")) candidates.push_back(std::string(h) + "/bin/nvdisasm");
  candidates.push_back("/usr/local/cuda/bin/nvdisasm");
  if (const char* p = std::getenv("PATH")) {
    std::stringstream ss(p);
    for (std::string d; std::getline(ss, d, ':');) candidates.push_back(d + "/nvdisasm");
  }
  for (const std::string& c : candidates)
    if (!c.empty() && std::filesystem::exists(c)) return c;
  return "";
}

std::string disassemble(const std::string& nvdisasm, const std::vector<char>& cubin) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string stem = (dir / ("tj_pin_waits_" + std::to_string(::getpid()))).string();
  {
    std::ofstream out(stem + ".cubin", std::ios::binary);
    out.write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
  }
  const std::string cmd = "'" + nvdisasm + "' -c '" + stem + ".cubin' > '" + stem + ".sass' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(stem + ".sass");
  std::stringstream ss;
  ss << in.rdbuf();
  std::filesystem::remove(stem + ".cubin");
  std::filesystem::remove(stem + ".sass");
  REQUIRE_MESSAGE(rc == 0, ss.str());
  return ss.str();
}

// The exp2s that run while a wgmma group is in flight: between two wgmma issues (the loop's
// body), the most MUFU.EX2 after its first wait and before its last one. (Unpinned, ptxas put the
// last wait before the softmax: none.)
int ex2_under_the_late_dot(const std::string& sass) {
  int best = 0;
  std::vector<char> seg;   // 'w' a wait, 'e' an exp2, in order, since the last wgmma issue
  auto close = [&] {
    const auto first = std::find(seg.begin(), seg.end(), 'w');
    const auto last = std::find(seg.rbegin(), seg.rend(), 'w');
    if (first != seg.end()) best = std::max(best, static_cast<int>(std::count(first, last.base(), 'e')));
    seg.clear();
  };
  std::stringstream ss(sass);
  for (std::string l; std::getline(ss, l);) {
    if (l.find("GMMA.") != std::string::npos) close();
    else if (l.find("WARPGROUP.DEPBAR.LE") != std::string::npos) seg.push_back('w');
    else if (l.find("MUFU.EX2") != std::string::npos) seg.push_back('e');
  }
  close();
  return best;
}

}  // namespace

TEST_CASE("pin_waits: the README attention's softmax is pinned above the late P.V's wait, in one word per warp") {
  for (DType t : {DType::bf16, DType::e4m3})
    for (bool causal : {false, true}) {
      CAPTURE(name(t));
      CAPTURE(causal);
      const ir::Function f = readme_attention(t, causal);
      const codegen::GeneratedKernel on = generate(f, 1), off = generate(f, 0);
      INFO(on.source);
      // The softmax's sink (the running sum, computed from every exp2) is stored right before
      // the wait for the late dot.
      CHECK(std::regex_search(on.source, std::regex(R"(tj::dev::pin_above_wait\(tj_smem \+ tj_pin_at, v\d+\);[^\n]*\n\s*tj::dev::wgmma_wait<0>\(\);   // the late dot is complete)")));
      CHECK(on.source.find("constexpr unsigned tj_pin_at = ") != std::string::npos);
      CHECK(off.source.find("pin_above_wait") == std::string::npos);
      // A word per warp of the tiles (8 warps): at most 4 * 8 bytes and the alignment more.
      CHECK(on.dynamic_smem_bytes >= off.dynamic_smem_bytes + 32);
      CHECK(on.dynamic_smem_bytes <= off.dynamic_smem_bytes + 48);
    }
}

TEST_CASE("pin_waits: the attention backward's exp2s are pinned above the wait for the dot that runs beside them") {
  const std::vector<int64_t> shape = {2, 4, 1024, 128};
  const TensorSpec t16{DType::bf16, shape}, t32{DType::f32, {shape[0], shape[1], shape[2]}};
  const ir::Function f = kernels::attention_bwd_dkdv().trace({t16, t16, t16, t16, t32, t32, t16, t16, RuntimeScalar{0.1f}, false});
  const codegen::GeneratedKernel g = generate(f, 1);
  INFO(g.source);
  // P^T (exp2 of the scores) before the wait for dP^T = V.dO^T, dS^T before the wait for dV's dot.
  const std::regex pin(R"(tj::dev::pin_above_wait\(tj_smem \+ tj_pin_at, v\d+\);[^\n]*\n\s*tj::dev::wgmma_wait<0>\(\);)");
  CHECK(std::distance(std::sregex_iterator(g.source.begin(), g.source.end(), pin), std::sregex_iterator()) == 2);
}

TEST_CASE("pin_waits: in the SASS, the README attention's exp2s run while the late P.V wgmma is in flight (nvdisasm)") {
  const std::string nvdisasm = find_nvdisasm();
  if (nvdisasm.empty()) {
    MESSAGE("SKIPPED: no nvdisasm (set TILEJIT_NVDISASM, CUDA_HOME or PATH): the SASS placement of the waits is not checked");
    return;
  }
  for (DType t : {DType::bf16, DType::e4m3}) {
    CAPTURE(name(t));
    const ir::Function f = readme_attention(t, false);
    const int on = ex2_under_the_late_dot(disassemble(nvdisasm, tj_test::nvrtc(generate(f, 1), "sm_90a").cubin));
    const int off = ex2_under_the_late_dot(disassemble(nvdisasm, tj_test::nvrtc(generate(f, 0), "sm_90a").cubin));
    MESSAGE(name(t), ": MUFU.EX2 under the late P.V: ", on, " pinned, ", off, " not");
    // Every score's exp2 of the thread (128 x 128 scores over 256 threads) and the rescale's.
    CHECK(on >= 64);
  }
}
