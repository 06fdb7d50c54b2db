"""A folder for `sys.path` (not imported as this package): its `jax` refuses to import.
`warm.keep_jax_out` puts it first on a `serve` process's path, which the worker processes
Grain spawns inherit."""
