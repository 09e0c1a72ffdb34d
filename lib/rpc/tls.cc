#include "lib/rpc/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/stat.h>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "lib/base/logging.h"

namespace swaserve::rpc {

namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

// The files' modification times and sizes: what a reload watches.
std::string Stamp(const TlsFiles& f) {
  std::string out;
  for (const std::string* path : {&f.cert_file, &f.key_file, &f.client_ca_file}) {
    struct stat st {};
    if (path->empty() || stat(path->c_str(), &st) != 0) {
      out += "-;";
      continue;
    }
    absl::StrAppend(&out, st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":", st.st_size, ";");
  }
  return out;
}

absl::StatusOr<SSL_CTX*> BuildContext(const TlsFiles& f) {
  if (f.cert_file.empty() != f.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key file");
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslError());
  auto fail = [ctx](std::string what) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(std::move(what));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_use_certificate_chain_file(ctx, f.cert_file.c_str()) != 1) {
    return fail(absl::StrCat("TLS certificate ", f.cert_file, ": ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, f.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return fail(absl::StrCat("TLS key ", f.key_file, ": ", OpenSslError()));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return fail(absl::StrCat("TLS key ", f.key_file, " does not match the certificate ",
                             f.cert_file));
  }
  if (!f.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, f.client_ca_file.c_str(), nullptr) != 1) {
      return fail(absl::StrCat("TLS client CA ", f.client_ca_file, ": ", OpenSslError()));
    }
    SSL_CTX_set_verify(ctx,
                       SSL_VERIFY_PEER |
                           (f.require_client_cert ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
                       nullptr);
  }
  return ctx;
}

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& files) {
  absl::StatusOr<SSL_CTX*> ctx = BuildContext(files);
  if (!ctx.ok()) return ctx.status();
  SSL_CTX_free(*ctx);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  if (absl::Status st = CheckTlsFiles(files); !st.ok()) return st;
  const unsigned int refresh =
      static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(files.refresh)));
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (files.client_ca_file.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        files.key_file, files.cert_file, refresh);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        files.key_file, files.cert_file, files.client_ca_file, refresh);
  }
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (files.client_ca_file.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(files.require_client_cert
                                      ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                      : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::unique_ptr<HttpTlsContext>> HttpTlsContext::Create(const TlsFiles& files) {
  if (!files.enabled()) return absl::InvalidArgumentError("TLS needs a certificate and a key");
  std::unique_ptr<HttpTlsContext> c(new HttpTlsContext(files));
  absl::MutexLock lock(&c->mu_);
  c->stamp_ = Stamp(files);
  absl::StatusOr<SSL_CTX*> ctx = BuildContext(files);
  if (!ctx.ok()) return ctx.status();
  c->ctx_ = *ctx;
  c->last_check_ = absl::Now();
  return c;
}

HttpTlsContext::~HttpTlsContext() {
  absl::MutexLock lock(&mu_);
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

void HttpTlsContext::MaybeReload() {
  const absl::Time now = absl::Now();
  if (now - last_check_ < files_.refresh) return;
  last_check_ = now;
  const std::string stamp = Stamp(files_);
  if (stamp == stamp_) return;
  absl::StatusOr<SSL_CTX*> ctx = BuildContext(files_);
  if (!ctx.ok()) {
    // Keep serving with the current files; try again at the next check
    // (the stamp is not taken: a half-written file completes).
    const std::string error(ctx.status().message());
    if (error != last_error_) SWA_LOG(warn, "TLS reload failed, keeping the current certificate: {}", error);
    last_error_ = error;
    return;
  }
  SSL_CTX_free(ctx_);  // SSLs made from it hold their own reference
  ctx_ = *ctx;
  stamp_ = stamp;
  last_error_.clear();
  ++reloads_;
  SWA_LOG(info, "TLS certificate reloaded from {}", files_.cert_file);
}

SSL* HttpTlsContext::NewSsl() {
  absl::MutexLock lock(&mu_);
  MaybeReload();
  return SSL_new(ctx_);
}

int HttpTlsContext::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}

}  // namespace swaserve::rpc
