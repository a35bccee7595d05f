"""The router's token ids for an upstream that names its tokenizer: the model's chat template rendered as
vLLM renders it (checked here on hand-written expectations; against real vLLM in
tests/realengine/test_router_kv_events_real.py), the completions forms, the fallback to text hashing,
the config errors, and the kv-events picker matching blocks keyed by an engine's token ids."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from oculis import ConfigError, parse_config
from oculis_router import model_tokens
from oculis_router.metrics import Metrics
from oculis_router.pick import Fleet, Pool, Replica, Tokenized, pick_request
from oculis_router.picking import BlockStored, EventBatch, approx_token_ids, block_hashes, chat_parts
from oculis_router.state import ConfigHolder

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
          "{{ (message['content'] if message['content'] is string else '') + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
PARTS = ("{{ bos_token }}{% for message in messages %}{{ message['role'] }}:"
         "{% for part in message['content'] %}[{{ part['text'] }}]{% endfor %}\n{% endfor %}")  # trim_blocks eats \n
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_tokenizer(where: Path, config: dict[str, object]) -> Path:
    """A small byte-level BPE (as the tiny model's), trained on a few lines, with ChatML's special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["def f(x): return x * 2", "the system prompt says hello to the user", "import os\nimport sys"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    where.mkdir(parents=True, exist_ok=True)
    tok.save(str(where / "tokenizer.json"))
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return where


@pytest.fixture
def chatml(tmp_path: Path) -> model_tokens.ModelTokens:
    return model_tokens.load(str(write_tokenizer(tmp_path / "chatml", {"chat_template": CHATML,
                                                                        "eos_token": "<|im_end|>"})))


def encode(mt: model_tokens.ModelTokens, text: str) -> list[int]:
    return mt.tokenizer.encode(text, add_special_tokens=False).ids


def test_a_chat_is_the_template_rendered_then_tokenized_with_its_special_tokens_whole(
        chatml: model_tokens.ModelTokens) -> None:
    body = {"messages": [{"role": "system", "content": "the system prompt"},
                         {"role": "user", "content": [{"type": "text", "text": "hello"},
                                                      {"type": "image_url", "image_url": {"url": "x"}},
                                                      {"type": "text", "text": "to the user"}]}]}
    text = ("<|im_start|>system\nthe system prompt<|im_end|>\n<|im_start|>user\nhello\nto the user<|im_end|>\n"
            "<|im_start|>assistant\n")
    ids = chatml.chat_ids(body)
    assert ids == encode(chatml, text)
    start = chatml.tokenizer.token_to_id("<|im_start|>")
    assert ids is not None and ids[0] == start and ids.count(start) == 3  # one token each, never split
    closed = chatml.chat_ids({**body, "add_generation_prompt": False})
    assert closed == encode(chatml, text.removesuffix("<|im_start|>assistant\n"))


def test_messages_keep_only_what_vllm_passes_and_developer_turns_system_where_the_template_lacks_it(
        chatml: model_tokens.ModelTokens) -> None:
    body = {"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "x", "extra": 1},
                         {"role": "developer", "content": [{"type": "text", "text": "b"}]}]}
    text = "<|im_start|>system\na\n\nb<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert chatml.chat_ids(body) == encode(chatml, text)
    assert chatml._message({"role": "user", "content": "x", "extra": 1, "name": "n"}) == \
        {"role": "user", "content": "x", "name": "n"}


def test_a_template_that_loops_over_content_gets_parts_and_the_special_tokens(tmp_path: Path) -> None:
    mt = model_tokens.load(str(write_tokenizer(tmp_path / "parts", {"chat_template": [
        {"name": "tool_use", "template": "unused"}, {"name": "default", "template": PARTS}],
        "bos_token": {"content": "<|endoftext|>", "special": True}})))
    assert mt.openai_content
    ids = mt.chat_ids({"messages": [{"role": "user", "content": "a"},
                                    {"role": "user", "content": [{"type": "text", "text": "b"},
                                                                 {"type": "text", "text": "c"}]}]})
    assert ids == encode(mt, "<|endoftext|>user:[a]user:[b][c]")


def test_chat_template_jinja_beside_the_tokenizer_wins_and_the_generation_tag_renders(tmp_path: Path) -> None:
    where = write_tokenizer(tmp_path / "jinja", {"chat_template": CHATML})
    (where / "chat_template.jinja").write_text(
        "{% for m in messages %}{% generation %}{{ m.role }}={{ m.content | trim }};{% endgeneration %}"
        "{% endfor %}{{ {'k': 'é'} | tojson }}")
    mt = model_tokens.load(str(where / "tokenizer.json"))
    assert mt.chat_ids({"messages": [{"role": "user", "content": " hi "}]}) == encode(mt, 'user=hi;{"k": "é"}')


def test_completions_add_special_tokens_unless_told_and_take_token_ids_as_given(
        chatml: model_tokens.ModelTokens) -> None:
    assert chatml.completion_ids({"prompt": "import os"}) == chatml.tokenizer.encode("import os").ids
    assert chatml.completion_ids({"prompt": "import os", "add_special_tokens": False}) == encode(chatml, "import os")
    assert chatml.completion_ids({"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert chatml.completion_ids({"prompt": ["import os", "import sys"]}) == chatml.tokenizer.encode("import os").ids
    assert chatml.completion_ids({"prompt": {"not": "a prompt"}}) is None


def test_a_request_the_template_refuses_is_hashed_as_text(tmp_path: Path) -> None:
    mt = model_tokens.load(str(write_tokenizer(tmp_path / "strict", {"chat_template":
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "{{ m.content }}{% endfor %}"})))
    body = {"messages": [{"role": "tool", "content": "x " * 40}]}
    assert mt.chat_ids(body) is None
    req = pick_request(body, "chat", 4, tokens=mt)
    ids = approx_token_ids(chat_parts(body["messages"]))
    assert req.prompt_tokens == len(ids) and req.block_hashes == block_hashes(ids, 4)


def test_the_config_refuses_a_relative_or_missing_tokenizer_in_one_line(tmp_path: Path) -> None:
    up = {"name": "tiny", "provider": "vllm", "endpoints": ["http://127.0.0.1:9/v1"], "model": "m"}
    route = [{"name": "r", "tiers": [{"name": "a", "upstream": "tiny"}]}]
    with pytest.raises(ConfigError, match="tokenizer 'models/tiny' is not an absolute path"):
        parse_config(yaml.safe_dump({"oculis": {"upstreams": [{**up, "tokenizer": "models/tiny"}], "routes": route}}))
    with pytest.raises(ConfigError, match="provider openai has none, remove tokenizer"):
        parse_config(yaml.safe_dump({"oculis": {"upstreams": [
            {"name": "gpt", "provider": "openai", "model": "m", "tokenizer": "/x"}], "routes": route}}))
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {"upstreams": [{**up, "tokenizer": str(tmp_path / "none")}],
                                              "routes": route}}))
    with pytest.raises(ConfigError) as err:
        ConfigHolder(cfg, Metrics())
    msg = str(err.value)
    assert msg.startswith("upstreams[0] (tiny).tokenizer: ") and "has no tokenizer.json" in msg and "\n" not in msg


