"""Error texts that hid their useful part (QA3 Part 2 #24): `bench run` quoted a server's message cut
mid-word after 160 characters, so the router's 503 lost its fix ("load it on the engines (vLLM --lora-m): the
target failed"). The quote is now whole words, long enough for the router's messages, and marked where cut.
(The router's own 502 naming the address refused is tests/integration/test_router_error_names_every_tier_s_failure.)"""

from __future__ import annotations

import json

from oculis_measure.bench.failures import diagnose, error_text

ROUTER_503 = ("no replica of upstream qwen lists adapter 'sql' (declared, not loaded yet): the engines' /v1/models "
              "list none of it; load it on the engines (vLLM --lora-modules sql=PATH at start, or POST "
              "/v1/load_lora_adapter with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); if a GPUUpstream manages qwen, "
              "kubectl get gu qwen shows its ADAPTERS (retry after Retry-After)")


def test_the_server_s_message_is_quoted_whole_with_its_fix() -> None:
    detail = error_text(json.dumps({"error": {"message": ROUTER_503}}).encode())
    assert detail == ROUTER_503
    line = diagnose("http_503", 8, 8, "http://127.0.0.1:8080", "chat/sql", None, detail, early=True).line
    assert "--lora-modules sql=PATH" in line and "kubectl get gu qwen" in line, line


def test_a_message_too_long_is_cut_between_words_and_says_so() -> None:
    words = " ".join(f"word{i}" for i in range(300))
    line = diagnose("http_500", 3, 3, "http://127.0.0.1:8080", "chat", None, words).line
    quoted = line.split("(the server said: ", 1)[1].split(")", 1)[0]
    assert quoted.endswith(" [...]") and all(w.startswith("word") and w[4:].isdigit()
                                             for w in quoted.removesuffix(" [...]").split())
