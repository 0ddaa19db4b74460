// cachectl [--socket PATH] [--json] [--timeout MS] COMMAND ...
#include <cstdio>
#include <functional>

#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  using namespace kvtier::cachectl;
  GlobalOptions global;
  CLI::App app{"cachectl: inspect and control a running kvtierd", "cachectl"};
  app.require_subcommand(1);
  app.fallthrough();  // Global options may also follow the command.
  app.add_option("--socket", global.socket, "kvtierd's Unix socket")
      ->envname("KVTIER_SOCKET")
      ->capture_default_str();
  app.add_option("--server-uid", global.server_uid,
                 "The uid kvtierd runs as; refuse any other (default: $KVTIER_SERVER_UID, else the socket's owner "
                 "where only its owner may write the directory)");
  app.add_flag("--json", global.json, "Print one JSON document (per line with stats --watch)");
  app.add_option("--timeout", global.timeout_ms, "Connect timeout in milliseconds")
      ->check(CLI::Range(1, 3600 * 1000))
      ->capture_default_str();

  std::function<int()> action;
  AddCommands(app, global, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // Prints help (rc 0) or the parse error.
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (!action) {
    std::fprintf(stderr, "cachectl: no command given (see --help)\n");
    return kExitUsage;
  }
  return action();
}