def test_a_reload_naming_a_tokenizer_not_mounted_is_refused_keeps_the_last_good_config_and_applies_once_it_lands(
        tmp_path: Path) -> None:
    """In a cluster the operator renders spec.routing.tokenizer without seeing the router pod's files: a path
    not (yet) mounted there is the router's one-line rejection, the config in force keeps serving, and the
    same file applies on the next tick after the tokenizer appears (a volume populated late)."""
    up = {"name": "tiny", "provider": "vllm", "endpoints": ["http://127.0.0.1:9/v1"], "model": "m"}

    def write(route: str, **extra: str) -> None:
        routes = [{"name": route, "tiers": [{"name": "a", "upstream": "tiny"}]}]
        cfg.write_text(yaml.safe_dump({"oculis": {"upstreams": [{**up, **extra}], "routes": routes}}))

    cfg = tmp_path / "oculis-config.yaml"
    write("first")
    holder = ConfigHolder(cfg, Metrics())
    where = tmp_path / "tokenizers" / "tiny"
    write("second", tokenizer=str(where))
    holder.tick()
    assert set(holder.current.routes) == {"first"} and holder.rejected is not None
    reason = holder.rejected.reason
    assert reason.startswith("upstreams[0] (tiny).tokenizer: ") and "has no tokenizer.json" in reason
    assert str(where) in reason and "\n" not in reason
    holder.tick()
    assert set(holder.current.routes) == {"first"}  # nothing changed: still refused, not retried in a loop
    write_tokenizer(where, {"chat_template": CHATML})
    holder.tick()
    assert set(holder.current.routes) == {"second"} and holder.rejected is None
    assert holder.current.config.upstreams[0].tokenizer == str(where)

    # --wait-for-config: the first config naming a missing tokenizer is "not ready", naming why, until it lands
    late = tmp_path / "late"
    write("third", tokenizer=str(late))
    waiting = ConfigHolder(cfg, Metrics(), wait_for_file=True)
    assert waiting.waiting and waiting.rejected is not None and "has no tokenizer.json" in waiting.rejected.reason
    write_tokenizer(late, {"chat_template": CHATML})
    waiting.tick()
    assert not waiting.waiting and set(waiting.current.routes) == {"third"}


