"""`oculis epp`: the router's replica (and tier) choice as a Gateway API endpoint picker, served over
Envoy's ext_proc gRPC protocol (the Gateway API Inference Extension's endpoint-picker protocol,
`docs/proposals/004-endpoint-picker-protocol`).

- `decisions.py`: pure: what the request is, which replicas may serve it, the answer's values.
- `messages.py`: the ext_proc protobuf messages built from those values, and read from the proxy's.
- `core.py`: the picker state (the router's `pick.Fleet`, replica discovery and probes) and one request's
  decision: `--upstream` picks a replica; `--route` plans the tier as the router does, then picks.
- `server.py`: the gRPC servicers (ExternalProcessor, Health) and the process's loops.
"""
