"""Public ops: thin wrappers that validate, pick a config and launch the shared kernels."""
