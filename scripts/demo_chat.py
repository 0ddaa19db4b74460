#!/usr/bin/env python3
"""demo_chat.py URL[,URL...] --recompute URL: the seed's conversation with the
real model, through the official openai client. Each turn goes to the next
kvtier.serve process in turn (so a conversation one process started is
continued by another), then the same turn to a service that keeps no cache
(--cache none); per turn it prints the reply, the prompt tokens and how many
came from kvtier, and the time to first token beside the same turn recomputed.
The main job (scripts/demo.sh) runs it.

With --worker, kvtier-worker (the C++ transformer) then serves one more turn on
the same model directory (--model-dir): the conversation so far and a new
question, tokenized here with the model's chat template and tokenizer and handed
over as token ids (--prompt-tokens). It computes the model identity the Python
services do, so the conversation's cached prefix is its too."""

import argparse
import json
import statistics
import subprocess
import textwrap
import time

import openai

# The seed service's conversation (a quicksort in Python, then comments), and two more turns.
TURNS = ["请用Python写一个快速排序函数。", "能加上注释吗？", "What is the time complexity of quicksort?",
         "Show how to call it on the list [3, 1, 2]."]
NEXT = "Can you write it without recursion?"


def ask(client, model, messages, max_tokens):
    """One streamed turn: (reply, prompt tokens, cached tokens, ttft seconds)."""
    start = time.perf_counter()
    first, parts, usage = None, [], None
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True,
                                                max_tokens=max_tokens, temperature=0):
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - start
            parts.append(chunk.choices[0].delta.content)
        if getattr(chunk, "usage", None):
            usage = chunk.usage
    ttft = first if first is not None else time.perf_counter() - start
    return "".join(parts), usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, ttft


def show(text, width=100, lines=12):
    out = []
    for line in text.splitlines() or [""]:
        out += textwrap.wrap(line, width) or [""]
    more = f"\n      [... {len(out) - lines} more lines]" if len(out) > lines else ""
    return "\n".join("      " + line for line in out[:lines]) + more


def worker_turn(a, messages):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(a.model_dir, local_files_only=True)
    ids = tokenizer.apply_chat_template(messages + [{"role": "user", "content": NEXT}], add_generation_prompt=True,
                                        tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    out = subprocess.run([a.worker, "--model", a.model_dir, "--socket", a.socket, "--profile", "smollm2", "--threads", "2",
                          "--output-tokens", "48", "--prompt-session", "demo-worker",
                          "--prompt-tokens", ",".join(str(int(t)) for t in ids)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"kvtier-worker failed:\n{out.stderr}")
    r = json.loads(out.stdout.splitlines()[-1])
    text = tokenizer.decode(r["output"], skip_special_tokens=True)
    print(f"kvtier-worker, turn {len(TURNS) + 1}: prompt {r['prompt_tokens']} tokens, {r['cached_tokens']} from "
          f"kvtier; TTFT {r['ttft_ms']:.0f} ms")
    print(f"    user: {NEXT}")
    print(f"    assistant:\n{show(text)}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("urls", help="comma-separated kvtier.serve base URLs (http://host:port)")
    p.add_argument("--recompute", required=True, help="base URL of a service without a cache (--cache none)")
    p.add_argument("--max-tokens", type=int, default=64, help="reply cap per turn (default %(default)s)")
    p.add_argument("--worker", help="kvtier-worker: serve one more turn with it")
    p.add_argument("--model-dir", help="--worker: the model directory the services load")
    p.add_argument("--socket", help="--worker: kvtierd's socket")
    a = p.parse_args()
    def client(url):
        return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", timeout=120)
    services = [client(u) for u in a.urls.split(",")]
    recompute = client(a.recompute)
    model = services[0].models.list().data[0].id
    messages = []
    speedups, same = [], 0
    for turn, question in enumerate(TURNS):
        messages.append({"role": "user", "content": question})
        which = turn % len(services)
        reply, prompt, cached, ttft = ask(services[which], model, messages, a.max_tokens)
        again, prompt2, cached2, ttft2 = ask(recompute, model, messages, a.max_tokens)
        assert prompt2 == prompt and cached2 == 0, (prompt2, cached2)
        same += reply == again
        speedups.append(ttft2 / ttft)
        print(f"turn {turn + 1}, service {'AB'[which % 2] if len(services) <= 2 else which}: prompt {prompt} tokens, "
              f"{cached} from kvtier; TTFT {1000 * ttft:.0f} ms with kvtier, {1000 * ttft2:.0f} ms recomputed "
              f"({ttft2 / ttft:.1f}x); the recomputed reply is {'the same' if reply == again else 'DIFFERENT'}")
        print(f"    user: {question}")
        print(f"    assistant:\n{show(reply)}")
        if reply != again:
            print(f"    recomputed:\n{show(again)}")
        messages.append({"role": "assistant", "content": reply})
    print(f"follow-up turns: TTFT recomputed / with kvtier, median {statistics.median(speedups[1:]):.1f}x "
          f"(turns 2-{len(TURNS)}: {', '.join(f'{s:.1f}x' for s in speedups[1:])}); "
          f"{same} of {len(TURNS)} replies equal to the recomputed ones")
    if a.worker:
        worker_turn(a, messages)
    # A differing reply is shown, not fatal: fp32 sums over a cached prefix may round apart.
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
