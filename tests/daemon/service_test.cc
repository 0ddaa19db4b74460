// Service: tenant labels (checked and bounded at Hello), paged session
// listings and replies that always fit one frame, driven through
// Service::Handle in this process, without a socket.
#include "service/service.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "log.h"
#include "support/test_names.h"

namespace kvtier::daemon {
namespace {

// A page is built in about a millisecond; sanitizers slow that tenfold.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kPageBoundMs = 1000;
#else
constexpr int kPageBoundMs = 100;
#endif

using Clock = std::chrono::steady_clock;

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kOtherUid = 54321;  // Not kvtierd's user, not root: no admin.

class ServiceTest : public ::testing::Test {
 protected:
  void Start(const std::string& more_yaml = "") {
    const std::string yaml = "instance: " + testing::UniqueShmPrefix("svc") +
                             "\nbackend: host\nlog_level: error\nprofiles:\n  - name: p\n    layers: 1\n"
                             "    kv_heads: 1\n    head_dim: 8\n    block_tokens: 16\n    gpu_blocks: 64\n"
                             "    host_blocks: 64\n" +
                             more_yaml;
    auto config = ParseConfig(yaml, "test.yaml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    SetLogLevel(config->log_level);  // As kvtierd's main does: no line per Hello.
    auto svc = Service::Create(*config);
    ASSERT_TRUE(svc.ok()) << svc.status().ToString();
    svc_ = std::move(svc).value();
  }

  // A connection of an admin (kvtierd's own user) or of another user.
  std::unique_ptr<ClientState> NewClient(bool admin) {
    auto c = std::make_unique<ClientState>();
    c->id = svc_->NextClientId();
    c->peer.uid = admin ? ::geteuid() : kOtherUid;
    c->peer.gid = c->peer.uid;
    return c;
  }

  wire::Message Call(ClientState& c, const wire::Message& request) {
    Reply r = svc_->Handle(c, request);
    EXPECT_FALSE(r.deferred);
    return std::move(r.message);
  }

  // Says Hello as `tenant`; the error, if the Hello was refused.
  Status Hello(ClientState& c, const std::string& tenant) {
    wire::Hello h;
    h.client_name = "service_test";
    h.tenant = tenant;
    const Reply r = svc_->Handle(c, h);
    if (const auto* e = std::get_if<wire::ErrorResponse>(&r.message)) {
      EXPECT_TRUE(r.close) << "a refused Hello closes its connection";
      return wire::ToStatus(*e);
    }
    EXPECT_TRUE(std::holds_alternative<wire::Welcome>(r.message));
    return Status::Ok();
  }

  // A connected client of `tenant`; `admin` as above.
  std::unique_ptr<ClientState> Connected(const std::string& tenant, bool admin = false) {
    auto c = NewClient(admin);
    const Status st = Hello(*c, tenant);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return c;
  }

  // Commits one block (always the same tokens: after the first, a duplicate) as session `id`.
  void CommitSession(ClientState& c, const std::string& id) {
    auto granted = Call(c, wire::AllocateRequest{1});
    const auto* lease = std::get_if<wire::AllocateResponse>(&granted);
    ASSERT_NE(lease, nullptr) << "allocate failed";
    wire::CommitRequest commit;
    commit.lease_id = lease->lease_id;
    commit.session = id;
    commit.tokens.assign(kBlockTokens, 7);
    commit.slots = lease->slots;
    auto committed = Call(c, commit);
    ASSERT_TRUE(std::holds_alternative<wire::CommitResponse>(committed))
        << wire::ToStatus(std::get<wire::ErrorResponse>(committed)).ToString();
    auto released = Call(c, wire::ReleaseRequest{lease->lease_id, std::nullopt});
    ASSERT_TRUE(std::holds_alternative<wire::OkResponse>(released));
  }

  // Every session, page by page of `limit`; fails on a page that does not fit or a repeat.
  std::vector<SessionSummary> AllPages(ClientState& c, const std::string& filter, uint32_t limit, int* pages) {
    std::vector<SessionSummary> all;
    std::set<std::pair<std::string, std::string>> seen;
    wire::ListSessionsRequest req{filter, wire::ListSessionsPage{limit, "", ""}};
    for (*pages = 0; *pages < 10000; ++*pages) {
      auto reply = Call(c, req);
      const auto* page = std::get_if<wire::ListSessionsResponse>(&reply);
      EXPECT_NE(page, nullptr) << wire::ToStatus(std::get<wire::ErrorResponse>(reply)).ToString();
      if (page == nullptr) break;
      EXPECT_LE(*wire::PayloadSize(reply), wire::kMaxPayload);
      if (limit != 0) {
        EXPECT_LE(page->sessions.size(), limit);
      }
      for (const SessionSummary& s : page->sessions) {
        EXPECT_TRUE(seen.insert({s.tenant, s.id}).second) << "listed twice: " << s.tenant << "/" << s.id;
        all.push_back(s);
      }
      if (!page->more) {
        ++*pages;
        break;
      }
      EXPECT_FALSE(page->sessions.empty());
      req.page->after_tenant = all.back().tenant;
      req.page->after_id = all.back().id;
    }
    return all;
  }

  std::vector<std::pair<std::string, double>> Stats(ClientState& c) {
    auto reply = Call(c, wire::StatsRequest{});
    EXPECT_TRUE(std::holds_alternative<wire::StatsResponse>(reply))
        << wire::ToStatus(std::get<wire::ErrorResponse>(reply)).ToString();
    return std::holds_alternative<wire::StatsResponse>(reply) ? std::get<wire::StatsResponse>(reply).values
                                                              : std::vector<std::pair<std::string, double>>{};
  }
  // Rows per tenant in StatsResponse: gpu_blocks, host_blocks, leased_blocks.
  static constexpr size_t kRowsPerTenant = 3;
  // And, for a tenant that loaded or saved anything: read_blocks, read_leases, read_seconds, read_errors, saved_blocks.
  static constexpr size_t kTrafficRows = 5;
  static size_t TenantRows(const std::vector<std::pair<std::string, double>>& stats) {
    size_t n = 0;
    for (const auto& [name, value] : stats) n += name.rfind("tenant.", 0) == 0 ? 1 : 0;
    return n;
  }

  std::unique_ptr<Service> svc_;
};

// On the host backend a worker writes and reads blocks with the CPU: a release
// or commit carrying a GPU event is refused, naming the request, and the lease
// stays the client's (a plain release then ends it).
TEST_F(ServiceTest, AGpuEventOnTheHostBackendIsRefusedAndTheLeaseStays) {
  Start();
  auto c = Connected("a");
  auto granted = Call(*c, wire::AllocateRequest{1});
  const auto* lease = std::get_if<wire::AllocateResponse>(&granted);
  ASSERT_NE(lease, nullptr);
  wire::IpcEventHandle event{};
  event[0] = 1;
  wire::CommitRequest commit;
  commit.lease_id = lease->lease_id;
  commit.session = "s";
  commit.tokens.assign(kBlockTokens, 7);
  commit.slots = lease->slots;
  commit.writer_event = event;
  auto refused = Call(*c, commit);
  ASSERT_TRUE(std::holds_alternative<wire::ErrorResponse>(refused));
  Status st = wire::ToStatus(std::get<wire::ErrorResponse>(refused));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("commit: backend host"), std::string::npos) << st.message();

