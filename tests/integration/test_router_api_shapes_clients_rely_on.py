"""API shapes code written against OpenAI relies on, behind the router (QA pass 2, findings 7 and 15):
a stream ends with the usage chunk (`choices: []`) only when the client asked for it with
`stream_options.include_usage`, live, replayed from the cache, buffered for an answer check, or
translated from Anthropic, so the openai SDK idiom `for chunk in s: chunk.choices[0].delta.content`
works everywhere; and `n` choices reach a client where the router can pass `n` through. The real
router over real HTTP, driven by the openai SDK."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import eventually
from router_support import Fakes, RouterHandle


@pytest.fixture
def checked(router: RouterHandle, fakes: Fakes) -> RouterHandle:
    """The fakes' config plus a route whose streams are buffered for the logprob check."""
    cfg = fakes.config()
    cfg["oculis"]["routes"].append({
        "name": "checked",
        "tiers": [{"name": "small", "match": {"complexity_below": 0.99}, "upstream": "llama-8b"},
                  {"name": "big", "upstream": "llama-70b"}],
        "escalation": {"on_low_confidence": False, "on_answer": {"min_mean_logprob": -1.0, "buffer_streams": True}}})
    router.write(cfg)
    eventually(lambda: "checked" in router.app.state.holder.current.routes, timeout=10, interval=0.05,
               what="the config with the buffered route to apply")
    fakes.scripts["small"].give_logprobs = True
    fakes.scripts["small"].logprob = -0.1  # a confident answer: kept, not replaced
    return router


# (model, extra request fields): live from a route and from an upstream named directly, a cache
# replay (the second of two identical temperature-0 requests), a buffered stream, an Anthropic stream.
WAYS = {
    "route": ("adaptive", {}),
    "direct upstream": ("llama-70b", {}),
    "cache replay": ("adaptive", {"temperature": 0}),
    "buffered": ("checked", {}),
    "anthropic": ("via-claude", {}),
}


def chunks_of(router: RouterHandle, model: str, extra: dict[str, Any], **opts: Any) -> list[Any]:
    return list(router.client.chat.completions.create(
        model=model, stream=True, messages=[{"role": "user", "content": "hi"}], **extra, **opts))


@pytest.mark.parametrize("way", list(WAYS), ids=list(WAYS))
def test_the_usage_chunk_comes_only_when_the_client_asked(checked: RouterHandle, way: str) -> None:
    model, extra = WAYS[way]
    for opts in ({}, {"stream_options": {"include_usage": False}}):  # the first of them stores the cache entry
        chunks = chunks_of(checked, model, extra, **opts)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)  # the idiom: IndexError before
        assert text.strip() and not any(c.usage for c in chunks), (way, opts)
    if way == "cache replay":
        raw = checked.client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True, **extra)
        assert raw.headers["x-oculis-cache"] == "hit"
        list(raw.parse())
    chunks = chunks_of(checked, model, extra, stream_options={"include_usage": True})
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0, way
    assert all(c.choices for c in chunks[:-1])


def test_completions_streams_carry_usage_only_when_asked(router: RouterHandle) -> None:
    s = router.client.completions.create(model="adaptive", prompt="Say hi", stream=True)
    assert "".join(c.choices[0].text for c in s).strip()
    s = router.client.completions.create(model="adaptive", prompt="Say hi", stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(s)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_n_choices_pass_through_where_the_router_can_keep_them(checked: RouterHandle, fakes: Fakes) -> None:
    """QA pass 2, finding 15: `n` was refused everywhere. vLLM and OpenAI answer `n` choices (best-of,
    self-consistency), so it passes through to an upstream named directly and to routes, streamed or not;
    a route that checks answers (judged and replaced one choice at a time) and an Anthropic tier (one
    choice per request) refuse it by name."""
    for model in ("llama-70b", "adaptive"):
        whole = checked.client.chat.completions.create(model=model, n=3, messages=[{"role": "user", "content": "hi"}])
        assert [c.index for c in whole.choices] == [0, 1, 2] and all(c.message.content for c in whole.choices)
        texts: dict[int, str] = {}
        for chunk in checked.client.chat.completions.create(model=model, n=2, stream=True,
                                                            messages=[{"role": "user", "content": "hi"}]):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        assert sorted(texts) == [0, 1] and texts[0] == texts[1] != ""
    assert fakes.scripts["large"].received[0]["n"] == 3  # passed through as sent
    import openai

    for model in ("checked", "via-claude"):
        with pytest.raises(openai.BadRequestError) as err:
            checked.client.chat.completions.create(model=model, n=2, messages=[{"role": "user", "content": "hi"}])
        assert err.value.param == "n" or "choice" in str(err.value), model
