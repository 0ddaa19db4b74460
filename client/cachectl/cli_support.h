// What cachectl's commands share: exit codes from statuses, connecting, JSON
// output, and the human formats of numbers, durations, sizes and latencies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "kvtier/client.h"

namespace kvtier::cachectl {

using nlohmann::json;
using StatMap = std::vector<std::pair<std::string, double>>;

// The exit code for a status: 4 not found, 3 unavailable, 5 permission, else 1.
int ExitCodeFor(StatusCode code);
// Prints "cachectl: <what>: <message>" and returns `rc` (ExitCodeFor(st) without it).
int Fail(const std::string& what, const Status& st, int rc);
int Fail(const std::string& what, const Status& st);
// Connects as "cachectl", once, within --timeout. On failure prints the error
// and sets *rc (3 when no daemon answers).
std::unique_ptr<Client> ConnectOrFail(const GlobalOptions& g, int* rc);

void PrintJson(const json& j);
// A whole number as a JSON integer, else a float.
json Number(double v);
json NumberOrNull(double v);  // NaN: null.
std::string FormatNumber(double v);
// "850ms", "12.3s", "4m05s", "2h10m", "3d04h".
std::string FormatDuration(double seconds);
// "512 B", "1.5 KiB", "3.2 GiB".
std::string FormatBytes(double bytes);
// Latencies: "850ns", "12us", "3.4ms", "1.20s".
std::string FormatLatency(double seconds);
// A stat's value (0 when absent).
double StatValue(const StatMap& stats, const std::string& name);
std::string InstanceHex(uint64_t id);

}  // namespace kvtier::cachectl
