#include "tests/integration/router/host_network.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "lib/base/status.h"
#include "lib/base/subprocess.h"

extern char** environ;

namespace swaserve::testing {
namespace {

constexpr char kNamePrefix[] = "swh";

// Runs argv; its output, or InternalError naming the command with the output.
absl::StatusOr<std::string> Capture(const std::vector<std::string>& argv,
                                    const std::string& stdin_data = "") {
  std::string out;
  ASSIGN_OR_RETURN(int rc, base::RunCommand(argv, &out, absl::Seconds(30), stdin_data));
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("`", absl::StrJoin(argv, " "), "` exited ", rc, ": ", out));
  }
  return out;
}

bool Executable(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    if (access((std::string(dir) + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// The pid in a name "swh<pid>..." (0 when it has none).
pid_t OwnerPid(absl::string_view name) {
  if (!absl::StartsWith(name, kNamePrefix)) return 0;
  name.remove_prefix(sizeof(kNamePrefix) - 1);
  size_t n = 0;
  while (n < name.size() && absl::ascii_isdigit(name[n])) ++n;
  int pid = 0;
  if (n == 0 || !absl::SimpleAtoi(name.substr(0, n), &pid)) return 0;
  return pid;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

std::vector<std::string> NetnsNames() {
  absl::StatusOr<std::string> out = Capture({"ip", "netns", "list"});
  std::vector<std::string> names;
  if (!out.ok()) return names;
  for (absl::string_view line : absl::StrSplit(*out, '\n', absl::SkipEmpty())) {
    names.emplace_back(line.substr(0, line.find(' ')));
  }
  return names;
}

std::vector<std::string> LinkNames() {
  absl::StatusOr<std::string> out = Capture({"ip", "-o", "link", "show"});
  std::vector<std::string> names;
  if (!out.ok()) return names;
  for (absl::string_view line : absl::StrSplit(*out, '\n', absl::SkipEmpty())) {
    // "12: swh123h2@if3: <...>"
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(": ", 2));
    if (f.size() < 2) continue;
    names.emplace_back(f[1].substr(0, f[1].find('@')));
  }
  return names;
}

std::string Micros(absl::Duration d) { return absl::StrCat(absl::ToInt64Microseconds(d), "us"); }

}  // namespace

int DeleteStaleHostNetworks() {
  int deleted = 0;
  for (const std::string& ns : NetnsNames()) {
    const pid_t owner = OwnerPid(ns);
    if (owner == 0 || Alive(owner)) continue;
    absl::StatusOr<std::string> pids = Capture({"ip", "netns", "pids", ns});
    if (pids.ok()) {
      for (absl::string_view p : absl::StrSplit(*pids, '\n', absl::SkipEmpty())) {
        int pid = 0;
        if (absl::SimpleAtoi(p, &pid) && pid > 1) kill(pid, SIGKILL);
      }
    }
    if (Capture({"ip", "netns", "del", ns}).ok()) ++deleted;
  }
  for (const std::string& link : LinkNames()) {
    const pid_t owner = OwnerPid(link);
    if (owner != 0 && !Alive(owner)) (void)Capture({"ip", "link", "del", link});
  }
  return deleted;
}

absl::StatusOr<std::unique_ptr<HostNetwork>> HostNetwork::Create(HostNetworkOptions options) {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "multi-host tests need root (network namespaces, veth, tc, nftables)");
  }
  for (const char* tool : {"ip", "tc", "nft"}) {
    if (!Executable(tool)) {
      return absl::FailedPreconditionError(
          absl::StrCat("multi-host tests need `", tool,
                       "` (Debian: iproute2, nftables; scripts/install-deps.sh)"));
    }
  }
  DeleteStaleHostNetworks();
  std::unique_ptr<HostNetwork> net(
      new HostNetwork(std::move(options), absl::StrCat(kNamePrefix, getpid())));
  absl::Status s = net->Setup();
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create network namespaces here: ", s.message()));
  }
  return net;
}

