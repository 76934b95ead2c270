#include <doctest/doctest.h>

#include <string>

#include "runtime/hash.h"

using namespace tj::runtime;

TEST_CASE("hash: content_hash is XXH3-128 as 32 hex digits") {
  // Reference value of XXH3_128bits("") from the xxHash test vectors.
  CHECK(content_hash("") == "99aa06d3014798d86001c324468d497f");
  std::string a = content_hash("kernel A");
  CHECK(a.size() == 32);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a == content_hash("kernel A"));
  CHECK(a != content_hash("kernel B"));
  CHECK(checksum64("") == 0xEF46DB3751D8E999ull);  // XXH64("", seed 0)
}

TEST_CASE("hash: Hasher matches content_hash and separates fields") {
  Hasher h;
  h.update("kernel ").update("A");
  CHECK(h.hex() == content_hash("kernel A"));
  Hasher f1, f2;
  f1.field("ab").field("c");
  f2.field("a").field("bc");
  CHECK(f1.hex() != f2.hex());
}
