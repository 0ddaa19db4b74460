"""vLLM's scheduler and KvtierConnector's two sides, without a model: fast tests
of what the connector plans (loads, saves, freed requests) and of every byte it
moves, against a real kvtierd.

Pipeline runs vLLM 0.32's own Scheduler (which makes the connector's scheduler
side, as an engine does) over a KV cache of real tensors in vLLM's CPU layout,
with the connector's worker side registered on them. A step is what vLLM's
engine and model runner do around a forward: schedule; hand the metadata to the
worker side (handle_preemptions, start_load_kv); the "forward" writes the K/V of
every scheduled token; wait_for_save, the load errors, get_finished; a sampled
token per request that finished its prompt; update_from_output. The K/V a
forward writes for position p of a request is a number derived from the
request's tokens 0..p, in every layer, head and channel, so check() can tell,
for every token a request has computed or loaded, whether its block holds that
request's own K/V: a block saved with another prompt's bytes, loaded into the
wrong place, or cut at the wrong token shows at once.

Real parts: vLLM's Scheduler, KVCacheManager, Request and output classes, the
connector, kvtierd. Not real: the model (its K/V is the function above) and the
sampled tokens (a function of the request and its length)."""

from __future__ import annotations

import torch

BLOCK = 128  # vLLM's CPU block.
LAYERS, HEADS, DIM = 4, 4, 64  # The tiny model's KV (vllm_engines.make_model).


def kv_value(tokens: list[int]) -> float:
    """The K/V the forward writes for the last of `tokens`: exact in fp32."""
    h = 0
    for t in tokens:
        h = (h * 1_000_003 + t + 1) % (1 << 23)
    return float(h + 1)


