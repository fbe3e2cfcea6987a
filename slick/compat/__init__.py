"""Compatibility layers for plug-ins written for other frameworks (slime: ``slick.compat.slime``).

Nothing here imports another slick room: the layers are plain Python that plug-ins import under the other
framework's module names (``slick.compat.finder``), and slick's rollout converts to and from them.
"""
