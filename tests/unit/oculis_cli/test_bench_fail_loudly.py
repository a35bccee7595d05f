"""`oculis bench run` against a real HTTP server (a tiny OpenAI-compatible fake in a thread): base URLs
with or without /v1 reach the same server; a run whose requests all fail alike stops early with one line
naming the cause and the fix and a documented exit code (QA2 #16, issue 21's wrong-URL run); each run's
prompts are its own unless the profile asks to share them, and --compare says when they were not."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from oculis_cli.bench import ProgressView
from oculis_cli.main import main


class Fake:
    """What the server answers (`mode`: ok, e500) and what it saw (paths, first messages)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.key: str | None = None
        self.paths: list[str] = []
        self.firsts: list[str] = []


@pytest.fixture
def fake() -> Iterator[tuple[Fake, str]]:
    state = Fake()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": "m"}]}).encode())
            else:
                self._send(404, b'{"detail": "Not Found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            state.paths.append(self.path)
            if self.path != "/v1/chat/completions":
                self._send(404, b'{"detail": "Not Found"}')
                return
            if state.key and self.headers.get("authorization") != f"Bearer {state.key}":
                self._send(401, b'{"error": {"message": "missing or invalid API key"}}')
                return
            if state.mode == "e500":
                self._send(500, b'{"error": {"message": "engine crashed"}}')
                return
            state.firsts.append(body["messages"][0]["content"])
            chunks = [{"choices": [{"delta": {"content": "hi"}}]},
                      {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}]
            sse = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
            self._send(200, sse, "text/event-stream")

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that stopped early resets its connections: not the test's output

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def bench(url: str, *extra: str) -> list[str]:
    return ["bench", "run", "--route", "m", "--url", url, "--no-progress", "--rate", "30", "--duration", "1s",
            "--warmup", "0s", "--profile", "chat", *extra]


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_one_line_errors_and_exit_codes_base_urls_with_or_without_v1(
        fake: tuple[Fake, str], suffix: str, capsys: pytest.CaptureFixture[str]) -> None:
    state, url = fake
    assert main(bench(url + suffix, "-o", "json")) == 0
    assert set(state.paths) == {"/v1/chat/completions"}
    assert json.loads(capsys.readouterr().out)["current"]["requests"]["failed"] == 0


@pytest.mark.parametrize(("setup", "extra", "code", "says"), [
    ({"url": "/api"}, [], 2, ["requests all failed: HTTP 404 from", "/api/v1/chat/completions",
                              "(the server said: Not Found)", "--url path or the --route is wrong"]),
    ({"key": "secret"}, [], 2, ["HTTP 401", "missing or invalid API key", "pass --api-key-env VAR"]),
    ({"key": "secret"}, ["--api-key-env", "OCULIS_TEST_WRONG_KEY"], 2, ["the key in $OCULIS_TEST_WRONG_KEY was "
                                                                          "refused"]),
    ({"mode": "e500"}, [], 5, ["HTTP 500", "engine crashed", "see its logs"]),
])
def test_one_line_errors_and_exit_codes_a_run_failing_alike_stops_early(
        fake: tuple[Fake, str], setup: dict[str, str], extra: list[str], code: int, says: list[str],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    state, url = fake
    state.key, state.mode = setup.get("key"), setup.get("mode", "ok")
    monkeypatch.setenv("OCULIS_TEST_WRONG_KEY", "wrong")
    assert main(bench(url + setup.get("url", ""), "--duration", "10s", *extra)) == code
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("oculis bench run: ") and err.count("\n") == 1, err
    assert all(s in err for s in says), err
    assert len(state.paths) < 100  # stopped after the first failures, not 300 requests later


def test_progress_draws_on_stderr_not_on_stdout() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    view = ProgressView(10, enabled=True, stream=err)
    view.update(5.0, 3, 2, 1, "measuring")
    view.close()
    assert "measuring: 3 sent" in err.getvalue()


def test_each_run_salts_its_prompts_unless_the_profile_shares_them(
        fake: tuple[Fake, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state, url = fake
    base = tmp_path / "base.json"
    assert main(bench(url, "--save", str(base), "-o", "json")) == 0
    first = set(state.firsts)
    state.firsts.clear()
    doc = json.loads(capsys.readouterr().out)
    assert doc["fresh_cache"] is True and doc["workload"]["salted"] is True
    assert main(bench(url, "--compare", str(base), "-o", "json")) in (0, 3, 4)  # 30 requests: may not settle
    assert not first & set(state.firsts)  # the second run cannot hit the first run's prefixes
    # a baseline whose prompts were not salted is not like with like
    assert main(bench(url, "--no-fresh-cache", "--compare", str(base), "-o", "json")) == 4
    capsys.readouterr()
    shared = tmp_path / "shared.yaml"
    shared.write_text("prompt: {median: 20}\noutput: {median: 5}\ncross_run_prefixes: true\n")
    state.firsts.clear()
    assert main(bench(url, "--profile", str(shared), "-o", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fresh_cache"] is False and not any(f.startswith("run") for f in state.firsts)
    assert main(bench(url, "--profile", str(shared), "--compare", str(base), "-o", "table")) == 4
    out = capsys.readouterr().out
    assert "prompts not salted" in out and "salted True vs False" in out


def test_the_html_report_is_readable_tables_log_latency_axes_and_clipped_deltas(
        fake: tuple[Fake, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, url = fake
    base, page = tmp_path / "base.json", tmp_path / "report.html"
    assert main(bench(url, "--save", str(base), "-o", "json")) == 0
    main(bench(url, "--compare", str(base), "--report", str(page), "-o", "json"))
    capsys.readouterr()
    text = page.read_text()
    assert "<table" in text and "<td>ttft_ms.p95</td>" in text  # the CLI's comparison table, not a JSON dump
    assert '"type":"log"' in text.replace(" ", "")  # latency CDFs on log axes
    assert "bars clipped at +\\u002f-100" in text and "seconds from the run" in text
    assert "<details><summary>raw JSON" in text and "prompts</b>: salted for this run" in text


def test_one_line_errors_and_exit_codes_eval_online_whose_every_item_is_refused(
        fake: tuple[Fake, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a sibling of the wrong-URL bench run: not "N bad suite lines", one line naming the cause and fix
    state, url = fake
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"prompt": f"q{i}", "expected": "x"}) + "\n" for i in range(3)))
    seed = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"
    args = ["eval", "run", "--config", str(seed), "--route", "adaptive", "--suite", str(suite)]
    assert main([*args, "--url", url + "/api"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "every request failed (3 of 3): HTTP 404" in err and "--url path" in err
    state.key = "secret"
    assert main([*args, "--url", url + "/v1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HTTP 401" in err and "pass --api-key-env VAR" in err
