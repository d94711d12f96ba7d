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
#include <map>
#include <queue>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
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

template <typename T>
const T* buffer_of(const py::buffer& buffer, std::size_t count, const char* name)
{
  py::buffer_info info = buffer.request();
  if (info.itemsize != static_cast<py::ssize_t>(sizeof(T)) || info.ndim != 1 ||
      static_cast<std::size_t>(info.shape[0]) != count)
    throw std::invalid_argument(std::string("edge classes: ") + name + " has the wrong item size or length");
  return static_cast<const T*>(info.ptr);
}

/* The edges in the executor's order: each vertex's (at its place in `order`) by its successors' places, and a
   class per edge, (the classes of its two ends, skip, wait), numbered as first met in that order. Returns
   (e_succ int32, v_succs int64, edge_class int32, classes int32 x 4 per class) as bytes. */
py::tuple edge_classes(py::buffer order_b, py::buffer position_b, py::buffer start_b, py::buffer successor_b,
                       py::bytes flags_b, py::buffer class_b)
{
  std::size_t n = static_cast<std::size_t>(order_b.request().shape[0]);
  const std::int32_t* order = buffer_of<std::int32_t>(order_b, n, "order");
  const std::int32_t* position = buffer_of<std::int32_t>(position_b, n, "position");
  const std::int64_t* start = buffer_of<std::int64_t>(start_b, n + 1, "start");
  std::size_t edges = static_cast<std::size_t>(start[n]);
  const std::int32_t* successor = buffer_of<std::int32_t>(successor_b, edges, "successor");
  std::string_view flags = flags_b;
  if (flags.size() != edges)
    throw std::invalid_argument("edge classes: flags has the wrong length");
  const std::int32_t* vertex_class = buffer_of<std::int32_t>(class_b, n, "vertex classes");
  std::vector<std::int32_t> e_succ, edge_class, classes;
  e_succ.reserve(edges);
  edge_class.reserve(edges);
  std::vector<std::int64_t> v_succs(n + 1, 0);
  std::unordered_map<std::uint64_t, std::int32_t> numbers;  // (class, class, skip, wait) -> its number
  std::vector<std::pair<std::int32_t, std::uint8_t>> mine;  // a vertex's edges: (successor's place, flags)
  for (std::size_t p = 0; p < n; ++p) {
    std::int32_t k = order[p];
    mine.clear();
    for (std::int64_t e = start[k]; e < start[k + 1]; ++e)
      mine.emplace_back(position[successor[e]], static_cast<std::uint8_t>(flags[e]));
    std::sort(mine.begin(), mine.end());
    for (auto [q, flag] : mine) {
      if (q < 0)
        throw std::invalid_argument("edge classes: an edge to a vertex the order leaves out");
      std::uint64_t key = (static_cast<std::uint64_t>(vertex_class[p]) << 35) |
                          (static_cast<std::uint64_t>(vertex_class[q]) << 3) | flag;
      auto [at, added] = numbers.try_emplace(key, static_cast<std::int32_t>(classes.size() / 4));
      if (added)
        classes.insert(classes.end(), {vertex_class[p], vertex_class[q], flag & SKIP, flag >> 1});
      e_succ.push_back(q);
      edge_class.push_back(at->second);
    }
    v_succs[p + 1] = static_cast<std::int64_t>(e_succ.size());
  }
  return py::make_tuple(as_bytes(e_succ), as_bytes(v_succs), as_bytes(edge_class), as_bytes(classes));
}

/* Each vertex's requirement class: (its class, the multiset of its incoming edges' classes mapped by
   `pred_class`), numbered as first met in the executor's order. Returns (requirement_class int32 per vertex as
   bytes, [(vertex class, (pred classes, sorted))] per requirement class). */
py::tuple requirement_classes(py::buffer e_succ_b, py::buffer v_succs_b, py::buffer edge_class_b,
                              py::buffer pred_class_b, py::buffer class_b)
{
  std::size_t n = static_cast<std::size_t>(class_b.request().shape[0]);
  const std::int32_t* vertex_class = buffer_of<std::int32_t>(class_b, n, "vertex classes");
  const std::int64_t* v_succs = buffer_of<std::int64_t>(v_succs_b, n + 1, "v_succs");
  std::size_t edges = static_cast<std::size_t>(v_succs[n]);
  const std::int32_t* e_succ = buffer_of<std::int32_t>(e_succ_b, edges, "e_succ");
  const std::int32_t* edge_class = buffer_of<std::int32_t>(edge_class_b, edges, "edge classes");
  std::size_t kinds = static_cast<std::size_t>(pred_class_b.request().shape[0]);
  const std::int32_t* pred_class = buffer_of<std::int32_t>(pred_class_b, kinds, "pred classes");
  std::vector<std::int64_t> first(n + 1, 0);  // incoming edges by successor (CSR)
  for (std::size_t e = 0; e < edges; ++e)
    ++first[e_succ[e] + 1];
  for (std::size_t j = 0; j < n; ++j)
    first[j + 1] += first[j];
  std::vector<std::int32_t> incoming(edges);
  std::vector<std::int64_t> filled(first.begin(), first.end() - 1);
  for (std::size_t p = 0; p < n; ++p)
    for (std::int64_t e = v_succs[p]; e < v_succs[p + 1]; ++e) {
      std::int32_t c = edge_class[e];
      if (c < 0 || static_cast<std::size_t>(c) >= kinds)
        throw std::invalid_argument("requirement classes: an edge class without a pred class");
      incoming[filled[e_succ[e]]++] = pred_class[c];
    }
  std::map<std::vector<std::int32_t>, std::int32_t> numbers;  // (vertex class, sorted pred classes) -> number
  std::vector<std::int32_t> out(n);
  py::list classes;
  std::vector<std::int32_t> key;
  for (std::size_t j = 0; j < n; ++j) {
    key.assign(1, vertex_class[j]);
    key.insert(key.end(), incoming.begin() + first[j], incoming.begin() + first[j + 1]);
    std::sort(key.begin() + 1, key.end());
    auto [at, added] = numbers.try_emplace(key, static_cast<std::int32_t>(numbers.size()));
    if (added) {
      py::tuple preds(key.size() - 1);
      for (std::size_t i = 1; i < key.size(); ++i)
        preds[i - 1] = key[i];
      classes.append(py::make_tuple(key[0], preds));
    }
    out[j] = at->second;
  }
  return py::make_tuple(as_bytes(out), classes);
}

}  // namespace

PYBIND11_MODULE(_order, m)
{
  m.doc() = "hcsim's vertex numbering, first-iteration order and edge classes in C++ (hcsim/workload/order.cpp)";
  m.def("number_graph", &number_graph, py::arg("successors"), py::arg("stable"));
  m.def("edge_classes", &edge_classes, py::arg("order"), py::arg("position"), py::arg("start"),
        py::arg("successor"), py::arg("flags"), py::arg("vertex_class"));
  m.def("requirement_classes", &requirement_classes, py::arg("e_succ"), py::arg("v_succs"), py::arg("edge_class"),
        py::arg("pred_class"), py::arg("vertex_class"));
}
