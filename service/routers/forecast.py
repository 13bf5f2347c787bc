"""POST /forecast: series rows -> the next H rows."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.errors import check_rows
from service.fast_path import JSONBodyRoute, plain_rows
from service.routers.one_shot import OneShot, OneShotDep, one_shot_route
from service.runtime.pipeline import run_whole
from service.schemas import ForecastRequest, ForecastResponse

router = APIRouter(tags=["forecast"], route_class=JSONBodyRoute)


async def forecast_of(call: OneShot, name: str | None, rows: list[list[float]]) -> dict[str, Any]:
    """The fields of :class:`ForecastResponse` for ``rows`` (validated as :class:`ForecastRequest` does)."""
    model = call.model(name, "forecast")
    check_rows(rows, call.settings)
    _, finished = await run_whole(model, rows)
    return {"model": model.ref, **finished.result}


@one_shot_route(
    router, "/forecast", ForecastResponse, forecast_of, field="rows", plain=plain_rows,
    summary="Forecast the next H rows of a multivariate series",
    description="Send at least the model's look-back of rows (`GET /models`: `manifest.settings.lookback`) to get "
    "a forecast; with fewer, `forecast` is null and `rows_needed` says how many more. Rows of the wrong width or "
    "holding NaN are refused (422).",
)
async def forecast(body: ForecastRequest, call: OneShotDep) -> ForecastResponse:
    return ForecastResponse(**await forecast_of(call, body.model, body.rows))