def test_a_tokenizer_replaced_in_place_is_reloaded_and_a_broken_replacement_keeps_the_previous_one(
        tmp_path: Path) -> None:
    """A ConfigMap or volume updated under the same path (a new model's chat template, say): the router
    loads it on its next tick, as it does a replaced classifier head; one that does not load is a
    rejection and the tokenizer in force keeps serving."""
    where = write_tokenizer(tmp_path / "tok", {"chat_template": CHATML})
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {"upstreams": [
        {"name": "tiny", "provider": "vllm", "endpoints": ["http://127.0.0.1:9/v1"], "model": "m",
         "tokenizer": str(where)}], "routes": [{"name": "r", "tiers": [{"name": "a", "upstream": "tiny"}]}]}}))
    metrics = Metrics()
    holder = ConfigHolder(cfg, metrics)
    body = {"messages": [{"role": "user", "content": "import os"}]}
    before = model_tokens.load(str(where)).chat_ids(body)
    holder.tick()
    assert model_tokens.load(str(where)).chat_ids(body) == before  # nothing changed: the same one
    (where / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}!"}))
    holder.tick()
    after = model_tokens.load(str(where)).chat_ids(body)
    assert after != before and after == encode(model_tokens.load(str(where)), "import os!")
    assert metrics.registry.get_sample_value("oculis_config_reloads_total", {"result": "applied"}) == 1
    (where / "tokenizer_config.json").write_text("{not json")
    holder.tick()
    assert metrics.registry.get_sample_value("oculis_config_reloads_total", {"result": "rejected"}) == 1
    assert model_tokens.load(str(where)).chat_ids(body) == after  # the last good one keeps serving
    holder.tick()
    assert metrics.registry.get_sample_value("oculis_config_reloads_total", {"result": "rejected"}) == 1  # said once


def test_kv_events_match_the_engines_token_ids_only_through_the_tokenizer(
        chatml: model_tokens.ModelTokens) -> None:
    """An engine's BlockStored carries the prompt's real token ids (chat template applied); the router's
    keys equal them when it tokenizes as the model does, and never when it hashes text."""
    bs = 8
    system = {"role": "system", "content": "the system prompt says hello to the user " * 6}
    first = {"messages": [system, {"role": "user", "content": "def f(x): return x * 2"}], "max_tokens": 4}
    engine_ids = chatml.chat_ids(first)
    assert engine_ids is not None and len(engine_ids) >= 4 * bs
    full = len(engine_ids) // bs
    stored = BlockStored(tuple(range(100, 100 + full)), None, tuple(engine_ids[:full * bs]), bs)
    later = {"messages": [system, {"role": "user", "content": "import os"}], "max_tokens": 4}
    for tokenizer, expect_hit in ((chatml, True), (None, False)):
        pool = Pool("tiny", "kv-events", Metrics())
        pool.sync([Replica("a", "http://127.0.0.1:9001/v1"), Replica("b", "http://127.0.0.1:9002/v1")])
        pool.picker.apply_events("a", EventBatch(0.0, (stored,)))
        pool.picker.apply_events("b", EventBatch(0.0, ()))
        assert pool.block_size() == bs  # not scraped yet: the events' block size
        lease = pool.lease(later, "chat", "stable", set(), tokenizer=tokenizer)
        assert lease is not None
        if expect_hit:
            assert (lease.replica.id, lease.pick.reason) == ("a", "prefix") and lease.pick.cached_blocks >= 3
        else:
            assert lease.pick.cached_blocks == 0 and lease.pick.reason != "prefix"
        lease.release()


