// memory::write_trace: a history (core/memory_history.h) as Chrome-trace JSON, the format Perfetto
// (ui.perfetto.dev) and chrome://tracing open.

// Note [memory trace format]
// One process (pid 1, named after the device). Counter tracks ("ph":"C", args {"bytes": n}):
//   - one per category (parameters, gradients, optimizer state, activations, data, other): live bytes;
//   - "allocated": the allocator's allocated bytes, exact: at every alloc and free its value is
//     Stats::allocated.current just after that event (the events are recorded under the allocator's mutex);
//   - "reserved": the bytes held from the system, at every segment taken or returned.
// All of them start when the history started with the values it found (blocks already live count in their
// category). Instant events: global ("s":"g") for an OOM, a cache flush, a segment taken or returned; on
// thread 1 ("blocks"), one per alloc, free or retag with the block's tag, op, phase, category, requested and
// rounded bytes, address and segment. Threads 2 and up ("ops, thread N", tid N + 1): the profiler's op slices
// ("ph":"X", core/profiler.h) of the ops that ran while the history recorded, with their phase, input
// shapes, dtype and bytes. Times are microseconds since the history started (a profiler's trace starts
// where the earlier of the profile and the history did). "otherData" holds the record's bounds (truncated,
// dropped: Note [history bounds]) and the profile's (ops, dropped_ops: Note [profile bounds]).
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "core/history_log.h"
#include "core/profiler.h"

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

// Flushes the text to the file now and then, so that a long record is never one string.
void spill(std::string& text, detail::OutputFile& out) {
  if (text.size() > (1 << 16)) out.write(std::exchange(text, std::string()));
}

// The history's counters and events, its times moved by `shift` nanoseconds.
void history_events(const HistoryRecord& r, int64_t shift, std::string& text, detail::OutputFile& out) {
  auto tag = [&](uint32_t id) -> std::string_view {
    return id < r.tags.size() ? std::string_view(r.tags[id]) : std::string_view("?");
  };
  text += "{\"ph\":\"M\",\"pid\":1,\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"blocks\"}},\n";
  // The starting values: the blocks live when the history started, by category.
  int64_t live[kNumCategories] = {};
  for (const HistoryEvent& e : r.events)
    if (e.kind == EventKind::Live) live[int(e.category)] += e.size;
  for (int c = 0; c < kNumCategories; ++c) text += counter(category_name(Category(c)), shift, live[c]);
  text += counter("allocated", shift, r.start_allocated);
  text += counter("reserved", shift, r.start_reserved);

  for (const HistoryEvent& e : r.events) {
    const int64_t t = e.time_ns + shift;
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
            text += counter(category_name(e.old_category), t, live[int(e.old_category)]);
            text += counter(category_name(e.category), t, live[int(e.category)]);
          }
        } else {
          live[int(e.category)] += e.kind == EventKind::Alloc ? e.size : -e.size;
          text += counter(category_name(e.category), t, live[int(e.category)]);
          text += counter("allocated", t, e.allocated);
        }
        text += frugal::detail::str_cat(
            "{\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":1,\"name\":",
            json_string(std::string(event_kind_name(e.kind)) + " " +
                        (*e.op ? e.op : std::string(tag(e.tag)))),
            ",\"ts\":", ts(t), ",\"args\":{\"bytes\":", e.size, ",\"requested\":", e.requested,
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
        text += counter("reserved", t, e.reserved);
        text += frugal::detail::str_cat(
            "{\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":0,\"name\":", json_string(event_kind_name(e.kind)),
            ",\"ts\":", ts(t), ",\"args\":{\"bytes\":", e.size, ",\"segment\":", e.segment,
            ",\"address\":", json_string(hex(e.address)), ",\"reserved\":", e.reserved, "}},\n");
        break;
      case EventKind::CacheFlush:
      case EventKind::Oom:
        text += frugal::detail::str_cat(
            "{\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":0,\"name\":",
            json_string(e.kind == EventKind::Oom ? "out of memory" : "cache flush"), ",\"ts\":", ts(t),
            ",\"args\":{\"requested\":", e.requested, ",\"allocated\":", e.allocated,
            ",\"reserved\":", e.reserved, ",\"op\":", json_string(e.op),
            ",\"phase\":", json_string(phase_name(e.phase)), "}},\n");
        break;
    }
    spill(text, out);
  }
}

