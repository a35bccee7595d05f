"""`oculis bench run` refuses bad input before sending anything: one line naming the flag, exit 2; an
unreachable target is exit 5. Output renderers say "simulated" wherever the figures are."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from oculis_cli.bench import render_csv, render_table
from oculis_cli.main import main
from oculis_measure.bench.stats import RequestResult, summarize

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there


@pytest.mark.parametrize(("extra", "says"), [
    (["--profile", "nope"], "--profile 'nope': neither a built-in profile"),
    (["--duration", "10"], "--duration '10' is not a duration"),
    (["--duration", "0s"], "--duration '0s' is zero"),
    (["--warmup", "soon"], "--warmup 'soon' is not a duration"),
    (["--rate", "0"], "--rate 0 is not positive"),
    (["--concurrency", "0"], "--concurrency 0 is below 1"),
    (["--burstiness", "-1"], "--burstiness -1 is not positive"),
    (["--slo", "ttft_p95<fast"], "--slo 'ttft_p95<fast' is not an SLO"),
    (["--pricing", "0.1"], "--pricing '0.1': give two non-negative numbers"),
    (["--pricing", "a,b"], "--pricing 'a,b'"),
    (["--api-key-env", "OCULIS_BENCH_TEST_UNSET"], "--api-key-env OCULIS_BENCH_TEST_UNSET: not set"),
    (["--url", "127.0.0.1:8080"], "--url '127.0.0.1:8080' is not an http(s) URL"),
    (["--tolerance", "-5"], "--tolerance -5 is negative"),
    (["--compare", "/nonexistent/base.json"], "cannot read --compare /nonexistent/base.json"),
])
def test_bad_input_is_one_line_naming_the_flag_with_exit_2(extra: list[str], says: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "run", "--route", "r", "--url", UNREACHABLE, "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oculis bench run: ") and says in err and err.count("\n") == 1


def test_a_baseline_that_is_no_benchmark_result_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"hello": 1}))
    assert main(["bench", "run", "--route", "r", "--url", UNREACHABLE, "--compare", str(bad)]) == 2
    assert "neither an `oculis bench run --save` file" in capsys.readouterr().err


def test_an_unreachable_target_exits_5(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "run", "--route", "r", "--url", UNREACHABLE, "--duration", "1s"]) == 5
    err = capsys.readouterr().err
    assert f"--url {UNREACHABLE}: target unreachable" in err and err.count("\n") == 1


def _doc(simulated: bool) -> dict[str, Any]:
    rs = [RequestResult(i, float(i), ok=True, ttft_s=0.05, e2e_s=0.5, output_tokens=10, simulated=simulated)
          for i in range(5)]
    wl = {"profile": "chat", "dataset_hash": "sha256:x", "seed": 42, "route": "r", "duration_s": 5.0,
          "warmup_s": 0.0, "load": {"concurrency": 2}}
    return {"verdict": None, "reasons": [], "simulated": simulated, "workload": wl, "workload_hash": "f",
            "current": summarize(rs, 5.0), "baseline": None, "delta": None, "slos": [], "warnings": []}


@pytest.mark.parametrize("simulated", [True, False])
def test_table_and_csv_say_simulated_exactly_when_the_answers_were(simulated: bool) -> None:
    table, sheet = io.StringIO(), io.StringIO()
    render_table(_doc(simulated), table)
    render_csv(_doc(simulated), sheet)
    assert table.getvalue().startswith("SIMULATED") is simulated
    assert ("(simulated)" in table.getvalue()) is simulated
    rows = list(csv.DictReader(io.StringIO(sheet.getvalue())))
    assert rows and {r["simulated"] for r in rows} == {str(simulated).lower()}
    assert next(r for r in rows if r["metric"] == "ttft_ms.p50")["current"] == "50.0"


def test_progress_is_a_plain_line_every_5_s_when_piped_and_nothing_when_off() -> None:
    from oculis_cli.bench import ProgressView

    piped = io.StringIO()  # not a terminal: no bar, no escape codes
    view = ProgressView(20, enabled=True, stream=piped)
    for t in (0.0, 2.0, 5.0, 6.0, 10.5):
        view.update(t, sent=int(t), done=0, inflight=1, phase="measuring")
    view.close()
    assert piped.getvalue().splitlines() == [
        "oculis bench run:     5s/20s measuring: 5 sent, 0 done, 1 in flight",
        "oculis bench run:    10s/20s measuring: 10 sent, 0 done, 1 in flight"]
    off = io.StringIO()
    quiet = ProgressView(20, enabled=False, stream=off)
    quiet.update(10, 1, 1, 0, "measuring")
    assert off.getvalue() == ""


def _sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (b"data: [DONE]\n\n" if done
                                                                                     else b"")


def _run_one(body: bytes, status: int = 200, salt: str = "", headers: dict[str, str] | None = None,
             ) -> tuple[RequestResult, list[dict[str, Any]]]:
    import asyncio

    import httpx

    from oculis_measure.bench.load import one_request as _one
    from oculis_measure.bench.workload import PlannedRequest

    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(status, content=body, headers={"content-type": "text/event-stream", **(headers or {})})

    req = PlannedRequest([{"role": "system", "content": "shared"}, {"role": "user", "content": "hi"}], 3, 0, 0)
    result = RequestResult(0, 0.0)

    async def go() -> None:
        async with httpx.AsyncClient(base_url="http://t", transport=httpx.MockTransport(handler)) as client:
            await _one(client, "r", req, result, 0.0, 10.0, salt)

    asyncio.run(go())
    return result, sent


def test_a_stream_gives_ttft_gaps_usage_and_the_simulator_mark() -> None:
    def chunk(text: str) -> dict[str, Any]:
        return {"system_fingerprint": "oculis-simulator", "choices": [{"delta": {"content": text}}]}

    usage = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3,
                                      "prompt_tokens_details": {"cached_tokens": 4}}}
    r, sent = _run_one(_sse({"choices": [{"delta": {"role": "assistant"}}]}, chunk("a"), chunk(" b"), chunk(" c"),
                            usage), headers={"x-oculis-upstream": "llama-8b"})
    assert r.ok and r.error is None and r.simulated and r.upstream == "llama-8b"
    assert r.ttft_s is not None and len(r.itl_s) == 2  # the role chunk carries no content: not the first token
    assert (r.output_tokens, r.prompt_tokens, r.cached_tokens) == (3, 9, 4)
    assert sent[0]["model"] == "r" and sent[0]["stream"] and sent[0]["stream_options"] == {"include_usage": True}
    assert sent[0]["messages"][0]["content"] == "shared"


def test_fresh_cache_salts_only_the_start_of_the_prompt() -> None:
    _, sent = _run_one(_sse({"choices": [{"delta": {"content": "x"}}]}), salt="run1234")
    assert [m["content"] for m in sent[0]["messages"]] == ["run1234 shared", "hi"]


@pytest.mark.parametrize(("body", "status", "kind"), [
    (b'{"error": {"message": "slow down"}}', 429, "http_429"),
    (_sse({"error": {"message": "upstream failed"}}), 200, "stream_error"),
    (_sse({"choices": [{"delta": {"content": "x"}}]}, done=False), 200, "stream_cut"),
    (b"data: {not json\n\n", 200, "bad_stream"),
])
def test_failed_answers_are_counted_by_kind(body: bytes, status: int, kind: str) -> None:
    r, _ = _run_one(body, status)
    assert not r.ok and r.error == kind


def test_unmetered_answers_are_estimated_from_their_text_never_zero() -> None:
    # a sibling of QA2 #4 in the load generator: an answer without usage was priced with 0 prompt tokens
    r, _ = _run_one(_sse({"choices": [{"delta": {"content": "a"}}]}, {"choices": [{"delta": {"content": " b"}}]}))
    assert r.ok and r.usage_estimated and (r.prompt_tokens, r.output_tokens) == (2, 2)  # "shared" + "hi"
    m = summarize([r], 1.0)
    assert m["usage_estimated"] == 1 and m["input_tokens"] == 2
