#!/usr/bin/env python3
"""demo_vllm.py --model DIR --socket PATH: the seed's conversation in vLLM, two
engine processes with KvtierConnector on one kvtierd. Engine A holds the
conversation; engine B, a new process with an empty prefix cache of its own,
then answers its last turn: the prefix comes from kvtierd (engine A's blocks),
beside the same turn recomputed by B (a request with a cache_salt, which neither
vLLM's prefix cache nor the connector reuses). The main job (scripts/demo.sh)
runs it."""

import argparse
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "tests", "vllm"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_chat import TURNS, show  # noqa: E402
from vllm_engines import Engine  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--socket", required=True)
    p.add_argument("--profile", default="smollm2-vllm-cpu",
                   help="kvtierd's profile: the model's, with blocks of vLLM's block size (128 on its CPU backend)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--logs", default="/tmp", help="where the engines' logs go")
    a = p.parse_args()
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(a.model, local_files_only=True)

    def ids(messages):
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return [int(t) for t in (out["input_ids"] if isinstance(out, dict) or hasattr(out, "input_ids") else out)]

    extra = {"profile": a.profile}
    started = time.monotonic()
    engines = {}

    def start(name):
        engines[name] = Engine(a.model, os.path.join(a.logs, f"vllm-{name}.log"), socket=a.socket, extra=extra,
                               kv_cache_bytes=256 << 20)

    # Both processes start together (B has seen nothing when A holds the conversation).
    threads = [threading.Thread(target=start, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if len(engines) < 2:
            raise SystemExit("demo_vllm: an engine did not start (logs in " + a.logs + ")")
        engine_a, engine_b = engines["a"], engines["b"]
        for e in (engine_a, engine_b):  # An engine's first request pays for its warm-up: not this one's.
            e.generate([ids([{"role": "user", "content": "Hello!"}])], max_tokens=1)
        print(f"engines A and B started in {time.monotonic() - started:.0f} s", flush=True)
        messages = []
        for turn, question in enumerate(TURNS):
            messages.append({"role": "user", "content": question})
            out = engine_a.generate([ids(messages)], max_tokens=a.max_tokens)[0]
            reply = tokenizer.decode(out["tokens"], skip_special_tokens=True)
            print(f"engine A, turn {turn + 1}: prompt {len(ids(messages))} tokens, {out['cached']} cached, "
                  f"TTFT {1000 * out['ttft']:.0f} ms")
            messages.append({"role": "assistant", "content": reply})
        last = messages[:-1]
        prompt = ids(last)
        time.sleep(1.2)  # Engine A's worker busy-polls for a second after its last step: not on B's time.
        hit = engine_b.generate([prompt], max_tokens=a.max_tokens)[0]
        again = engine_b.generate([prompt], max_tokens=a.max_tokens, salts=["recompute"])[0]
        text = tokenizer.decode(hit["tokens"], skip_special_tokens=True)
        print(f"engine B, turn {len(TURNS)} again: prompt {len(prompt)} tokens, {hit['cached']} from kvtierd (engine "
              f"A's blocks); TTFT {1000 * hit['ttft']:.0f} ms, recomputed {1000 * again['ttft']:.0f} ms; the reply "
              f"is {'the same as' if hit['tokens'] == again['tokens'] else 'DIFFERENT from'} the recomputed one and "
              f"{'the same as' if text == messages[-1]['content'] else 'different from'} engine A's")
        print(f"    user: {last[-1]['content']}")
        print(f"    assistant:\n{show(text)}")
    finally:
        for e in engines.values():  # Both shut down at once.
            e.quit()
        for e in engines.values():
            e.stop()


if __name__ == "__main__":
    main()
