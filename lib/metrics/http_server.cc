#include "lib/metrics/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lib/base/signals.h"
#include "lib/metrics/exposition.h"

namespace swaserve::metrics {
namespace {

// How long Create waits for the accept loop to start.
constexpr absl::Duration kStartTimeout = absl::Seconds(10);

}  // namespace

MetricsHttpServer::MetricsHttpServer(std::string host, int port,
                                     std::unique_ptr<httplib::Server> server)
    : host_(std::move(host)), port_(port), server_(std::move(server)) {}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Create(
    const MetricsHttpServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics http server: bad port ", options.port));
  }
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics http server: num_threads must be >= 1, got ",
                     options.num_threads));
  }
  base::IgnoreSigpipeIfDefault();

  const Registry* registry =
      options.registry != nullptr ? options.registry : &DefaultRegistry();
  auto server = std::make_unique<httplib::Server>();
  const size_t num_threads = static_cast<size_t>(options.num_threads);
  server->new_task_queue = [num_threads] {
    return new httplib::ThreadPool(num_threads);
  };
  // Short keep-alive so Stop() does not wait long on an idle scraper
  // connection.
  server->set_keep_alive_timeout(2);
  server->set_read_timeout(5);
  server->set_write_timeout(5);
  // httplib's default also sets SO_REUSEPORT, which would let a second
  // server bind the same port and silently share its traffic. Only allow
  // rebinding over TIME_WAIT.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  server->Get("/metrics",
              [registry](const httplib::Request&, httplib::Response& res) {
                res.status = 200;
                res.set_content(registry->RenderText(),
                                std::string(kTextFormatContentType).c_str());
              });
  server->Get("/health", [health = options.health](const httplib::Request&,
                                                   httplib::Response& res) {
    const absl::Status status = health ? health() : absl::OkStatus();
    if (status.ok()) {
      res.status = 200;
      res.set_content("ok\n", "text/plain; charset=utf-8");
    } else {
      res.status = 503;
      res.set_content(absl::StrCat(status.ToString(), "\n"),
                      "text/plain; charset=utf-8");
    }
  });

  int port = options.port;
  if (port == 0) {
    port = server->bind_to_any_port(options.host);
    if (port < 0) {
      return absl::UnavailableError(absl::StrCat(
          "metrics http server: cannot bind ", options.host, ":0"));
    }
  } else if (!server->bind_to_port(options.host, port)) {
    return absl::UnavailableError(absl::StrCat(
        "metrics http server: cannot bind ", options.host, ":", port));
  }

  auto self = std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(options.host, port, std::move(server)));
  MetricsHttpServer* raw = self.get();
  raw->thread_ = std::thread([raw] {
    raw->server_->listen_after_bind();
    raw->listen_returned_.store(true, std::memory_order_release);
  });
  // httplib's stop() only works once the accept loop runs; wait for it so
  // that Stop() right after Create() cannot hang.
  const absl::Time deadline = absl::Now() + kStartTimeout;
  while (!raw->server_->is_running() &&
         !raw->listen_returned_.load(std::memory_order_acquire)) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          "metrics http server: accept loop did not start");
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  if (raw->listen_returned_.load(std::memory_order_acquire)) {
    return absl::UnavailableError(
        absl::StrCat("metrics http server: listening on ", options.host, ":",
                     port, " failed"));
  }
  return self;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (!thread_.joinable()) return;
  // Create() returned only once the accept loop was running (or had ended),
  // so this stop() cannot be lost. Call it once: httplib asserts on a repeat.
  server_->stop();
  thread_.join();
}

}  // namespace swaserve::metrics
