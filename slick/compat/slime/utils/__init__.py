"""slime.utils: ``types`` (Sample) and ``http_utils`` (post, get)."""
