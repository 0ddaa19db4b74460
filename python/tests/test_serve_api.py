"""kvtier.serve's parts in this process, no model or service: what a request
may hold (Pydantic, every violation a 400 in OpenAI's shape naming the field),
the reply shapes on the wire, and the metrics' registry per service."""

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
serve = pytest.importorskip("kvtier.serve")


def parse(body, model="tiny-chat"):
    return serve.parse_request(body if isinstance(body, bytes) else json.dumps(body).encode(), model)


def refusal(body):
    with pytest.raises(serve.ApiError) as e:
        parse(body)
    return e.value


def hi(**fields):
    return {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": 5, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": "tiny-chat"}, "messages"),
    ({"model": "tiny-chat", "messages": []}, "messages"),
    ({"model": "tiny-chat", "messages": "hi"}, "messages"),
    ({"model": "tiny-chat", "messages": ["hi"]}, "messages[0]"),
    ({"model": "tiny-chat", "messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
    ({"model": "tiny-chat", "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": "tiny-chat", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": "tiny-chat", "messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"model": "tiny-chat", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text"),
    ({"model": "tiny-chat", "messages": [{"role": "user", "content": [1, 2]}]}, "messages[0].content[0]"),
    ({"model": "tiny-chat", "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
     "messages[0].content[0]"),
    ({"model": "tiny-chat", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0]"),
    ({"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": 7}]}]}, "messages[1].content[1]"),
    (hi(max_tokens=0), "max_tokens"),
    (hi(max_tokens=4097), "max_tokens"),
    (hi(max_tokens="5"), "max_tokens"),
    (hi(max_tokens=True), "max_tokens"),
    (hi(max_tokens=2.5), "max_tokens"),
    (hi(max_completion_tokens=-1), "max_completion_tokens"),
    (hi(temperature=2.5), "temperature"),
    (hi(temperature="0.5"), "temperature"),
    (hi(temperature=False), "temperature"),
    (hi(seed=2**70), "seed"),
    (hi(seed=-(2**63) - 1), "seed"),
    (hi(seed="1"), "seed"),
    (hi(stream="yes"), "stream"),
    (hi(stream=1), "stream"),
])
def test_each_violation_is_a_400_naming_its_field(body, param):
    e = refusal(body)
    assert (e.status, e.param, e.type) == (400, param, "invalid_request_error"), (e.message, body)
    assert e.response().status_code == 400
    assert json.loads(e.response().body) == {"error": {"message": e.message, "type": "invalid_request_error",
                                                       "param": param, "code": None}}


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]", b'"hi"', b"null", "{\"model\": \"\u00e9".encode()[:-1]])
def test_a_body_that_is_no_json_object_is_a_400_without_a_param(body):
    e = refusal(body)
    assert (e.status, e.param, e.type) == (400, None, "invalid_request_error"), e.message


def test_another_model_is_a_404():
    e = refusal(hi(model="gpt-9"))
    assert (e.status, e.code, e.param) == (404, "model_not_found", "model")


def test_a_valid_request_reads_as_the_template_wants_it():
    r = parse({"model": "tiny-chat", "stream": True, "seed": 2**64 - 1, "temperature": 1, "n": 1, "top_p": 0.5,
               "stream_options": {"include_usage": True},
               "messages": [{"role": "developer", "content": "be brief"},
                            {"role": "user", "name": "ann", "content": [
                                {"type": "text", "text": "what is "}, {"type": "image_url", "image_url": {}},
                                {"type": "text", "text": "this?"}]}]})
    assert r.template_messages() == [{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": "what is this?"}]
    assert (r.stream, r.seed, r.temperature, r.reply_limit()) == (True, 2**64 - 1, 1.0, serve.api.DEFAULT_MAX_TOKENS)
    assert parse(hi(max_tokens=5)).reply_limit() == 5
    assert parse(hi(max_tokens=5, max_completion_tokens=7)).reply_limit() == 7
    assert parse(hi(max_tokens=None, temperature=None, seed=None, stream=None)).reply_limit() == 64


def test_chunks_carry_what_openai_sends_and_no_more():
    def chunk(delta, finish=None, usage=None):
        c = serve.ChatCompletionChunk(id="c", created=1, model="m", usage=usage,
                                      choices=[serve.api.ChunkChoice(delta=delta, finish_reason=finish)])
        event = c.event()
        assert event.startswith("data: ") and event.endswith("\n\n")
        return json.loads(event[len("data: "):])

    first = chunk(serve.api.Delta(role="assistant", content=""))
    assert first == {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    assert chunk(serve.api.Delta(content="x"))["choices"][0]["delta"] == {"content": "x"}
    last = chunk(serve.api.Delta(), "stop", serve.Usage.of(10, 3, 4))
    assert last["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert last["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                             "prompt_tokens_details": {"cached_tokens": 4}}


def test_two_services_metrics_in_one_process_keep_apart():
    connected = {"a": True}
    a = serve.Metrics(lambda: connected["a"], lambda: 2)
    b = serve.Metrics(lambda: False, lambda: 0)  # Would raise "Duplicated timeseries" in one registry.
    a.completed(prompt_tokens=10, cached_tokens=8, completion_tokens=3, ttft=0.02)
    a.failed(400)
    text = a.render().decode()
    for line in ('kvtier_serve_requests_total{outcome="ok"} 1.0', 'kvtier_serve_requests_total{outcome="error_400"} 1.0',
                 "kvtier_serve_prompt_tokens_total 10.0", "kvtier_serve_cached_tokens_total 8.0",
                 "kvtier_serve_completion_tokens_total 3.0", "kvtier_serve_ttft_seconds_count 1.0",
                 'kvtier_serve_ttft_seconds_bucket{le="0.025"} 1.0', "kvtier_serve_cache_connected 1.0",
                 "kvtier_serve_requests_in_progress 2.0"):
        assert line + "\n" in text, line
    connected["a"] = False
    assert "kvtier_serve_cache_connected 0.0\n" in a.render().decode(), "read at each scrape"
    assert "kvtier_serve_requests_total{" not in b.render().decode()
    assert "kvtier_serve_prompt_tokens_total 0.0\n" in b.render().decode()
