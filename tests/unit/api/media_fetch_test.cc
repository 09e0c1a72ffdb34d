// media_fetch.h: data: URLs, and http(s) fetches against a real HTTP server on
// loopback — bodies, redirects, and every limit (size by Content-Length and
// while streaming, the deadline, redirect count, private addresses).
#include "lib/api/media_fetch.h"

#include <httplib.h>

#include <string>
#include <thread>

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

TEST_F(MediaFetchTest, PrivateAddressesSchemesAndBadUrlsAreRefused) {
  const MediaFetcher strict(MediaFetcherOptions{});
  // The default refuses loopback (and the redirect target would be checked
  // the same way).
  EXPECT_TRUE(absl::StrContains(Error(strict, "/cat.png"), "private"));
  auto v6 = strict.Fetch(absl::StrCat("http://[::1]:", port_, "/cat.png"));
  EXPECT_TRUE(absl::StrContains(v6.status().message(), "private")) << v6.status();
  for (const char* url : {"http://10.1.2.3/x", "http://192.168.0.1/x", "http://169.254.169.254/",
                          "http://[fd00::1]/x", "http://0.0.0.0/x"}) {
    auto r = strict.Fetch(url);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "private")) << url << " " << r.status();
  }
  MediaFetcherOptions no_http = Loopback();
  no_http.allow_http = false;
  EXPECT_TRUE(absl::StrContains(Error(MediaFetcher(no_http), "/cat.png"), "scheme 'http'"));
  for (const char* url : {"ftp://x/y", "file:///etc/passwd", "http://user@host/x", "http://",
                          "http://host:99999/x", "gopher"}) {
    auto r = strict.Fetch(url);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << url;
  }
}

}  // namespace
}  // namespace swaserve::api
