"""Driver-side engine clients behind the ``slick.engine.base.Engine`` protocol: the HTTP client (``HttpEngine``),
the vLLM client (``VllmEngine``) and its server launcher and in-server plugin, launching workers and the router,
health watching and fault recovery."""
