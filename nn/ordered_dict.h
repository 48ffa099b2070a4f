// OrderedDict: named values kept in insertion order, as libtorch's OrderedDict<Key, Value> (what
// named_parameters(), named_buffers(), named_children() and named_modules() return). Not a general map:
// lookups by key walk the items (these dicts hold tens to hundreds of entries and are looked up rarely).
//
//   for (const auto& p : net->named_parameters()) std::cout << p.key() << " " << p.value().shape() << "\n";
//   Tensor w = net->named_parameters()["fc1.weight"];  // throws Error naming the key if it is missing
//   for (const auto& [name, t] : net->named_buffers()) ...;  // items are also (first, second) pairs
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.h"

namespace frugal {

template <typename Key, typename Value>
class OrderedDict {
 public:
  // One entry. key()/value() as in libtorch; first/second as in std::pair, so structured bindings and code
  // written against a vector of pairs keep working.
  struct Item {
    Key first;
    Value second;
    const Key& key() const { return first; }
    Value& value() { return second; }
    const Value& value() const { return second; }
  };
  using iterator = typename std::vector<Item>::iterator;
  using const_iterator = typename std::vector<Item>::const_iterator;

  OrderedDict() = default;
  // `what` names the dict in errors ("named_parameters").
  explicit OrderedDict(std::string what) : what_(std::move(what)) {}
  // From items whose keys the caller knows to be distinct (not checked: a module's paths are by
  // construction).
  OrderedDict(std::string what, std::vector<Item> items) : what_(std::move(what)), items_(std::move(items)) {}

  // Appends key -> value; a key already present is an Error.
  Value& insert(Key key, Value value) {
    FRUGAL_CHECK(find(key) == nullptr, what_, ": the key '", key, "' is already present");
    items_.push_back(Item{std::move(key), std::move(value)});
    return items_.back().second;
  }

  size_t size() const { return items_.size(); }
  bool is_empty() const { return items_.empty(); }
  bool empty() const { return items_.empty(); }
  bool contains(const Key& key) const { return find(key) != nullptr; }
  // The value under key, or nullptr.
  Value* find(const Key& key) {
    for (Item& it : items_)
      if (it.first == key) return &it.second;
    return nullptr;
  }
  const Value* find(const Key& key) const { return const_cast<OrderedDict*>(this)->find(key); }
  // The value under key; a missing key is an Error that names it.
  Value& operator[](const Key& key) { return at(key); }
  const Value& operator[](const Key& key) const { return at(key); }
  Value& at(const Key& key) {
    Value* v = find(key);
    FRUGAL_CHECK_INDEX(v != nullptr, what_, ": no key '", key, "' among its ", size(),
                       " keys; contains() tells whether a key is there");
    return *v;
  }
  const Value& at(const Key& key) const { return const_cast<OrderedDict*>(this)->at(key); }
  // The item at a position, in insertion order.
  Item& operator[](size_t index) { return items_.at(index); }
  const Item& operator[](size_t index) const { return items_.at(index); }
  Item& front() { return items_.front(); }
  Item& back() { return items_.back(); }

  std::vector<Key> keys() const {
    std::vector<Key> out;
    for (const Item& it : items_) out.push_back(it.first);
    return out;
  }
  std::vector<Value> values() const {
    std::vector<Value> out;
    for (const Item& it : items_) out.push_back(it.second);
    return out;
  }
  const std::vector<Item>& items() const { return items_; }

  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }
  const_iterator begin() const { return items_.begin(); }
  const_iterator end() const { return items_.end(); }

 private:
  std::string what_ = "OrderedDict";
  std::vector<Item> items_;
};

}  // namespace frugal
