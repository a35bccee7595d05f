"""A prompt's token ids as the engine computes them: the model's chat template rendered the way vLLM
renders it, then the model's own tokenizer. With them the router's block hashes equal the token ids in
vLLM's KV events (`BlockStored.token_ids`), so the `kv-events` picker matches the blocks a real engine
holds; hashing text (`picking.approx_token_ids`) can only match the simulator's events.

An upstream names its tokenizer in the config (`tokenizer: /abs/path`): a directory holding
`tokenizer.json` (and, for chat, `chat_template.jinja` or a `chat_template` in `tokenizer_config.json`,
as a Hugging Face model directory has them), or a `tokenizer.json` file. Loaded once per path when the
config is built (a missing or unreadable file is a config error naming the field).

What vLLM 0.32 does for a chat request, and what is done here likewise (`vllm/renderers/hf.py`,
`transformers/utils/chat_template_utils.py`):
- each message keeps its role, content and only the fields vLLM keeps (an assistant's tool calls and
  reasoning, a tool's call id, a name); developer messages become system ones, all system messages
  merged first, when the template does not name the developer role;
- each message's content becomes a string (text parts joined by newlines) when the template reads
  `message['content']` as a string, or a list of `{type: text, text}` parts when it loops over it
  (vLLM detects which from the template's syntax tree; this module looks for that loop);
- the template is rendered in jinja2's immutable sandbox with `trim_blocks`, `lstrip_blocks`, the
  loop-controls extension, transformers' `tojson` filter and `raise_exception`/`strftime_now`, given
  `messages`, `add_generation_prompt` (default true), `tools`, the tokenizer's special tokens
  (`bos_token`, `eos_token`, ...) and the request's `chat_template_kwargs`;
- the text is tokenized without adding special tokens (the template has them). A completions prompt is
  tokenized with them (`add_special_tokens`, default true, as vLLM's completions default); a prompt of
  token ids is taken as it is.
Not reproduced: images and other media parts (their placeholder tokens), `continue_final_message`
(rendered as a closed turn: only the last block can differ), and templates shipped only with a
multimodal processor. A template that raises (an unsupported role, say) makes `ids` return None: the
caller hashes text instead, and the engine gives the client its own error.

Why here rather than the engine's `/tokenize` per request: one more HTTP round trip to a busy engine's
API server before every pick (measured in tests/realengine/test_router_kv_events_real.py's summary).

Off the event loop: encoding a long prompt takes milliseconds (an 8,910-token chat ~7.8 ms), and
`Tokenizer.encode` holds the GIL throughout, so running it in a thread alone would still stall the loop;
`encode_batch` lets go of the GIL while the Rust code runs (same ids). `prompt_ids` runs a prompt over
`OFF_LOOP_CHARS` that way in a worker thread and a shorter one inline (a thread hop costs ~65 us).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

log = logging.getLogger("oculis.router")
# Prompts longer than this (characters of text, ~500 tokens, ~0.5 ms to encode) are tokenized in a worker
# thread; shorter ones inline, where the thread hop would cost more than it spares the loop.
OFF_LOOP_CHARS = 2048


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers' filter: jinja2's own escapes HTML characters, which would change the prompt
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a plain attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def loops_over_content(template: str) -> bool:
    """Whether the template iterates over a message's content (`for part in message['content']`): vLLM
    then passes content as a list of parts (its "openai" content format), else as one string."""
    try:
        tree = _environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    for loop in tree.find_all(jinja2.nodes.For):
        it = loop.iter
        while isinstance(it, jinja2.nodes.Filter) and it.node is not None:  # `message['content'] | list`
            it = it.node
        key = it.arg if isinstance(it, jinja2.nodes.Getitem) else None
        if isinstance(key, jinja2.nodes.Const) and key.value == "content":
            return True
        if isinstance(it, jinja2.nodes.Getattr) and it.attr == "content":
            return True
    return False


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """bos_token, eos_token, ... as the template sees them (strings, as transformers passes them)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if not key.endswith("_token"):
            continue
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _chat_template(where: Path, config: dict[str, Any]) -> str | None:
    """chat_template.jinja beside the tokenizer (transformers prefers it), else tokenizer_config's
    `chat_template` (a string, or a list of named templates: the one named `default`)."""
    jinja_file = where / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    tpl = config.get("chat_template")
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    return tpl if isinstance(tpl, str) else None


