// kvtier-consumer [SOCKET]: the smallest worker. Without a socket it prints the
// package version and a block key (proto code, linked through kvtier::client);
// with one it connects to that kvtierd, maps its segments, and pings it.
#include <chrono>
#include <cstdio>

#include <kvtier/client.h>

int main(int argc, char** argv) {
  std::printf("kvtier %s (protocol %u)\n", KVTIER_PACKAGE_VERSION, kvtier::ProtocolVersion());
  if (argc < 2) {
    const kvtier::TokenId tokens[] = {1, 2, 3, 4};
    const auto ns = kvtier::Namespace::Make(0, "consumer");
    std::printf("block key %s\n", kvtier::ChainKey({}, ns, tokens).ToHex().c_str());
    return 0;
  }
  // The daemon may still be starting: Connect retries until connect_timeout.
  auto client = kvtier::Client::Connect(
      {.socket_path = argv[1], .client_name = "kvtier-consumer", .connect_timeout = std::chrono::seconds(10)});
  if (!client.ok()) {
    std::fprintf(stderr, "kvtier-consumer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto rtt = (*client)->Ping();
  if (!rtt.ok()) {
    std::fprintf(stderr, "kvtier-consumer: ping: %s\n", rtt.status().ToString().c_str());
    return 1;
  }
  const kvtier::ModelProfile p = (*client)->profile();
  std::printf("connected: backend %s, profile %s (%zu bytes/block), ping %.1f us\n", (*client)->backend().c_str(),
              p.name.c_str(), p.BlockBytes(),
              std::chrono::duration<double, std::micro>(*rtt).count());
  return 0;
}
