#include "lib/base/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/base/clock.h"

extern char** environ;

namespace swaserve::base {
namespace {

absl::Status ErrnoError(absl::string_view what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

int DecodeWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Everything the child needs, prepared before fork() so that the child only
// makes async-signal-safe calls.
struct ExecPlan {
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;

  explicit ExecPlan(const std::vector<std::string>& args,
                    const std::vector<std::string>& extra_env)
      : argv_storage(args) {
    for (char** e = environ; *e != nullptr; ++e) {
      absl::string_view entry(*e);
      absl::string_view name = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const std::string& x : extra_env) {
        if (absl::string_view(x).substr(0, x.find('=')) == name) overridden = true;
      }
      if (!overridden) env_storage.emplace_back(entry);
    }
    for (const std::string& x : extra_env) env_storage.push_back(x);
    for (std::string& s : argv_storage) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (std::string& s : env_storage) envp.push_back(s.data());
    envp.push_back(nullptr);
  }
};

// Runs in the child after fork(): sets up fds and execs; on failure writes
// errno to `err_fd` and exits 127.
[[noreturn]] void ChildExec(const ExecPlan& plan, int stdin_fd, int out_fd,
                            const char* working_dir, int err_fd, int nice_increment) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // A priority the child cannot get (a negative increment without
  // CAP_SYS_NICE) leaves it at the parent's: not a reason not to run it.
  if (nice_increment != 0) (void)!nice(nice_increment);
  // Undo signal blocking inherited from a parent that waits with sigwait().
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (stdin_fd >= 0) dup2(stdin_fd, STDIN_FILENO);
  if (out_fd >= 0) {
    dup2(out_fd, STDOUT_FILENO);
    dup2(out_fd, STDERR_FILENO);
  }
  if (working_dir != nullptr && chdir(working_dir) != 0) {
    int e = errno;
    (void)!write(err_fd, &e, sizeof(e));
    _exit(127);
  }
  execvpe(plan.argv[0], plan.argv.data(), plan.envp.data());
  int e = errno;
  (void)!write(err_fd, &e, sizeof(e));
  _exit(127);
}

// Forks and execs; returns the child's pid once exec succeeded.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::vector<std::string>& env,
                            int stdin_fd, int out_fd,
                            const std::string& working_dir, int nice_increment = 0) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  ExecPlan plan(argv, env);
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno);
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(err_pipe[0]);
    close(err_pipe[1]);
    return ErrnoError("fork", e);
  }
  if (pid == 0) {
    close(err_pipe[0]);
    ChildExec(plan, stdin_fd, out_fd,
              working_dir.empty() ? nullptr : working_dir.c_str(), err_pipe[1], nice_increment);
  }
  close(err_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(err_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(err_pipe[0]);
  if (n == sizeof(child_errno)) {
    int status;
    waitpid(pid, &status, 0);
    return absl::NotFoundError(absl::StrCat("cannot execute '", argv[0],
                                            "': ", std::strerror(child_errno)));
  }
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const SubprocessOptions& options) {
  int out_fd = -1;
  if (!options.log_path.empty()) {
    out_fd = open(options.log_path.c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) {
      return ErrnoError(absl::StrCat("open log file ", options.log_path), errno);
    }
  }
  absl::StatusOr<pid_t> pid =
      Spawn(options.argv, options.env, -1, out_fd, options.working_dir, options.nice_increment);
  if (out_fd >= 0) close(out_fd);
  if (!pid.ok()) return pid.status();
  return std::unique_ptr<Subprocess>(new Subprocess(*pid, options));
}

Subprocess::~Subprocess() {
  if (!exit_code_.has_value()) (void)Stop();
}

absl::Status Subprocess::Signal(int signo) {
  if (exit_code_.has_value()) return absl::OkStatus();
  if (kill(pid_, signo) != 0 && errno != ESRCH) {
    return ErrnoError(absl::StrCat("kill ", pid_), errno);
  }
  return absl::OkStatus();
}

bool Subprocess::Running() {
  if (exit_code_.has_value()) return false;
  int status;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ = DecodeWaitStatus(status);
    return false;
  }
  return true;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  while (Running()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " (", options_.argv[0],
                       ") still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
  return *exit_code_;
}

absl::StatusOr<int> Subprocess::Stop() {
  if (exit_code_.has_value()) return *exit_code_;
  (void)Signal(SIGTERM);
  absl::StatusOr<int> code = Wait(options_.stop_grace);
  if (code.ok()) return code;
  (void)Signal(SIGKILL);
  return Wait(absl::Seconds(10));
}

std::string Subprocess::ReadLog() const {
  if (options_.log_path.empty()) return "";
  std::ifstream in(options_.log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<int> PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    close(fd);
    return ErrnoError("bind 127.0.0.1:0", e);
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

absl::Status WaitForTcpPort(const std::string& host, int port,
                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an IPv4 address: '", host, "'"));
  }
  while (true) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoError("socket", errno);
    int r = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    close(fd);
    if (r == 0) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("nothing listening on ", host, ":", port, " after ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<int> RunCommand(const std::vector<std::string>& argv,
                               std::string* output, absl::Duration timeout,
                               const std::string& stdin_data) {
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno);
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    close(in_pipe[0]);
    close(in_pipe[1]);
    return ErrnoError("pipe2", e);
  }
  absl::StatusOr<pid_t> pid = Spawn(argv, {}, in_pipe[0], out_pipe[1], "");
  close(in_pipe[0]);
  close(out_pipe[1]);
  if (!pid.ok()) {
    close(in_pipe[1]);
    close(out_pipe[0]);
    return pid.status();
  }
  // Feed stdin and drain stdout together so neither side can block forever.
  // A child that exits without reading stdin must not kill us with SIGPIPE:
  // block it on this thread and consume any pending one afterwards.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  fcntl(in_pipe[1], F_SETFL, O_NONBLOCK);
  size_t written = 0;
  int in_fd = in_pipe[1];
  if (stdin_data.empty()) {
    close(in_fd);
    in_fd = -1;
  }
  int out_fd = out_pipe[0];
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  char buf[65536];
  while (out_fd >= 0) {
    pollfd fds[2];
    int nfds = 0;
    fds[nfds++] = {out_fd, POLLIN, 0};
    if (in_fd >= 0) fds[nfds++] = {in_fd, POLLOUT, 0};
    int wait_ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    int r = poll(fds, nfds, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      timed_out = true;
      break;
    }
    if (fds[0].revents != 0) {
      ssize_t n = read(out_fd, buf, sizeof(buf));
      if (n > 0) {
        if (output != nullptr) output->append(buf, n);
      } else if (n == 0 || errno != EINTR) {
        close(out_fd);
        out_fd = -1;
      }
    }
    if (nfds == 2 && fds[1].revents != 0) {
      ssize_t n = write(in_fd, stdin_data.data() + written,
                        stdin_data.size() - written);
      if (n > 0) written += n;
      if ((n < 0 && errno != EAGAIN && errno != EINTR) ||
          written == stdin_data.size()) {
        close(in_fd);
        in_fd = -1;
      }
    }
  }
  if (in_fd >= 0) close(in_fd);
  if (out_fd >= 0) close(out_fd);
  const timespec zero{0, 0};
  while (sigtimedwait(&pipe_set, nullptr, &zero) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  int status = 0;
  // The child may outlive its stdout (e.g. it forked): bound the wait too.
  while (!timed_out) {
    pid_t r = waitpid(*pid, &status, WNOHANG);
    if (r == *pid) return DecodeWaitStatus(status);
    if (r < 0 && errno != EINTR) return ErrnoError("waitpid", errno);
    if (absl::Now() >= deadline) {
      timed_out = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  {
    kill(*pid, SIGKILL);
    waitpid(*pid, &status, 0);
    return absl::DeadlineExceededError(
        absl::StrCat("'", absl::StrJoin(argv, " "), "' ran longer than ",
                     absl::FormatDuration(timeout)));
  }
}

absl::StatusOr<std::string> MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/",
                                   prefix, "-XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    return ErrnoError(absl::StrCat("mkdtemp ", templ), errno);
  }
  return templ;
}

}  // namespace swaserve::base
