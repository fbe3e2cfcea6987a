"""Weights from the trainer to the engines: the transports (:mod:`.transport`: colocated, disk, broadcast), the
sync driver (:mod:`.sync`), LoRA adapter payloads (:mod:`.lora_sync`) and the check after a sync (:mod:`.check`).

Shared by ``train`` (a trainer sends its weights), ``cluster`` (trainer ranks) and ``loop``. Import submodules
directly.
"""
