"""Which API a server at a URL speaks: SGLang's native one (SGLang, `slick serve`, sglang-router) or vLLM's."""
from __future__ import annotations

import urllib.error
import urllib.request


def _get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout) as r:
            return r.status, r.read(1 << 20).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def server_kind(url: str, timeout: float = 10.0) -> str:
    """``"sglang"`` when ``url`` answers SGLang's ``/get_model_info``, ``"vllm"`` when it answers vLLM's
    ``/weight_info`` instead; for a server whose routes need a key (both 401), its open ``/metrics`` decides (vLLM
    names its metrics ``vllm:...``); ``"unknown"`` when it answers none of them (not up, or another API)."""
    url = url.rstrip("/")
    info, _ = _get(url + "/get_model_info", timeout)
    if info == 200:
        return "sglang"
    weights, _ = _get(url + "/weight_info", timeout)
    if weights == 200:
        return "vllm"
    if 401 in (info, weights):
        status, text = _get(url + "/metrics", timeout)
        if status == 200:
            return "vllm" if "vllm:" in text else "sglang"
    return "unknown"
