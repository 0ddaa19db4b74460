// kvtier._native: Client, a connection to kvtierd: keys, probe, acquire,
// allocate and commit, session control, stats.
#include <algorithm>

#include "bindings.h"

namespace kvtier::python {

void BindClient(py::module_& m) {
  py::class_<PyClient>(m, "Client", "A connection to kvtierd")
      .def(py::init([](const std::string& socket, const std::string& tenant, const std::string& profile,
                       const py::object& model_id, const std::string& client_name, double connect_timeout,
                       double request_timeout, bool open_gpu, bool prefault_pools) {
             ClientOptions o;
             o.socket_path = socket;
             o.tenant = tenant;
             o.profile = profile;
             o.model = ModelFrom(model_id);
             o.client_name = client_name.empty() ? "python" : client_name;
             o.connect_timeout = Ms(connect_timeout);
             o.request_timeout = Ms(request_timeout);
             o.open_gpu = open_gpu;
             o.prefault_pools = prefault_pools;
             auto c = Unlocked([&] { return Client::Connect(o); });
             return std::make_unique<PyClient>(PyClient{Take(std::move(c))});
           }),
           py::arg("socket") = "/run/kvtier/kvtierd.sock", py::arg("tenant") = "", py::arg("profile") = "",
           py::arg("model_id") = py::none(), py::arg("client_name") = "", py::arg("connect_timeout") = 2.0,
           py::arg("request_timeout") = 10.0, py::arg("open_gpu") = true, py::arg("prefault_pools") = false)
      .def_property_readonly("profile", [](const PyClient& c) { return ProfileDict(c.client->profile()); })
      .def_property_readonly("block_tokens", [](const PyClient& c) { return c.client->block_tokens(); })
      .def_property_readonly("backend", [](const PyClient& c) { return c.client->backend(); })
      .def_property_readonly("client_id", [](const PyClient& c) { return c.client->client_id(); })
      .def_property_readonly("instance_id", [](const PyClient& c) { return c.client->instance_id(); })
      .def_property_readonly(
          "stores_below", [](const PyClient& c) { return c.client->StoresBelow(); },
          "True when kvtierd has stores below its host tier (disk, Redis): a probe miss may be a locate() hit")
      .def_property_readonly("model_id",
                             [](const PyClient& c) -> py::object {
                               const ModelId& id = c.client->options().model;
                               return id.IsNull() ? py::object(py::none()) : py::object(py::str(id.ToHex()));
                             })
      .def(
          "keys",
          [](const PyClient& c, const std::vector<int64_t>& tokens, const std::optional<std::string>& parent) {
            std::vector<std::string> out;
            for (const BlockKey& k : c.client->Keys(Tokens(tokens), KeyFromHex(parent))) out.push_back(k.ToHex());
            return out;
          },
          py::arg("tokens"), py::arg("parent") = py::none(), "Keys (32 hex digits) of the full blocks of tokens")
      .def(
          "probe",
          [](const PyClient& c, const std::vector<int64_t>& tokens) { return c.client->Probe(Tokens(tokens)); },
          py::arg("tokens"), "Blocks of tokens cached now (reads the shared index; no round trip)")
      .def(
          "acquire",
          [](PyClient& c, const std::vector<int64_t>& tokens, const std::string& session, const py::object& promote) {
            const std::vector<TokenId> t = Tokens(tokens);
            const Promote how = PromoteFrom(promote);
            auto r = Unlocked([&] { return c.client->Acquire(session, t, how); });
            return std::make_unique<PyLease>(
                PyLease{Take(std::move(r)), c.client->profile(), c.client->backend() == "cuda"});
          },
          py::arg("tokens"), py::arg("session") = "", py::arg("promote") = true,
          "Leases the longest cached prefix of tokens' full blocks. promote: True (copy host-tier hits to "
          "the GPU tier now; wait() before reading them), False (read them where they lie), or 'after_read' "
          "(read them where they lie now; kvtierd promotes them once the lease is released)")
      .def(
          "locate",
          [](PyClient& c, const std::vector<int64_t>& tokens) {
            const std::vector<TokenId> t = Tokens(tokens);
            return Take(Unlocked([&] { return c.client->Locate(t); }));
          },
          py::arg("tokens"),
          "Blocks of tokens' full blocks cached once kvtierd has brought into its host tier what only its "
          "stores below (disk, Redis) hold; leases nothing, so probe() finds them afterwards. One round trip, "
          "waiting for the stores up to kvtierd's stores.fetch_budget_ms")
      .def(
          "allocate",
          [](PyClient& c, uint32_t blocks) {
            auto r = Unlocked([&] { return c.client->Allocate(blocks); });
            return std::make_unique<PyWriteLease>(PyWriteLease{Take(std::move(r)), c.client->profile()});
          },
          py::arg("blocks"))
      .def(
          "commit",
          [](PyClient& c, PyWriteLease& lease, const std::string& session, const std::vector<int64_t>& tokens,
             uint32_t start_block, const std::optional<std::string>& parent, const std::vector<uint32_t>& slots) {
            const std::vector<TokenId> t = Tokens(tokens);
            const BlockKey p = KeyFromHex(parent);
            auto r = Unlocked([&] { return c.client->Commit(lease.lease, session, p, start_block, t, slots); });
            const CommitResult done = Take(std::move(r));
            return py::make_tuple(done.stored, done.duplicates);
          },
          py::arg("lease"), py::arg("session"), py::arg("tokens"), py::arg("start_block") = 0,
          py::arg("parent") = py::none(), py::arg("slots") = std::vector<uint32_t>{},
          "Publishes the blocks written into the lease's slots; returns (stored, duplicates)")
      .def(
          "save",
          [](PyClient& c, PyWriteLease& lease, const std::string& session, const std::vector<int64_t>& tokens,
             uint32_t start_block, const std::optional<std::string>& parent, bool adopt, uint32_t refill,
             const std::vector<uint32_t>& slots) {
            const std::vector<TokenId> t = Tokens(tokens);
            const BlockKey p = KeyFromHex(parent);
            const SaveOptions options{.adopt = adopt, .refill = refill};
            auto r = Unlocked([&] { return c.client->Save(lease.lease, session, p, start_block, t, options, slots); });
            const SaveResult done = Take(std::move(r));
            return py::make_tuple(done.stored, done.duplicates, done.adopted, done.last.ToHex());
          },
          py::arg("lease"), py::arg("session"), py::arg("tokens"), py::arg("start_block") = 0,
          py::arg("parent") = py::none(), py::arg("adopt") = false, py::arg("refill") = 0,
          py::arg("slots") = std::vector<uint32_t>{},
          "A commit in one round trip whose cost does not grow with the prefix: adopt takes the cached chain "
          "ending at parent as the session's first start_block blocks; the lease comes back (a new id) with up "
          "to refill slots. Returns (stored, duplicates, adopted, the last block's key)")
      .def(
          "demote",
          [](PyClient& c, const std::string& session) {
            auto r = Unlocked([&] { return c.client->Demote(session); });
            return Take(std::move(r));
          },
          py::arg("session"))
      .def(
          "prefetch",
          [](PyClient& c, const std::string& session) {
            auto r = Unlocked([&] { return c.client->Prefetch(session); });
            return Take(std::move(r));
          },
          py::arg("session"))
      .def(
          "end_session",
          [](PyClient& c, const std::string& session) {
            auto r = Unlocked([&] { return c.client->EndSession(session); });
            return Take(std::move(r));
          },
          py::arg("session"))
      .def(
          "evict",
          [](PyClient& c, const std::string& session, const std::string& tenant) {
            auto r = Unlocked([&] { return c.client->Evict(session, tenant); });
            return Take(std::move(r));
          },
          py::arg("session"), py::arg("tenant") = "")
      .def(
          "set_priority",
          [](PyClient& c, const std::string& session, int priority, double ttl) {
            Check(Unlocked([&] { return c.client->SetPriority(session, priority, Ms(ttl)); }));
          },
          py::arg("session"), py::arg("priority"), py::arg("ttl") = 0.0)
      .def(
          "sessions",
          [](PyClient& c, const std::string& tenant) {
            auto r = Unlocked([&] { return c.client->ListSessions(tenant); });
            py::list out;
            for (const SessionSummary& s : Take(std::move(r))) out.append(SummaryDict(s));
            return out;
          },
          py::arg("tenant") = "")
      .def(
          "session",
          [](PyClient& c, const std::string& id) {
            auto r = Unlocked([&] { return c.client->GetSession(id); });
            const SessionInfo info = Take(std::move(r));
            py::dict d = SummaryDict(info.summary);
            // Past the session's own blocks: those dropped into the stores, named as kvtierd names them.
            py::list chain;
            for (size_t i = 0; i < info.chain.size(); ++i) {
              const uint8_t t = i < info.tiers.size() ? info.tiers[i] : kPlaceUnknown;
              chain.append(py::make_tuple(info.chain[i].ToHex(), PlaceName(t, info.stores)));
            }
            d["chain"] = chain;
            d["dropped_blocks"] = info.chain.size() - std::min<size_t>(info.chain.size(), info.summary.blocks);
            return d;
          },
          py::arg("id"))
      .def("stats",
           [](PyClient& c) {
             auto r = Unlocked([&] { return c.client->Stats(); });
             py::dict out;
             for (const auto& [k, v] : Take(std::move(r))) out[py::str(k)] = v;
             return out;
           })
      .def("ping", [](PyClient& c) {
        auto r = Unlocked([&] { return c.client->Ping(); });
        return std::chrono::duration<double>(Take(std::move(r))).count();
      });
}

}  // namespace kvtier::python
