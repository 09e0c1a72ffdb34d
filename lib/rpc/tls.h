// TLS from files, reloaded when the files change, for the gRPC listeners and
// the router's HTTP listener.
//
// gRPC: ServerCredentialsFor() wraps gRPC's own FileWatcherCertificateProvider
// (the files are re-read every `refresh`; a new certificate serves new
// handshakes, established connections keep theirs).
//
// HTTP (libevent): HttpTlsContext holds an OpenSSL SSL_CTX built from the
// same files and rebuilds it when their modification times change, checked
// at most every `refresh` as new connections arrive. A rebuild that fails (a
// half-written file, a key that does not match) keeps the current context
// and logs the error once per distinct error.
//
// Both check the files once at creation: a missing or unreadable file, or a
// key that does not match its certificate, is InvalidArgument naming the
// file, so a misconfigured listener fails at start, not at the first
// handshake.
//
// Thread-safety: HttpTlsContext::NewSsl may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace swaserve::rpc {

struct TlsFiles {
  // PEM certificate chain and private key of this listener. Both or
  // neither (no TLS).
  std::string cert_file;
  std::string key_file;
  // PEM bundle of the CAs whose client certificates are accepted; empty:
  // clients are not asked for one.
  std::string client_ca_file;
  // With client_ca_file: refuse clients without a certificate it signed
  // (mutual TLS). Default true.
  bool require_client_cert = true;
  // How often the files are checked for changes. Default 60 s.
  absl::Duration refresh = absl::Seconds(60);

  bool enabled() const { return !cert_file.empty(); }
};

// Checks `files` (readable, key matching the certificate, CA bundle
// parsing): InvalidArgument naming what is wrong.
absl::Status CheckTlsFiles(const TlsFiles& files);

// Server credentials for a gRPC listener: TLS from `files`, reloaded; the
// insecure credentials when !files.enabled().
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& files);

class HttpTlsContext {
 public:
  static absl::StatusOr<std::unique_ptr<HttpTlsContext>> Create(const TlsFiles& files);
  ~HttpTlsContext();
  HttpTlsContext(const HttpTlsContext&) = delete;
  HttpTlsContext& operator=(const HttpTlsContext&) = delete;

  // A new server-side SSL for an accepted connection, from the current
  // context (reloaded first when the files changed and `refresh` passed).
  // The caller owns it (libevent's openssl bufferevent frees it). nullptr
  // on allocation failure.
  SSL* NewSsl();
  // Times the context was rebuilt from changed files.
  int reloads() const;

 private:
  explicit HttpTlsContext(const TlsFiles& files) : files_(files) {}
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TlsFiles files_;
  mutable absl::Mutex mu_;
  SSL_CTX* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string stamp_ ABSL_GUARDED_BY(mu_);  // the files' mtimes and sizes
  absl::Time last_check_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  int reloads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace swaserve::rpc
