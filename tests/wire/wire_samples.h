// One message of every wire type, with non-trivial field values, for the wire
// tests and the fuzz corpus writer.
#pragma once

#include <vector>

#include "kvtier/wire.h"

namespace kvtier::wire::testing {

// Exactly one message per MessageType.
std::vector<Message> SampleMessages();

// `m` with every extension field (wire.h) at its default: the message an older
// peer would send, and what a frame cut right before the extension decodes to.
Message WithoutExtensions(const Message& m);

}  // namespace kvtier::wire::testing