def test_a_long_prompt_is_tokenized_in_a_worker_thread_with_the_same_ids_and_the_same_pick(
        chatml: model_tokens.ModelTokens, monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoding a long prompt takes milliseconds of the router's event loop: over OFF_LOOP_CHARS it runs in a
    worker thread (encode_batch, which lets go of the GIL), below inline; the ids, and so the pick, are the
    same either way, for chats, completions and a request the template refuses."""
    system = {"role": "system", "content": "the system prompt says hello to the user " * 60}
    parts = [{"type": "text", "text": "def f(x): return x * 2"}]
    long_chat = {"messages": [system, {"role": "user", "content": parts}]}
    short_chat = {"messages": [{"role": "user", "content": "import os"}]}
    long_prompt = {"prompt": "import os\nimport sys\n" * 200}
    unrendered = {"messages": "not a list", "max_tokens": 8}  # no ids: its text is hashed
    assert model_tokens.prompt_chars(long_chat) > model_tokens.OFF_LOOP_CHARS > model_tokens.prompt_chars(short_chat)
    assert model_tokens.prompt_chars(long_prompt) > model_tokens.OFF_LOOP_CHARS
    threads: list[tuple[bool, int]] = []
    real = model_tokens.ModelTokens.ids

    def recorded(self: model_tokens.ModelTokens, body: dict[str, Any], chat: bool, release_gil: bool = False) -> Any:
        threads.append((release_gil, threading.get_ident()))
        return real(self, body, chat, release_gil)

    monkeypatch.setattr(model_tokens.ModelTokens, "ids", recorded)

    async def both(body: dict[str, Any], chat: bool) -> tuple[list[int] | None, list[int] | None, int]:
        off = await model_tokens.prompt_ids(chatml, body, chat)
        return off, real(chatml, body, chat), threading.get_ident()

    for body, chat, off_loop in ((long_chat, True, True), (long_prompt, False, True), (short_chat, True, False)):
        threads.clear()
        got, inline, loop_thread = asyncio.run(both(body, chat))
        assert got is not None and got == inline  # encode_batch in a thread == encode on the loop
        assert threads == [(off_loop, threads[0][1])] and (threads[0][1] != loop_thread) is off_loop
    assert chatml.ids(long_chat, True, release_gil=True) == chatml.ids(long_chat, True)
    for k in (True, False):
        assert chatml.completion_ids({**long_prompt, "add_special_tokens": k}, release_gil=True) == \
            chatml.completion_ids({**long_prompt, "add_special_tokens": k})

    fleet = Fleet(Metrics())
    up = parse_config(yaml.safe_dump({"oculis": {"upstreams": [{
        "name": "tiny", "provider": "vllm", "model": "m", "picker": "prefix", "tokenizer": chatml.path,
        "endpoints": ["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"]}], "routes": []}})).upstreams[0]
    fleet.sync({"tiny": ("prefix", [Replica("a", "http://127.0.0.1:9001/v1"), Replica("b", "http://127.0.0.1:9002/v1")])})
    for body in (long_chat, short_chat, unrendered):
        tokenized = asyncio.run(fleet.tokenize(up, body, "chat"))
        assert tokenized == Tokenized(chatml.chat_ids(body)) and (tokenized.ids is None) is (body is unrendered)
        ahead = pick_request(body, "chat", 16, tokenized=tokenized)
        assert ahead == pick_request(body, "chat", 16, tokens=chatml)
        lease = fleet.lease(up, body, "chat", "stable", set(), tokenized)
        assert lease is not None and lease.pick.reason in ("load", "prefix")
        lease.release()
    fleet.sync({"tiny": ("least-loaded", [Replica("a", "http://127.0.0.1:9001/v1")])})
    assert asyncio.run(fleet.tokenize(up, long_chat, "chat")) is None  # a strategy blind to prefixes: nothing to do
