// link_delay: added latency for a host's link where the kernel has no netem
// (tests/integration/router/host_network.h). Runs inside the host's network
// namespace, bound to netfilter queue --queue (iptables -j NFQUEUE sends the
// host's eth0 packets there), and accepts each packet --delay_us later, plus
// up to --jitter_us of uniform jitter; packets leave in the order they came
// (a link does not reorder). Only packet metadata is copied to user space.
//
// Usage: link_delay --queue=N --delay_us=D [--jitter_us=J]
// Exits 1 with a message when the queue cannot be bound.
// The libc headers before the kernel's (both define struct in_addr).
#include <arpa/inet.h>
#include <poll.h>
// clang-format off
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
// clang-format on
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  Clock::time_point release;
  uint32_t id;
};

// Appends a netlink attribute.
void PutAttr(std::vector<char>& msg, uint16_t type, const void* data, size_t len) {
  nlattr a{};
  a.nla_len = static_cast<uint16_t>(NLA_HDRLEN + len);
  a.nla_type = type;
  const size_t at = msg.size();
  msg.resize(at + NLA_ALIGN(a.nla_len), 0);
  std::memcpy(msg.data() + at, &a, sizeof(a));
  std::memcpy(msg.data() + at + NLA_HDRLEN, data, len);
}

// A queue message (config or verdict) for queue `queue` with attributes
// `attrs` (already encoded).
std::vector<char> QueueMessage(uint16_t type, uint16_t queue, const std::vector<char>& attrs) {
  std::vector<char> msg(NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg)), 0);
  nfgenmsg g{};
  g.nfgen_family = AF_UNSPEC;
  g.version = NFNETLINK_V0;
  g.res_id = htons(queue);
  std::memcpy(msg.data() + NLMSG_HDRLEN, &g, sizeof(g));
  msg.insert(msg.end(), attrs.begin(), attrs.end());
  nlmsghdr h{};
  h.nlmsg_len = static_cast<uint32_t>(msg.size());
  h.nlmsg_type = static_cast<uint16_t>((NFNL_SUBSYS_QUEUE << 8) | type);
  h.nlmsg_flags = NLM_F_REQUEST;
  std::memcpy(msg.data(), &h, sizeof(h));
  return msg;
}

bool Send(int fd, const std::vector<char>& msg) {
  sockaddr_nl to{};
  to.nl_family = AF_NETLINK;
  return sendto(fd, msg.data(), msg.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to)) ==
         static_cast<ssize_t>(msg.size());
}

bool Configure(int fd, uint16_t queue) {
  std::vector<char> bind;
  nfqnl_msg_config_cmd cmd{};
  cmd.command = NFQNL_CFG_CMD_BIND;
  cmd.pf = htons(AF_INET);
  PutAttr(bind, NFQA_CFG_CMD, &cmd, sizeof(cmd));
  std::vector<char> params;
  nfqnl_msg_config_params p{};
  p.copy_range = htonl(0);
  p.copy_mode = NFQNL_COPY_META;
  PutAttr(params, NFQA_CFG_PARAMS, &p, sizeof(p));
  const uint32_t maxlen = htonl(200000);
  PutAttr(params, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof(maxlen));
  // A full queue accepts instead of dropping.
  const uint32_t flags = htonl(NFQA_CFG_F_FAIL_OPEN), mask = htonl(NFQA_CFG_F_FAIL_OPEN);
  PutAttr(params, NFQA_CFG_FLAGS, &flags, sizeof(flags));
  PutAttr(params, NFQA_CFG_MASK, &mask, sizeof(mask));
  return Send(fd, QueueMessage(NFQNL_MSG_CONFIG, queue, bind)) &&
         Send(fd, QueueMessage(NFQNL_MSG_CONFIG, queue, params));
}

void Accept(int fd, uint16_t queue, uint32_t id) {
  std::vector<char> attrs;
  nfqnl_msg_verdict_hdr v{};
  v.verdict = htonl(NF_ACCEPT);
  v.id = htonl(id);
  PutAttr(attrs, NFQA_VERDICT_HDR, &v, sizeof(v));
  (void)Send(fd, QueueMessage(NFQNL_MSG_VERDICT, queue, attrs));
}

// The packet ids in a received buffer.
void ParsePackets(const char* buf, size_t n, std::vector<uint32_t>* ids) {
  for (auto* h = reinterpret_cast<const nlmsghdr*>(buf); NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
    if ((h->nlmsg_type & 0xff) != NFQNL_MSG_PACKET) continue;
    const char* p = reinterpret_cast<const char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(sizeof(nfgenmsg));
    const char* end = reinterpret_cast<const char*>(h) + h->nlmsg_len;
    while (p + NLA_HDRLEN <= end) {
      nlattr a;
      std::memcpy(&a, p, sizeof(a));
      if (a.nla_len < NLA_HDRLEN || p + a.nla_len > end) break;
      if ((a.nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR) {
        nfqnl_msg_packet_hdr ph;
        std::memcpy(&ph, p + NLA_HDRLEN, sizeof(ph));
        ids->push_back(ntohl(ph.packet_id));
      }
      p += NLA_ALIGN(a.nla_len);
    }
  }
}

long Flag(int argc, char** argv, const char* name, long fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::strtol(argv[i] + prefix.size(), nullptr, 10);
    }
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const auto queue = static_cast<uint16_t>(Flag(argc, argv, "queue", 0));
  const std::chrono::microseconds delay(Flag(argc, argv, "delay_us", 0));
  const long jitter_us = Flag(argc, argv, "jitter_us", 0);
  const int fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
  sockaddr_nl self{};
  self.nl_family = AF_NETLINK;
  const int rcvbuf = 16 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof(self)) != 0 ||
      !Configure(fd, queue)) {
    std::fprintf(stderr, "link_delay: cannot bind netfilter queue %u: %s\n", queue,
                 std::strerror(errno));
    return 1;
  }
  std::mt19937 rng(queue + 1);
  std::deque<Held> held;
  std::vector<char> buf(1 << 20);
  std::vector<uint32_t> ids;
  Clock::time_point last_release = Clock::now();
  while (true) {
    int timeout_ms = -1;
    if (!held.empty()) {
      const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(
          held.front().release - Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, (wait.count() + 999) / 1000));
    }
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) > 0) {
      // Everything queued now (a packet the socket has no room for is lost).
      ssize_t n;
      while ((n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT)) > 0 || errno == ENOBUFS) {
        if (n <= 0) continue;
        ids.clear();
        ParsePackets(buf.data(), static_cast<size_t>(n), &ids);
        const Clock::time_point now = Clock::now();
        for (uint32_t id : ids) {
          const long j = jitter_us > 0 ? static_cast<long>(rng() % (jitter_us + 1)) : 0;
          // In order: never before the packet ahead of it.
          last_release = std::max(last_release, now + delay + std::chrono::microseconds(j));
          held.push_back({last_release, id});
        }
      }
    }
    const Clock::time_point now = Clock::now();
    while (!held.empty() && held.front().release <= now) {
      Accept(fd, queue, held.front().id);
      held.pop_front();
    }
  }
}