absl::Status HostNetwork::Setup() {
  // Only one network per process at a time: names carry the pid.
  for (const std::string& ns : NetnsNames()) {
    if (absl::StartsWith(ns, prefix_ + "-")) {
      return absl::FailedPreconditionError("another HostNetwork of this process is alive");
    }
  }
  RETURN_IF_ERROR(StartReaper());
  // A /24 no interface here uses: 10.150.0.0 - 10.249.255.0, from the pid.
  ASSIGN_OR_RETURN(std::string addrs, Capture({"ip", "-4", "-o", "addr", "show"}));
  for (int k = 0; k < 25600 && subnet_.empty(); ++k) {
    const int idx = static_cast<int>((getpid() + k) % 25600);
    const std::string candidate = absl::StrCat("10.", 150 + idx / 256, ".", idx % 256, ".");
    if (!absl::StrContains(addrs, "inet " + candidate)) subnet_ = candidate;
  }
  bridge_ = prefix_ + "br";
  client_address_ = subnet_ + "1";
  RETURN_IF_ERROR(Run({"ip", "link", "add", bridge_, "type", "bridge", "forward_delay", "0"}));
  RETURN_IF_ERROR(Run({"ip", "addr", "add", client_address_ + "/24", "dev", bridge_}));
  return Run({"ip", "link", "set", bridge_, "up"});
}

std::string HostNetwork::CleanupScript() const {
  const std::string bridge = bridge_.empty() ? prefix_ + "br" : bridge_;
  // Kill what runs in the namespaces, delete them, then the veth ends (they
  // go with their namespaces, but asynchronously) and the bridge.
  const std::string namespaces = absl::StrCat(
      "for ns in $(ip netns list | awk '{print $1}' | grep '^", prefix_, "-'); do ",
      "for p in $(ip netns pids \"$ns\"); do kill -9 \"$p\" 2>/dev/null; done; ",
      "ip netns del \"$ns\"; done; ");
  const std::string links =
      absl::StrCat("for l in $(ip -o link show | grep -o '", prefix_, "h[0-9]*'); do ",
                   "ip link del \"$l\" 2>/dev/null; done; ");
  return absl::StrCat(namespaces, links, "ip link del ", bridge, " 2>/dev/null; true");
}

absl::Status HostNetwork::StartReaper() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(strerror(errno));
  // Waits for the pipe's end (this process closed it, or died), then
  // cleans up; ignores the signals a test runner sends its process group.
  const std::string script =
      absl::StrCat("trap '' INT TERM HUP; cat >/dev/null; ", CleanupScript());
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[0], 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::string sh = "/bin/sh", c = "-c";
  char* argv[] = {sh.data(), c.data(), const_cast<char*>(script.c_str()), nullptr};
  const int rc = posix_spawn(&reaper_pid_, "/bin/sh", &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[0]);
  if (rc != 0) {
    close(fds[1]);
    return absl::InternalError(absl::StrCat("posix_spawn of the reaper: ", strerror(rc)));
  }
  reaper_fd_ = fds[1];
  return absl::OkStatus();
}

