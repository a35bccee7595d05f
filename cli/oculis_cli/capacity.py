"""`oculis capacity plan`: the operator's KV-cache capacity check, from the command line.

Exit codes: 0 fits, 3 does not fit (or cannot be planned), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from oculis import gpus
from oculis.base import format_errors
from oculis.upstream import Engine, ModelConfig, Speculative, Traffic

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
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    p.add_argument("--draft-model")
    p.add_argument("--profile", choices=["interactive", "rag", "batch"], default="interactive")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.set_defaults(run=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from oculis_operator import capacity, catalog

    def bad(msg: str) -> int:
        print(f"oculis capacity plan: error: {msg}", file=sys.stderr)
        return 2

    try:
        product = gpus.lookup(args.gpu)
    except KeyError as exc:
        return bad(f"--gpu: {exc.args[0]}")
    if args.tensor_parallel < 1:
        return bad(f"--tensor-parallel {args.tensor_parallel}: must be a positive integer")
    try:
        engine = Engine(max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_dtype=args.kv_cache_dtype,
                        gpu_memory_utilization=args.gpu_memory_utilization,
                        speculative=Speculative(draft_model=args.draft_model) if args.draft_model else None)
    except ValidationError as exc:
        return bad(format_errors(exc).replace("_", "-").replace("\n", "; "))
    inline = None
    if args.model_config is not None:
        try:
            inline = ModelConfig.model_validate(yaml.safe_load(args.model_config.read_text()))
        except OSError as exc:
            return bad(f"--model-config {args.model_config}: cannot read it: {exc.strerror}")
        except yaml.YAMLError as exc:
            return bad(f"--model-config {args.model_config}: not valid YAML/JSON: {' '.join(str(exc).split())}")
        except ValidationError as exc:
            return bad(f"--model-config {args.model_config}: " + format_errors(exc, "modelConfig").replace("\n", "; "))
    result: dict[str, Any]
    try:
        model = catalog.lookup(args.model, inline)
        draft = catalog.lookup(args.draft_model) if args.draft_model else None
    except KeyError as exc:
        return bad(f"--model/--draft-model: {exc.args[0]} (here: --model-config FILE with the same fields)")
    mismatch = capacity.draft_mismatch(model, draft, args.model, args.draft_model) if draft else None
    plan = capacity.plan(model, product, args.tensor_parallel, engine, Traffic(profile=args.profile), draft, args.model)
    result = {k: v for k, v in plan.as_dict().items() if k != "refuse_at_admission"}
    if mismatch:
        result.update(fits=False, error_code=capacity.TOKENIZER_MISMATCH, message=mismatch)
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        gib = 1024**3
        print(f"{args.model} on {product.key} x{args.tensor_parallel}")
        print(f"  weights per GPU      {result['weights_bytes_per_gpu'] / gib:10.2f} GiB")
        print(f"  KV bytes per token   {result['kv_bytes_per_token']:10d} (per GPU)")
        print(f"  KV cache tokens      {result['kv_cache_tokens']:10d}")
        print(f"  max concurrency      {result['max_concurrency']:10d} sequences of {result['tokens_per_seq']} tokens")
        print(f"  {'FITS' if result['fits'] else 'DOES NOT FIT'}: {result['message']}")
    return 0 if result["fits"] else NOT_FITTING
