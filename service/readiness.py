"""Whether this replica can serve: one answer behind ``/readyz``, KServe v2's ``/v2/health/ready`` and gRPC's
``ServerReady``.

Ready means three things at once: Redis answers and accepts writes (the sessions live there), every model of the
repository is loaded, and the replica is not shutting down (from the first SIGTERM on, a load balancer should send it
nothing new while it finishes what it has).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.runtime.registry import ModelRegistry
from service.shutdown import Shutdown
from service.state_store import StateStore, StateStoreUnavailable


@dataclass(frozen=True)
class ReplicaReadiness:
    redis: str  # "ok", or why Redis cannot be used
    models_loaded: int
    models_expected: int
    draining: bool
    warnings: list[str] = field(default_factory=list)  # settings that endanger sessions without making it unready

    @property
    def ready(self) -> bool:
        return self.redis == "ok" and self.models_loaded == self.models_expected and not self.draining

    @property
    def status(self) -> str:
        return "ready" if self.ready else "draining" if self.draining else "unavailable"

    def reason(self) -> str:
        """Why the replica is not ready, in one sentence (the KServe v2 error body); empty when it is."""
        if self.redis != "ok":
            return f"session store unavailable: {self.redis}"
        if self.draining:
            return "not ready: shutting down"
        if self.models_loaded != self.models_expected:
            return (f"not ready: {self.models_loaded} of {self.models_expected} models loaded (the others are "
                    "loading, or failed to load: the repository index says which)")
        return ""


async def readiness(store: StateStore, registry: ModelRegistry, shutdown: Shutdown) -> ReplicaReadiness:
    """Where the replica stands now: one write round trip to Redis, the rest from memory."""
    warnings: list[str] = []
    try:
        warnings = await store.check_writable()
        redis = "ok"
    except StateStoreUnavailable as error:
        redis = str(error)
    return ReplicaReadiness(redis, registry.loaded_count(), registry.expected_count(), shutdown.draining, warnings)