// The profiler's op slices, one track per thread (tid: the thread's number + 1), times since zero_ns.
void op_slices(const std::vector<profiler::OpRecord>& ops, int64_t zero_ns, std::string& text,
               detail::OutputFile& out) {
  std::vector<uint32_t> threads;
  for (const profiler::OpRecord& o : ops)
    if (std::find(threads.begin(), threads.end(), o.thread) == threads.end()) threads.push_back(o.thread);
  for (uint32_t t : threads)
    text +=
        frugal::detail::str_cat("{\"ph\":\"M\",\"pid\":1,\"tid\":", t + 1,
                                ",\"name\":\"thread_name\",\"args\":{\"name\":\"ops, thread ", t, "\"}},\n");
  for (const profiler::OpRecord& o : ops) {
    if (o.start_ns < zero_ns) continue;
    text += frugal::detail::str_cat(
        "{\"ph\":\"X\",\"pid\":1,\"tid\":", o.thread + 1, ",\"name\":", json_string(o.name),
        ",\"ts\":", ts(o.start_ns - zero_ns), ",\"dur\":", ts(o.duration_ns),
        ",\"args\":{\"phase\":", json_string(phase_name(o.phase)), ",\"shapes\":", json_string(o.shapes()),
        ",\"dtype\":", json_string(dtype_name(o.dtype)), ",\"bytes\":", o.bytes, "}},\n");
    spill(text, out);
  }
}

}  // namespace

void detail::write_chrome_trace(const std::string& path, const char* what, const HistoryRecord* history,
                                const std::vector<profiler::OpRecord>& ops, int64_t zero_ns,
                                int64_t dropped_ops) {
  detail::OutputFile out(path, what);
  const HistoryRecord empty;
  const HistoryRecord& r = history ? *history : empty;
  // Where the history's own times (since its start) fall in this trace's.
  const int64_t shift = history ? r.start_ns - zero_ns : 0;
  std::string text = frugal::detail::str_cat(
      "{\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"producer\":",
      history ? "\"frugal memory history\"" : "\"frugal profiler\"",
      ",\"device\":", json_string(r.device.str()), ",\"events\":", r.events.size(),
      ",\"max_events\":", r.max_events, ",\"truncated\":", r.truncated ? "true" : "false",
      ",\"dropped\":", r.dropped, ",\"start_allocated\":", r.start_allocated,
      ",\"start_reserved\":", r.start_reserved, ",\"ops\":", ops.size(), ",\"dropped_ops\":", dropped_ops,
      "},\n\"traceEvents\":[\n",
      "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":",
      json_string(history ? "frugal memory (" + r.device.str() + ")" : std::string("frugal")), "}},\n");
  if (history) history_events(r, shift, text, out);
  op_slices(ops, zero_ns, text, out);
  // The last event ends without a comma: a closing metadata record keeps every line above alike.
  text +=
      "{\"ph\":\"M\",\"pid\":1,\"tid\":1,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":1}}\n]}\n";
  out.write(text);
  out.close();
}

void write_trace(const std::string& path, const HistoryRecord& r) {
  // The profiler's op slices of the same time span, when a profile recorded then.
  std::vector<profiler::OpRecord> ops = profiler::records();
  std::erase_if(
      ops, [&](const profiler::OpRecord& o) { return o.start_ns < r.start_ns || o.start_ns > r.end_ns; });
  detail::write_chrome_trace(path, "dump_trace", &r, ops, r.start_ns,
                             ops.empty() ? 0 : profiler::dropped_records());
}

}  // namespace frugal::memory
