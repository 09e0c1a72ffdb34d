// media_url.h: the URL parser, redirect resolution, the domain allowlist and
// the special-purpose address ranges, each range with an address inside it,
// and public addresses (also behind the mapped, NAT64 and 6to4 forms).
#include "lib/api/media_url.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace swaserve::api {
namespace {

std::string Parsed(absl::string_view url) {
  absl::StatusOr<MediaUrl> u = ParseMediaUrl(url);
  return u.ok() ? u->ToString() : std::string("error: ") + std::string(u.status().message());
}

TEST(ParseMediaUrl, NormalisesWhatItAcceptsAndNamesWhatItRefuses) {
  EXPECT_EQ(Parsed("HTTPS://Media.Example.COM./a/b.png?x=1#frag"),
            "https://media.example.com:443/a/b.png?x=1");
  EXPECT_EQ(Parsed("http://example.com"), "http://example.com:80/");
  EXPECT_EQ(Parsed("http://example.com:8080?q"), "http://example.com:8080/?q");
  EXPECT_EQ(Parsed("http://[2001:4860::8888]:81/x"), "http://[2001:4860::8888]:81/x");
  EXPECT_EQ(Parsed("http://example.com/caf\xc3\xa9|x"), "http://example.com:80/caf%C3%A9%7Cx");
  for (const auto& [url, why] : std::vector<std::pair<const char*, const char*>>{
           {"ftp://example.com/x", "scheme 'ftp'"},
           {"file:///etc/passwd", "scheme 'file'"},
           {"example.com/x", "not an absolute URL"},
           {"http://user:pw@example.com/x", "user information"},
           {"http://exa%6dple.com/x", "character '%'"},
           {"http://example.com\\evil.com/x", "character '\\'"},
           {"http://[fe80::1%25eth0]/x", "bad IPv6 literal"},
           {"http://[::1/x", "unterminated"},
           {"http://[::1]x/", "junk after"},
           {"http://example.com:99999/x", "bad port"},
           {"http://example.com:+80/x", "bad port"},
           {"http:///x", "no host"},
           {"http://exa mple.com/", "control character or space"},
           {"http://example.com/a\r\nX-Injected: 1", "control character or space"},
       }) {
    EXPECT_TRUE(absl::StrContains(Parsed(url), why)) << url << " -> " << Parsed(url);
  }
}

TEST(ResolveRedirect, FollowsEveryReferenceForm) {
  const MediaUrl base = *ParseMediaUrl("https://cdn.example.com/a/b/c.png?x=1");
  auto at = [&](absl::string_view location) {
    absl::StatusOr<MediaUrl> u = ResolveRedirect(base, location);
    return u.ok() ? u->ToString() : std::string("error: ") + std::string(u.status().message());
  };
  EXPECT_EQ(at("http://other.example/x"), "http://other.example:80/x");
  EXPECT_EQ(at("//other.example/y"), "https://other.example:443/y");
  EXPECT_EQ(at("/root.png"), "https://cdn.example.com:443/root.png");
  EXPECT_EQ(at("d.png"), "https://cdn.example.com:443/a/b/d.png");
  EXPECT_EQ(at("../d.png?z"), "https://cdn.example.com:443/a/d.png?z");
  EXPECT_EQ(at("../../../../d.png"), "https://cdn.example.com:443/d.png");
  EXPECT_EQ(at("./"), "https://cdn.example.com:443/a/b/");
  EXPECT_EQ(at("?y=2"), "https://cdn.example.com:443/a/b/c.png?y=2");
  EXPECT_EQ(at("#top"), "https://cdn.example.com:443/a/b/c.png?x=1");
  EXPECT_EQ(at("  /spaced  "), "https://cdn.example.com:443/spaced");
  EXPECT_TRUE(absl::StartsWith(at(""), "error: empty Location"));
  EXPECT_TRUE(absl::StrContains(at("gopher://x/"), "scheme 'gopher'"));
  EXPECT_TRUE(absl::StrContains(at("javascript:alert(1)"), "without '//'"));
  EXPECT_TRUE(absl::StrContains(at("//user@evil/x"), "user information"));
}

TEST(HostAllowed, MatchesExactNamesAndSuffixPatterns) {
  const std::vector<std::string> allow = {"*.media.example", "Img.Example.COM."};
  EXPECT_TRUE(HostAllowed("a.media.example", allow));
  EXPECT_TRUE(HostAllowed("a.b.media.example.", allow));
  EXPECT_TRUE(HostAllowed("img.example.com", allow));
  EXPECT_FALSE(HostAllowed("media.example", allow));
  EXPECT_FALSE(HostAllowed("evilmedia.example", allow));
  EXPECT_FALSE(HostAllowed("x.img.example.com", allow));
  EXPECT_FALSE(HostAllowed("anything", {}));
  EXPECT_FALSE(HostAllowed("a.b", std::vector<std::string>{"*."}));
}

TEST(SpecialPurposeRange, EveryRangeIsNamedAndPublicAddressesPass) {
  const std::vector<std::pair<const char*, const char*>> special = {
      {"0.1.2.3", "0.0.0.0/8"},
      {"10.200.0.1", "private 10.0.0.0/8"},
      {"100.64.0.1", "CGNAT"},
      {"100.127.255.254", "CGNAT"},
      {"127.0.0.1", "loopback"},
      {"169.254.169.254", "link-local"},
      {"172.31.255.255", "private 172.16.0.0/12"},
      {"192.0.0.170", "IETF protocol assignments"},
      {"192.0.2.1", "documentation"},
      {"192.88.99.1", "6to4 relay"},
      {"192.168.1.1", "private 192.168.0.0/16"},
      {"198.19.0.1", "benchmarking"},
      {"198.51.100.7", "documentation"},
      {"203.0.113.9", "documentation"},
      {"224.0.0.251", "multicast"},
      {"239.255.255.250", "multicast"},
      {"240.0.0.1", "reserved"},
      {"255.255.255.255", "broadcast"},
      {"::", "unspecified"},
      {"::1", "loopback ::1/128"},
      {"::7f00:1", "IPv4-compatible"},
      {"::ffff:127.0.0.1", "IPv4-mapped ::ffff:0:0/96 of 127.0.0.1 (loopback"},
      {"::ffff:10.1.1.1", "IPv4-mapped"},
      {"64:ff9b::7f00:1", "NAT64 64:ff9b::/96 of 127.0.0.1"},
      {"64:ff9b::a9fe:a9fe", "NAT64 64:ff9b::/96 of 169.254.169.254"},
      {"64:ff9b:1::8.8.8.8", "local-use NAT64"},
      {"2002:7f00:1::1", "6to4 2002::/16 of 127.0.0.1"},
      {"2002:c0a8:101::1", "6to4 2002::/16 of 192.168.1.1"},
      {"2001::1", "Teredo"},
      {"2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"},
      {"2001:2::1", "IETF protocol assignments 2001::/23"},
      {"2001:db8::1", "documentation 2001:db8::/32"},
      {"3fff::1", "documentation 3fff::/20"},
      {"100::1", "discard-only"},
      {"fc00::1", "unique local"},
      {"fd12:3456::1", "unique local"},
      {"fe80::1", "link-local fe80::/10"},
      {"febf::1", "link-local fe80::/10"},
      {"fec0::1", "site-local"},
      {"ff02::1", "multicast"},
      {"5f00::1", "outside global unicast"},
      {"4000::1", "outside global unicast"},
  };
  for (const auto& [text, range] : special) {
    absl::StatusOr<IpAddress> ip = IpAddress::Parse(text);
    ASSERT_TRUE(ip.ok()) << text;
    EXPECT_TRUE(absl::StrContains(SpecialPurposeRange(*ip), range))
        << text << " -> '" << SpecialPurposeRange(*ip) << "'";
  }
  for (const char* text : {"8.8.8.8", "1.1.1.1", "93.184.216.34", "100.63.255.255", "100.128.0.1",
                           "172.15.0.1", "172.32.0.1", "192.0.1.1", "198.17.0.1", "223.255.255.1",
                           "2606:4700:4700::1111", "2001:4860:4860::8888", "2001:200::1",
                           "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
                           "3fff:1000::1"}) {
    absl::StatusOr<IpAddress> ip = IpAddress::Parse(text);
    ASSERT_TRUE(ip.ok()) << text;
    EXPECT_EQ(SpecialPurposeRange(*ip), "") << text;
  }
  EXPECT_FALSE(IpAddress::Parse("localhost").ok());
  EXPECT_FALSE(IpAddress::Parse("127.1").ok());  // only canonical numeric forms
  EXPECT_EQ(IpAddress::Parse("::ffff:1.2.3.4")->ToString(), "::ffff:1.2.3.4");
}

}  // namespace
}  // namespace swaserve::api
