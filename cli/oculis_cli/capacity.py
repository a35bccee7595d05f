"""`oculis capacity plan`: the operator's KV-cache capacity check, from the command line.

Exit codes: 0 fits, 3 does not fit (or cannot be planned), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from oculis import gpus
from oculis.base import format_errors
from oculis.upstream import GPUUpstreamSpec
from oculis_cli.inputs import InputError, finite_float, load_yaml, read_text

NOT_FITTING = 3


def register(sub: Any) -> None:
    cap = sub.add_parser("capacity", help="capacity planning for self-hosted models")
    cap_sub = cap.add_subparsers(dest="capacity_command", required=True, metavar="COMMAND")
    p = cap_sub.add_parser("plan", help="will a model fit its GPUs with these engine settings?")
    p.add_argument("--model", required=True, help="Hugging Face id from the built-in catalog (or any name with "
                   "--model-config)")
    p.add_argument("--model-config", type=Path, metavar="FILE",
                   help="YAML/JSON architecture facts for a model outside the catalog: the GPUUpstream "
                   "spec.modelConfig fields (paramsBillions, numLayers, hiddenSize, numAttentionHeads, numKvHeads, "
                   "headDim, vocabSize, maxPositionEmbeddings[, dtypeBytes, mlaLatentDim])")
    p.add_argument("--gpu", required=True, help=f"one of {', '.join(gpus.GPU_PRODUCTS)}")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto")
    p.add_argument("--gpu-memory-utilization", type=finite_float, default=0.92)
    p.add_argument("--draft-model")
    p.add_argument("--profile", choices=["interactive", "rag", "batch"], default="interactive")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.set_defaults(run=run_plan)


# Where each field of the GPUUpstream spec the CLI builds comes from, to name the flag in errors.
FLAGS = {"spec.model": "--model", "spec.gpu.count": "--tensor-parallel", "spec.engine.maxModelLen": "--max-model-len",
         "spec.engine.maxNumSeqs": "--max-num-seqs", "spec.engine.maxNumBatchedTokens": "--max-num-batched-tokens",
         "spec.engine.gpuMemoryUtilization": "--gpu-memory-utilization",
         "spec.engine.speculative.draftModel": "--draft-model", "spec.modelConfig": "--model-config"}


def spec_body(args: argparse.Namespace, product: str, model_config: Any) -> dict[str, Any]:
    """The GPUUpstream `spec` these flags describe (camelCase, as `kubectl apply` would send it)."""
    engine = {"maxModelLen": args.max_model_len, "maxNumSeqs": args.max_num_seqs,
              "maxNumBatchedTokens": args.max_num_batched_tokens, "kvCacheDtype": args.kv_cache_dtype,
              "gpuMemoryUtilization": args.gpu_memory_utilization,
              "speculative": {"draftModel": args.draft_model} if args.draft_model else None}
    body = {"provider": "vllm", "model": args.model, "gpu": {"product": product, "count": args.tensor_parallel},
            "engine": {k: v for k, v in engine.items() if v is not None}, "traffic": {"profile": args.profile},
            "modelConfig": model_config}
    return {k: v for k, v in body.items() if v is not None}


def with_flags(errors: str) -> str:
    """Schema errors, one line, each led by the flag it came from (`--max-num-seqs: spec.engine...`)."""
    out = []
    for line in errors.splitlines():
        path = line.split(": ", 1)[0]
        if path == "spec":  # a rule across fields: name every flag the message mentions
            named = [f for p, f in FLAGS.items() if p.removeprefix("spec.") in line and "." in p.removeprefix("spec.")]
        else:
            named = [f for p, f in FLAGS.items() if path == p or path.startswith(p + ".")][:1]
        out.append(f"{'/'.join(named)}: {line}" if named else line)
    return "; ".join(out)


def run_plan(args: argparse.Namespace) -> int:
    from oculis_operator import reconcile

    def bad(msg: str) -> int:
        print(f"oculis capacity plan: error: {msg}", file=sys.stderr)
        return 2

    try:
        product = gpus.lookup(args.gpu)
    except KeyError as exc:
        return bad(f"--gpu: {exc.args[0]}")
    inline = None
    if args.model_config is not None:
        try:
            inline = load_yaml(read_text(args.model_config, "--model-config"), f"--model-config {args.model_config}")
        except InputError as exc:
            return bad(str(exc))
        if inline is None:
            return bad(f"--model-config {args.model_config}: the file is empty; give the modelConfig fields")
    # The operator's own path: the schema validation `kubectl apply` runs, then the check it plans with,
    # so the CLI and the GPUUpstream status give one verdict.
    try:
        spec = GPUUpstreamSpec.model_validate(spec_body(args, product.key, inline))
    except ValidationError as exc:
        return bad(with_flags(format_errors(exc, "spec")))
    verdict = reconcile.check(spec)
    result: dict[str, Any]
    if isinstance(verdict, tuple):
        reason, message = verdict
        if reason == "UnknownModel":
            return bad(f"--model/--draft-model: {message} (here: --model-config FILE with the same fields)")
        code = message.split(":", 1)[0] if message.startswith("ERR_") else reason
        result = {"fits": False, "error_code": code, "reason": reason, "message": message}
    else:
        result = {k: v for k, v in verdict.as_dict().items() if k != "refuse_at_admission"}
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        gib = 1024**3
        print(f"{args.model} on {product.key} x{args.tensor_parallel}")
        if "kv_cache_tokens" in result:  # a plan (not a model that could not be planned at all)
            print(f"  weights per GPU      {result['weights_bytes_per_gpu'] / gib:10.2f} GiB")
            print(f"  KV bytes per token   {result['kv_bytes_per_token']:10d} (per GPU)")
            print(f"  KV cache tokens      {result['kv_cache_tokens']:10d}")
            print(f"  max concurrency      {result['max_concurrency']:10d} sequences of {result['tokens_per_seq']} "
                  "tokens")
        print(f"  {'FITS' if result['fits'] else 'DOES NOT FIT'}: {result['message']}")
    return 0 if result["fits"] else NOT_FITTING
