#pragma once
// Content hashes for cache keys (XXH3-128) and checksums (XXH64), from libxxhash.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace tj::runtime {

// XXH3 128-bit hash of `data` as 32 lowercase hex digits (canonical big-endian order).
std::string content_hash(std::string_view data);

// XXH64 (seed 0) of `data`.
uint64_t checksum64(std::string_view data);

// Incremental XXH3-128 over several parts. field() hashes a length prefix before the bytes,
// so ("ab","c") and ("a","bc") differ; update() hashes raw bytes.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  Hasher& update(std::string_view bytes);
  Hasher& field(std::string_view bytes);
  // The digest so far, in content_hash's format. update()/field() may continue after.
  std::string hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tj::runtime