@dataclass
class ModelTokens:
    """One model's tokenizer and chat template, loaded from `path`."""

    path: str
    tokenizer: Tokenizer
    template: jinja2.Template | None
    openai_content: bool  # the template loops over content parts
    special: dict[str, str]
    developer_role: bool  # the template names the developer role (else vLLM makes it system)

    def ids(self, body: dict[str, Any], chat: bool, release_gil: bool = False) -> list[int] | None:
        """The prompt's ids: a chat's (chat_ids) or a completions prompt's (completion_ids). `release_gil`:
        encode without holding the GIL (for a worker thread, so the event loop runs meanwhile)."""
        return self.chat_ids(body, release_gil) if chat else self.completion_ids(body, release_gil)

    def _encode(self, text: str, add_special_tokens: bool, release_gil: bool) -> list[int]:
        if release_gil:  # encode_batch runs without the GIL (encode holds it); the same ids
            return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def chat_ids(self, body: dict[str, Any], release_gil: bool = False) -> list[int] | None:
        """The token ids vLLM prefills for this chat request; None when it cannot be rendered here."""
        messages = body.get("messages")
        if self.template is None or not isinstance(messages, list):
            return None
        conv = [self._message(m) for m in messages if isinstance(m, dict)]
        if not self.developer_role and any(m["role"] == "developer" for m in conv):
            conv = _developer_as_system(conv)
        kwargs = body.get("chat_template_kwargs")
        extra = {k: v for k, v in kwargs.items() if isinstance(k, str)} if isinstance(kwargs, dict) else {}
        agp = body.get("add_generation_prompt", True)
        try:
            text = self.template.render(**{**self.special, **extra, "messages": conv,
                                           "tools": body.get("tools"), "documents": body.get("documents"),
                                           "add_generation_prompt": agp is not False})
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError) as exc:
            log.debug("chat template of %s did not render this request (%s): hashing its text", self.path, exc)
            return None
        return self._encode(text, False, release_gil)

    def completion_ids(self, body: dict[str, Any], release_gil: bool = False) -> list[int] | None:
        """The token ids of a completions prompt: a string tokenized (special tokens added unless the request
        says not), token ids as given; the first of a batch."""
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
            prompt = prompt[0]  # a batch: the picker places the request by its first prompt
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str):
            return None
        return self._encode(prompt, body.get("add_special_tokens", True) is not False, release_gil)

    def _message(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The message as vLLM hands it to the template: role and content, and only the other fields it
        keeps (an assistant's tool calls and reasoning, a tool's call id, a name)."""
        role = msg.get("role")
        content = msg.get("content")
        if isinstance(content, str):
            texts: Sequence[str] = [content]
        elif isinstance(content, list):
            texts = [str(p.get("text", "")) for p in content
                     if isinstance(p, dict) and p.get("type", "text") == "text"]
        else:
            texts = []
        out: dict[str, Any] = {"role": role}
        if self.openai_content and role != "tool":  # vLLM flattens a tool's text parts for every template
            out["content"] = [{"type": "text", "text": t} for t in texts]
        else:
            out["content"] = "\n".join(texts)
        if role == "assistant":
            if msg.get("tool_calls") is not None:
                out["tool_calls"] = list(msg["tool_calls"])
            if msg.get("reasoning") is not None:
                out["reasoning"] = out["reasoning_content"] = msg["reasoning"]
        elif role == "tool" and "tool_call_id" in msg:
            out["tool_call_id"] = msg["tool_call_id"]
        for key in ("name", "task"):
            if isinstance(msg.get(key), str):
                out[key] = msg[key]
        if role == "developer":
            out["tools"] = msg.get("tools")
        return out


def _developer_as_system(conv: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM, for a template that does not name the developer role: developer messages become system ones,
    and all system messages are merged into one first message (texts joined by blank lines)."""
    conv = [{**{k: v for k, v in m.items() if k != "tools"}, "role": "system"} if m["role"] == "developer" else m
            for m in conv]
    systems = [i for i, m in enumerate(conv) if m["role"] == "system"]
    if not systems or systems == [0]:
        return conv
    texts = []
    for i in systems:
        c = conv[i].get("content", "")
        if isinstance(c, list):
            c = "\n".join(p["text"] for p in c if isinstance(p, dict) and "text" in p)
        if c:
            texts.append(c)
    return [{"role": "system", "content": "\n\n".join(texts)}, *(m for m in conv if m["role"] != "system")]


def prompt_chars(body: dict[str, Any]) -> int:
    """The characters of text in a request's prompt (messages' contents, or the completions prompt): what
    encoding it costs grows with."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) for p in prompt if isinstance(p, str))
    total, messages = 0, body.get("messages")
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(t) for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str))
    return total


async def prompt_ids(tokens: ModelTokens, body: dict[str, Any], chat: bool) -> list[int] | None:
    """`tokens.ids(body, chat)`, in a worker thread without the GIL when the prompt is over OFF_LOOP_CHARS,
    so a long prompt does not hold up the router's other requests; the same ids either way."""
    if prompt_chars(body) <= OFF_LOOP_CHARS:
        return tokens.ids(body, chat)
    return await asyncio.to_thread(tokens.ids, body, chat, True)


Stamps = tuple[tuple[int, int] | None, ...]  # (mtime, size) of each of files_read(path), None where absent
_LOADED: dict[str, tuple[Stamps | None, ModelTokens]] = {}


def files_read(path: str) -> tuple[Path, ...]:
    """The paths whose change can change what `load(path)` finds (the path itself, a directory's files)."""
    p = Path(path)
    return (p, *(p / name for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")))


def load(path: str, stamps: Stamps | None = None) -> ModelTokens:
    """The model's tokenizer at `path` (a directory with tokenizer.json, or the file), loaded once per path;
    `stamps` (a config build, state.py): its files' stamps now, loaded again when they differ from those
    it was loaded with (a ConfigMap or volume updated in place), the previous one kept when the new files
    do not load. ValueError with one line saying what is missing or wrong."""
    cached = _LOADED.get(path)
    if cached is not None and (stamps is None or cached[0] == stamps):
        return cached[1]
    p = Path(path)
    where = p if p.is_dir() else p.parent
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise ValueError(f"{path!r} has no tokenizer.json; give the model's directory (tokenizer.json, "
                         "tokenizer_config.json) or its tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust loader's own exception type is not exported
        raise ValueError(f"{file} is not a tokenizers tokenizer.json ({str(exc)[:120]})") from None
    config: dict[str, Any] = {}
    cfg_file = where / "tokenizer_config.json"
    if cfg_file.is_file():
        try:
            loaded = json.loads(cfg_file.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{cfg_file} is not JSON ({exc})") from None
        config = loaded if isinstance(loaded, dict) else {}
    source = _chat_template(where, config)
    if source is None:  # chats then hash as text, which never matches a real engine's KV events: say so once
        log.warning("tokenizer %s has no chat template (chat_template.jinja or tokenizer_config.json's "
                    "chat_template): chat requests are hashed as text, so kv-events cannot match a real engine "
                    "on them; put the engine's --chat-template file beside it as chat_template.jinja", path)
    template = None
    if source is not None:
        try:
            template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"the chat template beside {file} does not compile ({exc})") from None
    got = ModelTokens(path, tokenizer, template, source is not None and loops_over_content(source),
                      _special_tokens(config), source is not None and ("'developer'" in source
                                                                       or '"developer"' in source))
    _LOADED[path] = (stamps, got)
    return got
