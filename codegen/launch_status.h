#pragma once
// The status codes of tilejit's C interfaces: the launchers `tilejit export` writes
// (codegen/host_launcher.h) and the library's C API (api/tilejit_c.h) share them (tj_status).
#include <cstdint>

namespace tj::codegen {

// tj_status of the C headers.
enum class LaunchStatus : int32_t {
  success = 0,
  invalid_argument = 1,     // NULL tensor, wrong argument count/kind, not device memory, negative dim
  dtype = 2,                // no exported specialization takes these element types / ranks
  shape = 3,                // no exported specialization for these shapes / host values
  alignment = 4,            // data or strides not aligned as the kernel needs (TMA: 16 bytes)
  unsupported_device = 5,   // no CUBIN for the current GPU's architecture
  no_context = 6,           // no current CUDA context on the calling thread
  cuda = 7,                 // a CUDA driver call failed
  too_large = 8,            // more blocks than one launch allows
  too_many_contexts = 9,    // more CUDA contexts than the launcher tracks (64)
};

// A short description of a status (static storage): tj_status_message's text.
const char* status_message(LaunchStatus s);

}  // namespace tj::codegen
