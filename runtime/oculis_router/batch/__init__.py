"""The OpenAI Batch API on the router: `check` (input files, pure), `store` (a directory, per tenant),
`runner` (each line through the router's request path at the batch priority), `api` (HTTP)."""
