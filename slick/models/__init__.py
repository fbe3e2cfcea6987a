"""Model directories: the bundled demo model and tiny random models for tests."""