  auto release = Call(*c, wire::ReleaseRequest{lease->lease_id, event});
  ASSERT_TRUE(std::holds_alternative<wire::ErrorResponse>(release));
  st = wire::ToStatus(std::get<wire::ErrorResponse>(release));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("release: backend host"), std::string::npos) << st.message();
  EXPECT_TRUE(std::holds_alternative<wire::OkResponse>(Call(*c, wire::ReleaseRequest{lease->lease_id, std::nullopt})));
}

// profiles[].models: a profile that lists model identities welcomes only
// clients that give one of them; each model chains its keys in a namespace of
// its own (the Welcome's), so two models of the tenant never share a block.
TEST_F(ServiceTest, AProfileAcceptsOnlyItsModelsAndEachIsKeyedApart) {
  const ModelId a{BlockKey{1, 0xa}}, b{BlockKey{2, 0xb}};
  Start("    models: [\"" + a.ToHex() + "\", \"" + b.ToHex() + "\"]\n");
  auto hello = [&](const ModelId& model, wire::Welcome* welcome) {
    auto c = NewClient(false);
    wire::Hello h;
    h.client_name = "service_test";
    h.model = model;
    const Reply r = svc_->Handle(*c, h);
    if (const auto* e = std::get_if<wire::ErrorResponse>(&r.message)) return wire::ToStatus(*e);
    if (welcome != nullptr) *welcome = std::get<wire::Welcome>(r.message);
    return Status::Ok();
  };
  const Status none = hello(ModelId{}, nullptr);
  EXPECT_EQ(none.code(), StatusCode::kPermissionDenied) << none.ToString();
  EXPECT_NE(none.message().find("gave no model identity"), std::string::npos) << none.message();
  EXPECT_NE(none.message().find(a.ToHex()), std::string::npos) << none.message();
  const ModelId stranger{BlockKey{3, 0xc}};
  const Status other = hello(stranger, nullptr);
  EXPECT_EQ(other.code(), StatusCode::kPermissionDenied) << other.ToString();
  EXPECT_NE(other.message().find("runs " + stranger.ToHex()), std::string::npos) << other.message();
  wire::Welcome wa, wb, wa2;
  ASSERT_TRUE(hello(a, &wa).ok());
  ASSERT_TRUE(hello(b, &wb).ok());
  ASSERT_TRUE(hello(a, &wa2).ok());
  EXPECT_NE(wa.ns, wb.ns) << "two models, two key namespaces";
  EXPECT_EQ(wa.ns, wa2.ns);
}

TEST_F(ServiceTest, ATenantLabelIsShortAndPrintable) {
  Start();
  for (const std::string& bad :
       {std::string(4096, 'x'), std::string(65, 'a'), std::string("a b"), std::string("a/b"), std::string("t\n"),
        std::string("t\x1b[31m"), std::string("t\0u", 3), std::string("t{x=\"1\"}")}) {
    auto c = NewClient(false);
    const Status st = Hello(*c, bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("[A-Za-z0-9._-]"), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find(bad), std::string::npos) << "the label is not echoed: " << st.message();
  }
  for (const std::string& good : {std::string(64, 'a'), std::string("Tenant-1.b_2"), std::string()}) {
    auto c = NewClient(false);
    EXPECT_TRUE(Hello(*c, good).ok()) << good;
  }
}

TEST_F(ServiceTest, LabelsAreBoundedAndAnIdleOneMakesRoom) {
  Start("limits:\n  max_tenants: 4\n");
  std::vector<std::unique_ptr<ClientState>> held;
  for (int i = 0; i < 4; ++i) held.push_back(Connected("t" + std::to_string(i)));
  CommitSession(*held[0], "chat");  // t0 will hold a session with no client.
  auto fifth = NewClient(false);
  const Status refused = Hello(*fifth, "t4");
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("limits.max_tenants"), std::string::npos) << refused.message();
  auto again = Connected("t1");  // A known label is no new one.
  svc_->Disconnect(*again);
  // t0 has no client now but a session: not forgotten. t1 has neither: forgotten for t4.
  svc_->Disconnect(*held[0]);
  svc_->Disconnect(*held[1]);
  auto t4 = NewClient(false);
  ASSERT_TRUE(Hello(*t4, "t4").ok());
  auto t5 = NewClient(false);
  EXPECT_EQ(Hello(*t5, "t5").code(), StatusCode::kResourceExhausted) << "t0 keeps its place while it holds a session";
  auto admin = Connected("t2", /*admin=*/true);
  const auto stats = Stats(*admin);
  std::set<std::string> tenants;
  for (const auto& [name, value] : stats) {
    if (name.rfind("tenant.", 0) == 0) tenants.insert(name.substr(7, name.rfind('.') - 7));
  }
  EXPECT_EQ(tenants, (std::set<std::string>{"t0", "t2", "t3", "t4"}));
}

