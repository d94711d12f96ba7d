/* The route search of hcsim/platform/routes.py (its docstring says the rules), as the extension
   hcsim.platform._routes: Dijkstra on (latency in integer femtoseconds, -bottleneck bandwidth, push order)
   over a platform graph that RouteSearch lays out as flat arrays (nodes numbered in the graph's order), one
   search per source. A search pops the same nodes in the same order as the Python loop it replaces (its keys
   are totally ordered: the push counter is unique), so it finds the same routes; it keeps per-node state in
   arrays stamped with the search's number, so a search costs what it settles, not the graph's size. */

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

struct Entry {
  std::int32_t position;  // the link's place in its node's networkx adjacency: the order links are tried in
  std::int32_t neighbour;
  std::int64_t latency;  // femtoseconds
  double bandwidth;
};

/* Links grouped by a key (a node or a server): key k's links are [start[k], start[k + 1]), each from the node
   `at` (the transit side) to the entry's neighbour. */
struct Links {
  std::vector<std::int64_t> start;
  std::vector<std::int32_t> at;
  std::vector<Entry> entries;
};

struct Item {
  std::int64_t distance;
  double narrowest;  // -(the bottleneck bandwidth so far)
  std::int64_t counter;
  std::int32_t node;
  bool operator>(const Item& other) const
  {
    if (distance != other.distance)
      return distance > other.distance;
    if (narrowest != other.narrowest)
      return narrowest > other.narrowest;
    return counter > other.counter;
  }
};

std::vector<Entry> entries(const std::vector<std::int32_t>& position, const std::vector<std::int32_t>& neighbour,
                           const std::vector<std::int64_t>& latency, const std::vector<double>& bandwidth)
{
  if (neighbour.size() != position.size() || latency.size() != position.size() || bandwidth.size() != position.size())
    throw std::invalid_argument("route search: link arrays of different lengths");
  std::vector<Entry> out(position.size());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = {position[i], neighbour[i], latency[i], bandwidth[i]};
  return out;
}

class Search {
public:
  /* Per node (in the graph's order): transit, a memory, its owner's number, its server's number, the server it
     forwards into only (server_only nodes), a dead end (-1 where none). `adjacency` holds each node's plain
     links (key: the node); `endpoint_links` the links from the fabric to an endpoint (key: the endpoint);
     `server_links` the links into a server's NICs (key: the server's number). */
  Search(std::vector<std::uint8_t> transit, std::vector<std::uint8_t> memory, std::vector<std::int32_t> owner,
         std::vector<std::int32_t> server, std::vector<std::int32_t> inward, std::vector<std::uint8_t> dead_end,
         Links adjacency, Links endpoint_links, Links server_links)
      : transit_(std::move(transit))
      , memory_(std::move(memory))
      , owner_(std::move(owner))
      , server_(std::move(server))
      , inward_(std::move(inward))
      , dead_end_(std::move(dead_end))
      , adjacency_(std::move(adjacency))
      , endpoint_links_(std::move(endpoint_links))
      , server_links_(std::move(server_links))
  {
    std::size_t n = transit_.size();
    if (memory_.size() != n || owner_.size() != n || server_.size() != n || inward_.size() != n ||
        dead_end_.size() != n || adjacency_.start.size() != n + 1 || endpoint_links_.start.size() != n + 1)
      throw std::invalid_argument("route search: node arrays of different lengths");
    for (auto* stamp : {&settled_, &reached_, &target_, &extra_mark_})
      stamp->assign(n, 0);
    distance_.assign(n, 0);
    narrowest_.assign(n, 0.0);
    parent_.assign(n, -1);
  }

  /* Routes from `source` to each of `targets` (distinct node numbers), with the links into `endpoints` (the
     targets and their owners) and into the NICs of `servers` (the source's and the targets'). Returns (True,
     the routes' nodes one after the other, where each route ends) or (False, the targets not reached, []). */
  py::tuple operator()(std::int32_t source, const std::vector<std::int32_t>& targets,
                       const std::vector<std::int32_t>& endpoints, const std::vector<std::int32_t>& servers)
  {
    check(source);
    ++stamp_;
    extra_.clear();
    for (std::int32_t endpoint : endpoints)
      add_extra(endpoint_links_, check(endpoint));
    for (std::int32_t server : servers)
      if (server >= 0 && static_cast<std::size_t>(server) + 1 < server_links_.start.size())
        add_extra(server_links_, server);
    std::size_t remaining = 0;
    for (std::int32_t target : targets)
      if (target_[check(target)] != stamp_) {
        target_[target] = stamp_;
        ++remaining;
      }
    heap_.clear();
    counter_ = 0;
    reach(source, 0, -std::numeric_limits<double>::infinity(), -1);
    while (!heap_.empty() && remaining > 0) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<Item>());
      Item item = heap_.back();
      heap_.pop_back();
      if (settled_[item.node] == stamp_)
        continue;
      settled_[item.node] = stamp_;
      if (target_[item.node] == stamp_)
        --remaining;
      expand(item, source);
    }
    if (remaining > 0) {
      std::vector<std::int32_t> missing;
      for (std::int32_t target : targets)
        if (settled_[target] != stamp_ && std::find(missing.begin(), missing.end(), target) == missing.end())
          missing.push_back(target);
      return py::make_tuple(false, missing, std::vector<std::int64_t>());
    }
    std::vector<std::int32_t> nodes;
    std::vector<std::int64_t> ends;
    for (std::int32_t target : targets) {
      std::size_t first = nodes.size();
      for (std::int32_t node = target; node >= 0; node = parent_[node])
        nodes.push_back(node);
      std::reverse(nodes.begin() + first, nodes.end());
      ends.push_back(static_cast<std::int64_t>(nodes.size()));
    }
    return py::make_tuple(true, nodes, ends);
  }

