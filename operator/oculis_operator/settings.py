"""The operator's settings, read from its environment once at import:
  OCULIS_RECHECK_SECONDS (default 10): how often upstreams are reconciled again, by name, when their
  last reconcile failed on an API error (kopf does not retry event handlers) or they wait for an
  API-key Secret; every 6th round also every external upstream, so a Secret deleted or emptied
  after the fact turns it not Ready. Polling those few by name needs only `get` on Secrets;
  watching Secrets would need cluster-wide list/watch on every Secret, which least privilege rules out.
  OCULIS_METRICS_PORT (+ _ADDR): serve the operator's Prometheus metrics (`oculis_operator_*`).
  OCULIS_WEBHOOK_PORT (+ _ADDR, _HOST, _CERT, _KEY, _CA): serve the validating webhook, which
  refuses at apply time a change whose single sequence or weights cannot fit.
  OCULIS_ADAPTER_SECONDS (default 5): how often the LoRA adapters of each upstream serving LoRA are
  compared with what its engines hold and loaded/unloaded (adapter_sync); OCULIS_ENGINE_ENDPOINTS=FILE:
  reach engine pods at the 127.0.0.1 ports of the pod stand-in's endpoint map instead of their pod IPs.
  OCULIS_PROMETHEUS_URL: where the engines' and the router's metrics are queried (unset: no metric reads).
  OCULIS_NETWORK_POLICY: JSON of who may reach the engine pods (engine_access.Peers; the chart writes it
  from values networkPolicy); unset: no NetworkPolicy per GPUUpstream.
"""

from __future__ import annotations

import os
import sys

from oculis_operator import engine_access

WEBHOOK_PORT = os.environ.get("OCULIS_WEBHOOK_PORT")
RECHECK_SECONDS = float(os.environ.get("OCULIS_RECHECK_SECONDS", "10"))
# Where the engines' vllm:cache_config_info is scraped, to compare the KV plan with what vLLM got; unset: no check.
PROMETHEUS_URL = os.environ.get("OCULIS_PROMETHEUS_URL", "")
# The window over which the router's demand for an upstream is counted (a request in it wakes an upstream
# at zero and keeps one from counting as idle).
AUTOSCALE_DEMAND_WINDOW_SECONDS = float(os.environ.get("OCULIS_AUTOSCALE_DEMAND_WINDOW_SECONDS", "60"))
# The speculative-decoding guard's window: acceptance is judged over this many seconds.
SPECULATIVE_WINDOW_SECONDS = int(os.environ.get("OCULIS_SPECULATIVE_WINDOW_SECONDS", "300"))
ADAPTER_SECONDS = float(os.environ.get("OCULIS_ADAPTER_SECONDS", "5"))  # the LoRA adapter sync's period
# Who may reach the engines (engine_access.Peers as JSON, rendered by the chart from values networkPolicy);
# unset: no NetworkPolicy is rendered (the operator run outside the chart does not know the router's labels).
try:
    NETWORK_POLICY = engine_access.parse_peers(os.environ.get(engine_access.POLICY_ENV))
except ValueError as _exc:  # one line and out, before kopf starts: every upstream would render it
    print(f"oculis operator: error: {_exc}", file=sys.stderr)
    sys.exit(2)