// The attack of the issue, in process: 3,000 Hellos with distinct labels,
// 4 KiB ones (refused) and 64-byte ones (each forgotten once its client goes).
TEST_F(ServiceTest, ThousandsOfDistinctLabelsLeaveTheStatsBounded) {
  Start("limits:\n  max_tenants: 64\n");
  for (int i = 0; i < 3000; ++i) {
    auto c = NewClient(false);
    const std::string label = std::string(i % 2 == 0 ? 4090 : 60, 'a' + i % 26) + std::to_string(i);
    const Status st = Hello(*c, label);
    if (i % 2 == 0) {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    } else {
      ASSERT_TRUE(st.ok()) << i << ": " << st.ToString();
      svc_->Disconnect(*c);
    }
  }
  auto admin = Connected("", /*admin=*/true);
  const auto stats = Stats(*admin);
  EXPECT_LE(TenantRows(stats), 64u * kRowsPerTenant) << "the rows of at most max_tenants labels";
}

// At the most tenants a daemon may know, each with the longest name, an
// admin's stats still fit one frame (kMaxTenants is chosen for that).
TEST_F(ServiceTest, StatsOfTheMostTenantsFitOneFrame) {
  Start("limits:\n  max_clients: 20000\n  max_tenants: " + std::to_string(kMaxTenants) + "\n");
  std::vector<std::unique_ptr<ClientState>> held;
  for (uint32_t i = 0; i < kMaxTenants; ++i) {
    std::string name = std::to_string(i);
    name.insert(0, kMaxTenantName - name.size(), 'n');
    held.push_back(Connected(name));
  }
  auto refused = NewClient(false);
  EXPECT_EQ(Hello(*refused, "one-more").code(), StatusCode::kResourceExhausted);
  auto admin = Connected(std::string(kMaxTenantName - 1, 'n') + "1", /*admin=*/true);
  auto reply = Call(*admin, wire::StatsRequest{});
  ASSERT_TRUE(std::holds_alternative<wire::StatsResponse>(reply));
  EXPECT_EQ(TenantRows(std::get<wire::StatsResponse>(reply).values), size_t{kMaxTenants} * kRowsPerTenant);
  const auto bytes = wire::PayloadSize(reply);
  ASSERT_TRUE(bytes.ok());
  EXPECT_LT(*bytes, wire::kMaxPayload / 3) << "well inside one frame";
  // A client that is not an admin sees its own tenant's rows only.
  EXPECT_EQ(TenantRows(Stats(*held[0])), kRowsPerTenant);

  // Every tenant with traffic (here a refused Acquire each: a read error): its
  // traffic rows too, and the reply still fits one frame.
  wire::AcquireRequest bad;
  bad.session = "s";
  bad.keys = {BlockKey{1, 2}};
  bad.tokens = {1};  // Not one block of tokens per key.
  for (auto& c : held) ASSERT_TRUE(std::holds_alternative<wire::ErrorResponse>(Call(*c, bad)));
  reply = Call(*admin, wire::StatsRequest{});
  ASSERT_TRUE(std::holds_alternative<wire::StatsResponse>(reply));
  EXPECT_EQ(TenantRows(std::get<wire::StatsResponse>(reply).values),
            size_t{kMaxTenants} * (kRowsPerTenant + kTrafficRows));
  const auto with_traffic = wire::PayloadSize(reply);
  ASSERT_TRUE(with_traffic.ok());
  EXPECT_LT(*with_traffic, wire::kMaxPayload) << "one frame";
  auto stat = [&](const std::string& name) {
    for (const auto& [k, v] : Stats(*held[0])) {
      if (k == name) return v;
    }
    return -1.0;
  };
  EXPECT_EQ(stat("tenant." + std::string(kMaxTenantName - 1, 'n') + "0.read_errors"), 1);
}

