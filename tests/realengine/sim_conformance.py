"""The same requests to real vLLM and to `oculis sim serve`, and what must match: status codes, JSON field
sets and types, SSE framing and chunk shapes, error shapes and wording (numbers aside: the tokenizers
differ), /v1/models entries, metric families, their label names, buckets and `_created` series.

Values are not compared (the simulator's words are placeholders and its timings modelled), except where
a client reads them: error `type`, `param`, `code`, the answering model name, the request id, finish
reasons, `object`. DELIBERATE lists the only differences allowed: the simulator's honesty markers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

MODEL = "tiny"
MAX_MODEL_LEN = 512

# The simulator's honesty markers: the only differences from real vLLM the conformance test allows. Keys that
# are JSON fields compare as "deliberate" wherever they appear; their values say what the simulator puts there.
DELIBERATE: dict[str, str] = {
    "system_fingerprint": "'oculis-simulator' (vLLM: 'vllm-0.32.0-<config hash>'), in the same places",
    "owned_by": "/v1/models entries are owned_by 'oculis-simulator' (vLLM: 'vllm')",
    "x-oculis-simulated": "a response header on every answer (vLLM has none)",
    "/sim/stats": "an endpoint of its own (the simulator's timing accuracy)",
    "--gpu, --sim-mean-logprob, --acceptance-rate, --vllm-version": "flags of its own (vLLM has none of them)",
}


@dataclass(frozen=True)
class Probe:
    name: str
    path: str
    body: Any = None  # None: GET; a str is sent as it is (not JSON)
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


def _chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "ignore_eos": True, **kw}


def _comp(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", "ignore_eos": True, **kw}


USAGE = {"include_usage": True}
PROBES: tuple[Probe, ...] = (
    Probe("chat", "/v1/chat/completions", _chat(max_tokens=5)),
    Probe("chat request id", "/v1/chat/completions", _chat(max_tokens=2), headers={"X-Request-Id": "conformance-1"}),
    Probe("chat stream", "/v1/chat/completions", _chat(max_tokens=5, stream=True)),
    Probe("chat stream usage", "/v1/chat/completions", _chat(max_tokens=5, stream=True, stream_options=USAGE)),
    Probe("chat logprobs", "/v1/chat/completions", _chat(max_tokens=4, logprobs=True, top_logprobs=2)),
    Probe("chat logprobs stream", "/v1/chat/completions", _chat(max_tokens=4, logprobs=True, top_logprobs=1,
                                                                 stream=True)),
    Probe("chat n=2", "/v1/chat/completions", _chat(max_tokens=3, n=2, temperature=1.0)),
    Probe("chat n=2 stream", "/v1/chat/completions", _chat(max_tokens=3, n=2, temperature=1.0, stream=True,
                                                           stream_options=USAGE)),
    Probe("chat without model", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 2, "ignore_eos": True}),
    Probe("completions", "/v1/completions", _comp(max_tokens=5)),
    Probe("completions default max_tokens", "/v1/completions", _comp()),
    Probe("completions stream usage", "/v1/completions", _comp(max_tokens=5, stream=True, stream_options=USAGE)),
    Probe("completions logprobs", "/v1/completions", _comp(max_tokens=4, logprobs=2)),
    Probe("completions echo", "/v1/completions", _comp(max_tokens=4, echo=True)),
    Probe("completions stream", "/v1/completions", _comp(max_tokens=4, stream=True)),
    Probe("completions two prompts", "/v1/completions", {**_comp(max_tokens=3, n=2), "prompt": ["Once", "Upon"]}),
    Probe("completions logprobs stream", "/v1/completions", _comp(max_tokens=4, logprobs=1, stream=True)),
    Probe("completions cut at max_model_len", "/v1/completions",
          {"model": MODEL, "prompt": [100] * 500, "max_tokens": 100, "ignore_eos": True}),
    # errors
    Probe("unknown model", "/v1/chat/completions", {**_chat(max_tokens=2), "model": "nope"}),
    Probe("temperature -1", "/v1/chat/completions", _chat(max_tokens=2, temperature=-1)),
    Probe("temperature 3", "/v1/completions", _comp(max_tokens=2, temperature=3)),
    Probe("top_p 0", "/v1/chat/completions", _chat(max_tokens=2, top_p=0)),
    Probe("max_tokens 0", "/v1/chat/completions", _chat(max_tokens=0)),
    Probe("max_tokens over max_model_len", "/v1/chat/completions", _chat(max_tokens=MAX_MODEL_LEN + 1)),
    Probe("completions max_tokens over", "/v1/completions", _comp(max_tokens=MAX_MODEL_LEN + 1)),
    Probe("prompt over max_model_len", "/v1/completions", {"model": MODEL, "prompt": [100] * 600, "max_tokens": 2}),
    Probe("greedy n=2", "/v1/chat/completions", _chat(max_tokens=2, n=2, temperature=0)),
    Probe("stream_options without stream", "/v1/chat/completions", _chat(max_tokens=2, stream_options=USAGE)),
    Probe("top_logprobs without logprobs", "/v1/chat/completions", _chat(max_tokens=2, top_logprobs=2)),
    Probe("messages missing", "/v1/chat/completions", {"model": MODEL}),
    Probe("not JSON", "/v1/chat/completions", "{not json"),
    Probe("unknown path", "/v1/nope", method="GET"),
    # the other endpoints
    Probe("models", "/v1/models", method="GET"),
    Probe("health", "/health", method="GET"),
    Probe("ping", "/ping", method="GET"),
    Probe("ping post", "/ping"),
    Probe("version", "/version", method="GET"),
    Probe("load", "/load", method="GET"),
    Probe("tokenize", "/tokenize", {"model": MODEL, "prompt": "hello world"}),
    Probe("detokenize", "/detokenize", {"model": MODEL, "tokens": [100, 101, 102]}),
)


@dataclass
class Observed:
    status: int
    kind: str  # json | sse | text | empty
    data: Any  # parsed JSON, the SSE events (parsed JSON or the raw string), or the text
    framing_ok: bool = True


def capture(base: str, probes: tuple[Probe, ...] = PROBES) -> dict[str, Observed]:
    out: dict[str, Observed] = {}
    with httpx.Client(base_url=base, timeout=120) as client:
        for p in probes:
            if p.body is None:
                req = client.build_request(p.method, p.path, headers=p.headers)
            elif isinstance(p.body, str):
                req = client.build_request(p.method, p.path, content=p.body,
                                           headers={"content-type": "application/json", **p.headers})
            else:
                req = client.build_request(p.method, p.path, json=p.body, headers=p.headers)
            resp = client.send(req)
            out[p.name] = observe(resp)
    return out


def observe(resp: httpx.Response) -> Observed:
    ctype = resp.headers.get("content-type", "")
    text = resp.text
    if ctype.startswith("text/event-stream"):
        # SSE framing as vLLM writes it: every event is one `data: ...` line and a blank line, [DONE] last
        framing = text.endswith("data: [DONE]\n\n") and all(
            block.startswith("data: ") and "\n" not in block for block in text.split("\n\n")[:-1])
        events = [json.loads(b[6:]) if b[6:].startswith("{") else b[6:] for b in text.split("\n\n")[:-1]]
        return Observed(resp.status_code, "sse", events, framing)
    if ctype.startswith("application/json"):
        return Observed(resp.status_code, "json", resp.json())
    return Observed(resp.status_code, "text" if text else "empty", text)


def shape(value: Any, path: str = "") -> Any:
    """A value's structure: dicts by key, lists by the set of their items' shapes, scalars by type. The
    honesty markers' paths compare as 'deliberate'."""
    key = path.rsplit(".", 1)[-1]
    if key in DELIBERATE:
        return "deliberate"
    if key == "bytes" and isinstance(value, list):
        # a token's UTF-8 bytes: a list of numbers, empty for a token that decodes to no bytes (the tiny
        # model's random answers draw one now and then: CI saw `bytes: []` in vLLM's chat logprobs)
        return [json.dumps("number")]
    if isinstance(value, dict):
        # dicts keyed by data (completions' top_logprobs: token -> logprob) compare by their value types
        if key == "top_logprobs_entry":
            return {"<token>": sorted({json.dumps(shape(v)) for v in value.values()})}
        return {k: shape(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        item = f"{path}.top_logprobs_entry" if key == "top_logprobs" and value and isinstance(value[0], dict) \
            and "token" not in value[0] else f"{path}[]"
        return sorted({json.dumps(shape(v, item), sort_keys=True) for v in value})
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "str"


NUMBER = re.compile(r"-?\d+(\.\d+)?")


def wording(message: str) -> str:
    """An error message with its figures replaced (token counts differ between the two tokenizers) and
    pydantic's echo of the request body cut (its repr is not an API)."""
    first = message.split("\n", 1)
    if message.startswith(("1 validation error", "2 validation errors")) and len(first) > 1:
        m = re.search(r"'msg': '([^']*)'", first[1])
        return NUMBER.sub("N", f"{first[0]} / {m.group(1) if m else ''}")
    return NUMBER.sub("N", message)


def sse_shape(events: list[Any]) -> tuple[Any, Any, list[str]]:
    """A stream's shape: its first and its last chunk before [DONE], and the set of all chunk shapes (how many
    tokens each chunk carries, and how choices interleave, differ from run to run)."""
    shapes = [json.dumps(shape(e), sort_keys=True) if isinstance(e, dict) else e for e in events]
    body = shapes[:-1] if shapes and shapes[-1] == "[DONE]" else shapes
    return (body[0] if body else None, body[-1] if body else None, sorted(set(shapes)))


def differences(real: dict[str, Observed], sim: dict[str, Observed]) -> list[str]:
    out: list[str] = []
    for name, r in real.items():
        s = sim[name]
        if (r.status, r.kind) != (s.status, s.kind):
            out.append(f"{name}: status/kind {r.status}/{r.kind} (vLLM) vs {s.status}/{s.kind} (simulator)")
            continue
        if r.kind == "sse":
            if not s.framing_ok or not r.framing_ok:
                out.append(f"{name}: SSE framing (vLLM ok={r.framing_ok}, simulator ok={s.framing_ok})")
            if sse_shape(r.data) != sse_shape(s.data):
                out.append(f"{name}: chunk shapes differ:\n  vLLM {sse_shape(r.data)}\n  sim  {sse_shape(s.data)}")
            continue
        if r.kind != "json":
            if r.kind == "text" and r.data != s.data:
                out.append(f"{name}: text {r.data!r} (vLLM) vs {s.data!r} (simulator)")
            continue
        if shape(r.data) != shape(s.data):
            out.append(f"{name}: JSON shape differs:\n  vLLM {shape(r.data)}\n  sim  {shape(s.data)}")
        err_r, err_s = (r.data.get("error") if isinstance(r.data, dict) else None,
                        s.data.get("error") if isinstance(s.data, dict) else None)
        if isinstance(err_r, dict) and isinstance(err_s, dict):
            for k in ("type", "param", "code"):
                if err_r.get(k) != err_s.get(k):
                    out.append(f"{name}: error {k} {err_r.get(k)!r} (vLLM) vs {err_s.get(k)!r} (simulator)")
            if wording(str(err_r.get("message"))) != wording(str(err_s.get("message"))):
                out.append(f"{name}: error wording\n  vLLM {err_r.get('message')!r}\n  sim  {err_s.get('message')!r}")
        for k in ("model", "object", "detail"):
            if isinstance(r.data, dict) and r.data.get(k) != s.data.get(k):
                out.append(f"{name}: {k} {r.data.get(k)!r} (vLLM) vs {s.data.get(k)!r} (simulator)")
        if isinstance(r.data, dict) and isinstance(r.data.get("choices"), list):
            fr = [c.get("finish_reason") for c in r.data["choices"]]
            fs = [c.get("finish_reason") for c in s.data["choices"]]
            if fr != fs:
                out.append(f"{name}: finish_reason {fr} (vLLM) vs {fs} (simulator)")
        if name == "chat request id" and r.data.get("id") != s.data.get("id"):
            out.append(f"{name}: id {r.data.get('id')!r} (vLLM) vs {s.data.get('id')!r} (simulator)")
    return out


@dataclass(frozen=True)
class Family:
    type: str
    labels: frozenset[str]
    buckets: tuple[str, ...]
    created: bool


def families(text: str) -> dict[str, Family]:
    """Metric families from a Prometheus text page: type, label names, buckets, whether `_created` exists."""
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    buckets: dict[str, list[str]] = {}
    created: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([^{ ]+)(?:\{(.*)\})? ", line)
        if not m:
            continue
        sample, labeltext = m.group(1), m.group(2) or ""
        names = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labeltext))
        fam = next((f for f in (sample, *(sample[: -len(sfx)] for sfx in ("_total", "_bucket", "_sum", "_count",
                                                                           "_created") if sample.endswith(sfx)))
                    if f in types), None)
        if fam is None:
            continue
        if sample.endswith("_created"):
            created.add(fam)
        if sample.endswith("_bucket") and "le" in names and names["le"] not in buckets.setdefault(fam, []):
            buckets[fam].append(names["le"])
        labels.setdefault(fam, set()).update(k for k in names if k != "le")
    return {f: Family(t, frozenset(labels.get(f, ())), tuple(buckets.get(f, ())), f in created)
            for f, t in types.items() if f.startswith("vllm:")}


def metric_differences(real: str, sim: str) -> list[str]:
    r, s = families(real), families(sim)
    out = [f"family {f}: only in vLLM" for f in sorted(set(r) - set(s))]
    out += [f"family {f}: only in the simulator" for f in sorted(set(s) - set(r))]
    for f in sorted(set(r) & set(s)):
        if r[f] != s[f]:
            out.append(f"family {f}: vLLM {r[f]} vs simulator {s[f]}")
    return out
