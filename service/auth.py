"""API keys: `X-API-Key: <key>` or `Authorization: Bearer <key>`, when RTSERVE_API_KEYS is set.

Without keys every caller owns the same sessions (no authentication), but the session quota is
counted per client address, so one client cannot take every place.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from service.dependencies import SettingsDep
from service.settings import Settings


def owner_of(api_key: str | None) -> str:
    """Sessions are owned by a hash of the API key, never the key itself."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32] if api_key else "anonymous"


def _presented_key(request: HTTPConnection) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


# Declared for OpenAPI (the "Authorize" button of /docs); the key itself is read by _presented_key, which
# also takes a Bearer token with odd spacing. auto_error=False: without RTSERVE_API_KEYS no key is needed.
api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, scheme_name="APIKey",
                              description="An API key of `RTSERVE_API_KEYS` (needed only when that is set).")
bearer = HTTPBearer(auto_error=False, scheme_name="Bearer",
                    description="The same API key as a Bearer token: `Authorization: Bearer <key>`.")


# What an operation that checks the key itself (owner_of_request) declares in OpenAPI, as get_owner's Security does
SECURED = {"security": [{"APIKey": []}, {"Bearer": []}]}


async def get_owner(
    request: Request, settings: SettingsDep,
    _key: Annotated[str | None, Security(api_key_header)] = None,
    _token: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
) -> str:
    """The owner id of the caller's sessions; 401 when keys are configured and none valid is presented."""
    return owner_of_request(request, settings)


def owner_of_request(request: HTTPConnection, settings: Settings) -> str:
    """:func:`get_owner` without FastAPI's dependency solver (a route's fast path, a stream's upgrade)."""
    if not settings.api_keys:
        return owner_of(None)
    key = _presented_key(request)
    # bytes, not str: compare_digest refuses str with non-ASCII characters (a header may hold any byte)
    presented = key.encode() if key is not None else b""
    if key is None or not any(hmac.compare_digest(presented, allowed.encode()) for allowed in settings.api_keys):
        raise HTTPException(
            status_code=401,
            detail="missing or unknown API key: send it as `X-API-Key: <key>` or `Authorization: Bearer <key>`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return owner_of(key)


OwnerDep = Annotated[str, Depends(get_owner)]


async def get_quota(request: Request, settings: SettingsDep, owner: OwnerDep) -> str:
    """The dependency of :func:`quota_of`, for the request's client address."""
    return quota_of(settings, owner, request.client.host if request.client else None)


def quota_of(settings: Settings, owner: str, host: str | None) -> str:
    """Whose session quota a create counts against: the API key's owner, or without keys the client address
    ``host``, from any transport (HTTP, gRPC).

    Over HTTP the address is the TCP peer, or the `X-Forwarded-For` client when uvicorn trusts the proxy
    (`FORWARDED_ALLOW_IPS`); behind a proxy that is not trusted every client shares the proxy's quota.
    """
    return owner if settings.api_keys else f"{owner}@{host or 'unknown'}"


QuotaDep = Annotated[str, Depends(get_quota)]
