#pragma once
// tilejit device library: the shared-memory swizzle of the tensor cores' operand tiles, as TMA
// writes them and wgmma's descriptors / ldmatrix's row addresses read them. Any architecture,
// and the host.
#include "fp8.cuh"   // TJ_HD

namespace tj {
namespace dev {

// Shared-memory swizzle modes, numbered as the wgmma descriptor's bits 62-63 encode them.
enum SmemSwizzle : int { SWIZZLE_NONE = 0, SWIZZLE_128B = 1, SWIZZLE_64B = 2, SWIZZLE_32B = 3 };

// Byte offset of byte `off` (offset from an aligned tile base) after the hardware swizzle for
// mode `sw`: 16-byte chunk bits [4,7) XOR address bits [7,10) (128B: 3 bits, 64B: 2, 32B: 1).
// Use it when threads (not TMA) write a swizzled operand tile.
TJ_HD unsigned swizzle_offset(unsigned off, int sw) {
  unsigned mask = sw == SWIZZLE_128B ? 7u : sw == SWIZZLE_64B ? 3u : sw == SWIZZLE_32B ? 1u : 0u;
  return off ^ (((off >> 7) & mask) << 4);
}

}  // namespace dev
}  // namespace tj
