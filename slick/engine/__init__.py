"""The inference core: the ``Engine`` protocol (``base``), ``LocalEngine`` (model, KV cache, native kernels,
sampling) and the engine-side receiving of weight updates."""
