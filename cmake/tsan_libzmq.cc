// Linked into the programs that use ZMQ, in ThreadSanitizer builds only
// (kvtier_tsan_libzmq in KvtierOptions.cmake). libzmq is not built with
// ThreadSanitizer: its threads hand messages over through lock-free queues
// whose atomics TSan cannot see, so every message that crosses threads inside
// it (the events helper's sockets and I/O thread, a subscriber's) reads
// as a race. The calls libzmq makes into intercepted functions (malloc, free,
// memcpy, recv) are ignored instead; kvtier's own threads stay checked.
extern "C" const char* __tsan_default_suppressions() { return "called_from_lib:libzmq.so.5\n"; }