private:
  std::int32_t check(std::int32_t node) const
  {
    if (node < 0 || static_cast<std::size_t>(node) >= transit_.size())
      throw std::out_of_range("route search: no node " + std::to_string(node));
    return node;
  }

  void add_extra(const Links& links, std::int32_t key)
  {
    for (std::int64_t i = links.start[key]; i < links.start[key + 1]; ++i) {
      extra_[links.at[i]].push_back(links.entries[i]);
      extra_mark_[links.at[i]] = stamp_;
    }
  }

  void reach(std::int32_t node, std::int64_t distance, double narrowest, std::int32_t parent)
  {
    reached_[node] = stamp_;
    distance_[node] = distance;
    narrowest_[node] = narrowest;
    parent_[node] = parent;
    heap_.push_back({distance, narrowest, counter_++, node});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<Item>());
  }

  /* The links of a settled node, in networkx's order, with routes.py's gates. */
  void expand(const Item& item, std::int32_t source)
  {
    std::int32_t node = item.node;
    bool node_transit = transit_[node];
    bool own_only = false;
    if (node != source && !node_transit) {
      std::int32_t previous = parent_[node];
      own_only = !(memory_[previous] && owner_[previous] == node);
    }
    std::int32_t inward = node != source ? inward_[node] : -1;
    if (inward >= 0 && server_[parent_[node]] == inward)
      inward = -1;  // from inside its server: it forwards anywhere
    const Entry* begin = adjacency_.entries.data() + adjacency_.start[node];
    const Entry* end = adjacency_.entries.data() + adjacency_.start[node + 1];
    if (extra_mark_[node] == stamp_) {
      links_.assign(begin, end);
      const std::vector<Entry>& more = extra_[node];
      links_.insert(links_.end(), more.begin(), more.end());
      std::sort(links_.begin(), links_.end(),
                [](const Entry& a, const Entry& b) { return a.position < b.position; });
      begin = links_.data();
      end = begin + links_.size();
    }
    for (const Entry* link = begin; link != end; ++link) {
      std::int32_t neighbour = link->neighbour;
      if (settled_[neighbour] == stamp_)
        continue;
      if (own_only && owner_[neighbour] != node)
        continue;
      if (inward >= 0 && server_[neighbour] != inward)
        continue;
      if (node_transit && dead_end_[neighbour] && extra_mark_[neighbour] != stamp_ && target_[neighbour] != stamp_)
        continue;
      std::int64_t through = item.distance + link->latency;
      double narrowest = -link->bandwidth > item.narrowest ? -link->bandwidth : item.narrowest;
      if (reached_[neighbour] != stamp_ || through < distance_[neighbour] ||
          (through == distance_[neighbour] && narrowest < narrowest_[neighbour]))
        reach(neighbour, through, narrowest, node);
    }
  }

  std::vector<std::uint8_t> transit_, memory_;
  std::vector<std::int32_t> owner_, server_, inward_;
  std::vector<std::uint8_t> dead_end_;
  Links adjacency_, endpoint_links_, server_links_;
  // per search
  std::uint32_t stamp_ = 0;
  std::vector<std::uint32_t> settled_, reached_, target_, extra_mark_;  // == stamp_: true in this search
  std::vector<std::int64_t> distance_;
  std::vector<double> narrowest_;
  std::vector<std::int32_t> parent_;
  std::unordered_map<std::int32_t, std::vector<Entry>> extra_;
  std::vector<Entry> links_;
  std::vector<Item> heap_;
  std::int64_t counter_ = 0;
};

Links links(std::vector<std::int64_t> start, std::vector<std::int32_t> at, const std::vector<std::int32_t>& position,
            const std::vector<std::int32_t>& neighbour, const std::vector<std::int64_t>& latency,
            const std::vector<double>& bandwidth)
{
  Links out{std::move(start), std::move(at), entries(position, neighbour, latency, bandwidth)};
  if (out.at.size() != out.entries.size() || out.start.empty() || out.start.back() != std::int64_t(out.at.size()))
    throw std::invalid_argument("route search: link groups do not cover the links");
  return out;
}

}  // namespace

PYBIND11_MODULE(_routes, m)
{
  m.doc() = "hcsim's route search on flat arrays (hcsim/platform/routes.py lays them out)";
  py::class_<Links>(m, "Links").def(py::init(&links), py::arg("start"), py::arg("at"), py::arg("position"),
                                    py::arg("neighbour"), py::arg("latency"), py::arg("bandwidth"));
  py::class_<Search>(m, "Search")
      .def(py::init<std::vector<std::uint8_t>, std::vector<std::uint8_t>, std::vector<std::int32_t>,
                    std::vector<std::int32_t>, std::vector<std::int32_t>, std::vector<std::uint8_t>, Links, Links,
                    Links>(),
           py::arg("transit"), py::arg("memory"), py::arg("owner"), py::arg("server"), py::arg("inward"),
           py::arg("dead_end"), py::arg("adjacency"), py::arg("endpoint_links"), py::arg("server_links"))
      .def("__call__", &Search::operator(), py::arg("source"), py::arg("targets"), py::arg("endpoints"),
           py::arg("servers"));
}
