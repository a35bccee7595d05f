"""`oculis bench run --save/--report` to a path that cannot be written is refused before the first request
(QA3 Part 2 #9): it was found only after the whole run, and the run's results were thrown away with it.
Also: `bench run --help` printed `5%%` (#15). A real HTTP server counts what reached it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from oculis_cli.main import main


@pytest.fixture
def target() -> Iterator[tuple[list[str], str]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()

        do_POST = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield seen, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("flag", "where", "says"), [
    ("--save", "missing/x.json", "its folder"), ("--report", "missing/x.html", "its folder"),
    ("--save", "", "is a directory"), ("--report", "", "is a directory")])
def test_an_unwritable_output_is_refused_before_any_request(
        target: tuple[list[str], str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        flag: str, where: str, says: str) -> None:
    seen, url = target
    path = tmp_path / where if where else tmp_path
    code = main(["bench", "run", "--no-progress", "--url", url, "--route", "chat", "--profile", "chat",
                 "--duration", "2s", "--concurrency", "2", flag, str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{flag} {path}" in err and says in err, err
    assert seen == []  # nothing was sent: the run never started


def test_bench_run_help_shows_a_single_percent_sign(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "run", "--help"])
    text = capsys.readouterr().out
    assert "5% cut at the drain" in " ".join(text.split()) and "%%" not in text
