"""`cache advise` on a vLLM upstream reads the engines' prefix-cache counters whatever multiplier flags are
given (QA3 Part 2 #6): one flag used to switch the observed share to the router's cached-token counter (0:
vLLM sends no prompt_tokens_details) and the other multiplier to the pricing's r 1, so one window read
"32.8 %, pays", "0.0 %, no-reuse" or "does-not-pay" depending on an unrelated flag."""

from __future__ import annotations

import pytest

from oculis_measure.cache.advise import SELF_HOSTED, advise_self_hosted, self_hosted_multipliers

HITS, QUERIES = 328.0, 1000.0  # the engines' 32.8 %


@pytest.mark.parametrize(("write", "read"), [(None, None), (None, 0.1), (1.25, None), (1.25, 0.1)])
def test_the_engines_share_is_read_whatever_the_flags(write: float | None, read: float | None) -> None:
    m = self_hosted_multipliers(write, read)
    assert (m.write, m.read) == (write if write is not None else 1.0, read if read is not None else 0.0)
    rep = advise_self_hosted("llama-8b", HITS, QUERIES, m, 0.05)
    assert rep["prefix_hit_token_share"] == 0.328 and rep["verdict"] == "pays", rep


def test_no_flag_is_the_self_hosted_default() -> None:
    assert self_hosted_multipliers(None, None) == SELF_HOSTED
    assert "--read-multiplier" in self_hosted_multipliers(None, 0.1).source