// One tenant holding every max_clients slot locked the others out. With
// tenants: configured, each may connect max_clients / (tenants + 1) clients by
// default (here 6 / 3 = 2); limits.max_clients_per_tenant sets it.
TEST_F(ServiceTest, NoTenantTakesEveryConnection) {
  std::vector<std::unique_ptr<ClientState>> held;
  // A Hello as `tenant` (an admin may name any tenant); its status. Kept connected if welcomed.
  auto hello = [&](const std::string& tenant) {
    auto c = NewClient(/*admin=*/true);
    const Status st = Hello(*c, tenant);
    held.push_back(std::move(c));
    return st;
  };
  Start("limits:\n  max_clients: 6\ntenants:\n  - name: a\n  - name: b\n");
  EXPECT_TRUE(hello("a").ok());
  EXPECT_TRUE(hello("a").ok());
  const Status refused = hello("a");
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("max_clients_per_tenant"), std::string::npos) << refused.message();
  EXPECT_TRUE(hello("b").ok());
  EXPECT_TRUE(hello("b").ok());
  EXPECT_TRUE(hello("default").ok());
  svc_->Disconnect(*held[0]);  // One of a's: a slot of its own comes back.
  EXPECT_TRUE(hello("a").ok());

  held.clear();
  Start("limits:\n  max_clients: 6\n  max_clients_per_tenant: 5\ntenants:\n  - name: a\n");
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(hello("a").ok()) << i;
  EXPECT_EQ(hello("a").code(), StatusCode::kResourceExhausted);
  // Without tenants: (labels anyone may pick) there is no cap of its own.
  held.clear();
  Start("limits:\n  max_clients: 6\n");
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(hello("x").ok()) << i;
}

