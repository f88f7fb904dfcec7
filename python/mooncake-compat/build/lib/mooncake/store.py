"""``mooncake.store`` on strata: Mooncake 0.3.13's ``MooncakeDistributedStore``
with its own return conventions (a missing key's ``get`` is ``b""``), over
strata's Python SDK. One implementation with ``strata.mooncake``."""

from strata.mooncake import (  # noqa: F401  (the module's public names)
    BufferHandle,
    MooncakeHostMemAllocator,
    ReplicaDescriptor,
    ReplicateConfig,
)
from strata.mooncake import MooncakeDistributedStore as _Store


class MooncakeDistributedStore(_Store):
    MISSING = b""


__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "MooncakeHostMemAllocator", "BufferHandle", "ReplicaDescriptor"]
