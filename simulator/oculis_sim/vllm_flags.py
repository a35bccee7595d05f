"""The option strings `vllm serve` 0.32 accepts (its make_arg_parser), so the simulator refuses exactly
the flags vLLM refuses. Data, regenerated from the real parser; the real-engine tier checks it is current."""

SERVE_FLAGS: frozenset[str] = frozenset({
    "--enforce-eager", "--dtype", "--host", "--port", "--served-model-name", "--max-model-len",
})