class Pipeline:
    def __init__(self, model: str, socket: str, blocks: int = 64, extra: dict | None = None,
                 max_num_batched_tokens: int = 8192, max_num_seqs: int = 16):
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        from kvtier.vllm import KvtierConnector

        transfer = KVTransferConfig(kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
                                    kv_role="kv_both", kv_connector_extra_config={"socket": socket, **(extra or {})})
        self.config = EngineArgs(model=model, dtype="float32", max_model_len=4096, enforce_eager=True,
                                 skip_tokenizer_init=True, enable_prefix_caching=False, block_size=BLOCK,
                                 max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                 kv_transfer_config=transfer).create_engine_config()
        self.config.cache_config.num_gpu_blocks = blocks  # As the engine sets it once it has sized the cache.
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=DIM, dtype=torch.float32)
        self.kv_cache_config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                                             kv_cache_groups=[KVCacheGroupSpec(self.layer_names, spec)])
        self.scheduler = Scheduler(self.config, self.kv_cache_config, StructuredOutputManager(self.config),
                                   block_size=BLOCK, log_stats=True)
        self.connector = self.scheduler.connector
        # vLLM's CPU pages: [blocks, heads, block tokens, 2 x head size] per layer, one allocation.
        self.kv = torch.zeros(LAYERS, blocks, HEADS, BLOCK, 2 * DIM)
        self.worker = KvtierConnector(self.config, KVConnectorRole.WORKER, self.kv_cache_config)
        self.worker.register_kv_caches({n: self.kv[i] for i, n in enumerate(self.layer_names)})
        self.requests: dict[str, object] = {}
        self.outputs: dict[str, list[int]] = {}
        self.preempted = 0
        self.failed_blocks: list[int] = []
        self.counters: dict[str, float] = {}  # The connector's, both sides, since the start.
        self._next = 0

    # --- requests ------------------------------------------------------------------
    def add(self, prompt: list[int], max_tokens: int = 4, rid: str | None = None) -> str:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        rid = rid or f"r{self._next}"
        self._next += 1
        request = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                          None)
        self.requests[rid] = request
        self.outputs[rid] = []
        self.scheduler.add_request(request)
        return rid

    @staticmethod
    def sample(tokens: list[int]) -> int:
        """The 'model's' next token: a function of the sequence so far."""
        return 7 + (sum(tokens[-8:]) * 31 + len(tokens)) % 180

    # --- steps -----------------------------------------------------------------------
    def schedule(self):
        return self.scheduler.schedule()

    def execute(self, out) -> None:
        """The worker's part of a step, then the scheduler's update, for `out`."""
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        w = self.worker
        meta = out.kv_connector_metadata
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        sampled = {}
        for rid, n in out.num_scheduled_tokens.items():
            request = self.requests[rid]
            start = request.num_computed_tokens - n  # schedule() counted this step's tokens already.
            self._forward(request, start, n)
            if start + n >= request.num_tokens:
                sampled[rid] = [self.sample(list(request.all_token_ids))]
        w.wait_for_save()
        invalid = w.get_block_ids_with_load_errors()
        self.failed_blocks += sorted(invalid)
        w.get_finished(set(out.finished_req_ids))
        w.clear_connector_metadata()
        ids = list(out.num_scheduled_tokens)
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=[sampled.get(r, []) for r in ids],
                                   kv_connector_output=KVConnectorOutput(
                                       invalid_block_ids=invalid, kv_connector_stats=w.get_kv_connector_stats()))
        # vLLM sums both sides' counters into the step's scheduler stats, as an engine reports them.
        for outputs in self.scheduler.update_from_output(out, runner).values():
            for o in outputs.outputs:
                self.outputs[o.request_id] += list(o.new_token_ids)
            stats = outputs.scheduler_stats
            self._count(stats.kv_connector_stats if stats is not None else None)
        self.preempted += len(getattr(out, "preempted_req_ids", None) or ())

    def _count(self, data: dict | None) -> None:
        for k, v in (data or {}).items():
            self.counters[k] = self.counters.get(k, 0) + v

    def step(self):
        """One step; then every request still running holds its own K/V (check)."""
        out = self.schedule()
        self.execute(out)
        for rid in out.num_scheduled_tokens:
            if rid in self.scheduler.requests:
                self.check(rid)
        return out

    def run(self, limit: int = 1000) -> list:
        """Steps until every request finished; returns each step's scheduler output."""
        outs = []
        for _ in range(limit):
            if not self.scheduler.has_requests():
                return outs
            outs.append(self.step())
        raise AssertionError("requests still unfinished after %d steps" % limit)

    def drain(self) -> None:
        """Waits for the worker's saves (they run on its thread after the step)."""
        assert self.worker._saver is not None
        self.worker._saver.drain()

    def _forward(self, request, start: int, n: int) -> None:
        blocks = self.block_ids(request.request_id)
        tokens = list(request.all_token_ids)
        for p in range(start, start + n):
            self.kv[:, blocks[p // BLOCK], :, p % BLOCK, :] = kv_value(tokens[:p + 1])

    def block_ids(self, rid: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_blocks(rid).get_block_ids()[0])

    def check(self, rid: str) -> None:
        """Every token the request has computed (or loaded) has its own K/V in its block."""
        request = self.requests[rid]
        blocks = self.block_ids(rid)
        tokens = list(request.all_token_ids)
        wrong = []
        for p in range(request.num_computed_tokens):
            page = self.kv[:, blocks[p // BLOCK], :, p % BLOCK, :]
            want = kv_value(tokens[:p + 1])
            if not bool((page == want).all()):
                wrong.append(p)
        assert not wrong, f"request {rid}: {len(wrong)} tokens hold K/V that is not theirs (first at {wrong[0]})"

    def metric(self, name: str) -> float:
        """A connector counter (vllm:kvtier_<name>), both sides, since the start
        (the save thread's since the last step included)."""
        late = self.worker.get_kv_connector_stats()
        self._count(late.data if late is not None else None)
        return self.counters.get(name, 0)

    def close(self) -> None:
        self.worker.shutdown()
        if self.connector is not None:
            self.connector.shutdown()
