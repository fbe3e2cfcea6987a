"""Start-up checks of the engines slick launches as servers of their own: vLLM and SGLang (docs/vllm.md)."""
from __future__ import annotations

from slick.config.fields import flag_name

SERVER_ENGINES = ("vllm", "sglang")


def server_engine_problems(cfg, p: list[str]) -> None:
    """--rollout-engine vllm|sglang, --vllm-*, --engine-max-running, --use-routing-replay and the flags they cannot
    combine with."""
    engine = cfg.rollout_engine
    if cfg.use_routing_replay and engine in SERVER_ENGINES:
        why = ("vLLM's API returns no routing" if engine == "vllm" else
               "SGLang's return_routed_experts needs its server started with --enable-return-routed-experts, whose "
               "capturer pins host memory through CUDA: the CPU build here fails at start-up with it, so slick has "
               "never seen an SGLang server return routing")
        p.append(f"--use-routing-replay needs the experts each token was routed to: --rollout-engine {engine} does "
                 f"not return them ({why}; docs/moe.md). Use --rollout-engine local or http (slick serve returns "
                 "them), or drop --use-routing-replay")
    if cfg.engine_max_running is not None and cfg.engine_max_running < 1:
        p.append(f"--engine-max-running must be >= 1 (got {cfg.engine_max_running})")
    if cfg.engine_max_running is not None and (engine in SERVER_ENGINES or cfg.rollout_urls):
        whose = f"--rollout-engine {engine} servers" if engine in SERVER_ENGINES else "the servers at --rollout-urls"
        p.append(f"--engine-max-running sizes slick's own engine, but {whose} run their own: drop it (vLLM servers "
                 f"slick launches take --vllm-max-num-seqs N, SGLang's --sglang-max-running-requests N)")
    if cfg.vllm and engine != "vllm":
        p.append(f"--vllm-* options ({', '.join('--vllm-' + k.replace('_', '-') for k in cfg.vllm)}) go to vLLM "
                 f"servers slick launches, but --rollout-engine is {engine}: add --rollout-engine vllm or drop them")
    if engine not in SERVER_ENGINES:
        return
    if cfg.vllm and cfg.rollout_urls:
        p.append("--vllm-* options reach the vLLM servers slick launches; the servers at --rollout-urls are "
                 "already running (give them their own flags)")
    if not cfg.rollout_urls and not cfg.hf_checkpoint:
        p.append(f"--rollout-engine {engine} needs --rollout-urls or --hf-checkpoint (to launch servers)")
    if engine == "vllm" and cfg.router != "none":
        p.append(f"--router {cfg.router} speaks SGLang's API; vLLM servers are reached directly (drop --router)")
    if engine == "sglang" and cfg.rollout_num_gpus > 0:
        p.append(f"--rollout-engine sglang launches its servers from the driver; --rollout-num-gpus "
                 f"{cfg.rollout_num_gpus} (engine actors on Ray) runs slick's own engine or vLLM: drop one of them")
    if engine == "vllm" and cfg.colocate:
        p.append("--colocate runs slick's own engine inside each trainer rank; vLLM servers are processes of their "
                 "own: drop --colocate (engine bundles of their own: --rollout-num-gpus N)")
    if cfg.weight_transport not in ("auto", "disk"):
        p.append(f"--rollout-engine {engine} loads weights from the disk transport's directory: "
                 f"--weight-transport {cfg.weight_transport} cannot reach its servers (use disk)")
    if cfg.rollout_startup_timeout <= 0:
        p.append(f"{flag_name('rollout_startup_timeout')} must be > 0 (got {cfg.rollout_startup_timeout})")
