"""Tiered KV-cache storage: compressed DDR, local SSD and Redis/Valkey.

>>> from kvcore.tiers import TierManager, TierConfig, Namespace
"""

from .keys import ChunkKey, Namespace, chunk_keys
from .manager import Hit, RestorePlan, TierConfig, TierManager
from .metrics import Metrics
from .policy import CostAwarePolicy, LRUPolicy
from .remote import CircuitBreaker, RemoteConfig

__all__ = ["ChunkKey", "Namespace", "chunk_keys", "Hit", "RestorePlan", "TierConfig", "TierManager",
           "Metrics", "CostAwarePolicy", "LRUPolicy", "CircuitBreaker", "RemoteConfig"]
