#include "autotune/worker.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "autotune/session.h"
#include "core/error.h"

namespace tj::autotune {
namespace fs = std::filesystem;

namespace {

bool send_all(int fd, const std::string& s) {
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    ssize_t n = ::send(fd, p, left, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

bool executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------- ProcessBench

ProcessBench::ProcessBench(std::string executable) : executable_(std::move(executable)) {}

ProcessBench::~ProcessBench() { stop(); }

void ProcessBench::start() {
  if (pid_ > 0) return;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw Error(fmt::format("cannot start the tuning worker: socketpair: {}", std::strerror(errno)));
  // Everything the child needs is prepared before fork (only async-signal-safe calls after).
  std::string fd_arg = "3";
  std::vector<std::string> args = {executable_, "__tune-worker", "--fd", fd_arg};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    throw Error(fmt::format("cannot start the tuning worker: fork: {}", std::strerror(err)));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    if (sv[1] == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else if (::dup2(sv[1], 3) < 0) {
      ::_exit(125);
    }
    ::dup2(2, 1);   // nothing the worker prints reaches the parent's stdout
#ifdef SYS_close_range
    ::syscall(SYS_close_range, 4u, ~0u, 0u);
#else
    for (int fd = 4; fd < 1024; ++fd) ::close(fd);
#endif
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(sv[1]);
  fd_ = sv[0];
  pid_ = pid;
  buffer_.clear();
  ++starts_;
}

std::string ProcessBench::reap(bool kill_first) {
  if (pid_ <= 0) return "not running";
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  int status = 0;
  if (!kill_first) {
    // It is exiting (EOF): give it a moment, then make sure.
    for (int i = 0; i < 200; ++i) {
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return describe_status(status);
      }
      if (r < 0) {
        pid_ = -1;
        return "ended";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return kill_first ? "killed" : describe_status(status);
}

WorkerReply ProcessBench::call(const std::string& request, double timeout_s) {
  WorkerReply r;
  if (pid_ <= 0) {
    r.failure = "the worker is not running";
    return r;
  }
  if (!send_all(fd_, request + "\n")) {
    r.failure = "the worker " + reap(false);
    return r;
  }
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s));
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      r.ok = true;
      r.line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return r;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) {
      reap(true);
      r.timed_out = true;
      r.failure = fmt::format("no answer within {:.1f} s (a hang?); the worker was killed", timeout_s);
      return r;
    }
    pollfd p{fd_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, INT_MAX)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.failure = fmt::format("poll: {}", std::strerror(errno));
      reap(true);
      return r;
    }
    if (n == 0) continue;
    char buf[65536];
    ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      r.failure = "the worker " + reap(false);
      return r;
    }
    buffer_.append(buf, static_cast<size_t>(got));
  }
}

void ProcessBench::stop() {
  if (pid_ <= 0) return;
  if (send_all(fd_, "{\"op\":\"quit\"}\n")) {
    ::shutdown(fd_, SHUT_WR);
    // Wait up to 2 s for it to leave on its own.
    for (int i = 0; i < 200; ++i) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || r < 0) {
        ::close(fd_);
        fd_ = -1;
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  reap(true);
}

// ---------------------------------------------------------------------------- InProcessBench

struct InProcessBench::Session {
  std::unique_ptr<detail::Session> session = detail::make_session();
  bool dead = false;
};

InProcessBench::InProcessBench() = default;
InProcessBench::~InProcessBench() { stop(); }

void InProcessBench::start() {
  if (session_) return;
  session_ = new Session;
  ++starts_;
}

WorkerReply InProcessBench::call(const std::string& request, double) {
  WorkerReply r;
  if (!session_) {
    r.failure = "not started";
    return r;
  }
  if (session_->dead) {
    r.failure = "this process's CUDA context was lost to an earlier fault (tuning without a worker process)";
    return r;
  }
  bool fatal = false, quit = false;
  r.line = session_->session->handle(request, fatal, quit);
  r.ok = true;
  if (fatal) session_->dead = true;
  return r;
}

void InProcessBench::stop() {
  delete session_;
  session_ = nullptr;
}

// ---------------------------------------------------------------------------- discovery, main

std::string find_worker_executable() {
  if (const char* env = std::getenv("TILEJIT_TUNE_WORKER"); env && *env) {
    if (executable(env)) return env;
    std::fprintf(stderr, "tilejit: $TILEJIT_TUNE_WORKER=%s is not an executable; looking elsewhere\n", env);
  }
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && self.filename() == "tilejit" && executable(self)) return self.string();
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&find_worker_executable), &info) && info.dli_fname) {
    fs::path lib = fs::weakly_canonical(fs::path(info.dli_fname), ec);
    if (ec) lib = info.dli_fname;
    fs::path dir = lib.parent_path();
    for (const fs::path& candidate : {dir / "tools" / "tilejit", dir / ".." / "bin" / "tilejit", dir / "tilejit"})
      if (executable(candidate)) return fs::weakly_canonical(candidate, ec).string();
  }
  return {};
}

int worker_main(int fd) {
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<detail::Session> session = detail::make_session();
  std::string buffer;
  char buf[65536];
  while (true) {
    size_t nl;
    while ((nl = buffer.find('\n')) == std::string::npos) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return 0;   // the parent is gone or done
      buffer.append(buf, static_cast<size_t>(n));
    }
    std::string line = buffer.substr(0, nl);
    buffer.erase(0, nl + 1);
    bool fatal = false, quit = false;
    std::string reply = session->handle(line, fatal, quit);
    if (!send_all(fd, reply + "\n")) return 0;
    // A lost context cannot be used again and its teardown may hang: leave at once.
    if (fatal) ::_exit(3);
    if (quit) return 0;
  }
}

}  // namespace tj::autotune
