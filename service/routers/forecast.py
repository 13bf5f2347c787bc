"""POST /forecast: series rows -> the next H rows."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from service.errors import BODY, check_rows, responses
from service.fast_path import JSONBodyRoute, answer_json, plain_body, plain_rows, with_fast_path
from service.routers.one_shot import OneShot, OneShotDep, one_shot_call
from service.runtime.pipeline import run_whole
from service.schemas import ForecastRequest, ForecastResponse

router = APIRouter(tags=["forecast"], route_class=JSONBodyRoute)


async def forecast_of(call: OneShot, name: str | None, rows: list[list[float]]) -> dict[str, Any]:
    """The fields of :class:`ForecastResponse` for ``rows`` (validated as :class:`ForecastRequest` does)."""
    model = call.model(name, "forecast")
    check_rows(rows, call.settings)
    _, finished = await run_whole(model, rows)
    return {"model": model.ref, **finished.result}


async def forecast_fast(request: Request) -> Response | None:
    """The route's fast path (:mod:`service.fast_path`): plain rows answered; None for any other body."""
    body = plain_body(await request.json(), "rows")
    rows = plain_rows(body["rows"], await request.body()) if body is not None else None
    if body is None or rows is None:
        return None
    return answer_json(ForecastResponse, await forecast_of(one_shot_call(request), body.get("model"), rows))


@router.post(
    "/forecast", response_model=ForecastResponse, responses=responses(*BODY, 401, 404),
    summary="Forecast the next H rows of a multivariate series",
    description="Send at least the model's look-back of rows (`GET /models`: `manifest.settings.lookback`) to get "
    "a forecast; with fewer, `forecast` is null and `rows_needed` says how many more. Rows of the wrong width or "
    "holding NaN are refused (422).",
)
@with_fast_path(forecast_fast)
async def forecast(body: ForecastRequest, call: OneShotDep) -> ForecastResponse:
    return ForecastResponse(**await forecast_of(call, body.model, body.rows))
