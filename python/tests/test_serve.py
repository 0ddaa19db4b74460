"""kvtier.serve with the official openai client: a real service process on a
small seeded model (scripts/make_tiny_model.py, no download) over a real
kvtierd, against a service running without kvtier."""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import stop_process, until

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model") / "tiny-chat"
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tiny_model.py"), str(d)], check=True,
                   capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return str(d)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, model_dir, tmp_path, name, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"serve-{name}.log"
        self._log = open(self.log, "w")  # noqa: SIM115 - the service's output, closed by stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "kvtier.serve", "--model", model_dir, "--port",
                                      str(self.port), "--threads", "1", "--log-level", "warning", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvtier.serve exited:\n" + self.log.read_text())
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError("kvtier.serve did not start:\n" + self.log.read_text())
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def post(self, body: bytes):
        req = urllib.request.Request(self.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def raw_post(self, headers: str, chunks=(), timeout=10):
        """POST /v1/chat/completions over a socket of its own: the headers, then
        the chunks sent from another thread while the reply is read (a service
        that answers before reading them all may close the connection on them).
        Returns (status, JSON body, seconds from sending the headers to the reply)."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        start = time.monotonic()
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Content-Type: application/json\r\n{headers}\r\n".encode())

        def send():
            try:
                for c in chunks:
                    sock.sendall(c)
            except OSError:
                pass

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            reply = http.client.HTTPResponse(sock)
            reply.begin()
            took = time.monotonic() - start
            return reply.status, json.loads(reply.read()), took
        finally:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # Wakes a sender the service no longer reads from.
            except OSError:
                pass
            sock.close()
            sender.join(timeout)

    def stop(self):
        stop_process(self.proc)
        self._log.close()


@pytest.fixture
def services(make_daemon, model_dir, tmp_path):
    d = make_daemon(head_dim=16)
    made = []

    def make(name, *args):
        s = Service(model_dir, tmp_path, name, "--socket", d.socket, *args)
        made.append(s)
        return s

    yield d, make
    for s in made:
        s.stop()


def chat(service, messages, **kw):
    r = service.client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=6, temperature=0,
                                               **kw)
    return r.choices[0].message.content, r.usage


def test_follow_up_turns_come_from_the_cache_and_reply_as_without_it(services):
    _, make = services
    kv, plain, local = make("kvtier"), make("plain", "--no-kvtier"), make("local", "--cache", "local")
    assert [m.id for m in kv.client.models.list().data] == ["tiny-chat"]
    messages = [{"role": "system", "content": "you are a small model that answers every question"},
                {"role": "user", "content": "hello, what is a kv cache and why is it fast?"}]
    previous = None
    for turn in range(3):
        reply, usage = chat(kv, messages)
        reference, ref_usage = chat(plain, messages)
        in_process, local_usage = chat(local, messages)
        assert reply == reference == in_process, f"turn {turn}"
        assert usage.prompt_tokens == ref_usage.prompt_tokens
        assert ref_usage.prompt_tokens_details.cached_tokens == 0
        if turn == 0:
            assert usage.prompt_tokens_details.cached_tokens == 0
        else:
            # The whole conversation before this turn (its prompt and reply): kvtierd's full
            # 4-token blocks and the tokens past them, which the service process kept.
            before = previous.prompt_tokens + previous.completion_tokens
            assert usage.prompt_tokens_details.cached_tokens == before, (turn, usage, previous)
            assert local_usage.prompt_tokens_details.cached_tokens == before, "in-process: token-granular"
        previous = usage
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": f"tell me more about turn {turn} please"}]
    metrics = urllib.request.urlopen(kv.url + "/metrics").read().decode()
    assert 'kvtier_serve_requests_total{outcome="ok"} 3' in metrics
    assert "kvtier_serve_cache_connected 1" in metrics


def test_streaming_gives_the_same_reply_with_usage(services):
    _, make = services
    kv = make("kvtier")
    messages = [{"role": "user", "content": "what is a token?"}]
    whole, _ = chat(kv, messages)
    stream = kv.client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=6, temperature=0,
                                               stream=True)
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if getattr(chunk, "usage", None):
            usage = chunk.usage
    assert "".join(parts) == whole
    assert usage is not None and usage.completion_tokens > 0


def test_a_second_service_process_continues_a_conversation_the_first_started(services):
    _, make = services
    a, b = make("a"), make("b")
    messages = [{"role": "user", "content": "the first service starts this chat about memory tiers"}]
    reply, _ = chat(a, messages)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "and the second goes on"}]
    _, usage = chat(b, messages)
    assert usage.prompt_tokens_details.cached_tokens > 0, "served from the blocks the first process committed"
    assert usage.prompt_tokens_details.cached_tokens % 4 == 0, "whole blocks: the tail stayed in the first process"


def test_bad_requests_get_openai_style_errors(services):
    _, make = services
    kv = make("kvtier", "--max-context", "64")
    status, body = kv.post(b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = kv.post(json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}).encode())
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = kv.post(json.dumps({"model": "tiny-chat", "messages": []}).encode())
    assert status == 400 and body["error"]["param"] == "messages"
    # Content parts that are no objects, or text that is no string (a 500 once); a seed past 64 bits (a 500
    # once, and a 200 then an error event streamed).
    for content, param in (([{"type": "text", "text": 5}], "messages[0].content[0].text"),
                           ([1, 2], "messages[0].content[0]"), ([{"text": "no type"}], "messages[0].content[0]")):
        status, body = kv.post(json.dumps({"model": "tiny-chat",
                                           "messages": [{"role": "user", "content": content}]}).encode())
        assert status == 400 and body["error"]["param"] == param, (content, status, body)
    for stream in (False, True):
        status, body = kv.post(json.dumps({"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}],
                                           "seed": 2**70, "stream": stream}).encode())
        assert status == 400 and body["error"]["param"] == "seed", (stream, status, body)
    # Pydantic validates; its 422 never shows: every violation is a 400 in OpenAI's shape, naming the field.
    for extra, param in (({"max_tokens": "5"}, "max_tokens"), ({"max_completion_tokens": 0}, "max_completion_tokens"),
                         ({"temperature": True}, "temperature"), ({"stream": "yes"}, "stream")):
        status, body = kv.post(json.dumps({"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}],
                                           **extra}).encode())
        assert status == 400 and body["error"] == {"message": body["error"]["message"], "param": param,
                                                   "type": "invalid_request_error", "code": None}, (extra, body)
    status, body = kv.post(json.dumps({"model": "tiny-chat", "messages": [{"role": "tool", "content": "hi"}]}).encode())
    assert status == 400 and body["error"]["param"] == "messages[0].role", body
    status, body = kv.post(b"[1, 2]")
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    try:
        urllib.request.urlopen(kv.url + "/v1/completions", timeout=5)
        raise AssertionError("an unknown route answered")
    except urllib.error.HTTPError as e:
        assert e.code == 404 and json.loads(e.read())["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        chat(kv, [{"role": "user", "content": "word " * 80}])
    assert e.value.code == "context_length_exceeded"
    # Still serving.
    assert chat(kv, [{"role": "user", "content": "hi"}])[0] is not None


def test_an_overlong_conversation_keeps_the_system_prompt_and_the_latest_turns(services):
    _, make = services
    kv = make("kvtier", "--max-context", "64", "--context-policy", "truncate")
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(6):
        messages += [{"role": "user", "content": f"question {i} about the cache"},
                     {"role": "assistant", "content": "an answer about the gpu tier"}]
    messages.append({"role": "user", "content": "and the last one?"})
    _, usage = chat(kv, messages)
    assert usage.prompt_tokens + 6 <= 64


def health(service):
    return json.loads(urllib.request.urlopen(service.url + "/health", timeout=5).read())["kvtier"]


def test_kvtierd_killed_mid_conversation_means_recomputing_not_failing(services):
    d, make = services
    kv = make("kvtier")
    messages = [{"role": "user", "content": "a chat that outlives its cache"}]
    reply, _ = chat(kv, messages)
    assert health(kv) is True
    d.proc.kill()
    d.proc.wait()
    # The link's next ping (every 0.5 s) finds it gone.
    until(lambda: health(kv) is False, 2, "/health to say kvtierd is down")
    assert "kvtier_serve_cache_connected 0" in urllib.request.urlopen(kv.url + "/metrics", timeout=5).read().decode()
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "still there?"}]
    reply2, usage = chat(kv, messages)
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert reply2 is not None


def test_a_restarted_kvtierd_serves_hits_again_within_a_second(services, tmp_path):
    """kvtierd SIGKILLed mid-conversation and started again on the same socket:
    within a second of its answering, the service's link has found it, and the
    turns computed after that are cached for the next ones (before, the service
    asked again only after 1, 2, 4 ... 30 s, and turns in that window were
    neither loaded nor stored)."""
    from conftest import Daemon

    d, make = services
    kv = make("kvtier")
    messages = [{"role": "user", "content": "a conversation across a kvtierd restart, long enough to fill blocks"}]
    reply, usage = chat(kv, messages)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "and the turn after"}]
    reply, usage = chat(kv, messages)
    assert usage.prompt_tokens_details.cached_tokens > 0  # The cache works before the fault.
    d.proc.kill()
    d.proc.wait()
    until(lambda: health(kv) is False, 2, "the service to see kvtierd gone")
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "while it is away"}]
    reply, usage = chat(kv, messages)
    assert usage.prompt_tokens_details.cached_tokens == 0  # Really away: recomputed.
    d.stop()
    back = Daemon(tmp_path, head_dim=16)  # The same socket; an empty cache.
    try:
        import kvtier

        answering = time.monotonic()
        assert kvtier.Client(socket=back.socket).ping() >= 0
        found = until(lambda: health(kv) is True, 3, "the service to find kvtierd again")
        assert found - answering < 1.0, f"found {found - answering:.2f} s after kvtierd answered"
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "back again"}]
        reply, usage = chat(kv, messages)  # Computed after the restart: stored.
        first = usage.prompt_tokens
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "and once more"}]
        _, usage = chat(kv, messages)
        assert usage.prompt_tokens_details.cached_tokens >= first, (usage, first)  # The whole turn before.
    finally:
        back.stop()


def test_a_full_queue_answers_503_and_the_service_goes_on(services):
    import threading

    _, make = services
    kv = make("kvtier", "--queue-limit", "1")
    long_reply = {}

    def long_request():
        long_reply["status"] = kv.post(json.dumps({"model": "tiny-chat", "max_tokens": 1000, "temperature": 0,
                                                   "messages": [{"role": "user", "content": "talk"}]}).encode())[0]

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)
    if not t.is_alive():
        pytest.skip("the long request ended (end of sequence) before the second was sent")
    status, body = kv.post(json.dumps({"model": "tiny-chat", "max_tokens": 2,
                                       "messages": [{"role": "user", "content": "me too"}]}).encode())
    t.join()
    assert status == 503 and body["error"]["code"] == "overloaded", body
    assert long_reply["status"] == 200
    assert chat(kv, [{"role": "user", "content": "and now?"}])[1].completion_tokens > 0


def test_health_answers_while_a_large_request_is_tokenized(services):
    # Once a 10 MB body took 11-13 s to get its 400 (parsed and tokenized on the event loop), and a /health
    # sent meanwhile waited as long. Now: a 3.8 MB body (1.9 M tokens, seconds of tokenizing; under the
    # default 4 MiB limit) is tokenized off the loop while /health keeps answering.
    _, make = services
    kv = make("kvtier", "--max-context", "64")
    big = json.dumps({"model": "tiny-chat", "messages": [{"role": "user", "content": "a " * 1_900_000}]}).encode()
    assert 3_000_000 < len(big) < 4 << 20
    result = {}
    t = threading.Thread(target=lambda: result.update(reply=kv.post(big), ended=time.monotonic()))
    started = time.monotonic()
    t.start()
    time.sleep(0.2)
    probes = []
    while t.is_alive():
        before = time.monotonic()
        urllib.request.urlopen(kv.url + "/health", timeout=30).read()
        probes.append(time.monotonic() - before)
        time.sleep(0.05)
    t.join()
    status, body = result["reply"]
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    lasted = result["ended"] - started
    assert probes, f"the large request took {lasted:.2f} s, too short to probe /health"
    # On the loop, the request would hold /health for all of its time: one or two probes, the
    # longest nearly as long as the request. Off it, /health answers throughout (a probe may
    # still wait a moment for the GIL or a core: 1.7 s once, beside the suite's other tests).
    assert len(probes) >= 5 and max(probes) < lasted / 2, \
        f"/health waited up to {max(probes):.2f} s behind the large request ({lasted:.2f} s, {len(probes)} probes)"
    # Past the default limit (4 MiB): 413 from the Content-Length alone.
    status, body, took = kv.raw_post("Content-Length: 5000000\r\n", [b" " * 65536])
    assert status == 413 and body["error"]["code"] == "request_too_large", body
    assert took < 2.0


def test_a_body_past_the_limit_is_refused_413_unread(services):
    _, make = services
    kv = make("kvtier", "--max-body-bytes", "1000000")
    # A Content-Length past --max-body-bytes: refused at once, before the body is sent (a 100 MB one was read).
    status, body, took = kv.raw_post("Content-Length: 100000000\r\n", [b" " * 65536])
    assert status == 413 and body["error"]["type"] == "invalid_request_error", body
    assert body["error"]["code"] == "request_too_large" and took < 2.0, (body, took)
    # A chunked body, no length told: refused once what was read passes the limit, not after reading it all.
    chunk = b"%x\r\n%s\r\n" % (256 << 10, b" " * (256 << 10))
    status, body, took = kv.raw_post("Transfer-Encoding: chunked\r\n", [chunk] * 40 + [b"0\r\n\r\n"])
    assert status == 413 and body["error"]["code"] == "request_too_large", body
    # Under the limit, served as ever.
    small = json.dumps({"model": "tiny-chat", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert kv.post(small.encode())[0] == 200
    metrics = urllib.request.urlopen(kv.url + "/metrics", timeout=5).read().decode()
    assert 'kvtier_serve_requests_total{outcome="error_413"} 2.0' in metrics
