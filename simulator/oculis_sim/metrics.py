"""/metrics as vLLM 0.32 exports it: the same families, types, label names (`model_name, engine` first),
label values pre-created at 0 and buckets (vllm/v1/metrics/loggers.py, buckets.py, perf.py,
v1/spec_decode/metrics.py). prometheus-client writes the `_created` series as vLLM's does. Spec-decode
families exist only when speculative decoding is configured, as in vLLM. Values are the simulated engine's.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from oculis_sim.config import Settings
from oculis_sim.engine import EngineCore

REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


def token_buckets(max_model_len: int) -> list[float]:
    """vLLM's 1-2-5 series capped at max_model_len."""
    out: list[float] = []
    e = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**e
            if v > max_model_len:
                return out
            out.append(v)
        e += 1


def cache_config_labels(s: Settings) -> dict[str, str]:
    """CacheConfig.metrics_info(): every field as a string, in vLLM's order, plus `engine`."""
    tokens = s.kv_cache_tokens
    block = s.block_size
    return {
        "block_size": str(block), "user_specified_block_size": "False", "kv_cache_layout": "None",
        "prefix_match_unit": "None", "gpu_memory_utilization": str(s.gpu_memory_utilization),
        "cache_dtype": s.kv_cache_dtype, "is_attention_free": "False",
        "num_gpu_blocks_override": str(s.num_gpu_blocks_override), "sliding_window": "None",
        "enable_prefix_caching": str(s.prefix_caching), "prefix_caching_hash_algo": "sha256",
        "prefix_cache_retention_interval": "0", "kv_cache_dtype_skip_layers": "[]", "mamba_page_size_padded": "None",
        "skip_page_size_padded": "None", "mamba_block_size": "None", "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto", "mamba_cache_mode": "none", "enable_mamba_shared_prefix_checkpoint": "False",
        "replayssm_buffer_len": "16", "use_replayssm": "False", "use_kda_recoverssm": "False",
        "num_gpu_blocks": str(s.num_blocks), "num_cpu_blocks": "None", "effective_attention_block_size": str(block),
        "kv_cache_size_tokens": str(tokens), "kv_cache_max_concurrency": str(round(tokens / s.max_model_len, 2)),
        "hash_block_size": str(block), "cache_hit_alignment_tokens": str(block), "kv_sharing_fast_prefill": "False",
        "swa_bounded_replay": "True", "kv_cache_memory_bytes": str(s.kv_cache_memory_bytes),
        "kv_offloading_size": "None",
        "kv_offloading_backend": "native", "_block_size_resolved": "True", "engine": "0",
    }


@dataclass(frozen=True)
class Finished:
    """One finished sequence's figures, observed once (times in seconds on the server's clock)."""

    reason: str
    arrival: float
    scheduled: float  # first scheduled (end of queueing)
    first_token: float
    last_token: float
    prompt_tokens: int
    cached_tokens: int
    generation_tokens: int
    max_tokens: int
    n: int
    preemptions: int


