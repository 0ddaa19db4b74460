// The model the worker tests run: small enough for milliseconds, with every
// feature on (GQA: 4 heads over 2 kv heads; two layers; a SwiGLU wider than
// hidden). Its KV is 2 layers x 2 kv heads x 16 dim, fp32.
#pragma once

#include "model_config.h"

namespace kvtier::model {

inline ModelConfig TinyModel() {
  ModelConfig c;
  c.name = "test";
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.intermediate = 96;
  c.vocab = 260;
  c.seed = 7;
  return c;
}

}  // namespace kvtier::model
