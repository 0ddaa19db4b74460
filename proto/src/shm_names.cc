#include "kvtier/shm_names.h"

namespace kvtier::shm_names {

std::string Segment(std::string_view instance, std::string_view object);

namespace {

std::string Join(std::string_view instance, std::string_view profile, std::string_view what) {
  return Segment(instance, std::string(profile) + "." + std::string(what));
}

}  // namespace

std::string Segment(std::string_view instance, std::string_view object) {
  std::string out = "/";
  out.append(instance).append(".").append(object);
  return out;
}
std::string PoolObject(std::string_view profile, Tier tier) { return std::string(profile) + "." + TierName(tier); }

std::string Domain(std::string_view profile, std::string_view isolated_tenant) {
  std::string out(profile);
  if (!isolated_tenant.empty()) out.append(".").append(isolated_tenant);
  return out;
}

std::string Fences(std::string_view instance) { return Segment(instance, "fences"); }
std::string Pool(std::string_view instance, std::string_view profile, Tier tier) {
  return Segment(instance, PoolObject(profile, tier));
}
std::string Index(std::string_view instance, std::string_view profile) { return Join(instance, profile, "index"); }
std::string WarmManifest(std::string_view instance, std::string_view profile) {
  return Join(instance, profile, "warm");
}
std::string Staging(std::string_view segment) { return std::string(segment) + ".tmp"; }
std::string ShmPath(std::string_view segment) { return std::string(kShmDir) + std::string(segment); }
std::string InstanceLock(std::string_view instance) { return ShmPath("/" + std::string(instance) + ".lock"); }
std::string SocketLock(std::string_view socket_path) { return std::string(socket_path) + ".lock"; }

}  // namespace kvtier::shm_names
