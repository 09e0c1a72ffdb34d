// media_fetch.h: data: URLs, and http(s) fetches against a real HTTP server on
// loopback — bodies, redirects, and every limit (size by Content-Length and
// while streaming, the deadline, redirect count), and where a fetch may go:
// loopback and private addresses refused (literal, by name, after a
// redirect), one resolution per hop whose address is the one connected to,
// the domain allowlist, plain http off by default.
#include "lib/api/media_fetch.h"

#include <httplib.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace swaserve::api {
namespace {

TEST(ParseDataUrl, DecodesBase64AndNamesEveryProblem) {
  const std::string bytes = std::string("\x89PNG\r\n\x1a\n", 8) + std::string(100, '\x01');
  auto ok = ParseDataUrl(absl::StrCat("data:image/PNG;base64,", absl::Base64Escape(bytes)), 1000);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->mime_type, "image/png");
  EXPECT_EQ(ok->bytes, bytes);
  // URL-safe alphabet without padding.
  auto web = ParseDataUrl(absl::StrCat("data:audio/wav;base64,", absl::WebSafeBase64Escape(bytes)),
                          1000);
  ASSERT_TRUE(web.ok()) << web.status();
  EXPECT_EQ(web->bytes, bytes);
  auto msg = [](absl::string_view url, int64_t max = 50) {
    auto r = ParseDataUrl(url, max);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << url;
    return std::string(r.status().message());
  };
  EXPECT_TRUE(absl::StrContains(msg("data:image/png,raw"), "only base64"));
  EXPECT_TRUE(absl::StrContains(msg("data:image/png;base64"), "no ','"));
  EXPECT_TRUE(absl::StrContains(msg("data:image/png;base64,"), "empty payload"));
  EXPECT_TRUE(absl::StrContains(msg("data:image/png;base64,!!!!"), "invalid base64"));
  EXPECT_TRUE(absl::StrContains(
      msg(absl::StrCat("data:image/png;base64,", absl::Base64Escape(std::string(60, 'x')))),
      "more than 50 bytes"));
  EXPECT_TRUE(absl::StrContains(msg("https://x/y.png"), "not a data: URL"));
}

class MediaFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Get("/cat.png", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(1000, 'c'), "image/png");
    });
    server_.Get("/big", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(5000, 'b'), "image/png");
    });
    server_.Get("/stream", [](const httplib::Request&, httplib::Response& res) {
      // Chunked: no Content-Length, so the limit bites while receiving.
      res.set_chunked_content_provider("image/png", [](size_t, httplib::DataSink& sink) {
        const std::string chunk(1000, 's');
        for (int i = 0; i < 10; ++i) {
          if (!sink.write(chunk.data(), chunk.size())) return false;
        }
        sink.done();
        return true;
      });
    });
    server_.Get("/slow", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      res.set_content("late", "image/png");
    });
    server_.Get("/missing", [](const httplib::Request&, httplib::Response& res) {
      res.status = 404;
    });
    server_.Get(R"(/hop/(\d+))", [](const httplib::Request& req, httplib::Response& res) {
      const int n = std::stoi(req.matches[1]);
      res.set_redirect(n == 0 ? "/cat.png" : absl::StrCat("/hop/", n - 1), 302);
    });
    server_.Get("/host", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(req.get_header_value("Host"), "text/plain");
    });
    // Redirects to wherever ?to= says.
    server_.Get("/to", [](const httplib::Request& req, httplib::Response& res) {
      res.set_redirect(req.get_param_value("to"), 302);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  void TearDown() override {
    server_.stop();
    thread_.join();
  }
  std::string Url(absl::string_view path) { return absl::StrCat("http://127.0.0.1:", port_, path); }
  static MediaFetcherOptions Loopback() {
    MediaFetcherOptions o;
    o.allow_private_addresses = true;
    o.allow_http = true;
    o.max_bytes = 2000;
    o.timeout = absl::Milliseconds(800);
    o.max_redirects = 2;
    return o;
  }
  std::string Error(const MediaFetcher& f, absl::string_view path) {
    auto r = f.Fetch(Url(path));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << path << " " << r.status();
    return std::string(r.status().message());
  }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(MediaFetchTest, FetchesAndFollowsRedirectsWithinTheLimits) {
  const MediaFetcher f(Loopback());
  auto r = f.Fetch(Url("/cat.png"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes, std::string(1000, 'c'));
  EXPECT_EQ(r->mime_type, "image/png");
  auto two = f.Fetch(Url("/hop/1"));  // /hop/1 -> /hop/0 -> /cat.png
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->bytes.size(), 1000u);
  EXPECT_TRUE(absl::StrContains(Error(f, "/hop/2"), "too many redirects"));
  EXPECT_TRUE(absl::StrContains(Error(f, "/missing"), "returned HTTP 404"));
  EXPECT_TRUE(absl::StrContains(Error(f, "/big"), "more than 2000 bytes (Content-Length 5000)"));
  EXPECT_TRUE(absl::StrContains(Error(f, "/stream"), "more than 2000 bytes"));
  EXPECT_TRUE(absl::StrContains(Error(f, "/slow"), "timed out")) << Error(f, "/slow");
  // data: URLs through the same call.
  auto d = f.Fetch("data:image/png;base64," + absl::Base64Escape("png!"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->bytes, "png!");
}

// Plain http allowed, 127.0.0.1 the one special-purpose address allowed, and
// host names resolved by `hosts` (no DNS); `lookups` counts resolutions.
MediaFetcherOptions Vetted(std::vector<std::pair<std::string, std::string>> hosts,
                           std::atomic<int>* lookups = nullptr) {
  MediaFetcherOptions o;
  o.allow_http = true;
  o.timeout = absl::Seconds(2);
  o.allowed_addresses.push_back(*IpAddress::Parse("127.0.0.1"));
  o.resolve = [hosts, lookups](const std::string& host)
      -> absl::StatusOr<std::vector<IpAddress>> {
    if (lookups != nullptr) ++*lookups;
    std::vector<IpAddress> out;
    for (const auto& [name, ip] : hosts) {
      if (name == host) out.push_back(*IpAddress::Parse(ip));
    }
    if (out.empty()) return absl::NotFoundError(absl::StrCat("no such host ", host));
    return out;
  };
  return o;
}

TEST_F(MediaFetchTest, LoopbackIsRefusedByDefaultAsLiteralOrName) {
  MediaFetcherOptions o;
  o.allow_http = true;  // so that the address, not the scheme, is the reason
  const MediaFetcher strict(o);
  const std::string v4 = Error(strict, "/cat.png");
  EXPECT_TRUE(absl::StrContains(v4, "127.0.0.1, a special-purpose address (loopback")) << v4;
  auto v6 = strict.Fetch(absl::StrCat("http://[::1]:", port_, "/cat.png"));
  EXPECT_TRUE(absl::StrContains(v6.status().message(), "(loopback ::1/128)")) << v6.status();
  auto named = strict.Fetch(absl::StrCat("http://localhost:", port_, "/cat.png"));
  EXPECT_TRUE(absl::StrContains(named.status().message(), "special-purpose")) << named.status();
  // Other spellings of loopback resolve to it and are refused the same way.
  for (const char* host : {"127.1", "2130706433", "0x7f.0.0.1", "[::ffff:127.0.0.1]"}) {
    auto r = strict.Fetch(absl::StrCat("http://", host, ":", port_, "/cat.png"));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << host;
    EXPECT_FALSE(r.ok()) << host;
  }
}

TEST_F(MediaFetchTest, AHostResolvingToAPrivateAddressIsRefused) {
  const MediaFetcher f(Vetted({{"media.test", "10.0.0.7"},
                               {"mixed.test", "93.184.216.34"},
                               {"mixed.test", "192.168.1.1"},
                               {"nat64.test", "64:ff9b::a00:1"}}));
  auto r = f.Fetch("http://media.test/cat.png");
  EXPECT_TRUE(absl::StrContains(r.status().message(), "10.0.0.7, a special-purpose address "
                                                      "(private 10.0.0.0/8)"))
      << r.status();
  // One private address among public ones is enough to refuse.
  r = f.Fetch("http://mixed.test/cat.png");
  EXPECT_TRUE(absl::StrContains(r.status().message(), "192.168.1.1")) << r.status();
  r = f.Fetch("http://nat64.test/cat.png");
  EXPECT_TRUE(absl::StrContains(r.status().message(), "NAT64")) << r.status();
}

TEST_F(MediaFetchTest, TheConnectionGoesToTheVettedAddressWithTheNameAsHost) {
  // media.test exists only in the resolver hook: the fetch can succeed only
  // by connecting to the address the hook gave, once per hop.
  std::atomic<int> lookups{0};
  const MediaFetcher f(Vetted({{"media.test", "127.0.0.1"}}, &lookups));
  auto r = f.Fetch(absl::StrCat("http://media.test:", port_, "/host"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes, absl::StrCat("media.test:", port_));
  EXPECT_EQ(lookups.load(), 1);
  lookups = 0;
  r = f.Fetch(absl::StrCat("http://media.test:", port_, "/hop/1"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(lookups.load(), 3);  // one per hop
}

TEST(MediaFetchIpv6, TheConnectionGoesToTheVettedIpv6Address) {
  httplib::Server server;
  server.Get("/host", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(req.get_header_value("Host"), "text/plain");
  });
  const int port = server.bind_to_any_port("::1");
  if (port <= 0) GTEST_SKIP() << "no IPv6 loopback here";
  std::thread t([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  MediaFetcherOptions o = Vetted({{"media6.test", "::1"}});
  o.allowed_addresses = {*IpAddress::Parse("::1")};
  auto r = MediaFetcher(o).Fetch(absl::StrCat("http://media6.test:", port, "/host"));
  server.stop();
  t.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes, absl::StrCat("media6.test:", port));
}

TEST_F(MediaFetchTest, EveryRedirectHopIsVettedAgain) {
  const MediaFetcher f(Vetted({{"media.test", "127.0.0.1"}, {"internal.test", "192.168.7.7"}}));
  auto via = [&](absl::string_view to) {
    return f.Fetch(absl::StrCat("http://media.test:", port_, "/to?to=", to));
  };
  auto ok = via("/cat.png");
  ASSERT_TRUE(ok.ok()) << ok.status();
  for (const std::string& to :
       {std::string("http://10.1.2.3/x"), absl::StrCat("http://[::1]:", port_, "/cat.png"),
        std::string("http://internal.test/x"), std::string("http://169.254.169.254/latest"),
        std::string("http://[::ffff:10.0.0.1]/x"), std::string("http://[2002:a00:1::1]/x")}) {
    auto r = via(to);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "special-purpose")) << to << " "
                                                                             << r.status();
  }
  auto ftp = via("ftp://media.test/x");
  EXPECT_TRUE(absl::StrContains(ftp.status().message(), "bad redirect Location")) << ftp.status();
  // http off: the first hop is refused for its scheme.
  MediaFetcherOptions https_only = Vetted({{"media.test", "127.0.0.1"}});
  https_only.allow_http = false;
  auto plain = MediaFetcher(https_only).Fetch(absl::StrCat("http://media.test:", port_, "/cat.png"));
  EXPECT_TRUE(absl::StrContains(plain.status().message(), "scheme 'http' is not allowed"))
      << plain.status();
}

TEST_F(MediaFetchTest, OnlyAllowedDomainsAreFetchedOnEveryHop) {
  MediaFetcherOptions o = Vetted({{"a.media.test", "127.0.0.1"},
                                  {"media.test", "127.0.0.1"},
                                  {"exact.test", "127.0.0.1"},
                                  {"other.test", "127.0.0.1"}});
  o.allowed_domains = {"*.media.test", "Exact.Test."};
  const MediaFetcher f(o);
  auto url = [&](absl::string_view host, absl::string_view path) {
    return absl::StrCat("http://", host, ":", port_, path);
  };
  EXPECT_TRUE(f.Fetch(url("a.media.test", "/cat.png")).ok());
  EXPECT_TRUE(f.Fetch(url("exact.test", "/cat.png")).ok());
  for (const char* host : {"media.test", "other.test", "127.0.0.1"}) {
    auto r = f.Fetch(url(host, "/cat.png"));
    EXPECT_TRUE(absl::StrContains(r.status().message(), "not in the allowed domains"))
        << host << " " << r.status();
  }
  auto hop = f.Fetch(url("a.media.test", absl::StrCat("/to?to=", url("other.test", "/cat.png"))));
  EXPECT_TRUE(absl::StrContains(hop.status().message(), "other.test is not in the allowed"))
      << hop.status();
}

TEST_F(MediaFetchTest, PrivateAddressesSchemesAndBadUrlsAreRefused) {
  // The default: https only, and never a special-purpose address.
  const MediaFetcher strict(MediaFetcherOptions{});
  EXPECT_TRUE(absl::StrContains(Error(strict, "/cat.png"), "scheme 'http' is not allowed"));
  for (const char* url : {"https://10.1.2.3/x", "https://192.168.0.1/x",
                          "https://169.254.169.254/", "https://[fd00::1]/x", "https://0.0.0.0/x",
                          "https://100.64.0.1/x", "https://[fe80::1]/x", "https://224.0.0.1/x"}) {
    auto r = strict.Fetch(url);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "special-purpose"))
        << url << " " << r.status();
  }
  for (const char* url : {"ftp://x/y", "file:///etc/passwd", "http://user@host/x", "http://",
                          "http://host:99999/x", "gopher"}) {
    auto r = strict.Fetch(url);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << url;
  }
}

}  // namespace
}  // namespace swaserve::api
