"""Model directories: checks of local HF directories (``check``), the bundled demo model, tiny random models
for tests."""
