"""The `make demo` job: GRPO on single-digit addition with SmolLM2-135M-Instruct on CPU."""
