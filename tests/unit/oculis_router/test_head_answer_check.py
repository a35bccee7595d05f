"""escalation.on_answer's pure parts: which tiers are checked, what they are asked, how sure an answer is."""

from __future__ import annotations

from oculis import parse_config
from oculis_router import answer_check as ac

CONFIG = """
oculis:
  upstreams:
    - {name: small, provider: vllm, base_url: "http://127.0.0.1:9/v1", model: m}
    - {name: hosted, provider: openai, model: gpt-4o, api_key_env: K}
  routes:
    - name: r
      escalation: {on_answer: {min_mean_logprob: -1.0}}
      tiers: [{name: a, match: {complexity_below: 0.5}, upstream: small}, {name: b, upstream: hosted},
              {name: c, upstream: small}]
"""


def test_only_self_hosted_tiers_with_a_tier_after_them_are_checked() -> None:
    cfg = parse_config(CONFIG.replace("{name: c, upstream: small}", ""), "x").routes[0]
    ups = {u.name: u for u in parse_config(CONFIG, "x").upstreams}
    assert ac.check_for(cfg, ups["small"], 0, 2) is not None
    assert ac.check_for(cfg, ups["hosted"], 0, 2) is None  # hosted providers are not asked
    assert ac.check_for(cfg, ups["small"], 1, 2) is None  # the last tier has nothing to escalate to
    assert ac.check_for(None, ups["small"], 0, 2) is None


def test_logprobs_are_asked_in_each_endpoints_spelling_and_client_choices_kept() -> None:
    assert ac.with_logprobs({"model": "r"}, "chat")["logprobs"] is True
    assert ac.with_logprobs({"model": "r"}, "completions")["logprobs"] == 1
    assert ac.with_logprobs({"logprobs": 5}, "completions")["logprobs"] == 5
    assert ac.client_wants_logprobs({"logprobs": 0}) and not ac.client_wants_logprobs({"logprobs": False})
    assert ac.unbuffered({"stream": True, "stream_options": {}, "model": "r"}) == {"model": "r"}


def test_mean_logprob_reads_chat_and_completions_and_judges_nothing_it_cannot_read() -> None:
    chat = {"choices": [{"logprobs": {"content": [{"logprob": -1.0}, {"logprob": -3.0}]}}]}
    assert ac.mean_logprob(chat, "chat") == -2.0
    text = {"choices": [{"logprobs": {"token_logprobs": [None, -0.5, -1.5]}}]}  # echo's first token has none
    assert ac.mean_logprob(text, "completions") == -1.0
    for data in ({}, {"choices": []}, {"choices": [{"logprobs": None}]}, {"choices": [{"logprobs": {"content": []}}]},
                 {"choices": ["x"]}, {"choices": [{"logprobs": {"content": [{"logprob": "nan"}]}}]}):
        assert ac.mean_logprob(data, "chat") is None
    stripped = ac.without_logprobs(chat)
    assert stripped["choices"][0]["logprobs"] is None and chat["choices"][0]["logprobs"] is not None