HostNetwork::~HostNetwork() {
  // The reaper does the clean-up once its pipe ends; wait for it (a later
  // network of this process reuses the names).
  if (reaper_fd_ >= 0) close(reaper_fd_);
  if (reaper_pid_ > 0) {
    int status = 0;
    while (waitpid(reaper_pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  // The kernel tears a deleted namespace down asynchronously, its veth end
  // last: wait for the links to go before the names are used again.
  for (const absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;
       absl::SleepFor(absl::Milliseconds(50))) {
    const std::vector<std::string> links = LinkNames();
    if (std::none_of(links.begin(), links.end(),
                     [&](const std::string& l) { return absl::StartsWith(l, prefix_); })) {
      break;
    }
  }
}

absl::Status HostNetwork::Run(const std::vector<std::string>& argv, const std::string& stdin_data) {
  return Capture(argv, stdin_data).status();
}

absl::StatusOr<const HostNetwork::Host*> HostNetwork::AddHost(const std::string& name) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), [](char ch) {
        return absl::ascii_isalnum(ch) || ch == '-' || ch == '_';
      })) {
    return absl::InvalidArgumentError(absl::StrCat("bad host name '", name, "'"));
  }
  if (hosts_.count(name) > 0) return absl::AlreadyExistsError(name);
  if (next_index_ > 254) return absl::ResourceExhaustedError("253 hosts at most");
  auto st = std::make_unique<HostState>();
  Host& h = st->host;
  h.name = name;
  h.netns = absl::StrCat(prefix_, "-", name);
  h.address = absl::StrCat(subnet_, next_index_);
  h.veth = absl::StrCat(prefix_, "h", next_index_);
  ++next_index_;
  const std::vector<std::string> in_ns = {"ip", "-n", h.netns};
  auto ns = [&](std::vector<std::string> rest) {
    std::vector<std::string> argv = in_ns;
    argv.insert(argv.end(), rest.begin(), rest.end());
    return argv;
  };
  RETURN_IF_ERROR(Run({"ip", "netns", "add", h.netns}));
  RETURN_IF_ERROR(
      Run({"ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns}));
  RETURN_IF_ERROR(Run({"ip", "link", "set", h.veth, "master", bridge_, "up"}));
  RETURN_IF_ERROR(Run(ns({"addr", "add", h.address + "/24", "dev", "eth0"})));
  RETURN_IF_ERROR(Run(ns({"link", "set", "eth0", "up"})));
  RETURN_IF_ERROR(Run(ns({"link", "set", "lo", "up"})));
  RETURN_IF_ERROR(ApplyFilters(*st));
  const Host* out = &st->host;
  hosts_[name] = std::move(st);
  return out;
}

const HostNetwork::Host* HostNetwork::Get(const std::string& name) const {
  auto it = hosts_.find(name);
  return it == hosts_.end() ? nullptr : &it->second->host;
}

HostNetwork::HostState* HostNetwork::Find(const std::string& name) {
  auto it = hosts_.find(name);
  return it == hosts_.end() ? nullptr : it->second.get();
}

std::vector<std::string> HostNetwork::Wrap(const std::string& host,
                                           std::vector<std::string> argv) const {
  const Host* h = Get(host);
  if (h == nullptr) return {};
  std::vector<std::string> out = {"ip",
                                  "netns",
                                  "exec",
                                  h->netns,
                                  "env",
                                  "UCX_TLS=" + options_.ucx_tls,
                                  "UCX_NET_DEVICES=" + options_.ucx_net_devices};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status HostNetwork::ApplyFilters(const HostState& h) {
  // The whole table is rewritten in one transaction ("table" first so that
  // "delete" finds one).
  auto chain = [&](bool input) {
    const std::string dir = input ? "saddr" : "daddr";
    std::string c =
        absl::StrCat("  chain ", input ? "input" : "output", " {\n", "    type filter hook ",
                     input ? "input" : "output", " priority 0; policy accept;\n", "    ",
                     input ? "iif" : "oif", " \"lo\" accept\n");
    if (h.isolated) absl::StrAppend(&c, "    drop\n");
    const std::vector<std::string>& peers = input ? h.blocked_in : h.blocked_out;
    if (!peers.empty()) {
      absl::StrAppend(&c, "    ip ", dir, " { ", absl::StrJoin(peers, ", "), " } drop\n");
    }
    if (h.shape.loss > 0) {
      const int64_t per_million = std::llround(std::clamp(h.shape.loss, 0.0, 1.0) * 1e6);
      absl::StrAppend(&c, "    numgen random mod 1000000 < ", per_million, " drop\n");
    }
    return c + "  }\n";
  };
  const std::string script =
      absl::StrCat("table inet swh\ndelete table inet swh\ntable inet swh {\n", chain(true),
                   chain(false), "}\n");
  return Run({"ip", "netns", "exec", h.host.netns, "nft", "-f", "-"}, script);
}

absl::Status HostNetwork::Shape(const std::string& host, const LinkShape& shape) {
  HostState* h = Find(host);
  if (h == nullptr) return absl::NotFoundError(host);
  if (shape.rate_bits_per_second < 0 || shape.loss < 0 || shape.loss > 1 ||
      shape.delay < absl::ZeroDuration() || shape.jitter < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("negative rate, delay or jitter, or loss outside 0..1");
  }
  StopDelayer(*h);
  const bool delayed = shape.delay > absl::ZeroDuration() || shape.jitter > absl::ZeroDuration();
  bool use_delayer = false;
  // Egress of eth0 (what the host sends) and of its bridge-side end (what
  // it receives).
  const std::vector<std::vector<std::string>> devs = {{"tc", "-n", h->host.netns}, {"tc"}};
  const std::vector<std::string> names = {"eth0", h->host.veth};
  for (size_t i = 0; i < devs.size(); ++i) {
    auto tc = [&](std::vector<std::string> rest) {
      std::vector<std::string> argv = devs[i];
      argv.insert(argv.end(), rest.begin(), rest.end());
      return argv;
    };
    (void)Capture(tc({"qdisc", "del", "dev", names[i], "root"}));  // none yet: fails
    std::string parent = "root";
    if (delayed && !use_delayer) {
      absl::Status s =
          Run(tc({"qdisc", "add", "dev", names[i], "root", "handle", "1:", "netem", "delay",
                  Micros(shape.delay), Micros(shape.jitter), "limit", "100000"}));
      if (s.ok()) {
        parent = "1:1";
      } else if (options_.link_delay_bin.empty() || !Executable("iptables")) {
        return absl::FailedPreconditionError(
            absl::StrCat("link delay needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), or "
                         "link_delay_bin and iptables: ",
                         s.message()));
      } else {
        use_delayer = true;
      }
    }
    if (shape.rate_bits_per_second > 0) {
      const int64_t bytes_per_s = shape.rate_bits_per_second / 8;
      const int64_t burst = std::max<int64_t>(bytes_per_s / 100, 32 * 1024);
      std::vector<std::string> argv = tc({"qdisc", "add", "dev", names[i]});
      if (parent == "root") {
        argv.push_back("root");
      } else {
        argv.insert(argv.end(), {"parent", parent});
      }
      argv.insert(argv.end(),
                  {"handle", "10:", "tbf", "rate", absl::StrCat(shape.rate_bits_per_second, "bit"),
                   "burst", absl::StrCat(burst), "latency", "200ms"});
      RETURN_IF_ERROR(Run(argv));
    }
  }
  if (use_delayer) RETURN_IF_ERROR(StartDelayer(*h, shape));
  h->shape = shape;
  return ApplyFilters(*h);
}

absl::Status HostNetwork::StartDelayer(HostState& h, const LinkShape& shape) {
  ASSIGN_OR_RETURN(
      h.delayer,
      base::Subprocess::Start(
          {.argv = {"ip", "netns", "exec", h.host.netns, options_.link_delay_bin, "--queue=0",
                    absl::StrCat("--delay_us=", absl::ToInt64Microseconds(shape.delay)),
                    absl::StrCat("--jitter_us=", absl::ToInt64Microseconds(shape.jitter))},
           .stop_grace = absl::Seconds(1)}));
  // Both directions of eth0 (not loopback); --queue-bypass: packets pass
  // undelayed, not dropped, while no helper listens.
  for (const std::vector<std::string>& rule :
       {std::vector<std::string>{"OUTPUT", "-o", "eth0"}, {"INPUT", "-i", "eth0"}}) {
    std::vector<std::string> argv = {"ip", "netns", "exec", h.host.netns, "iptables", "-A"};
    argv.insert(argv.end(), rule.begin(), rule.end());
    argv.insert(argv.end(), {"-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"});
    RETURN_IF_ERROR(Run(argv));
  }
  absl::SleepFor(absl::Milliseconds(100));  // bound to its queue
  if (!h.delayer->Running()) {
    return absl::InternalError(
        absl::StrCat("link_delay exited: ", h.delayer->ReadLog()));
  }
  return absl::OkStatus();
}

void HostNetwork::StopDelayer(HostState& h) {
  if (h.delayer == nullptr) return;
  for (const char* chain : {"OUTPUT", "INPUT"}) {
    (void)Capture({"ip", "netns", "exec", h.host.netns, "iptables", "-F", chain});
  }
  h.delayer.reset();  // SIGTERM, reaped
}

absl::Status HostNetwork::Partition(const std::string& host) {
  HostState* h = Find(host);
  if (h == nullptr) return absl::NotFoundError(host);
  h->isolated = true;
  return ApplyFilters(*h);
}

absl::Status HostNetwork::PartitionFrom(const std::string& host, const std::string& peer,
                                        bool one_way) {
  HostState* h = Find(host);
  const Host* p = Get(peer);
  if (h == nullptr || p == nullptr) return absl::NotFoundError(absl::StrCat(host, " or ", peer));
  auto add = [](std::vector<std::string>& v, const std::string& a) {
    if (std::find(v.begin(), v.end(), a) == v.end()) v.push_back(a);
  };
  add(h->blocked_out, p->address);
  if (!one_way) add(h->blocked_in, p->address);
  return ApplyFilters(*h);
}

absl::Status HostNetwork::Heal(const std::string& host) {
  HostState* h = Find(host);
  if (h == nullptr) return absl::NotFoundError(host);
  h->isolated = false;
  h->blocked_in.clear();
  h->blocked_out.clear();
  return ApplyFilters(*h);
}

}  // namespace swaserve::testing
