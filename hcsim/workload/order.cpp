/* The vertex numbering of hcsim/workload/graph.py (number_vertices: its docstring says the rules), as the
   extension hcsim.workload._order: one pass over networkx's own adjacency dicts (graph._succ) numbers the vertices
   in the order they were added, reads each edge's successor, skip_first_iteration and wait, and orders the
   vertices by Kahn's algorithm on the first-iteration edges; with `stable`, the ready vertex least by str(name)
   first (the order networkx's lexicographical_topological_sort with key=str gives), else first come, first
   served. A million-vertex graph's dicts are read once, in C: the Python loops this replaces looked each
   successor up by name in million-entry dicts, several times over. */

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <queue>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

constexpr std::uint8_t SKIP = 1;  // an edge's flags: skip_first_iteration, then its wait's code << 1
constexpr const char* WAITS[] = {"xpu", "group", "all"};  // code 3: anything else (validation names it)

/* The vertices by name: an open-addressing table of (name, its hash, its number), compared as dicts compare. */
class Numbers {
public:
  explicit Numbers(std::size_t n)
  {
    std::size_t size = 1;
    while (size < 2 * n + 2)
      size <<= 1;
    mask_ = size - 1;
    slots_.assign(size, Slot{nullptr, 0, -1});
  }

  void add(PyObject* name, Py_hash_t hash, std::int32_t number)
  {
    std::size_t i = static_cast<std::size_t>(hash) & mask_;
    while (slots_[i].name != nullptr)
      i = (i + 1) & mask_;
    slots_[i] = {name, hash, number};
  }

  std::int32_t find(PyObject* name) const
  {
    Py_hash_t hash = PyObject_Hash(name);  // a str keeps its hash: no work
    if (hash == -1)
      throw py::error_already_set();
    for (std::size_t i = static_cast<std::size_t>(hash) & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.name == nullptr)
        break;
      if (slot.name == name)
        return slot.number;
      if (slot.hash == hash) {
        int equal = PyObject_RichCompareBool(slot.name, name, Py_EQ);
        if (equal < 0)
          throw py::error_already_set();
        if (equal)
          return slot.number;
      }
    }
    throw std::invalid_argument("vertex numbering: an edge names a vertex the graph does not have");
  }

private:
  struct Slot {
    PyObject* name;
    Py_hash_t hash;
    std::int32_t number;
  };
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

/* An edge attribute's key, made once (a str keeps its hash): PyDict_GetItemString makes a str per call. */
PyObject* key_of(const char* name)
{
  PyObject* key = PyUnicode_InternFromString(name);  // a new reference, kept for the process
  if (key == nullptr)
    throw py::error_already_set();
  return key;
}

std::uint8_t wait_code(PyObject* edge)
{
  static PyObject* const key = key_of("wait");
  PyObject* wait = PyDict_GetItemWithError(edge, key);  // borrowed
  if (wait == nullptr && PyErr_Occurred())
    throw py::error_already_set();
  if (wait != nullptr && PyUnicode_Check(wait))
    for (std::uint8_t code = 0; code < 3; ++code)
      if (PyUnicode_CompareWithASCIIString(wait, WAITS[code]) == 0)
        return code;
  return 3;
}

/* Each vertex's rank by str(name) (ties, names alike as strings, by number). */
std::vector<std::int32_t> ranks(const std::vector<PyObject*>& names)
{
  std::vector<py::object> strings;  // str(name) where a name is not a str: kept alive while compared
  std::vector<std::string_view> keys(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    PyObject* text = names[i];
    if (!PyUnicode_CheckExact(text)) {
      strings.push_back(py::reinterpret_steal<py::object>(PyObject_Str(text)));
      if (!strings.back())
        throw py::error_already_set();
      text = strings.back().ptr();
    }
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(text, &size);  // UTF-8 byte order is code point order
    if (utf8 == nullptr)
      throw py::error_already_set();
    keys[i] = std::string_view(utf8, static_cast<std::size_t>(size));
  }
  std::vector<std::int32_t> by_rank(names.size());
  for (std::size_t i = 0; i < names.size(); ++i)
    by_rank[i] = static_cast<std::int32_t>(i);
  std::sort(by_rank.begin(), by_rank.end(), [&keys](std::int32_t a, std::int32_t b) {
    return keys[a] != keys[b] ? keys[a] < keys[b] : a < b;
  });
  std::vector<std::int32_t> rank(names.size());
  for (std::size_t r = 0; r < by_rank.size(); ++r)
    rank[by_rank[r]] = static_cast<std::int32_t>(r);
  return rank;
}

