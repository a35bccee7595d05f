"""`oculis sim replay` and `oculis sim serve`: engine flags spelled as `vllm serve` spells them.

Bad input is one line naming the flag, the value and the fix, exit 2 (vLLM's words where it has them).
`serve` accepts a pod's rendered `vllm serve` arguments unchanged: flags vLLM 0.32 has but the simulator
does not model are ignored with one warning line; flags vLLM 0.32 does not have are refused as vLLM
refuses them ("unrecognized arguments", exit 2); a later --host/--port overrides an earlier one.
MODEL may be a local model directory: its config.json is the architecture (as `vllm serve DIR` reads it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from oculis.adapters import VLLM_LORA_RANKS
from oculis_cli.inputs import InputError, port_number
from oculis_cli.serve import bind_problem
from oculis_measure.figures import known, pick, text, with_reasons
from oculis_sim import config, versions, vllm_flags

if TYPE_CHECKING:
    from oculis_sim.workload import Workload

BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + error
        self.exit(BAD_INPUT, f"{self.prog}: error: {message}\n")


def _flag_bool(p: argparse.ArgumentParser) -> None:
    p.add_argument("--enable-prefix-caching", dest="prefix_caching", action=argparse.BooleanOptionalAction,
                   default=True, help="prefix caching (vLLM's default: on)")


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_positional", nargs="?", metavar="MODEL", help="model (as `vllm serve MODEL`)")
    p.add_argument("--model", help="Hugging Face id from the built-in catalog (or any name with --model-config)")
    p.add_argument("--model-config", type=Path, metavar="FILE",
                   help="YAML/JSON architecture of a model outside the catalog (the GPUUpstream spec.modelConfig "
                   "fields)")
    p.add_argument("--gpu", default=os.environ.get("OCULIS_SIM_GPU"),
                   help="GPU product to simulate: an Oculis name (H100-80GB) or its nvidia.com/gpu.product value; "
                   "default $OCULIS_SIM_GPU")
    p.add_argument("--tensor-parallel-size", "-tp", "--tensor-parallel", dest="tp", type=int, default=1,
                   metavar="N")
    p.add_argument("--max-num-seqs", type=int, metavar="S")
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs",
                   help="fcfs, or priority: requests' `priority` field orders the waiting queue and picks "
                   "who is preempted (lower first), as vLLM's scheduler")
    p.add_argument("--max-num-batched-tokens", metavar="B", help="per-step token budget (2048, 8k, 8K)")
    p.add_argument("--max-model-len", metavar="L", help="longest sequence; `auto` = the largest that fits")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92, metavar="U",
                   help="vLLM 0.32's default: 0.92 (vllm/config/cache.py)")
    p.add_argument("--kv-cache-dtype", default="auto", metavar="D", help="auto or fp8")
    p.add_argument("--quantization", "-q", metavar="Q", help="fp8, awq, gptq, compressed-tensors")
    p.add_argument("--speculative-config", "-sc", metavar="JSON",
                   help='e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\' or {"model": ..., ...}')
    p.add_argument("--acceptance-rate", type=float, metavar="A",
                   help="per-position draft acceptance probability (default by method)")
    p.add_argument("--kv-cache-memory-bytes", metavar="BYTES",
                   help="KV cache size instead of the --gpu-memory-utilization plan (1M = 1,048,576; vLLM's flag); "
                   "with --gpu CPU, $VLLM_CPU_KVCACHE_SPACE (GiB) wins over it, as in vLLM")
    p.add_argument("--num-gpu-blocks-override", type=int, metavar="N",
                   help="KV blocks (of --block-size tokens) instead of what the memory plan gives (vLLM's flag)")
    p.add_argument("--step-profile", type=Path, metavar="FILE",
                   help="a step-time model fitted on the hardware (JSON/YAML: step_s, request_s, prefill_token_s, "
                   "decode_token_s, ...) instead of the GPU roofline, e.g. bench/data/cpu_step_profile.json")
    p.add_argument("--block-size", type=int, metavar="T",
                   help="KV block in tokens (vLLM's default: 16 on GPUs, 128 with --gpu CPU)")
    p.add_argument("--vllm-version", metavar="X.Y",
                   help="the engine release whose overheads to simulate (0.5: V0, 0.8: V1, 0.12+: V1 with async "
                   "scheduling; an image tag such as vllm/vllm-openai:v0.15.1 also works); default: the operator's "
                   "pinned engine image")
    _flag_bool(p)
    p.add_argument("--served-model-name", nargs="+", metavar="NAME")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage.prompt_tokens_details with the prompt's cached tokens (vLLM's flag)")
    p.add_argument("--sim-mean-logprob", type=float, default=-0.4, metavar="LP",
                   help="simulator only: mean token logprob of the modelled answers (-0.4 confident; -2.5 makes a "
                   "router's min_mean_logprob check escalate)")


def _local_model(model: str) -> object | None:
    """A model directory's config.json as the ModelConfig (vLLM serves a path the same way), else None."""
    from oculis_operator import hfconfig

    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    try:
        return hfconfig.parse(path.read_text(encoding="utf-8"), str(path))
    except (hfconfig.HFConfigError, OSError, UnicodeDecodeError) as exc:
        raise config.SimConfigError(f"MODEL {model}: {exc}") from None


