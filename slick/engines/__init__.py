"""Driver-side engine clients behind the ``slick.engine.base.Engine`` protocol: the HTTP client (``HttpEngine``),
launching workers and the router, health watching and fault recovery."""