TEST_F(ServiceTest, ListSessionsPagesWhereOneReplyCannotHoldThem) {
  Start();
  auto a = Connected("a"), b = Connected("b");
  // 4,100 sessions of 4 KiB ids: about 17 MB of rows, more than one frame.
  const std::string long_id(4088, 'x');
  for (int i = 0; i < 4100; ++i) CommitSession(*a, long_id + std::to_string(i));
  for (int i = 0; i < 10; ++i) CommitSession(*b, "b" + std::to_string(i));
  auto admin = Connected("", /*admin=*/true);

  // The older, unpaged request: every session or a clear error, never a cut list.
  auto whole = Call(*admin, wire::ListSessionsRequest{"", std::nullopt});
  const auto* err = std::get_if<wire::ErrorResponse>(&whole);
  ASSERT_NE(err, nullptr) << "the unpaged list does not fit one frame";
  EXPECT_EQ(err->code, StatusCode::kResourceExhausted);
  EXPECT_NE(err->message.find("page by page"), std::string::npos) << err->message;
  auto small = Call(*b, wire::ListSessionsRequest{"", std::nullopt});
  ASSERT_TRUE(std::holds_alternative<wire::ListSessionsResponse>(small)) << "a tenant's own list still fits";
  EXPECT_EQ(std::get<wire::ListSessionsResponse>(small).sessions.size(), 10u);
  EXPECT_FALSE(std::get<wire::ListSessionsResponse>(small).more) << "never set for an older client";

  int pages = 0;
  const auto t0 = Clock::now();
  const auto all = AllPages(*admin, "", 0, &pages);
  const auto took = Clock::now() - t0;
  EXPECT_EQ(all.size(), 4110u);
  EXPECT_GE(pages, 5) << "4 MiB pages";
  EXPECT_LT(took / pages, std::chrono::milliseconds(kPageBoundMs)) << "per page";
  EXPECT_EQ(AllPages(*admin, "b", 3, &pages).size(), 10u);
  EXPECT_EQ(pages, 4);
  // A client that is not an admin pages through its own tenant only.
  const auto mine = AllPages(*b, "", 4, &pages);
  EXPECT_EQ(mine.size(), 10u);
  for (const SessionSummary& s : mine) EXPECT_EQ(s.tenant, "b");
  auto denied = Call(*b, wire::ListSessionsRequest{"a", wire::ListSessionsPage{}});
  ASSERT_TRUE(std::holds_alternative<wire::ErrorResponse>(denied));
  EXPECT_EQ(std::get<wire::ErrorResponse>(denied).code, StatusCode::kPermissionDenied);

  // Evicting one tenant's sessions leaves the other's.
  auto evicted = Call(*admin, wire::EvictRequest{"", "b", false});
  ASSERT_TRUE(std::holds_alternative<wire::CountResponse>(evicted));
  EXPECT_EQ(std::get<wire::CountResponse>(evicted).count, 10u);
  EXPECT_EQ(AllPages(*admin, "a", 0, &pages).size(), 4100u);
}

