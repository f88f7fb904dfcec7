"""The :class:`strata.Client` options an engine's own config passes
through: the data-plane addresses, which are the engine host's (the nodes
pull large PUT payloads from them), not the cluster's. Shared by the
LMCache and vLLM adapters and the Mooncake facade; SGLang's adapter takes
the same options as its ``strata_client`` mapping."""

from __future__ import annotations

from typing import Any, Dict, Mapping

# Engine-config key -> ``strata.ClientConfig`` field.
DATA_PLANE_KEYS = {
    "strata_data_bind": "data_bind",
    "strata_data_advertise": "data_advertise",
}


def client_options(extra: Mapping[str, Any]) -> Dict[str, Any]:
    """``strata_client`` (a mapping of ``ClientConfig`` fields, as SGLang's
    adapter takes it) with ``strata_data_bind`` / ``strata_data_advertise``
    over it; unset or empty keys leave the client's defaults
    (``STRATA_DATA_BIND``, else the route to the seeds)."""
    options = dict(extra.get("strata_client") or {})
    for key, name in DATA_PLANE_KEYS.items():
        value = extra.get(key)
        if value:
            options[name] = str(value)
    return options
