"""strata's stand-in for the ``mooncake`` package: ``mooncake.store`` runs
Mooncake Store's Python API on a strata cluster (see python/README.md,
"mooncake.store drop-in"). The transfer engine modules are not provided."""
