"""Upstream wire formats: OpenAI-compatible (vLLM, OpenAI, others) and Anthropic's Messages API."""
