"""API keys: `X-API-Key: <key>` or `Authorization: Bearer <key>`, when RTSERVE_API_KEYS is set."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from service.dependencies import SettingsDep
from service.sessions import owner_of


def _presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def get_owner(request: Request, settings: SettingsDep) -> str:
    """The owner id of the caller's sessions; 401 when keys are configured and none valid is presented."""
    if not settings.api_keys:
        return owner_of(None)
    key = _presented_key(request)
    if key is None or not any(hmac.compare_digest(key, allowed) for allowed in settings.api_keys):
        raise HTTPException(
            status_code=401,
            detail="missing or unknown API key: send it as `X-API-Key: <key>` or `Authorization: Bearer <key>`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return owner_of(key)


OwnerDep = Annotated[str, Depends(get_owner)]
