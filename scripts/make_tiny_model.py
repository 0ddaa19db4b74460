#!/usr/bin/env python3
"""make_tiny_model.py DIR [--seed N] [--layers L] [--hidden H --heads Q --kv-heads K --head-dim D]: writes a small Hugging Face
model directory (config.json, model.safetensors, tokenizer files with a chat
template) that transformers loads offline. Nothing is downloaded: the weights
are drawn from the seed and the tokenizer is a word-level one built from a
vocabulary this script writes (the words of a few hundred lines of text it
generates, plus bytes for anything else), so the same arguments give the same
directory everywhere.

By default the model is a Llama of 2 layers, hidden 64, 4 heads (2 KV heads) of
16: its KV geometry is kvtierd's profile `layers: 2, kv_heads: 2, head_dim: 16,
dtype: fp32`. `--layers 4 --hidden 256 --heads 4 --kv-heads 4 --head-dim 64`
fits the default profile of configs/kvtierd.yaml (what scripts/demo.sh uses).
"""

import argparse
import json
import os
import random

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

WORDS = """the a an and or but if then so because when while of to in on at by for with from about as into
like through after over between out against during without before under around among kv cache block tier
gpu host memory model worker daemon prefix token session chat turn reply question answer fast slow
shared first next last new old good bad small large many few more less every each some any all no yes
hello hi please thanks thank you what why how where who which can could would should will may might
is are was were be been being have has had do does did say says said see sees saw know knows knew
think thinks thought make makes made use uses used want wants need needs help helps tell tells ask
asks one two three four five six seven eight nine ten time day week year world people thing things
data system service request response error number word words text story poem line lines code""".split()

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
SPECIALS = ["<|pad|>", "<|unk|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


def build_tokenizer(seed):
    rng = random.Random(seed)
    vocab = {}
    for tok in SPECIALS:
        vocab[tok] = len(vocab)
    for w in sorted(set(WORDS)):
        vocab[w] = len(vocab)
    for p in ".,?!:;'\"()-":
        vocab.setdefault(p, len(vocab))
    for i in range(10):
        vocab.setdefault(str(i), len(vocab))
    # A few hundred generated lines decide nothing here (word-level), but keep
    # the vocabulary a function of the seed's corpus for a byte-for-byte stable file.
    rng.shuffle(WORDS)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##")  # Joins words with spaces.
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>",
                                                unk_token="<|unk|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    a = p.parse_args()
    tokenizer = build_tokenizer(a.seed)
    torch.manual_seed(a.seed)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                      num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                                      max_position_embeddings=4096, rms_norm_eps=1e-5,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    os.makedirs(a.dir, exist_ok=True)
    model.save_pretrained(a.dir, safe_serialization=True)
    tokenizer.save_pretrained(a.dir)
    with open(os.path.join(a.dir, "kvtier.json"), "w") as f:
        json.dump({"made_by": "scripts/make_tiny_model.py", "seed": a.seed,
                   "profile": {"layers": a.layers, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "dtype": "fp32"}},
                  f, indent=2)
    print(f"wrote {a.dir}: llama {a.layers} layers, vocab {len(tokenizer)}, seed {a.seed}")


if __name__ == "__main__":
    main()
