// The on-disk cache: round trips, every kind of bad entry, concurrent writers; the atomic file
// replacement it and the tuning cache write through.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "runtime/atomic_file.h"
#include "runtime/disk_cache.h"

using tj::runtime::DiskCache;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tilejit-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Captures what is written to file descriptor 2 while alive.
struct CaptureStderr {
  fs::path file;
  int saved = -1;
  explicit CaptureStderr(const fs::path& dir) : file(dir / "stderr.txt") {
    std::fflush(stderr);
    saved = ::dup(2);
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    ::close(fd);
  }
  std::string finish() {
    if (saved >= 0) {
      std::fflush(stderr);
      ::dup2(saved, 2);
      ::close(saved);
      saved = -1;
    }
    std::ifstream in(file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  ~CaptureStderr() { finish(); }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string binary_payload(size_t n, unsigned seed) {
  std::string s(n, '\0');
  unsigned x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

// Expects get(key) to reject the entry with a warning containing `why`, and remove it.
void expect_rejected(const DiskCache& cache, const fs::path& dir, const std::string& key,
                     const std::string& why) {
  fs::path path = cache.path_for(key);
  REQUIRE(fs::exists(path));
  CaptureStderr capture(dir.parent_path());
  std::optional<std::string> got = cache.get(key);
  std::string err = capture.finish();
  INFO("stderr: " << err);
  CHECK_FALSE(got.has_value());
  CHECK(err.find("tilejit: ignoring corrupt cache entry " + path.string() + ": ") !=
        std::string::npos);
  CHECK(err.find(why) != std::string::npos);
  CHECK_FALSE(fs::exists(path));
}

}  // namespace

TEST_CASE("disk cache: round trip, miss, overwrite, remove") {
  TempDir tmp;
  DiskCache cache(tmp.path / "cache");  // created on first put
  CHECK_FALSE(cache.get("absent").has_value());
  std::string payload = binary_payload(100000, 1);
  payload[10] = '\0';  // binary safe
  cache.put("kernel-1", payload);
  CHECK(cache.get("kernel-1") == payload);
  CHECK(cache.path_for("kernel-1").parent_path() == tmp.path / "cache");
  cache.put("kernel-1", "v2");
  CHECK(cache.get("kernel-1") == std::string("v2"));
  cache.put("empty", "");
  CHECK(cache.get("empty") == std::string());
  // A second cache object (another process, say) over the same directory sees the entries.
  DiskCache other(tmp.path / "cache");
  CHECK(other.get("kernel-1") == std::string("v2"));
  cache.remove("kernel-1");
  CHECK_FALSE(cache.get("kernel-1").has_value());
  // No temporary files are left behind.
  for (const auto& e : fs::directory_iterator(tmp.path / "cache"))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("disk cache: corrupt payload bytes are detected and rebuilt") {
  TempDir tmp;
  DiskCache cache(tmp.path / "c");
  cache.put("k", binary_payload(4096, 2));
  std::string bytes = read_file(cache.path_for("k"));
  bytes[bytes.size() - 100] ^= 0x5a;
  write_file(cache.path_for("k"), bytes);
  expect_rejected(cache, tmp.path / "c", "k", "checksum");
  // The caller rebuilds: the next put/get works.
  cache.put("k", "rebuilt");
  CHECK(cache.get("k") == std::string("rebuilt"));
}

TEST_CASE("disk cache: truncated files are detected") {
  TempDir tmp;
  DiskCache cache(tmp.path / "c");
  cache.put("k", binary_payload(4096, 3));
  std::string bytes = read_file(cache.path_for("k"));
  write_file(cache.path_for("k"), bytes.substr(0, bytes.size() - 1));
  expect_rejected(cache, tmp.path / "c", "k", "truncated");
  cache.put("k", "x");
  write_file(cache.path_for("k"), read_file(cache.path_for("k")).substr(0, 10));
  expect_rejected(cache, tmp.path / "c", "k", "truncated header");
  write_file(cache.path_for("k"), "");
  expect_rejected(cache, tmp.path / "c", "k", "truncated header");
  cache.put("k", "x");
  write_file(cache.path_for("k"), read_file(cache.path_for("k")) + "extra");
  expect_rejected(cache, tmp.path / "c", "k", "trailing bytes");
}

TEST_CASE("disk cache: wrong magic and wrong format version are detected") {
  TempDir tmp;
  DiskCache cache(tmp.path / "c");
  cache.put("k", "payload");
  std::string bytes = read_file(cache.path_for("k"));
  CHECK(bytes.substr(0, 7) == "TJCACHE");
  std::string bad_version = bytes;
  bad_version[8] = static_cast<char>(DiskCache::kFormatVersion + 1);
  write_file(cache.path_for("k"), bad_version);
  expect_rejected(cache, tmp.path / "c", "k", "format version");
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  write_file(cache.path_for("k"), bad_magic);
  expect_rejected(cache, tmp.path / "c", "k", "magic");
}

TEST_CASE("disk cache: an entry stored for another key is rejected") {
  TempDir tmp;
  DiskCache cache(tmp.path / "c");
  cache.put("key-a", "payload of a");
  fs::copy_file(cache.path_for("key-a"), cache.path_for("key-b"));
  expect_rejected(cache, tmp.path / "c", "key-b", "another key");
  CHECK(cache.get("key-a") == std::string("payload of a"));
}

TEST_CASE("disk cache: an unwritable directory warns and does not throw") {
  TempDir tmp;
  write_file(tmp.path / "not-a-dir", "file");
  DiskCache cache(tmp.path / "not-a-dir" / "cache");
  CaptureStderr capture(tmp.path);
  CHECK_NOTHROW(cache.put("k", "v"));
  std::string err = capture.finish();
  CHECK(err.find("tilejit: cannot write cache entry") != std::string::npos);
  CHECK_FALSE(cache.get("k").has_value());
}

TEST_CASE("disk cache: processes writing and reading one key concurrently") {
  TempDir tmp;
  const fs::path dir = tmp.path / "c";
  constexpr int kProcesses = 4;
  constexpr int kIterations = 40;
  constexpr size_t kSize = 256 * 1024;
  // A payload is valid when it equals binary_payload(kSize, seed) for the seed written in
  // its first 4 bytes; torn or mixed writes would fail this.
  auto make = [&](unsigned seed) {
    std::string p = binary_payload(kSize, seed);
    for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(seed >> (8 * i));
    return p;
  };
  auto valid = [&](const std::string& p) {
    if (p.size() != kSize) return false;
    unsigned seed = 0;
    for (int i = 0; i < 4; ++i) seed |= unsigned(static_cast<unsigned char>(p[i])) << (8 * i);
    return p == make(seed);
  };
  std::vector<pid_t> children;
  for (int c = 0; c < kProcesses; ++c) {
    fs::path err_file = tmp.path / ("child" + std::to_string(c) + ".err");
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int fd = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 2);
      DiskCache cache(dir);
      int bad = 0;
      for (int i = 0; i < kIterations; ++i) {
        cache.put("shared-key", make(static_cast<unsigned>(c * 1000 + i + 1)));
        std::optional<std::string> got = cache.get("shared-key");
        if (!got || !valid(*got)) ++bad;
      }
      ::_exit(bad == 0 ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (int c = 0; c < kProcesses; ++c) {
    int status = 0;
    REQUIRE(::waitpid(children[c], &status, 0) == children[c]);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    // Readers never saw a partial entry (no corruption warnings).
    CHECK(read_file(tmp.path / ("child" + std::to_string(c) + ".err")) == "");
  }
  DiskCache cache(dir);
  std::optional<std::string> final_value = cache.get("shared-key");
  REQUIRE(final_value.has_value());
  CHECK(valid(*final_value));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++files;
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  }
  CHECK(files == 1);
}

namespace {
struct EnvGuard {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  explicit EnvGuard(std::initializer_list<const char*> names) {
    for (const char* n : names) {
      const char* v = std::getenv(n);
      saved.emplace_back(n, v ? std::optional<std::string>(v) : std::nullopt);
    }
  }
  ~EnvGuard() {
    for (auto& [n, v] : saved) {
      if (v) ::setenv(n.c_str(), v->c_str(), 1);
      else ::unsetenv(n.c_str());
    }
  }
};
}  // namespace

TEST_CASE("replace_file: the pieces replace the whole file, no temporary file stays, a missing folder says why") {
  TempDir dir;
  const fs::path file = dir.path / "entry.bin";
  auto read = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto names = [&] {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir.path)) out.push_back(e.path().filename().string());
    return out;
  };
  const std::string big(3 << 20, 'x');   // several write() calls' worth
  CHECK(tj::runtime::replace_file(file, {"head:", big, std::string_view("\0tail", 5)}) == "");
  CHECK(read() == "head:" + big + std::string("\0tail", 5));
  CHECK(tj::runtime::replace_file(file, {"short"}) == "");
  CHECK(read() == "short");
  CHECK(names() == std::vector<std::string>{"entry.bin"});

  const std::string why = tj::runtime::replace_file(dir.path / "no-such-folder" / "entry.bin", {"x"});
  CHECK(why == std::strerror(ENOENT));
  CHECK(read() == "short");
  CHECK(names() == std::vector<std::string>{"entry.bin"});
}

TEST_CASE("disk cache: default_dir precedence") {
  EnvGuard guard({"TILEJIT_CACHE_DIR", "XDG_CACHE_HOME", "HOME"});
  ::setenv("HOME", "/home/someone", 1);
  ::setenv("XDG_CACHE_HOME", "/xdg/cache", 1);
  ::setenv("TILEJIT_CACHE_DIR", "/explicit/dir", 1);
  CHECK(DiskCache::default_dir() == fs::path("/explicit/dir"));
  ::setenv("TILEJIT_CACHE_DIR", "", 1);  // empty counts as unset
  CHECK(DiskCache::default_dir() == fs::path("/xdg/cache/tilejit"));
  ::unsetenv("TILEJIT_CACHE_DIR");
  CHECK(DiskCache::default_dir() == fs::path("/xdg/cache/tilejit"));
  ::setenv("XDG_CACHE_HOME", "relative/path", 1);  // XDG: relative paths are ignored
  CHECK(DiskCache::default_dir() == fs::path("/home/someone/.cache/tilejit"));
  ::unsetenv("XDG_CACHE_HOME");
  CHECK(DiskCache::default_dir() == fs::path("/home/someone/.cache/tilejit"));
  ::unsetenv("HOME");
  CHECK_FALSE(DiskCache::default_dir().empty());  // from the password database
}
