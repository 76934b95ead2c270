#pragma once
// Config knobs as typed data: every knob a lowering reads is declared once, in that lowering's
// table (its name, its default, what it does), and read through the declaration, so the table
// that `tilejit show KERNEL --knobs` prints is the one the code uses, and a config that sets a
// knob no table declares is an error (codegen::generate_cuda checks, naming the closest knob).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsl/config.h"

namespace tj::codegen {

struct KnobSpec {
  const char* name;
  int64_t fallback;         // the value without the config (of(c)); a reader may pass its own
  const char* default_doc;  // the default as the docs say it ("1", "4 for fp8, else 0", ...)
  const char* doc;          // what it does

  int64_t of(const Config& c) const { return c.knob(name, fallback); }
  int64_t of(const Config& c, int64_t contextual_fallback) const { return c.knob(name, contextual_fallback); }
  bool on(const Config& c) const { return of(c) != 0; }
};

// A lowering's knobs, registered at static initialization; returns a dummy for `static const bool`.
bool register_knob_table(const std::string& lowering, std::vector<const KnobSpec*> table);

struct KnobTable {
  std::string lowering;
  std::vector<const KnobSpec*> knobs;
};
// Every registered table, in registration order.
std::vector<KnobTable> knob_tables();
// The table of one lowering ("emitter", "sm90_gemm", "sm80_gemm", "sm90_attention", ...).
std::optional<KnobTable> knob_table(const std::string& lowering);

// Throws tj::Error when `cfg` sets a knob that no table declares, naming the closest declared one.
void check_knob_names(const std::string& kernel, const Config& cfg);

}  // namespace tj::codegen