class Metrics:
    def __init__(self, s: Settings) -> None:
        self.registry = r = CollectorRegistry()
        lab = ["model_name", "engine"]
        self.labels = v = (s.served_names[0], "0")

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, [*lab, *extra], registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*lab, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return Histogram(name, doc, lab, buckets=buckets, registry=r)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = gauge(
            "vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason. Reason labels: 'capacity' = "
            "waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
            "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.", ("reason",))
        sleep = gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 "
                      "means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
                      "level 2.", ("sleep_state",))
        for state in SLEEP_STATES:
            sleep.labels(*v, state).set(1 if state == "awake" else 0)
        self.kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.queries = counter("vllm:prefix_cache_queries",
                               "Prefix cache queries, in terms of number of queried tokens.")
        self.hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance "
                "cache sharing, in terms of number of queried tokens.").labels(*v)
        counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache "
                "sharing, in terms of number of cached tokens.").labels(*v)
        counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.").labels(*v)
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.").labels(*v)
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                        ("source",))
        self.cached = counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
        self.cached_by_source = counter(
            "vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier that supplied them: "
            "device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.", ("source",))
        self.generation = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = counter("vllm:request_success", "Count of successfully processed requests.",
                               ("finished_reason",))
        rejections = Counter("vllm:admission_rejections", "Number of admission attempts rejected by a queue limit, "
                             "by reason.", ["model_name", "reason"], registry=r)
        tok = token_buckets(s.max_model_len)
        self.req_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok)
        self.req_gen = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", tok)
        self.iteration = histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                   ITERATION_TOKENS_BUCKETS)
        self.max_gen = histogram("vllm:request_max_num_generation_tokens",
                                 "Histogram of maximum number of requested generation tokens.", tok)
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS)
        self.params_max = histogram("vllm:request_params_max_tokens",
                                    "Histogram of the max_tokens request parameter.", tok)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.req_preempt = histogram("vllm:request_num_preemptions",
                                     "Histogram of the number of times a request was preempted.", PREEMPTIONS_BUCKETS)
        self.kv_computed = histogram("vllm:request_prefill_kv_computed_tokens",
                                     "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                                     tok)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     list(cache_config_labels(s)), registry=r)
        info.labels(**cache_config_labels(s)).set(1)
        self.flops = counter("vllm:estimated_flops_per_gpu_total", "Estimated number of floating point operations per "
                             "GPU (for Model Flops Utilization calculations).")
        counter("vllm:estimated_read_bytes_per_gpu_total", "Estimated number of bytes read from memory per GPU (for "
                "Model Flops Utilization calculations).").labels(*v)
        counter("vllm:estimated_write_bytes_per_gpu_total", "Estimated number of bytes written to memory per GPU "
                "(for Model Flops Utilization calculations).").labels(*v)
        # children vLLM creates at start (so every series exists at 0 before the first request)
        for m in (self.running, self.waiting, self.kv, self.queries, self.hits, self.preemptions, self.prompt,
                  self.cached, self.generation, self.req_prompt, self.req_gen, self.iteration, self.max_gen,
                  self.params_n, self.params_max, self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.inference,
                  self.prefill, self.decode, self.req_preempt, self.kv_computed, self.flops):
            m.labels(*v)
        for reason in ("capacity", "deferred"):
            self.waiting_by_reason.labels(*v, reason)
        for src in PROMPT_SOURCES:
            self.prompt_by_source.labels(*v, src)
        for src in CACHE_HIT_SOURCES:
            self.cached_by_source.labels(*v, src)
        for reason in FINISH_REASONS:
            self.success.labels(*v, reason)
        for reason in ADMISSION_REASONS:
            rejections.labels(v[0], reason)
        self.k = s.spec.num_speculative_tokens if s.spec else 0
        self.spec: dict[str, Counter] = {}
        if s.spec is not None:
            for key, name, doc in (("d", "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                                   ("dt", "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                                   ("a", "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")):
                self.spec[key] = counter(name, doc)
                self.spec[key].labels(*v)
            self.per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                   "Accepted tokens per draft position.", ("position",))
            for i in range(self.k):
                self.per_pos.labels(*v, str(i))
        self.seen: dict[str, int] = {}

    def _inc(self, key: str, metric: Counter, value: int, *extra: str) -> None:
        delta = value - self.seen.get(key, 0)
        if delta:
            metric.labels(*self.labels, *extra).inc(delta)
            self.seen[key] = value

    def sync(self, core: EngineCore) -> None:
        """Counters follow the engine's totals (increments of the difference); gauges its state."""
        c = core.counters
        self._inc("pre", self.preemptions, c.preemptions)
        self._inc("pt", self.prompt, c.prompt_tokens)
        self._inc("gt", self.generation, c.generation_tokens)
        self._inc("q", self.queries, c.prefix_queries)
        self._inc("h", self.hits, c.prefix_hits)
        self._inc("hc", self.cached, c.prefix_hits)
        self._inc("hd", self.cached_by_source, c.prefix_hits, "device")
        if self.spec:
            self._inc("d", self.spec["d"], c.spec_drafts)
            self._inc("dt", self.spec["dt"], c.spec_draft_tokens)
            self._inc("a", self.spec["a"], c.spec_accepted)
            for i, n in enumerate(c.spec_accepted_per_pos):
                self._inc(f"p{i}", self.per_pos, n, str(i))
        sched = core.scheduler
        lab = self.labels
        self.running.labels(*lab).set(len(sched.running))
        self.waiting.labels(*lab).set(len(sched.waiting))
        self.waiting_by_reason.labels(*lab, "capacity").set(len(sched.waiting))
        self.kv.labels(*lab).set(sched.usage())

    def step(self, tokens: int) -> None:
        self.iteration.labels(*self.labels).observe(tokens)

    def finished(self, f: Finished) -> None:
        """Every per-request histogram, observed once when the sequence ends (as vLLM's output processor)."""
        lab = self.labels
        self.success.labels(*lab, f.reason).inc()
        self.e2e.labels(*lab).observe(max(0.0, f.last_token - f.arrival))
        self.queue.labels(*lab).observe(max(0.0, f.scheduled - f.arrival))
        self.inference.labels(*lab).observe(max(0.0, f.last_token - f.scheduled))
        self.prefill.labels(*lab).observe(max(0.0, f.first_token - f.scheduled))
        self.decode.labels(*lab).observe(max(0.0, f.last_token - f.first_token))
        if f.generation_tokens > 1:
            self.tpot.labels(*lab).observe((f.last_token - f.first_token) / (f.generation_tokens - 1))
        self.req_prompt.labels(*lab).observe(f.prompt_tokens)
        self.req_gen.labels(*lab).observe(f.generation_tokens)
        self.max_gen.labels(*lab).observe(f.max_tokens)
        self.params_n.labels(*lab).observe(f.n)
        self.params_max.labels(*lab).observe(f.max_tokens)
        self.req_preempt.labels(*lab).observe(f.preemptions)
        self.kv_computed.labels(*lab).observe(max(0, f.prompt_tokens - f.cached_tokens))
        self.prompt_by_source.labels(*lab, "local_compute").inc(max(0, f.prompt_tokens - f.cached_tokens))
        if f.cached_tokens:
            self.prompt_by_source.labels(*lab, "local_cache_hit").inc(f.cached_tokens)
