/* The compiled platform in SimGrid: one zone of every host, routing by a table of the compiled routes.

   SimGrid 4.1's own zones cost more than the routes at scale. A Full zone allocates N^2 route slots for its
   N netpoints when sealed; splitting the hosts into many small Full zones (what the XML compiler does) costs
   hosts x zones twice over while loading: HostImpl's constructor checks the new name with
   Engine::host_by_name_or_null, which searches every zone, and each zone's seal() walks every host of the
   platform (NetZoneImpl::get_all_hosts filters Engine::get_filtered_hosts). A rail-optimised DGX fat tree
   compiles to a zone per GPU (every GPU leaves its node through its own NIC), so 131,072 GPUs made about
   150,000 zones and 330,000 hosts, which did not load in 36 minutes. RouteTable holds every host in one
   zone and answers get_local_route from a table of the compiled pairs only (a sorted row of destinations per source): memory and
   load time linear in hosts, links and route links. Each route is the compiled one, link for link and in
   order. */
#include "core.hpp"

#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/NetZoneImpl.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/NetZone.hpp>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace sg4 = simgrid::s4u;
namespace routing = simgrid::kernel::routing;
using simgrid::kernel::resource::StandardLinkImpl;

namespace hcsim::core {
namespace {

class RouteTable : public routing::NetZoneImpl {
public:
  explicit RouteTable(const std::string& name) : NetZoneImpl(name) {}

  /* The route from host netpoint src to dst: links (in order) and their summed latency (s). Routes are looked up
     once index() has laid every one out. */
  void add(const routing::NetPoint* src, const routing::NetPoint* dst, const std::vector<StandardLinkImpl*>& links,
           double latency)
  {
    added_.push_back({src, dst, {links_.size(), links.size(), latency}});
    links_.insert(links_.end(), links.begin(), links.end());
  }

  /* Every route added: each source's row of destinations, sorted, beside their entries. */
  void index()
  {
    std::sort(added_.begin(), added_.end(), [](const Added& a, const Added& b) {
      return a.src->id() != b.src->id() ? a.src->id() < b.src->id() : a.dst->id() < b.dst->id();
    });
    unsigned long sources = added_.empty() ? 0 : added_.back().src->id() + 1;
    row_start_.assign(sources + 1, 0);
    dst_.reserve(added_.size());
    entries_.reserve(added_.size());
    for (std::size_t k = 0; k < added_.size(); ++k) {
      const Added& route = added_[k];
      if (k > 0 && added_[k - 1].src == route.src && added_[k - 1].dst == route.dst)
        throw std::invalid_argument("platform: two routes from " + route.src->get_name() + " to " +
                                    route.dst->get_name());
      ++row_start_[route.src->id() + 1];
      dst_.push_back(route.dst->id());
      entries_.push_back(route.entry);
    }
    for (std::size_t src = 0; src < sources; ++src)
      row_start_[src + 1] += row_start_[src];
    added_ = {};
  }

  void get_local_route(const routing::NetPoint* src, const routing::NetPoint* dst, routing::Route* into,
                       double* latency) override
  {
    const Entry* found = find(src->id(), dst->id());
    if (found == nullptr)  // a pair the compiler was not asked for: a bug above the core
      throw std::runtime_error("platform: no route from " + src->get_name() + " to " + dst->get_name() +
                               " (hcsim compiles routes only for the host pairs a run uses)");
    auto first = links_.begin() + static_cast<std::ptrdiff_t>(found->first);
    into->link_list_.insert(into->link_list_.end(), first, first + static_cast<std::ptrdiff_t>(found->count));
    if (latency != nullptr)
      *latency += found->latency;
  }

private:
  /* One route: its links' span in links_, their summed latency (in route order from 0, as SimGrid sums a route's
     links). */
  struct Entry {
    std::size_t first, count;
    double latency;
  };
  struct Added {
    const routing::NetPoint *src, *dst;
    Entry entry;
  };
  const Entry* find(unsigned long src, unsigned long dst) const
  {
    if (src + 1 >= row_start_.size())
      return nullptr;
    auto begin = dst_.begin() + static_cast<std::ptrdiff_t>(row_start_[src]);
    auto end = dst_.begin() + static_cast<std::ptrdiff_t>(row_start_[src + 1]);
    auto at = std::lower_bound(begin, end, dst);
    return at != end && *at == dst ? &entries_[at - dst_.begin()] : nullptr;
  }
  // per source netpoint (SimGrid numbers them densely), its routes' destinations in a row of dst_ (row_start_),
  // their entries at the same places: a transfer's look-up searches one short row of keys, then reads one entry
  // and one span of links_ (a row of whole entries, or a hash map of every pair, missed the cache more often)
  std::vector<std::size_t> row_start_;
  std::vector<unsigned long> dst_;
  std::vector<Entry> entries_;
  std::vector<Added> added_;  // until index()
  std::vector<StandardLinkImpl*> links_;  // every route's links, one route after the other
};

}  // namespace

std::unordered_map<std::string, sg4::Host*> build_platform(sg4::Engine& engine, const PlatformTables& platform)
{
  auto* zone = new RouteTable("hcsim:routes");  // owned by its parent zone, as SimGrid's own zones are
  zone->set_parent(engine.get_netzone_root()->get_impl());
  sg4::NetZone* face = zone->get_iface();

  std::vector<StandardLinkImpl*> directions;  // 2 x link: UP, then DOWN
  directions.reserve(2 * platform.link_names.size());
  for (std::size_t i = 0; i < platform.link_names.size(); ++i) {
    // SPLITDUPLEX, as the XML compiler writes it: each direction has the full bandwidth
    sg4::SplitDuplexLink* link = face->add_split_duplex_link(platform.link_names[i], platform.link_bandwidth[i]);
    link->set_latency(platform.link_latency[i])->seal();
    directions.push_back(link->get_link_up()->get_impl());
    directions.push_back(link->get_link_down()->get_impl());
  }
  std::unordered_map<std::string, sg4::Host*> hosts;
  std::vector<sg4::Host*> numbered;
  numbered.reserve(platform.host_names.size());
  for (std::size_t i = 0; i < platform.host_names.size(); ++i) {
    sg4::Host* host = face->add_host(platform.host_names[i], platform.host_speed[i]);
    hosts.emplace(platform.host_names[i], host);
    numbered.push_back(host);
  }
  std::vector<StandardLinkImpl*> links;  // one route's, reused
  for (std::size_t r = 0; r < platform.routes; ++r) {
    links.clear();
    double latency = 0.0;
    for (std::int64_t k = platform.route_offsets[r]; k < platform.route_offsets[r + 1]; ++k) {
      links.push_back(directions[platform.route_links[k]]);
      latency += platform.link_latency[platform.route_links[k] / 2];
    }
    zone->add(numbered[platform.route_src[r]]->get_netpoint(), numbered[platform.route_dst[r]]->get_netpoint(),
              links, latency);
  }
  zone->index();
  return hosts;
}

}  // namespace hcsim::core
