#!/usr/bin/env python3
"""demo_chat.py URL[,URL...]: several multi-turn chats through the official
openai client against kvtier.serve processes, each turn sent to the next
service in turn (so a conversation one process started is continued by
another), printing per turn the time to first token and the prompt tokens that
came from kvtier. The main job (scripts/demo.sh) runs it."""

import argparse
import statistics
import time

import openai

TOPICS = ["the gpu tier", "a kv cache", "the host memory", "a chat session", "every worker process",
          "the prefix of a prompt"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("urls", help="comma-separated service base URLs (http://host:port)")
    p.add_argument("--chats", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    a = p.parse_args()
    clients = [openai.OpenAI(base_url=u.rstrip("/") + "/v1", api_key="unused") for u in a.urls.split(",")]
    model = clients[0].models.list().data[0].id
    system = ("you are a small model that answers every question about memory and data. " * 40).strip()
    chats = [[{"role": "system", "content": system},
              {"role": "user", "content": f"hello, what is {TOPICS[c % len(TOPICS)]} and why is it fast?"}]
             for c in range(a.chats)]
    print(f"{'chat':>4} {'turn':>4} {'service':>7} {'prompt':>7} {'cached':>7} {'ttft_ms':>8}  reply")
    ttft = {0: [], 1: []}
    served = 0
    for turn in range(a.turns):
        for c, messages in enumerate(chats):
            which = served % len(clients)
            served += 1
            start = time.perf_counter()
            first = None
            parts, usage = [], None
            for chunk in clients[which].chat.completions.create(model=model, messages=messages, stream=True,
                                                                max_tokens=a.max_tokens, temperature=0):
                if chunk.choices and chunk.choices[0].delta.content:
                    if first is None:
                        first = time.perf_counter() - start
                    parts.append(chunk.choices[0].delta.content)
                if getattr(chunk, "usage", None):
                    usage = chunk.usage
            reply = "".join(parts)
            ms = 1000 * (first if first is not None else time.perf_counter() - start)
            cached = usage.prompt_tokens_details.cached_tokens
            ttft[min(turn, 1)].append(ms)
            print(f"{c:>4} {turn:>4} {which:>7} {usage.prompt_tokens:>7} {cached:>7} {ms:>8.1f}  {reply[:40]!r}")
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": f"and what about {TOPICS[(c + turn + 1) % len(TOPICS)]}?"}]
    print(f"TTFT median: first turns {statistics.median(ttft[0]):.1f} ms (at most the shared system prompt "
          f"cached), follow-up turns {statistics.median(ttft[1]):.1f} ms (the conversation so far from kvtier, "
          f"whichever service computed it)")


if __name__ == "__main__":
    main()
