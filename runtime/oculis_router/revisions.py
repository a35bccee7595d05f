"""Which revision and replica of an upstream each attempt of a call goes to: a canary takes its percent
of calls (`revision`, pure, on a random draw) and every retry goes to stable; within a revision the
replica picker (pick.py) chooses per attempt."""

from __future__ import annotations

import time
from typing import Any, Literal

from oculis import Upstream
from oculis_router.pick import AdapterMissing, Fleet, Lease, Tokenized
from oculis_router.providers import anthropic, openai_compat
from oculis_router.verdicts import AdapterUnavailable


def provider_of(up: Upstream) -> Any:
    return anthropic if up.provider == "anthropic" else openai_compat


Revision = Literal["canary", "stable"]
REVISION_HEADER = "x-oculis-revision"
REPLICA_HEADER = "x-oculis-replica"  # the replica that answered (a pod's name), when the router picked one


def revision(up: Upstream, draw: float) -> Revision:
    """Which revision of `up` a call goes to, for a uniform `draw` in [0, 1): the canary for draws
    below its percent, so over many calls it takes that share."""
    return "canary" if up.canary is not None and draw * 100 < up.canary.percent else "stable"


def at_revision(up: Upstream, rev: Revision) -> Upstream:
    """`up` as called at `rev`: the canary's base_url (same name, model, key and revision, so the
    response cache's key and the metrics' upstream label do not change)."""
    if rev == "stable" or up.canary is None:
        return up
    return up.model_copy(update={"base_url": up.canary.base_url})


Request = tuple[str, dict[str, str], dict[str, Any]]  # url, headers, payload (a provider's build_request)


class Revisions:
    """The attempts of one call to `up`: the first goes to the revision the draw picked, every retry to
    stable. Within the revision a replica is picked per attempt (pick.py), a different one each time
    while one is left; without replicas each revision's request is built once. `extra`: attempts on
    top of the retry budget (a canary's failed attempt is retried on stable; a failed replica's on
    another replica of the same upstream, before the tier escalates)."""

    def __init__(self, up: Upstream, endpoint: str, body: dict[str, Any], draw: float,
                 fleet: Fleet | None = None) -> None:
        self.up, self.endpoint, self.body, self.fleet = up, endpoint, body, fleet
        self.prov = provider_of(up)
        self.first: Revision = revision(up, draw)
        pool = fleet.pool(up) if fleet is not None else None
        self.pooled = {rev for rev in (self.first, "stable") if pool is not None and pool.members(rev)}
        self._calls: dict[Revision, Request] = {rev: self.prov.build_request(at_revision(up, rev), endpoint, body)
                                                for rev in dict.fromkeys((self.first, "stable"))
                                                if rev not in self.pooled}
        self._tried = 0
        self.tried: set[str] = set()  # replicas this call has tried
        self.tokenized: Tokenized | None = None  # the prompt's model token ids, once (prepare)
        self._prepared = False
        self.extra = int(self.first == "canary") + int(pool is not None and len(pool.members("stable")) > 1)

    async def prepare(self) -> None:
        """Tokenize the prompt for the picker once per call, before its first pick (a long prompt off the
        event loop: Fleet.tokenize); every attempt's pick reuses the ids."""
        if not self._prepared and self.pooled and self.fleet is not None:
            self.tokenized = await self.fleet.tokenize(self.up, self.body, self.endpoint)
        self._prepared = True

    def another_replica(self) -> bool:
        """Whether a stable replica (every retry's revision) that this call has not tried is ready now (not
        set aside, not draining): a replica's own refusal (a 503/429 with a long Retry-After) is then retried
        there."""
        pool = self.fleet.pool(self.up) if self.fleet is not None else None
        now = time.monotonic()
        return pool is not None and any(r.id not in self.tried and not r.draining and r.aside_until <= now
                                        for r in pool.members("stable"))

    def next(self) -> tuple[Revision, Request, Lease | None]:
        rev: Revision = "stable" if self._tried else self.first
        self._tried += 1
        lease = None
        if rev in self.pooled and self.fleet is not None:
            try:
                lease = self.fleet.lease(self.up, self.body, self.endpoint, rev, self.tried, self.tokenized)
            except AdapterMissing as exc:
                if rev == "canary" and "stable" in self.pooled:  # a canary not loaded yet: the stable revision
                    rev = "stable"
                    lease = self.fleet.lease(self.up, self.body, self.endpoint, rev, self.tried, self.tokenized)
                else:
                    raise AdapterUnavailable(exc) from None
        if lease is None:
            if rev not in self._calls:  # every replica left since the call began: the base URL, as before
                self._calls[rev] = self.prov.build_request(at_revision(self.up, rev), self.endpoint, self.body)
            return rev, self._calls[rev], None
        self.tried.add(lease.replica.id)
        at = at_revision(self.up, rev).model_copy(update={"base_url": lease.url})
        return rev, self.prov.build_request(at, self.endpoint, self.body), lease