template <typename T>
py::bytes as_bytes(const std::vector<T>& values)
{
  return py::bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

/* (order, start, successor, flags) as bytes of int32, int64, int32 and uint8 (module comment): vertex i's
   edges are [start[i], start[i + 1]), in its adjacency dict's order; `order` leaves out the vertices on or after
   a cycle of first-iteration edges. */
py::tuple number_graph(py::dict successors, bool stable)
{
  std::size_t n = successors.size();
  if (n >= static_cast<std::size_t>(INT32_MAX))
    throw std::invalid_argument("vertex numbering: more than 2^31 vertices");
  std::vector<PyObject*> names;
  std::vector<PyObject*> adjacency;
  names.reserve(n);
  adjacency.reserve(n);
  Numbers numbers(n);
  PyObject *key, *value;
  Py_ssize_t position = 0;
  while (PyDict_Next(successors.ptr(), &position, &key, &value)) {  // borrowed: the graph holds them
    if (!PyDict_Check(value))
      throw std::invalid_argument("vertex numbering: an adjacency that is not a dict (not a networkx graph?)");
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1)
      throw py::error_already_set();
    numbers.add(key, hash, static_cast<std::int32_t>(names.size()));
    names.push_back(key);
    adjacency.push_back(value);
  }
  std::vector<std::int64_t> start(n + 1, 0);
  std::vector<std::int32_t> successor;
  std::vector<std::uint8_t> flags;
  std::vector<std::int32_t> indegree(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    Py_ssize_t at = 0;
    while (PyDict_Next(adjacency[i], &at, &key, &value)) {
      if (!PyDict_Check(value))
        throw std::invalid_argument("vertex numbering: edge data that is not a dict (not a networkx graph?)");
      std::int32_t j = numbers.find(key);
      static PyObject* const skip_key = key_of("skip_first_iteration");
      PyObject* skip = PyDict_GetItemWithError(value, skip_key);  // borrowed
      if (skip == nullptr && PyErr_Occurred())
        throw py::error_already_set();
      int skipped = skip == nullptr ? 0 : PyObject_IsTrue(skip);
      if (skipped < 0)
        throw py::error_already_set();
      successor.push_back(j);
      flags.push_back(static_cast<std::uint8_t>((skipped ? SKIP : 0) | (wait_code(value) << 1)));
      if (!skipped)
        ++indegree[j];
    }
    start[i + 1] = static_cast<std::int64_t>(successor.size());
  }
  std::vector<std::int32_t> order;
  order.reserve(n);
  auto release = [&](std::int32_t i, auto&& ready) {
    for (std::int64_t e = start[i]; e < start[i + 1]; ++e)
      if (!(flags[e] & SKIP) && --indegree[successor[e]] == 0)
        ready(successor[e]);
  };
  if (stable) {
    std::vector<std::int32_t> rank = ranks(names), by_rank(n);
    for (std::size_t i = 0; i < n; ++i)
      by_rank[rank[i]] = static_cast<std::int32_t>(i);
    std::priority_queue<std::int32_t, std::vector<std::int32_t>, std::greater<>> ready;
    for (std::size_t i = 0; i < n; ++i)
      if (indegree[i] == 0)
        ready.push(rank[i]);
    while (!ready.empty()) {
      std::int32_t i = by_rank[ready.top()];
      ready.pop();
      order.push_back(i);
      release(i, [&](std::int32_t j) { ready.push(rank[j]); });
    }
  } else {
    for (std::size_t i = 0; i < n; ++i)
      if (indegree[i] == 0)
        order.push_back(static_cast<std::int32_t>(i));
    for (std::size_t k = 0; k < order.size(); ++k)  // grows as vertices become ready
      release(order[k], [&](std::int32_t j) { order.push_back(j); });
  }
  return py::make_tuple(as_bytes(order), as_bytes(start), as_bytes(successor), as_bytes(flags));
}

}  // namespace

PYBIND11_MODULE(_order, m)
{
  m.doc() = "hcsim's vertex numbering and first-iteration order in C++ (hcsim/workload/order.cpp)";
  m.def("number_graph", &number_graph, py::arg("successors"), py::arg("stable"));
}
