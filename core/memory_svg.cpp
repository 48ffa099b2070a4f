// memory::write_svg: a history (core/memory_history.h) as one self-contained SVG picture, no script: live
// bytes by category over time as a stacked area, the peak marked with its time and value, and the ten largest
// blocks live at the peak with their tag, op and size. Record one step (a History around it) or a whole run.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <unordered_map>

#include "core/history_log.h"

namespace frugal::memory {

namespace {

constexpr int kWidth = 1000, kHeight = 700;
constexpr double kLeft = 90, kRight = 960, kTop = 60, kBottom = 360;  // the plot area
constexpr int kTopBlocks = 10;
constexpr const char* kColors[kNumCategories] = {"#4e79a7", "#f28e2b", "#e15759",
                                                 "#76b7b2", "#59a14f", "#bab0ac"};

std::string xml(std::string_view s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 has no place for other control characters, even escaped.
        out += static_cast<unsigned char>(c) < 0x20 && c != '\t' ? '?' : c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", double(ns) / 1e6);
  return buf;
}

std::string text_at(double x, double y, std::string_view s, const char* extra = "") {
  return frugal::detail::str_cat("<text x=\"", num(x), "\" y=\"", num(y), "\"", extra, ">", xml(s),
                                 "</text>\n");
}

// The live bytes of each category after an event.
struct Point {
  int64_t ns = 0;
  int64_t bytes[kNumCategories] = {};
  int64_t total() const {
    int64_t t = 0;
    for (int64_t b : bytes) t += b;
    return t;
  }
};

struct LiveBlock {
  int64_t size = 0, requested = 0;
  uint32_t tag = 0;
  const char* op = "";
  Category category = Category::Other;
  Phase phase = Phase::Other;
  bool before = false;  // live when the history started: its op and phase are unknown
};

}  // namespace

void write_svg(const std::string& path, const HistoryRecord& r) {
  detail::OutputFile out(path, "dump_svg");
  auto tag = [&](uint32_t id) -> std::string {
    return id < r.tags.size() ? (r.tags[id].empty() ? "(untagged)" : r.tags[id]) : "?";
  };

  // The series, and the peak: the first event at which the allocated bytes are highest.
  std::vector<Point> points(1);
  size_t peak_event = r.events.size();  // none
  int64_t peak_bytes = r.start_allocated, peak_ns = 0;
  for (size_t i = 0; i < r.events.size(); ++i) {
    const HistoryEvent& e = r.events[i];
    Point& last = points.back();
    if (e.kind == EventKind::Live) {
      last.bytes[int(e.category)] += e.size;
      continue;
    }
    if (e.kind != EventKind::Alloc && e.kind != EventKind::Free && e.kind != EventKind::Retag) continue;
    Point p = last;
    p.ns = e.time_ns;
    if (e.kind == EventKind::Retag) {
      p.bytes[int(e.old_category)] -= e.size;
      p.bytes[int(e.category)] += e.size;
    } else {
      p.bytes[int(e.category)] += e.kind == EventKind::Alloc ? e.size : -e.size;
    }
    points.push_back(p);
    if (e.kind == EventKind::Alloc && e.allocated > peak_bytes) {
      peak_bytes = e.allocated;
      peak_ns = e.time_ns;
      peak_event = i;
    }
  }
  const int64_t end_ns = std::max<int64_t>(points.back().ns, 1);

  // The blocks live at the peak (at the start, when nothing allocated beyond it).
  std::unordered_map<uint64_t, LiveBlock> live;
  for (size_t i = 0; i < r.events.size(); ++i) {
    const HistoryEvent& e = r.events[i];
    if (i > peak_event || (peak_event == r.events.size() && e.kind != EventKind::Live)) break;
    if (e.kind == EventKind::Live || e.kind == EventKind::Alloc)
      live[e.address] = {e.size, e.requested, e.tag, e.op, e.category, e.phase, e.kind == EventKind::Live};
    else if (e.kind == EventKind::Free)
      live.erase(e.address);
    else if (e.kind == EventKind::Retag)
      if (auto it = live.find(e.address); it != live.end()) {
        it->second.tag = e.tag;
        it->second.category = e.category;
      }
  }
  std::vector<LiveBlock> largest;
  for (const auto& [address, b] : live) largest.push_back(b);
  std::sort(largest.begin(), largest.end(), [](const LiveBlock& a, const LiveBlock& b) {
    return a.size != b.size ? a.size > b.size : a.requested > b.requested;
  });
  if (largest.size() > size_t(kTopBlocks)) largest.resize(kTopBlocks);

  // One point per pixel column at most, the highest of the column, so that no peak is lost.
  const double plot_w = kRight - kLeft, plot_h = kBottom - kTop;
  auto x_of = [&](int64_t ns) { return kLeft + plot_w * double(ns) / double(end_ns); };
  std::vector<Point> shown;
  for (const Point& p : points) {
    if (!shown.empty() && int(x_of(shown.back().ns)) == int(x_of(p.ns)) && shown.size() > 1) {
      if (p.total() > shown.back().total()) shown.back() = p;
    } else {
      shown.push_back(p);
    }
  }
  shown.push_back(points.back());
  shown.back().ns = end_ns;
  int64_t top = 1;
  for (const Point& p : shown) top = std::max(top, p.total());
  top = std::max(top, peak_bytes);
  const double y_max = double(top) * 1.1;
  auto y_of = [&](double bytes) { return kBottom - plot_h * bytes / y_max; };

  std::string s = frugal::detail::str_cat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
      kWidth, "\" height=\"", kHeight, "\" viewBox=\"0 0 ", kWidth, " ", kHeight,
      "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"#ffffff\"/>\n");
  s += text_at(kLeft, 24,
               frugal::detail::str_cat("frugal memory history: ", r.device.str(), ", ", r.events.size(),
                                       " events over ", ms(end_ns)),
               " font-size=\"16\" font-weight=\"bold\"");
  s += text_at(kLeft, 44,
               r.truncated ? frugal::detail::str_cat("truncated: recording stopped at ", r.max_events,
                                                     " events, ", r.dropped, " dropped after")
               : r.events.empty()
                   ? std::string("no events recorded")
                   : std::string("live bytes by category (stacked), from the allocator's history"),
               r.truncated ? " fill=\"#c00000\"" : " fill=\"#555555\"");

  // The stacked areas, bottom category first: each a polygon along its top edge and back along its bottom,
  // in steps (memory changes at an event and holds until the next).
  for (int c = 0; c < kNumCategories; ++c) {
    std::string upper, lower;
    auto below = [&](const Point& p, bool with_c) {
      int64_t sum = 0;
      for (int k = 0; k < c + (with_c ? 1 : 0); ++k) sum += p.bytes[k];
      return double(sum);
    };
    for (size_t i = 0; i < shown.size(); ++i) {
      const double x0 = x_of(shown[i].ns), x1 = i + 1 < shown.size() ? x_of(shown[i + 1].ns) : x0;
      const double y = y_of(below(shown[i], true));
      upper += num(x0) + "," + num(y) + " " + num(x1) + "," + num(y) + " ";
    }
    for (size_t i = shown.size(); i-- > 0;) {
      const double x0 = x_of(shown[i].ns), x1 = i + 1 < shown.size() ? x_of(shown[i + 1].ns) : x0;
      const double y = y_of(below(shown[i], false));
      lower += num(x1) + "," + num(y) + " " + num(x0) + "," + num(y) + " ";
    }
    s += frugal::detail::str_cat("<polygon fill=\"", kColors[c], "\" stroke=\"none\" points=\"", upper, lower,
                                 "\"><title>", xml(category_name(Category(c))), "</title></polygon>\n");
  }

  // Axes, with five ticks each.
  s += frugal::detail::str_cat("<path d=\"M", num(kLeft), ",", num(kTop), " V", num(kBottom), " H",
                               num(kRight), "\" stroke=\"#000000\" fill=\"none\"/>\n");
  for (int i = 0; i <= 5; ++i) {
    const double bytes = y_max * i / 5, y = y_of(bytes);
    s += frugal::detail::str_cat("<line x1=\"", num(kLeft - 4), "\" y1=\"", num(y), "\" x2=\"", num(kLeft),
                                 "\" y2=\"", num(y), "\" stroke=\"#000000\"/>\n");
    s += text_at(kLeft - 8, y + 4, format_bytes(int64_t(bytes)), " text-anchor=\"end\"");
    const double x = kLeft + plot_w * i / 5;
    s += text_at(x, kBottom + 18, ms(end_ns * i / 5), " text-anchor=\"middle\"");
  }

  // The peak.
  const double px = x_of(peak_ns), py = y_of(double(peak_bytes));
  const std::string peak_label = frugal::detail::str_cat("peak ", format_bytes(peak_bytes), " (", peak_bytes,
                                                         " bytes) at ", ms(peak_ns));
  s += frugal::detail::str_cat("<line x1=\"", num(px), "\" y1=\"", num(kBottom), "\" x2=\"", num(px),
                               "\" y2=\"", num(py), "\" stroke=\"#c00000\" stroke-dasharray=\"4,3\"/>\n",
                               "<circle cx=\"", num(px), "\" cy=\"", num(py),
                               "\" r=\"4\" fill=\"#c00000\"/>\n");
  s += text_at(std::min(px + 6, kRight - 300.0), std::max(py - 8, kTop + 12), peak_label,
               " fill=\"#c00000\" font-weight=\"bold\"");

  // The legend, in two rows: each category's bytes at the peak.
  int64_t at_peak[kNumCategories] = {};
  for (const auto& [address, b] : live) at_peak[int(b.category)] += b.size;
  for (int c = 0; c < kNumCategories; ++c) {
    const double x = kLeft + (c % 3) * 290.0, y = kBottom + 40 + (c / 3) * 18;
    s += frugal::detail::str_cat("<rect x=\"", num(x), "\" y=\"", num(y - 10),
                                 "\" width=\"12\" height=\"12\" fill=\"", kColors[c], "\"/>\n");
    s += text_at(x + 16, y,
                 frugal::detail::str_cat(category_name(Category(c)), " ", format_bytes(at_peak[c])));
  }

  // The largest blocks live at the peak.
  double y = kBottom + 100;
  s += text_at(kLeft, y, frugal::detail::str_cat("the ", largest.size(), " largest blocks live at the peak"),
               " font-weight=\"bold\"");
  y += 20;
  const double cols[] = {kLeft, kLeft + 110, kLeft + 440, kLeft + 640, kLeft + 760};
  const char* heads[] = {"size", "tag", "op", "category", "phase"};
  for (int i = 0; i < 5; ++i) s += text_at(cols[i], y, heads[i], " fill=\"#555555\"");
  for (const LiveBlock& b : largest) {
    y += 18;
    s += text_at(cols[0], y, format_bytes(b.size));
    s += text_at(cols[1], y, tag(b.tag));
    s += text_at(cols[2], y, *b.op ? b.op : "-");
    s += text_at(cols[3], y, category_name(b.category));
    s += text_at(cols[4], y, b.before ? "(before the history)" : phase_name(b.phase));
  }
  s += "</svg>\n";
  out.write(s);
  out.close();
}

}  // namespace frugal::memory
