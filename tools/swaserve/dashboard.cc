// swaserve dashboard: the Grafana dashboards of deploy/grafana rendered from a
// live Prometheus into one HTML page with a PNG chart per panel (Grafana is
// not packaged for this machine; with `swaserve up --prometheus` a local user
// sees TTFT and the hit rate too). Each panel's PromQL is run as a range query
// (Grafana's $__rate_interval becomes max(1m, 4 × step)); the chart draws every
// series (no text in the PNG: titles, legend, last/min/max values and the
// y range are HTML next to it).
#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lib/base/config.h"
#include "tools/swaserve/commands.h"

namespace swaserve::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kWidth = 720, kHeight = 240, kMargin = 6;
constexpr uint8_t kPalette[][3] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},
                                   {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {127, 127, 127},
                                   {188, 189, 34},  {23, 190, 207}};
constexpr int kColors = sizeof(kPalette) / sizeof(kPalette[0]);

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (unix s, value); NaN skipped when drawn
};

struct Canvas {
  std::vector<uint8_t> rgb = std::vector<uint8_t>(static_cast<size_t>(kWidth) * kHeight * 3, 255);
  void Dot(int x, int y, const uint8_t* c) {
    for (int dy = 0; dy < 2; ++dy) {
      for (int dx = 0; dx < 2; ++dx) {
        const int px = x + dx, py = y + dy;
        if (px < 0 || py < 0 || px >= kWidth || py >= kHeight) continue;
        uint8_t* p = &rgb[(static_cast<size_t>(py) * kWidth + px) * 3];
        p[0] = c[0], p[1] = c[1], p[2] = c[2];
      }
    }
  }
  void Line(int x0, int y0, int x1, int y1, const uint8_t* c) {  // Bresenham
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    while (true) {
      Dot(x0, y0, c);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
};

absl::Status WritePng(const std::string& path, const Canvas& canvas) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError("cannot write " + path);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (png == nullptr || info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    return absl::InternalError("libpng failed writing " + path);
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, kWidth, kHeight, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < kHeight; ++y) {
    png_write_row(png, const_cast<png_bytep>(&canvas.rgb[static_cast<size_t>(y) * kWidth * 3]));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return std::fclose(f) == 0 ? absl::OkStatus() : absl::InternalError("cannot close " + path);
}

// Draws the series over [t0, t1]; returns the y range drawn.
std::pair<double, double> Draw(const std::vector<Series>& series, double t0, double t1, Canvas* c) {
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series) {
    for (const auto& [t, v] : s.points) {
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    }
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (lo > 0 && lo < 0.5 * hi) lo = 0;  // counts and rates from 0
  if (hi == lo) hi = lo + (lo == 0 ? 1 : std::abs(lo) * 0.1);
  const uint8_t grid[3] = {225, 225, 225};
  for (int i = 0; i <= 4; ++i) {
    const int y = kMargin + (kHeight - 2 * kMargin) * i / 4;
    c->Line(kMargin, y, kWidth - kMargin, y, grid);
  }
  auto px = [&](double t) { return kMargin + static_cast<int>((t - t0) / (t1 - t0) * (kWidth - 2 * kMargin)); };
  auto py = [&](double v) {
    return kHeight - kMargin - static_cast<int>((v - lo) / (hi - lo) * (kHeight - 2 * kMargin));
  };
  for (size_t i = 0; i < series.size(); ++i) {
    const uint8_t* color = kPalette[i % kColors];
    bool have = false;
    int x0 = 0, y0 = 0;
    for (const auto& [t, v] : series[i].points) {
      if (!std::isfinite(v)) {
        have = false;
        continue;
      }
      const int x = px(t), y = py(v);
      if (have) {
        c->Line(x0, y0, x, y, color);
      } else {
        c->Dot(x, y, color);
      }
      x0 = x, y0 = y, have = true;
    }
  }
  return {lo, hi};
}

std::string Legend(std::string format, const json& metric) {
  if (format.empty()) return metric.dump();
  for (const auto& [k, v] : metric.items()) {
    if (v.is_string()) absl::StrReplaceAll({{"{{" + k + "}}", v.get<std::string>()}}, &format);
  }
  return format;
}

std::string Html(const std::string& s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

std::string Num(double v) {
  if (!std::isfinite(v)) return "–";
  return absl::StrFormat("%.4g", v);
}

struct Options {
  std::string prometheus = "http://127.0.0.1:9090";
  std::string dashboards;
  std::string out = "swaserve-dashboard";
  absl::Duration range = absl::Minutes(15);
  absl::Duration step = absl::Seconds(15);
};

absl::StatusOr<std::vector<Series>> RangeQuery(httplib::Client& client, const std::string& expr,
                                               const json& target, double t0, double t1,
                                               double step_s) {
  httplib::Result r = client.Get(
      "/api/v1/query_range",
      httplib::Params{{"query", expr},
                      {"start", absl::StrFormat("%.3f", t0)},
                      {"end", absl::StrFormat("%.3f", t1)},
                      {"step", absl::StrFormat("%.3f", step_s)}},
      httplib::Headers{});
  if (!r) return absl::UnavailableError("Prometheus unreachable: " + httplib::to_string(r.error()));
  const json body = json::parse(r->body, nullptr, false);
  if (r->status != 200 || body.is_discarded() || body.value("status", "") != "success") {
    return absl::InvalidArgumentError(absl::StrCat("query failed (", r->status, "): ", expr, ": ",
                                                   body.is_discarded() ? r->body : body.value("error", "")));
  }
  std::vector<Series> out;
  for (const json& s : body["data"]["result"]) {
    Series series;
    series.label = Legend(target.value("legendFormat", ""), s["metric"]);
    for (const json& p : s["values"]) {
      const std::string v = p[1].get<std::string>();
      series.points.emplace_back(p[0].get<double>(), v == "NaN" ? NAN : std::stod(v));
    }
    out.push_back(std::move(series));
  }
  return out;
}

absl::Status Render(const Options& o, int* panels_out) {
  httplib::Client client(o.prometheus);  // scheme://host:port
  client.set_read_timeout(30, 0);
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", o.out, ": ", ec.message()));
  const double t1 = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const double t0 = t1 - absl::ToDoubleSeconds(o.range);
  const double step = absl::ToDoubleSeconds(o.step);
  const std::string rate = absl::StrCat(static_cast<int>(std::max(60.0, 4 * step)), "s");
  std::string page = absl::StrCat(
      "<!doctype html><html><head><meta charset=\"utf-8\"><title>swaserve dashboards</title>"
      "<style>body{font-family:sans-serif;margin:2em}div.p{display:inline-block;vertical-align:top;"
      "margin:0 2em 2em 0;width:", kWidth, "px}h2{font-size:1em;margin:.2em 0}p{margin:.2em 0;"
      "color:#555;font-size:.85em}table{font-size:.8em}td{padding:0 .6em 0 0}"
      "span.c{display:inline-block;width:1em;height:.7em}</style></head><body>");
  absl::StrAppend(&page, "<p>Prometheus ", Html(o.prometheus), ", the last ",
                  absl::FormatDuration(o.range), " at a ", absl::FormatDuration(o.step),
                  " step, rendered ", absl::FormatTime(absl::Now()), "</p>");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(o.dashboards, ec)) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  if (ec || files.empty()) return absl::NotFoundError("no dashboards (*.json) in " + o.dashboards);
  std::sort(files.begin(), files.end());
  int n = 0;
  for (const fs::path& file : files) {
    std::ifstream in(file);
    const json d = json::parse(in, nullptr, false);
    if (d.is_discarded()) return absl::InvalidArgumentError("not JSON: " + file.string());
    absl::StrAppend(&page, "<h1>", Html(d.value("title", file.stem().string())), "</h1>");
    for (const json& panel : d["panels"]) {
      std::vector<Series> series;
      for (const json& target : panel["targets"]) {
        const std::string expr =
            absl::StrReplaceAll(target.value("expr", ""), {{"$__rate_interval", rate}});
        absl::StatusOr<std::vector<Series>> s = RangeQuery(client, expr, target, t0, t1, step);
        if (!s.ok()) return s.status();
        series.insert(series.end(), s->begin(), s->end());
      }
      Canvas canvas;
      const auto [lo, hi] = Draw(series, t0, t1, &canvas);
      const std::string png = absl::StrCat(file.stem().string(), "-", ++n, ".png");
      if (absl::Status s = WritePng((fs::path(o.out) / png).string(), canvas); !s.ok()) return s;
      const std::string unit = panel["fieldConfig"]["defaults"].value("unit", "");
      absl::StrAppend(&page, "<div class=\"p\"><h2>", Html(panel.value("title", "")), "</h2><p>",
                      Html(panel.value("description", "")), "</p><img src=\"", png,
                      "\" width=", kWidth, " height=", kHeight, "><p>y from ", Num(lo), " to ",
                      Num(hi), unit.empty() ? "" : " (" + Html(unit) + ")", "</p><table>");
      if (series.empty()) absl::StrAppend(&page, "<tr><td>no data</td></tr>");
      for (size_t i = 0; i < series.size(); ++i) {
        double last = NAN, mn = INFINITY, mx = -INFINITY;
        for (const auto& [t, v] : series[i].points) {
          if (!std::isfinite(v)) continue;
          last = v, mn = std::min(mn, v), mx = std::max(mx, v);
        }
        const uint8_t* c = kPalette[i % kColors];
        absl::StrAppend(&page, absl::StrFormat("<tr><td><span class=\"c\" style=\"background:#%02x%02x%02x\"></span> ",
                                               c[0], c[1], c[2]),
                        Html(series[i].label), "</td><td>last ", Num(last), "</td><td>min ", Num(mn),
                        "</td><td>max ", Num(mx), "</td></tr>");
      }
      absl::StrAppend(&page, "</table></div>");
    }
  }
  absl::StrAppend(&page, "</body></html>\n");
  std::ofstream html(fs::path(o.out) / "index.html");
  html << page;
  if (!html.good()) return absl::InternalError("cannot write " + o.out + "/index.html");
  *panels_out = n;
  return absl::OkStatus();
}

std::string DefaultDashboards() {
  std::error_code ec;
  const fs::path rel = fs::path("deploy") / "grafana" / "dashboards";
  if (fs::is_directory(fs::current_path(ec) / rel, ec)) return (fs::current_path(ec) / rel).string();
#ifdef SWASERVE_SOURCE_DIR
  return (fs::path(SWASERVE_SOURCE_DIR) / rel).string();
#else
  return rel.string();
#endif
}

}  // namespace

int Dashboard(int argc, const char* const* argv) {
  Options o;
  o.dashboards = DefaultDashboards();
  base::Config config(
      "swaserve dashboard",
      "Usage: swaserve dashboard [--prometheus=URL] [--out=DIR] [options]\n"
      "Renders the Grafana dashboards of deploy/grafana/dashboards from a live Prometheus "
      "(e.g. `swaserve up --prometheus`) into DIR/index.html with one PNG chart per panel. "
      "Exit 0 when written, 1 when Prometheus or a query failed, 2 for bad flags.");
  config.Add("prometheus", &o.prometheus, "Prometheus base URL")
      .Add("dashboards", &o.dashboards, "directory of Grafana dashboard JSON files")
      .Add("out", &o.out, "output directory (index.html and the PNGs)")
      .Add("range", &o.range, "time range up to now")
      .Add("step", &o.step, "range-query step");
  base::ParseConfigOrExit(config, argc, argv);
  if (o.step <= absl::ZeroDuration() || o.range <= o.step) {
    std::fprintf(stderr, "swaserve dashboard: --range must exceed --step > 0\n");
    return 2;
  }
  int panels = 0;
  if (absl::Status s = Render(o, &panels); !s.ok()) {
    std::fprintf(stderr, "swaserve dashboard: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("wrote %s/index.html (%d panels)\n", o.out.c_str(), panels);
  return 0;
}

}  // namespace swaserve::cli