def settings_from(args: argparse.Namespace) -> config.Settings:
    model = args.model or args.model_positional
    if not model:
        raise config.SimConfigError("--model: missing; name the model (e.g. --model meta-llama/Llama-3.1-8B-Instruct)")
    if args.sim_mean_logprob > 0:
        raise config.SimConfigError(f"--sim-mean-logprob {args.sim_mean_logprob}: a logprob is at most 0; use e.g. "
                                    "-0.4 (confident) or -2.5 (doubtful)")
    model_config = args.model_config
    if model_config is None:
        model_config = _local_model(model)
    tokens = (config.parse_int("--max-num-batched-tokens", args.max_num_batched_tokens)
              if args.max_num_batched_tokens is not None else None)
    return dataclasses.replace(config.resolve(
        model, args.gpu, model_config=model_config, tp=args.tp, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=tokens, max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization, prefix_caching=args.prefix_caching,
        speculative_config=args.speculative_config, acceptance_rate=args.acceptance_rate,
        served_names=tuple(args.served_model_name or ()), seed=args.seed,
        num_gpu_blocks_override=args.num_gpu_blocks_override, vllm_version=args.vllm_version,
        block_size=args.block_size, mean_logprob=args.sim_mean_logprob,
        prompt_tokens_details=args.enable_prompt_tokens_details, step_profile=args.step_profile,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes, cpu_kvcache_space=os.environ.get("VLLM_CPU_KVCACHE_SPACE")),
        scheduling_policy=args.scheduling_policy)


