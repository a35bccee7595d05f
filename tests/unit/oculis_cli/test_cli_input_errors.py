"""Every bad input to every `oculis` subcommand is one line on stderr naming the problem, with exit 2
(a busy port, not an input, is 1): never a traceback. Table-driven over files, numbers and hosts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from oculis import TierMatch, load_config
from oculis_measure.route.analysis import Scored, analyze, parse_shares

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "examples" / "oculis-config.yaml"
L8 = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_FACTS = ("numLayers: 32\nhiddenSize: 4096\nnumAttentionHeads: 32\nnumKvHeads: 8\nheadDim: 128\n"
               "vocabSize: 128256\nmaxPositionEmbeddings: 131072\n")


def oculis(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oculis_cli.main", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    deep = "[" * 100_000 + "]" * 100_000
    made = {
        "bad-utf8": b"oculis:\n  upstreams: []\n\xff\xfe\n",
        "deep-config": ("oculis: " + deep + "\n").encode(),
        "deep-1k": ("oculis: " + "[" * 1000 + "]" * 1000 + "\n").encode(),
        "model-bad-utf8": b"\xff",
        "model-deep": deep.encode(),
        "model-empty": b"",
        "model-list": b"[1, 2]\n",
        "model-inf": ("paramsBillions: .inf\n" + LLAMA_FACTS).encode(),
        "model-huge": ("paramsBillions: 1.0e+308\n" + LLAMA_FACTS).encode(),
        "model-nan": ("paramsBillions: .nan\n" + LLAMA_FACTS).encode(),
    }
    out = {}
    for name, data in made.items():
        (d / name).write_bytes(data)
        out[name] = d / name
    out["dir"] = d
    return out


def busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


SERVE = ["serve", "--config", str(SEED), "--metrics-port", "0"]
PLAN = ["capacity", "plan", "--model", L8, "--gpu", "H100-80GB"]
CASES: list[tuple[str, list[str], str]] = [
    # (id, argv with {file} placeholders, what stderr must say)
    ("serve-config-not-utf8", ["serve", "--config", "{bad-utf8}"], "not UTF-8 text"),
    ("serve-config-deep", ["serve", "--config", "{deep-config}"], "nested too deeply"),
    ("serve-config-deep-1k", ["serve", "--config", "{deep-1k}"], "nested too deeply"),
    ("serve-config-is-a-dir", ["serve", "--config", "{dir}"], "Is a directory"),
    ("serve-host-does-not-resolve", [*SERVE, "--host", "no.such.host.invalid", "--port", "18095"],
     "--host 'no.such.host.invalid' does not resolve"),
    ("serve-host-not-an-ip", [*SERVE, "--host", "999.1.1.1", "--port", "18095"], "--host '999.1.1.1' does not resolve"),
    ("serve-host-not-of-this-machine", [*SERVE, "--host", "192.0.2.1", "--port", "18095"],  # TEST-NET-1
     "cannot bind --host '192.0.2.1'"),
    ("serve-same-port-twice", ["serve", "--config", str(SEED), "--port", "18090", "--metrics-port", "18090"],
     "--metrics-port 18090 is also --port"),
    ("serve-grace-nan", [*SERVE, "--shutdown-grace", "nan"], "'nan' is not a finite number"),
    ("serve-grace-inf", [*SERVE, "--shutdown-grace", "inf"], "'inf' is not a finite number"),
    ("serve-grace-negative", [*SERVE, "--shutdown-grace", "-5"], "--shutdown-grace -5 is negative"),
    ("serve-port-huge", [*SERVE, "--port", "99999999999999999999"], "is not a port"),
    ("serve-port-unicode-digit", [*SERVE, "--port", "\u0663"], "is not a port"),
    ("serve-port-negative", [*SERVE, "--port", "-1"], "is not a port"),
    ("score-config-not-utf8", ["route", "score", "--config", "{bad-utf8}", "--route", "adaptive"], "not UTF-8 text"),
    ("score-config-deep", ["route", "score", "--config", "{deep-config}", "--route", "adaptive"], "nested too deeply"),
    ("analyze-config-is-a-dir", ["route", "analyze", "--config", "{dir}", "--route", "adaptive"], "Is a directory"),
    ("analyze-shares-nan", ["route", "analyze", "--config", str(SEED), "--route", "adaptive", "--shares",
                            "nan,0.5,0.5"], "--shares: shares nan,0.5,0.5 must be finite non-negative numbers"),
    ("analyze-shares-all-nan", ["route", "analyze", "--config", str(SEED), "--route", "adaptive", "--shares",
                                "nan,nan,nan"], "must be finite"),
    ("analyze-shares-inf", ["route", "analyze", "--config", str(SEED), "--route", "adaptive", "--shares",
                            "inf,-inf,1"], "must be finite"),
    ("analyze-shares-negative", ["route", "analyze", "--config", str(SEED), "--route", "adaptive",
                                 "--shares=-0.5,0.5,1"], "must be finite non-negative"),
    ("plan-model-config-not-utf8", ["capacity", "plan", "--model", "x/y", "--gpu", "H100-80GB", "--model-config",
                                    "{model-bad-utf8}"], "--model-config"),
    ("plan-model-config-deep", ["capacity", "plan", "--model", "x/y", "--gpu", "H100-80GB", "--model-config",
                                "{model-deep}"], "nested too deeply"),
    ("plan-model-config-empty", ["capacity", "plan", "--model", "x/y", "--gpu", "H100-80GB", "--model-config",
                                 "{model-empty}"], "is empty"),
    ("plan-model-config-list", ["capacity", "plan", "--model", "x/y", "--gpu", "H100-80GB", "--model-config",
                                "{model-list}"], "spec.modelConfig"),
    ("plan-model-config-dir", ["capacity", "plan", "--model", "x/y", "--gpu", "H100-80GB", "--model-config",
                               "{dir}"], "Is a directory"),
    ("plan-model-config-inf", ["capacity", "plan", "--model", "x/y", "--gpu", "H100-80GB", "--model-config",
                               "{model-inf}"], "modelConfig.paramsBillions"),
    ("plan-model-config-huge", ["capacity", "plan", "--model", "x/y", "--gpu", "H100-80GB", "--model-config",
                                "{model-huge}"], "modelConfig.paramsBillions"),
    ("plan-model-config-nan", ["capacity", "plan", "--model", "x/y", "--gpu", "H100-80GB", "--model-config",
                               "{model-nan}"], "modelConfig.paramsBillions"),
    # The operator's schema: the verdict and the message the CRD/webhook give for the same spec.
    ("plan-batched-below-seqs", [*PLAN, "--max-num-batched-tokens", "1", "--max-num-seqs", "4"],
     "engine.maxNumBatchedTokens must be >= engine.maxNumSeqs"),
    ("plan-tensor-parallel-negative", [*PLAN, "--tensor-parallel", "-2"], "--tensor-parallel: spec.gpu.count"),
    ("plan-tensor-parallel-huge", [*PLAN, "--tensor-parallel", "17"], "--tensor-parallel: spec.gpu.count"),
    ("plan-max-model-len-negative", [*PLAN, "--max-model-len", "-5"], "--max-model-len: spec.engine.maxModelLen"),
    ("plan-max-num-seqs-zero", [*PLAN, "--max-num-seqs", "0"], "--max-num-seqs: spec.engine.maxNumSeqs"),
    ("plan-utilization-nan", [*PLAN, "--gpu-memory-utilization", "nan"], "'nan' is not a finite number"),
    ("plan-utilization-huge", [*PLAN, "--gpu-memory-utilization", "1e400"], "not a finite number"),
    ("plan-unknown-draft", [*PLAN, "--draft-model", "nope/x"], "--model-config FILE"),
    ("no-such-command", ["nope"], "invalid choice"),
]


@pytest.mark.parametrize(("argv", "says"), [(a, s) for _, a, s in CASES], ids=[c[0] for c in CASES])
def test_every_bad_cli_input_is_one_line_and_exit_2(files: dict[str, Path], argv: list[str], says: str) -> None:
    proc = oculis(*[a.format(**{k: str(v) for k, v in files.items()}) for a in argv])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert says in lines[0] and lines[0].startswith("oculis"), lines[0]


def test_a_busy_port_is_told_apart_from_a_bad_host() -> None:
    with busy_port() as s:
        port = s.getsockname()[1]
        proc = oculis(*SERVE, "--port", str(port))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"oculis serve: --port {port}: 127.0.0.1:{port} is already in use; stop what holds "
                                   f"it (`ss -ltnp 'sport = :{port}'`) or pick another --port")


def test_capacity_plan_gives_the_operators_verdict_for_the_same_spec() -> None:
    from oculis.upstream import GPUUpstreamSpec
    from oculis_operator.admission import admission_verdict

    body = {"provider": "vllm", "model": L8, "gpu": {"product": "H100-80GB", "count": 1},
            "engine": {"maxNumBatchedTokens": 1, "maxNumSeqs": 4}}
    refusal = admission_verdict(body)
    assert refusal is not None  # the webhook refuses it...
    cli = oculis(*PLAN, "--max-num-batched-tokens", "1", "--max-num-seqs", "4")
    assert cli.returncode == 2 and refusal in cli.stderr  # ...and the CLI says the same words
    with pytest.raises(ValueError):
        GPUUpstreamSpec.model_validate(body)
    # A spec the operator admits but reports as not fitting (a preemption storm) is exit 3, as before.
    storm = oculis(*PLAN, "--max-num-seqs", "1000", "-o", "json")
    assert storm.returncode == 3 and json.loads(storm.stdout)["error_code"] == "ERR_OCULIS_KV_CACHE_EXHAUSTED"


def test_route_score_reports_a_deep_line_and_goes_on() -> None:
    lines = ["[" * 100_000 + "]" * 100_000, json.dumps({"prompt": "hi"}),
             '{"messages": [{"role": "user", "content": ' + "[" * 50_000 + "]" * 50_000 + "}]}",
             json.dumps({"prompt": "what is 2+2?"})]
    proc = oculis("route", "score", "--config", str(SEED), "--route", "adaptive", stdin="\n".join(lines) + "\n")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [("error" in o) for o in out] == [True, False, True, False]
    assert out[0]["error"].startswith("line 1: nested too deeply")


@pytest.mark.parametrize("raw", ["nan,0.5,0.5", "nan,nan,nan", "inf,0,0", "0.5,0.5,-inf", "-0.5,0.5,1"])
def test_shares_must_be_finite_and_non_negative(raw: str) -> None:
    with pytest.raises(ValueError, match="finite non-negative"):
        parse_shares(raw, 3)


ROUTE = load_config(SEED).route("adaptive")  # tiers simple / standard / complex


def split_with(suggested: dict[str, float | None], scored: list[Scored]) -> list[float]:
    """The share per tier the router's own tier choice gives once the suggested thresholds are set."""
    from oculis_router.classify import Classification
    from oculis_router.decide import choose_tier

    tiers = [t.model_copy(update={"match": TierMatch(complexity_below=suggested[t.name])}) if t.name in suggested
             else t for t in ROUTE.tiers]
    route = ROUTE.model_copy(update={"tiers": tiers})
    picked = [choose_tier(route, Classification(complexity=s.complexity, confidence=1.0)).index for s in scored]
    return [picked.count(i) / len(picked) for i in range(len(tiers))]


@pytest.mark.parametrize("top", [0.87, 1.0])  # the sample's maximum below, and at, the highest threshold
@pytest.mark.parametrize(("shares", "want"), [([1, 0, 0], [1, 0, 0]), ([0, 1, 0], [0, 1, 0]),
                                              ([0.5, 0.5, 0], [0.5, 0.5, 0]), ([0.5, 0.3, 0.2], [0.5, 0.3, 0.2])])
def test_suggested_thresholds_give_the_wanted_split_including_the_maximum(
        top: float, shares: list[float], want: list[float]) -> None:
    scored = [Scored(round(top * i / 99, 4), 0.9, "simple", False) for i in range(100)]
    suggested = analyze(ROUTE, scored, shares)["suggested_complexity_below"]
    got = split_with(suggested, scored)
    assert all(abs(g - w) <= 0.011 for g, w in zip(got, want, strict=True)), (suggested, got)