// tenants: isolated: true gives a tenant an engine of its own: its clients are
// handed that engine's segments (pools sized by its quotas, an index of its
// own), never the shared ones, and the daemon's figures, listings and
// evictions span every engine of the profile.
TEST_F(ServiceTest, AnIsolatedTenantIsWelcomedIntoPoolsAndAnIndexOfItsOwn) {
  Start(
      "tenants:\n"
      "  - name: a\n    isolated: true\n    gpu_blocks: 16\n    host_blocks: 8\n"
      "  - name: b\n    isolated: true\n    gpu_blocks: 8\n    host_blocks: 4\n"
      "  - name: c\n    gpu_blocks: 4\n");
  struct Welcomed {
    std::unique_ptr<ClientState> client;
    wire::Welcome welcome;
    std::vector<int> fds;
  };
  auto welcome = [&](const std::string& tenant) {
    Welcomed w{NewClient(/*admin=*/true), {}, {}};  // An admin may ask for any tenant.
    wire::Hello h;
    h.client_name = "service_test";
    h.tenant = tenant;
    Reply r = svc_->Handle(*w.client, h);
    EXPECT_TRUE(std::holds_alternative<wire::Welcome>(r.message)) << tenant;
    if (auto* m = std::get_if<wire::Welcome>(&r.message)) w.welcome = *m;
    w.fds = r.fds;
    return w;
  };
  Welcomed a1 = welcome("a"), a2 = welcome("a"), b = welcome("b"), c = welcome("c"), d = welcome("default");
  ASSERT_EQ(a1.fds.size(), 4u) << "gpu pool, host pool, index, fences";
  auto slots = [](const Welcomed& w, Tier t) { return w.welcome.pools[static_cast<size_t>(t)].slots; };
  EXPECT_EQ(slots(a1, Tier::kGpu), 16u);
  EXPECT_EQ(slots(a1, Tier::kHost), 8u);
  EXPECT_EQ(slots(b, Tier::kGpu), 8u);
  EXPECT_EQ(slots(b, Tier::kHost), 4u);
  EXPECT_EQ(slots(c, Tier::kGpu), 64u - 16 - 8) << "the shared pools are what the isolated ones leave";
  EXPECT_EQ(slots(c, Tier::kHost), 64u - 8 - 4);
  EXPECT_EQ(a1.fds, a2.fds) << "one tenant, one engine";
  EXPECT_EQ(c.fds, d.fds) << "the tenants that are not isolated share one engine";
  for (size_t i = 0; i < 3; ++i) {  // Pools and index; the fences are the backend's, one for all.
    EXPECT_NE(a1.fds[i], b.fds[i]) << i;
    EXPECT_NE(a1.fds[i], c.fds[i]) << i;
    EXPECT_NE(b.fds[i], c.fds[i]) << i;
  }
  EXPECT_EQ(a1.fds[3], c.fds[3]);
  EXPECT_NE(a1.welcome.index_segment, c.welcome.index_segment);
  EXPECT_NE(a1.welcome.pools[0].shm_name, b.welcome.pools[0].shm_name);

  // Each commits: the same tokens and session id, three engines.
  for (Welcomed* w : {&a1, &b, &c}) {
    CommitSession(*w->client, "chat");
    CommitSession(*w->client, "chat2");
  }
  auto stat = [&](const std::string& name) {
    for (const auto& [k, v] : Stats(*a1.client)) {
      if (k == name) return v;
    }
    return -1.0;
  };
  EXPECT_EQ(stat("gpu_slots"), 64) << "a profile's figures add up its engines";
  EXPECT_EQ(stat("blocks"), 3) << "one block per engine";
  EXPECT_EQ(stat("sessions"), 6);
  EXPECT_EQ(stat("tenant.a.gpu_blocks"), 1) << "read from a's own engine";
  EXPECT_EQ(stat("tenant.b.gpu_blocks"), 1);
  EXPECT_EQ(stat("tenant.c.gpu_blocks"), 1);
  EXPECT_EQ(stat("tenant.a.gpu_quota"), 16);
  EXPECT_EQ(stat("gpu_commits_without_writer_event"), 0) << "host-backend commits have no GPU writes to order";

  // An admin's listing pages through every engine, each session once.
  int pages = 0;
  const auto all = AllPages(*a1.client, "", 1, &pages);
  EXPECT_EQ(all.size(), 6u);
  EXPECT_EQ(pages, 6);
  std::set<std::string> tenants;
  for (const SessionSummary& s : all) tenants.insert(s.tenant);
  EXPECT_EQ(tenants, (std::set<std::string>{"a", "b", "c"}));
  EXPECT_EQ(AllPages(*a1.client, "", 4, &pages).size(), 6u);
  EXPECT_EQ(AllPages(*a1.client, "b", 0, &pages).size(), 2u);
  auto whole = Call(*a1.client, wire::ListSessionsRequest{"", std::nullopt});
  ASSERT_TRUE(std::holds_alternative<wire::ListSessionsResponse>(whole));
  EXPECT_EQ(std::get<wire::ListSessionsResponse>(whole).sessions.size(), 6u) << "an unpaged listing spans them too";

  // A tenant's eviction reaches its own engine; evict --all every engine.
  auto one = Call(*a1.client, wire::EvictRequest{"chat", "b", false});
  ASSERT_TRUE(std::holds_alternative<wire::CountResponse>(one));
  auto tenant = Call(*a1.client, wire::EvictRequest{"", "a", false});
  ASSERT_TRUE(std::holds_alternative<wire::CountResponse>(tenant));
  EXPECT_EQ(std::get<wire::CountResponse>(tenant).count, 2u);
  auto rest = Call(*a1.client, wire::EvictRequest{"", "", true});
  ASSERT_TRUE(std::holds_alternative<wire::CountResponse>(rest));
  EXPECT_EQ(std::get<wire::CountResponse>(rest).count, 3u) << "b's other session and c's two";
  EXPECT_EQ(stat("sessions"), 0);
}

}  // namespace
}  // namespace kvtier::daemon
