"""`slick inspect`: a local page to look inside a run (server.py serves static/ and the JSON API of data.py)."""
