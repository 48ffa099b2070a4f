// memory::write_trace: a history (core/memory_history.h) as Chrome-trace JSON, the format Perfetto
// (ui.perfetto.dev) and chrome://tracing open.

// Note [memory trace format]
// One process (pid 1, named after the device). Counter tracks ("ph":"C", args {"bytes": n}):
//   - one per category (parameters, gradients, optimizer state, activations, data, other): live bytes;
//   - "allocated": the allocator's allocated bytes, exact: at every alloc and free its value is
//     Stats::allocated.current just after that event (the events are recorded under the allocator's mutex);
//   - "reserved": the bytes held from the system, at every segment taken or returned.
// All of them start at ts 0 with the values when the history started (blocks already live count in their
// category). Instant events: global ("s":"g") for an OOM, a cache flush, a segment taken or returned; on
// thread 1 ("blocks"), one per alloc, free or retag with the block's tag, op, phase, category, requested and
// rounded bytes, address and segment. Times are microseconds since the history started. Thread 2 is kept for
// op slices ("ph":"X"), which a profiler will add; nothing writes it yet. "otherData" holds the record's
// bounds (truncated, dropped: Note [history bounds]).
#include <cinttypes>
#include <cstdio>

#include "core/history_log.h"

namespace frugal::memory {

namespace {

using detail::json_string;

std::string ts(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%" PRId64 ".%03" PRId64, ns / 1000, ns % 1000);
  return buf;
}

std::string counter(const char* name, int64_t ns, int64_t bytes) {
  return frugal::detail::str_cat("{\"ph\":\"C\",\"pid\":1,\"tid\":0,\"name\":", json_string(name),
                                 ",\"ts\":", ts(ns), ",\"args\":{\"bytes\":", bytes, "}},\n");
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

}  // namespace

void write_trace(const std::string& path, const HistoryRecord& r) {
  detail::OutputFile out(path, "dump_trace");
  auto tag = [&](uint32_t id) -> std::string_view {
    return id < r.tags.size() ? std::string_view(r.tags[id]) : std::string_view("?");
  };
  std::string text = frugal::detail::str_cat(
      "{\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"producer\":\"frugal memory history\",\"device\":",
      json_string(r.device.str()), ",\"events\":", r.events.size(), ",\"max_events\":", r.max_events,
      ",\"truncated\":", r.truncated ? "true" : "false", ",\"dropped\":", r.dropped,
      ",\"start_allocated\":", r.start_allocated, ",\"start_reserved\":", r.start_reserved,
      "},\n\"traceEvents\":[\n",
      "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":",
      json_string("frugal memory (" + r.device.str() + ")"), "}},\n",
      "{\"ph\":\"M\",\"pid\":1,\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"blocks\"}},\n");

  // The starting values: the blocks live when the history started, by category.
  int64_t live[kNumCategories] = {};
  for (const HistoryEvent& e : r.events)
    if (e.kind == EventKind::Live) live[int(e.category)] += e.size;
  for (int c = 0; c < kNumCategories; ++c) text += counter(category_name(Category(c)), 0, live[c]);
  text += counter("allocated", 0, r.start_allocated);
  text += counter("reserved", 0, r.start_reserved);

  for (const HistoryEvent& e : r.events) {
    switch (e.kind) {
      case EventKind::Live:
        break;
      case EventKind::Alloc:
      case EventKind::Free:
      case EventKind::Retag: {
        if (e.kind == EventKind::Retag) {
          if (e.category != e.old_category) {
            live[int(e.old_category)] -= e.size;
            live[int(e.category)] += e.size;
            text += counter(category_name(e.old_category), e.time_ns, live[int(e.old_category)]);
            text += counter(category_name(e.category), e.time_ns, live[int(e.category)]);
          }
        } else {
          live[int(e.category)] += e.kind == EventKind::Alloc ? e.size : -e.size;
          text += counter(category_name(e.category), e.time_ns, live[int(e.category)]);
          text += counter("allocated", e.time_ns, e.allocated);
        }
        text += frugal::detail::str_cat(
            "{\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":1,\"name\":",
            json_string(std::string(event_kind_name(e.kind)) + " " +
                        (*e.op ? e.op : std::string(tag(e.tag)))),
            ",\"ts\":", ts(e.time_ns), ",\"args\":{\"bytes\":", e.size, ",\"requested\":", e.requested,
            ",\"tag\":", json_string(tag(e.tag)), ",\"op\":", json_string(e.op),
            ",\"phase\":", json_string(phase_name(e.phase)),
            ",\"category\":", json_string(category_name(e.category)),
            e.kind == EventKind::Retag ? ",\"old_tag\":" + json_string(tag(e.old_tag)) : std::string(),
            ",\"address\":", json_string(hex(e.address)), ",\"segment\":", e.segment,
            ",\"thread\":", e.thread, "}},\n");
        break;
      }
      case EventKind::SegmentAlloc:
      case EventKind::SegmentFree:
        text += counter("reserved", e.time_ns, e.reserved);
        text += frugal::detail::str_cat(
            "{\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":0,\"name\":", json_string(event_kind_name(e.kind)),
            ",\"ts\":", ts(e.time_ns), ",\"args\":{\"bytes\":", e.size, ",\"segment\":", e.segment,
            ",\"address\":", json_string(hex(e.address)), ",\"reserved\":", e.reserved, "}},\n");
        break;
      case EventKind::CacheFlush:
      case EventKind::Oom:
        text += frugal::detail::str_cat(
            "{\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":0,\"name\":",
            json_string(e.kind == EventKind::Oom ? "out of memory" : "cache flush"),
            ",\"ts\":", ts(e.time_ns), ",\"args\":{\"requested\":", e.requested,
            ",\"allocated\":", e.allocated, ",\"reserved\":", e.reserved, ",\"op\":", json_string(e.op),
            ",\"phase\":", json_string(phase_name(e.phase)), "}},\n");
        break;
    }
    if (text.size() > (1 << 16)) out.write(std::exchange(text, std::string()));
  }
  // Op slices go here once a profiler records them: "ph":"X" events on pid 1, tid 2 (named "ops" by a
  // thread_name record), so that Perfetto shows each op above the counters it moved.
  // The last event ends without a comma: a closing metadata record keeps every line above alike.
  text +=
      "{\"ph\":\"M\",\"pid\":1,\"tid\":1,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":1}}\n]}\n";
  out.write(text);
  out.close();
}

}  // namespace frugal::memory
