// One message of every wire type, with non-trivial field values, for the wire
// tests and the fuzz corpus writer.
#pragma once

#include <vector>

#include "kvtier/wire.h"

namespace kvtier::wire::testing {

// Exactly one message per MessageType.
std::vector<Message> SampleMessages();

}  // namespace kvtier::wire::testing
