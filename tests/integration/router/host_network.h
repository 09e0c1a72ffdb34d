// HostNetwork: hosts for multi-host tests on one machine. Each host is a
// Linux network namespace with one interface, eth0 (a veth pair whose other
// end sits on a bridge in the test's own namespace), and its own IPv4
// address in a /24 of its own; the test process is on the bridge too (the
// ".1" address), so it reaches every host as a client would.
//
// Links: every host's link is shaped on its own — bandwidth (tbf, each
// direction), added delay and jitter (netem, each direction: a round trip
// between two hosts crosses both hosts' links twice, so it adds
// 2 x (delay_a + delay_b)), and random loss (nftables, each direction).
// Partitions are nftables drops inside the host's namespace, so packets
// vanish silently (no RST, no ICMP): from every peer, from one peer, or one
// way only. Heal() removes them.
//
// Processes run on a host by prefixing their command line with Wrap(host)
// (`ip netns exec <ns> env UCX_TLS=tcp UCX_NET_DEVICES=eth0 ...`: ip and
// env exec, so the child's pid is the service's); UCX then ships KV over
// TCP on eth0, not over shared memory.
//
// Clean-up: the destructor kills every process left in the namespaces and
// deletes them and the bridge. A reaper process (its own process group,
// deaf to SIGINT/SIGTERM/SIGHUP) waits for the end of a pipe only this
// process holds and does the same when this process dies by any means,
// SIGKILL included. Names start with "swh<pid>" (the creating process's
// pid); Create() first deletes what an earlier run whose process is gone
// left behind.
//
// Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), `ip` and `tc` (iproute2) and
// `nft` (nftables). Create() returns FailedPrecondition naming what is
// missing, for GTEST_SKIP. Delay and jitter use the kernel's netem qdisc
// (sch_netem); where the kernel has none, HostNetworkOptions::link_delay_bin
// (tests/integration/router/link_delay.cc, run in the host's namespace on
// the packets iptables queues to it: needs `iptables`) holds each packet
// instead; with neither Shape() returns FailedPrecondition for a delay, and
// bandwidth and loss still work.
//
// At most one HostNetwork per process at a time (its names carry the pid).
// Thread-compatible: one thread drives a HostNetwork.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/base/subprocess.h"

namespace swaserve::testing {

// One host's link, applied to each direction separately.
struct LinkShape {
  // Bandwidth in bits per second; 0 (default): unlimited.
  int64_t rate_bits_per_second = 0;
  // Added one-way delay and its jitter (netem); zero (default): none.
  absl::Duration delay = absl::ZeroDuration();
  absl::Duration jitter = absl::ZeroDuration();
  // Share of packets dropped, 0..1; 0 (default): none.
  double loss = 0;
};

struct HostNetworkOptions {
  // UCX transports and device for the processes of every host (UCX_TLS,
  // UCX_NET_DEVICES). Default: TCP on eth0.
  std::string ucx_tls = "tcp";
  std::string ucx_net_devices = "eth0";
  // The link_delay helper binary, for delay and jitter where the kernel has
  // no netem. Empty (default): netem only.
  std::string link_delay_bin;
};

class HostNetwork {
 public:
  struct Host {
    std::string name;     // as given to AddHost
    std::string netns;    // network namespace name
    std::string address;  // IPv4 address on the bridge
    std::string veth;     // the bridge-side end of its link (test namespace)
  };

  // Deletes what earlier runs left (their process gone), starts the reaper,
  // creates the bridge. FailedPrecondition when namespaces cannot be
  // created here (not root, a tool missing, the kernel refused).
  static absl::StatusOr<std::unique_ptr<HostNetwork>> Create(HostNetworkOptions options = {});
  ~HostNetwork();
  HostNetwork(const HostNetwork&) = delete;
  HostNetwork& operator=(const HostNetwork&) = delete;

  // Adds a host (a name of letters, digits, '-' or '_'); AlreadyExists when
  // present. The pointer stays valid for the network's life.
  absl::StatusOr<const Host*> AddHost(const std::string& name);
  // The host, or null.
  const Host* Get(const std::string& name) const;
  // The test process's own address on the bridge.
  const std::string& client_address() const { return client_address_; }

  // `argv` run on `host` (the prefix described above, then argv). Empty
  // when the host is unknown.
  std::vector<std::string> Wrap(const std::string& host, std::vector<std::string> argv) const;

  // Shapes the host's link (replacing its earlier shape; a default
  // LinkShape removes it).
  absl::Status Shape(const std::string& host, const LinkShape& shape);

  // Partitions: packets between `host` and every other host (the test
  // process included) dropped both ways.
  absl::Status Partition(const std::string& host);
  // Packets between `host` and `peer` dropped; both ways, or with
  // one_way only those `host` sends to `peer` (an asymmetric partition:
  // `peer`'s packets still arrive, so TCP to and from it stalls all the
  // same, but ICMP-free and half-open).
  absl::Status PartitionFrom(const std::string& host, const std::string& peer,
                             bool one_way = false);
  // Removes every partition of `host` (its loss stays).
  absl::Status Heal(const std::string& host);

  // Runs a command in the test's namespace; InternalError with its output
  // when it exits non-zero.
  absl::Status Run(const std::vector<std::string>& argv, const std::string& stdin_data = "");

 private:
  struct HostState {
    Host host;
    LinkShape shape;
    bool isolated = false;
    std::vector<std::string> blocked_in;  // peer addresses
    std::vector<std::string> blocked_out;
    // link_delay in the host's namespace while a delay is set without netem.
    std::unique_ptr<base::Subprocess> delayer;
  };
  HostNetwork(HostNetworkOptions options, std::string prefix)
      : options_(std::move(options)), prefix_(std::move(prefix)) {}
  absl::Status Setup();
  absl::Status StartReaper();
  // Rewrites the host's nftables table from its state.
  absl::Status ApplyFilters(const HostState& h);
  // link_delay on both directions of the host's link (the kernel has no
  // netem): the helper in its namespace and the iptables rules that queue
  // eth0's packets to it. StopDelayer ends both (no-op when none runs).
  absl::Status StartDelayer(HostState& h, const LinkShape& shape);
  void StopDelayer(HostState& h);
  HostState* Find(const std::string& name);
  // The shell commands that kill the processes of this run's namespaces
  // and delete them and the bridge.
  std::string CleanupScript() const;

  HostNetworkOptions options_;
  std::string prefix_;  // "swh<pid>"
  std::string bridge_;
  std::string subnet_;  // "10.X.Y."
  std::string client_address_;
  std::map<std::string, std::unique_ptr<HostState>> hosts_;
  int next_index_ = 2;
  pid_t reaper_pid_ = 0;
  int reaper_fd_ = -1;  // write end of the reaper's pipe
};

// Deletes namespaces and links named "swh<pid>..." whose <pid> is not a
// live process (left by runs that died before their reaper ran). Returns how
// many namespaces it deleted.
int DeleteStaleHostNetworks();

}  // namespace swaserve::testing