# Read from the rest of the argv as vLLM reads them (oculis_sim.lora), so listed here rather than as flags.
SERVE_EPILOG = f"""LoRA adapters (vLLM 0.32's flags):
  --enable-lora                 serve adapters beside the base model
  --max-loras M                 adapters one batch can use (default 1); others wait for a slot
  --max-lora-rank R             one of {", ".join(map(str, VLLM_LORA_RANKS))} (default 16)
  --lora-modules NAME=PATH ...  static adapters (or JSON {{"name", "path"}}); PATH holds adapter_config.json
  VLLM_ALLOW_RUNTIME_LORA_UPDATING=True  enables /v1/load_lora_adapter and /v1/unload_lora_adapter
Other `vllm serve` flags: those it does not model are ignored with one warning, ones vLLM 0.32 lacks refused."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="oculis sim", description="GPU-free simulator of a vLLM V1 engine (simulated figures)")
    sub = parser.add_subparsers(dest="sim_command", required=True, metavar="COMMAND", parser_class=_Parser)
    r = sub.add_parser("replay", help="run a workload in virtual time and print simulated latencies")
    add_engine_flags(r)
    r.add_argument("--workload", type=Path, required=True, metavar="FILE", help="YAML/JSON workload")
    r.add_argument("-o", "--output", choices=["text", "json"], default="text")
    f = sub.add_parser("fleet", help="a workload through N simulated engines behind the router's replica picker")
    add_engine_flags(f)
    f.add_argument("--replicas", type=int, default=4, metavar="N", help="engines of the same settings (default 4)")
    f.add_argument("--picker", default="prefix", metavar="NAME",
                   help="random, round-robin, least-loaded, prefix or kv-events; a comma-separated list runs each "
                   "on the same workload and prints them side by side")
    f.add_argument("--scrape-interval", type=float, default=1.0, metavar="S",
                   help="seconds between the router's reads of the engines' gauges (default 1)")
    f.add_argument("--workload", type=Path, required=True, metavar="FILE", help="YAML/JSON workload")
    f.add_argument("--lora-adapters", type=int, default=0, metavar="N",
                   help="each request asks for one of N LoRA adapters, every engine serving them all (default 0: "
                   "the base model)")
    f.add_argument("--lora-skew", type=float, metavar="S",
                   help="adapter k drawn with weight 1/k^S (default 0: uniformly)")
    f.add_argument("--max-loras", type=int, metavar="M", help="LoRA slots per engine (vLLM's, default 1)")
    f.add_argument("--lora-blind", action="store_true",
                   help="the picker ignores the engines' LoRA slots (keeps only to replicas listing the adapter)")
    f.add_argument("-o", "--output", choices=["text", "json"], default="text")
    s = sub.add_parser("serve", help="an OpenAI-compatible server backed by the simulated engine",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SERVE_EPILOG)
    add_engine_flags(s)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=port_number, default=8000)
    s.add_argument("--api-key", nargs="+", metavar="KEY", help="as vLLM: /v1 calls without `Authorization: Bearer "
                   "KEY` get 401, /health and /metrics stay open (default: VLLM_API_KEY from the environment)")
    s.add_argument("--kv-events-config", metavar="JSON",
                   help='vLLM\'s KVEventsConfig, e.g. \'{"enable_kv_cache_events": true, "publisher": "zmq", '
                   '"endpoint": "tcp://*:5557"}\': publish the engine\'s KV-cache events (msgpack over ZMQ PUB)')
    return parser


def replay_doc(res: object, s: config.Settings, sent: int) -> dict[str, Any]:
    """`sim replay -o json`: every figure the text prints, and that they are simulated. Latencies of a
    replay in which no request completed are null, not 0.0."""
    from oculis_sim.replay import ReplayResult

    assert isinstance(res, ReplayResult)
    hit = res.prefix_hit_rate
    doc: dict[str, Any] = {"simulated": True, "note": "simulated figures (oculis-simulator), not measurements",
                           "model": s.model_name, "gpu": s.gpu.key, "tp": s.tp, **res.summary,
                           "workload_requests": sent, "refused": res.refused,
                           "refused_why": "longer than max_model_len", "kv_cache_tokens": s.kv_cache_tokens,
                           "peak_kv_usage": round(res.peak_kv_usage, 4),
                           "prefix_cache_hit_rate": round(hit, 4) if known(hit) else hit,
                           "mean_acceptance_length": (round(res.spec_acceptance_length, 4)
                                                      if res.spec_acceptance_length else None)}
    if not res.summary["requests"]:
        doc["no_requests"] = _no_requests(sent, res.refused)
    return with_reasons(doc)  # figures of nothing are null, their reasons under "absent"


def _no_requests(sent: int, refused: int) -> str:
    return (f"no request completed ({sent} in the workload" + (f", {refused} refused: longer than max_model_len"
            if refused else "") + "): no latency or throughput figures; check the workload's stages and shapes")


def _text(res: object, s: config.Settings, sent: int | None = None) -> str:
    from oculis_sim.replay import ReplayResult

    assert isinstance(res, ReplayResult)
    sm = res.summary
    if not sm["requests"]:
        return (f"SIMULATED (oculis-simulator, not measured): {s.model_name} on {s.gpu.key} x{s.tp}\n  "
                + _no_requests(sent if sent is not None else res.refused, res.refused))
    lines = [f"SIMULATED (oculis-simulator, not measured): {s.model_name} on {s.gpu.key} x{s.tp}, "
             f"vLLM {s.vllm_version[0]}.{s.vllm_version[1]} ({versions.described(s.vllm_version)}), "
             f"max_num_seqs {s.max_num_seqs}, max_num_batched_tokens {s.max_num_batched_tokens}, "
             f"max_model_len {s.max_model_len}" + (f", {s.spec.method} k={s.spec.num_speculative_tokens} "
                                                   f"acceptance {s.acceptance_rate:g}" if s.spec else "")]
    lines.append(f"  {'':10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}  (ms)")
    for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        v = sm[key]
        lines.append(f"  {label:10}" + "".join(text(pick(v, k), ".1f", 10) for k in ("mean", "p50", "p90", "p99")))
    lines.append(f"  output tokens/s {text(sm['output_tokens_per_s'])}, "
                 f"requests/s {text(sm['requests_per_s'], '.3f')}, "
                 f"requests {sm['requests']}" + (f" ({res.refused} refused: longer than max_model_len)"
                                                 if res.refused else ""))
    lines.append(f"  preemptions {sm['preemptions']}, KV blocks {sm['kv_blocks']} ({s.kv_cache_tokens} tokens), "
                 f"peak KV usage {res.peak_kv_usage:.1%}, prefix cache hit rate {text(res.prefix_hit_rate, '.1%')}"
                 + (f", mean acceptance length {res.spec_acceptance_length:.2f}"
                    if res.spec_acceptance_length else ""))
    return "\n".join(lines)


def load_workload(path: Path) -> Workload:
    from oculis_sim import workload

    try:
        wl = workload.load(path)
    except InputError as exc:  # already names --workload and the file
        raise config.SimConfigError(str(exc)) from None
    except workload.WorkloadError as exc:
        raise config.SimConfigError(f"--workload {path}: {exc}") from None
    for note in wl.warnings:
        print(f"oculis sim: warning: --workload {path}: {note}", file=sys.stderr)
    return wl


def run_replay(args: argparse.Namespace) -> int:
    from oculis_sim import replay

    s = settings_from(args)
    wl = load_workload(args.workload)
    res = replay.run(s, wl)
    if args.output == "json":
        print(json.dumps(replay_doc(res, s, len(wl)), indent=2))
        print(f"oculis sim replay: simulated figures (oculis-simulator), not measurements; "
              f"{s.model_name} on {s.gpu.key} x{s.tp}", file=sys.stderr)
    else:
        print(_text(res, s, len(wl)))
    return 0


def run_serve(args: argparse.Namespace, ignored: list[str]) -> int:
    from oculis_sim.lora import from_args as lora_from_args
    from oculis_sim.server import serve

    s = settings_from(args)
    # The router's preflight: a host that does not resolve or is not this machine's is one line (exit 2),
    # a busy port exit 1, before the model's start-up lines and not as a traceback from the event loop.
    problem = bind_problem(args.host, args.port)
    if problem is not None:
        code, message = problem
        print(f"oculis sim serve: error: {message}", file=sys.stderr)
        return code
    lora, ignored = lora_from_args(ignored, s.served_names[0])
    flags = [a.split("=", 1)[0] for a in ignored if a.startswith("-")]
    if ignored:
        print(f"oculis sim serve: warning: ignoring what vLLM accepts and the simulator does not model: "
              f"{' '.join(flags or ignored)}", file=sys.stderr)
    kv = None
    if args.kv_events_config is not None:
        from oculis_sim import kvevents

        try:
            cfg = kvevents.parse_config(args.kv_events_config)
        except kvevents.KVEventsError as exc:
            raise config.SimConfigError(str(exc)) from None
        if cfg is not None:
            try:
                kv = kvevents.Publisher.bind(cfg, s.block_size)
            except kvevents.KVEventsError as exc:
                print(f"oculis sim serve: error: {exc}", file=sys.stderr)
                return 1
            print(f"oculis sim serve: publishing KV events on {cfg.endpoint} (topic {cfg.topic!r})", file=sys.stderr)
    from oculis_sim.auth import keys_from

    keys = keys_from(args.api_key)
    if keys:  # the keys themselves are never printed
        print("oculis sim serve: /v1 calls need an API key (--api-key or VLLM_API_KEY); /health and /metrics "
              "stay open", file=sys.stderr)
    serve(s, args.host, args.port, kv, lora, keys)
    return 0


def unrecognized(extra: list[str]) -> list[str]:
    """The arguments vLLM 0.32's `vllm serve` would refuse among those the simulator does not model: an
    option it does not have, and the values that follow it (argparse cannot tell them from positionals)."""
    out: list[str] = []
    known = False  # a stray positional before any option: vLLM refuses it too
    for arg in extra:
        if arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit():
            name = arg.split("=", 1)[0]
            if name.startswith("--"):  # vLLM's parser reads `--max_model_len` as `--max-model-len`
                name = "--" + name[2:].replace("_", "-")
            known = name in vllm_flags.SERVE_FLAGS
        if not known:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "serve" and argv[1] == "serve":
        del argv[1]  # a pod's args may start with `serve` (the image's `vllm serve` entrypoint split)
    parser = build_parser()
    ignored: list[str] = []
    if argv[:1] == ["serve"]:
        args, ignored = parser.parse_known_args(argv)
        unknown = unrecognized(ignored)
        if unknown:  # vLLM's parser refuses them: argparse's words and exit code
            parser.exit(BAD_INPUT, f"oculis sim serve: error: unrecognized arguments: {' '.join(unknown)}\n")
    else:
        args = parser.parse_args(argv)
    prog = f"oculis sim {args.sim_command}"
    try:
        if args.sim_command == "replay":
            return run_replay(args)
        if args.sim_command == "fleet":
            from oculis_sim.fleetcli import run_fleet

            return run_fleet(args, settings_from, load_workload)
        return run_serve(args, ignored)
    except config.SimConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
