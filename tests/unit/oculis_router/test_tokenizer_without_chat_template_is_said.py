"""An upstream `tokenizer:` whose directory has no chat template (the engine started with `--chat-template
FILE`, say) loaded silently and hashed every chat as text, so `kv-events` never matched a real engine on
chats and nothing said why (QA pass 3). Loading it now warns once, naming the path and the fix; chats still
hash as text (never refused), completions use the tokenizer."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from test_model_tokens import CHATML, write_tokenizer

from oculis_router import model_tokens


def test_a_tokenizer_without_chat_template_warns_once_and_chats_fall_back_to_text(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    where = str(write_tokenizer(tmp_path / "notemplate", {"eos_token": "<|im_end|>"}))
    with caplog.at_level(logging.WARNING, logger="oculis.router"):
        mt = model_tokens.load(where)
        model_tokens.load(where)  # loaded once per path: one warning
    warned = [r.getMessage() for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(warned) == 1 and where in warned[0] and "chat_template.jinja" in warned[0], warned
    assert mt.chat_ids({"messages": [{"role": "user", "content": "hello"}]}) is None  # hashed as text
    assert mt.completion_ids({"prompt": "hello"})


def test_a_tokenizer_with_its_template_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="oculis.router"):
        model_tokens.load(str(write_tokenizer(tmp_path / "chatml", {"chat_template": CHATML})))
    assert not [r for r in caplog.records if "no chat template" in r.getMessage()]
