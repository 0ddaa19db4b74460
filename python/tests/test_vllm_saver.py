"""kvtier.vllm's save thread (kvtier._vllm_saver.Saver, no vLLM needed): a
bounded queue that drops rather than blocks, and a wait for the saves of given
requests only (what a step waits for before reusing their freed blocks)."""

import threading
import time

from kvtier._vllm_saver import Saver


def test_saves_past_the_bound_are_refused_not_waited_for():
    gate = threading.Event()
    s = Saver(limit=2)
    try:
        assert s.put(gate.wait, "a")  # Running: the queue is empty again.
        time.sleep(0.05)
        assert s.put(lambda: None, "b") and s.put(lambda: None, "c")
        started = time.monotonic()
        assert not s.put(lambda: None, "d")  # Full: refused at once.
        assert time.monotonic() - started < 0.05
        assert s.put(lambda: None, None, always=True)  # Small work that must not be lost goes in anyway.
        assert s.busy(["b"]) and not s.busy(["d"])
    finally:
        gate.set()
        s.drain()
        s.close()


def test_a_step_waits_for_the_freed_requests_saves_only():
    slow, gate = threading.Event(), threading.Event()
    done = []
    s = Saver()
    try:
        s.put(lambda: (done.append("x"), slow.set()), "x")
        s.put(gate.wait, "y")  # A long save of a request that is still running.
        slow.wait(5)
        started = time.monotonic()
        s.wait_for({"x"})  # Finished already: no wait behind y.
        assert time.monotonic() - started < 0.1 and done == ["x"]
        waiter = threading.Thread(target=s.wait_for, args=({"y"},))
        waiter.start()
        time.sleep(0.1)
        assert waiter.is_alive()  # y's own save holds it...
        gate.set()
        waiter.join(5)
        assert not waiter.is_alive()  # ...until it is done.
    finally:
        gate.set()
        s.close()


def test_a_save_that_raises_is_logged_and_the_thread_goes_on():
    s = Saver()
    ran = []
    try:
        s.put(lambda: 1 / 0, "a")
        s.put(lambda: ran.append(1), "b")
        s.wait_for({"a", "b"})
        assert ran == [1] and not s.busy({"a", "b"})
    finally:
        s.close()
