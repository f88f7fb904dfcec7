"""vLLM's own Mooncake Store setup (``vllm.distributed.mooncake_store``:
``MooncakeStoreConfig.load_from_config`` reading ``MOONCAKE_CONFIG_PATH``,
then ``setup_mooncake_store``, the call vLLM's MooncakeStoreConnector
worker makes) against strata's ``mooncake.store`` drop-in.

Usage: mooncake_setup_driver.py; prints ``RESULT {json}`` lines."""

import json
import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from mooncake.store import MooncakeDistributedStore  # noqa: E402
from vllm.distributed.mooncake_store import MooncakeStoreConfig, setup_mooncake_store  # noqa: E402

config = MooncakeStoreConfig.load_from_config()
store = MooncakeDistributedStore()
setup_mooncake_store(store, config, "127.0.0.1")
put = store.put("vllm-mooncake-setup", b"through vLLM's setup")
got = store.get("vllm-mooncake-setup")
print("RESULT " + json.dumps({"module": type(store).__module__, "put": put, "got": got.decode(),
                              "tenant": config.tenant_id, "health": store.health_check()}), flush=True)
store.close()
