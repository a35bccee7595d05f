"""LoRA adapters in the request path: `model: <route or upstream>/<adapter>`, and a tier's `adapter`.

vLLM serves each adapter under its own model name, so a call for an adapter is a call to its upstream
with the adapter's name as `model`: the upstream is copied with that model (its name, pricing, replicas
and revision stay the upstream's; the cache key, which holds the model, keeps adapters apart). A
request naming an adapter its route or upstream does not declare is a 404 listing the declared ones.
"""

from __future__ import annotations

from oculis import Upstream
from oculis_router.errors import APIError
from oculis_router.state import RouteRuntime, Runtime

HEADER = "x-oculis-adapter"


def with_adapter(upstream: Upstream, adapter: str | None) -> Upstream:
    """The upstream as called for `adapter` (None: the base model)."""
    return upstream if adapter is None else upstream.model_copy(update={"model": adapter})


def route_adapters(rt: Runtime, rr: RouteRuntime) -> list[str]:
    """Every adapter a request may name on this route: those its tiers' upstreams declare."""
    seen: dict[str, None] = {}
    for tier in rr.route.tiers:
        for name in rt.upstreams[tier.upstream].adapters or []:
            seen[name] = None
    return list(seen)


def unknown(model: str, adapter: str, known: list[str]) -> APIError:
    listed = ", ".join(known) if known else "none"
    return APIError(404, f"the model {model[:200]!r} names adapter {adapter[:100]!r}, which {model.split('/')[0]!r} "
                    f"does not serve; its adapters: {listed}", param="model", code="model_not_found")


def split(rt: Runtime, name: str) -> tuple[str, str] | None:
    """(route or upstream, adapter) of a `<base>/<adapter>` model whose base this router knows, else None."""
    base, sep, adapter = name.rpartition("/")
    if not sep or not adapter or (base not in rt.upstreams and base not in rt.routes):
        return None
    return base, adapter


def tiers_for(rt: Runtime, rr: RouteRuntime, adapter: str) -> list[int]:
    """Positions of the route's tiers whose upstream serves `adapter`, cheapest first."""
    return [i for i, t in enumerate(rr.route.tiers) if adapter in (rt.upstreams[t.upstream].adapters or [])]
