"""The serving front: ``slick serve`` (SGLang's native API, OpenAI's /v1) over the inference core of ``slick.engine``."""
