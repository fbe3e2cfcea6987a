"""The HTTP routes of broadcast weight updates in ``slick serve``: SGLang's three endpoints over
:class:`slick.engine.weight_group.WeightGroups` (the engine-side receiving, which in-process engines use directly).
"""
from __future__ import annotations

import asyncio

from slick.engine.weight_group import DEFAULT_GROUP, PATHS, WeightGroupError, WeightGroups


class WeightGroupRoutes:
    """aiohttp handlers for the three endpoints, for a :class:`slick.serve.server.SlickServer`."""

    def __init__(self, server):
        self.server = server
        self.groups = WeightGroups(server.engine)

    def register(self, router) -> None:
        for path, h in zip(PATHS, (self.init, self.update, self.destroy)):
            router.add_post(path, h)

    async def _body(self, request) -> dict:
        body = await self.server._json(request)
        if not isinstance(body, dict):
            raise WeightGroupError("body must be a JSON object")
        return body

    async def init(self, request):
        """POST /init_weights_update_group: join the sender's group (answers once every member joined)."""
        from aiohttp import web

        try:
            name = await asyncio.shield(self.groups.init(await self._body(request)))
        except WeightGroupError as e:
            return web.json_response({"success": False, "message": str(e)}, status=400)
        return web.json_response({"success": True, "message": f"joined weight update group {name!r}"})

    async def update(self, request):
        """POST /update_weights_from_distributed: receive a bucket; the last one is applied all or nothing."""
        from aiohttp import web

        body = await self._body(request)
        try:   # shielded: a client that goes away cannot cut a copy short; the weights lock only for the copy
            out = await asyncio.shield(self.groups.update_from_distributed(body, self.server._weights_lock))
        except (WeightGroupError, ValueError, KeyError, RuntimeError) as e:   # the group is dropped
            return web.json_response({"success": False, "message": f"{type(e).__name__}: {e}"}, status=400)
        if "weight_version" in out:
            paused = len(self.server.engine.progress()) if self.server.paused else 0
            out["num_paused_requests"] = paused
        return web.json_response(out)

    async def destroy(self, request):
        """POST /destroy_weights_update_group ``{"group_name"?}``."""
        from aiohttp import web

        body = await self.server._json(request, default={"group_name": DEFAULT_GROUP})
        name = (body.get("group_name") if isinstance(body, dict) else None) or DEFAULT_GROUP
        found = self.groups.destroy(name)
        return web.json_response({"success": True, "message": f"group {name!r} "
                                  + ("destroyed" if found else "was not open")})
