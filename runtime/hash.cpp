#include "runtime/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tj::runtime {
namespace {

std::string to_hex(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static const char digits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = digits[c.digest[i] >> 4];
    out[2 * i + 1] = digits[c.digest[i] & 15];
  }
  return out;
}

}  // namespace

std::string content_hash(std::string_view data) {
  return to_hex(XXH3_128bits(data.data(), data.size()));
}

uint64_t checksum64(std::string_view data) { return XXH64(data.data(), data.size(), 0); }

struct Hasher::State {
  XXH3_state_t s;
};

Hasher::Hasher() : state_(std::make_unique<State>()) { XXH3_128bits_reset(&state_->s); }
Hasher::~Hasher() = default;

Hasher& Hasher::update(std::string_view bytes) {
  XXH3_128bits_update(&state_->s, bytes.data(), bytes.size());
  return *this;
}

Hasher& Hasher::field(std::string_view bytes) {
  uint64_t n = bytes.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
  XXH3_128bits_update(&state_->s, le, sizeof(le));
  return update(bytes);
}

std::string Hasher::hex() const { return to_hex(XXH3_128bits_digest(&state_->s)); }

}  // namespace tj::runtime
