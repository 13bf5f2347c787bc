"""POST /forecast: series rows -> the next H rows."""

from __future__ import annotations

from fastapi import APIRouter

from service.errors import BODY, check_rows, responses
from service.json_body import JSONBodyRoute
from service.routers.one_shot import OneShotDep
from service.runtime.pipeline import run_whole
from service.schemas import ForecastRequest, ForecastResponse

router = APIRouter(tags=["forecast"], route_class=JSONBodyRoute)


@router.post(
    "/forecast", response_model=ForecastResponse, responses=responses(*BODY, 401, 404),
    summary="Forecast the next H rows of a multivariate series",
    description="Send at least the model's look-back of rows (`GET /models`: `manifest.settings.lookback`) to get "
    "a forecast; with fewer, `forecast` is null and `rows_needed` says how many more. Rows of the wrong width or "
    "holding NaN are refused (422).",
)
async def forecast(body: ForecastRequest, call: OneShotDep) -> ForecastResponse:
    model = call.model(body.model, "forecast")
    check_rows(body.rows, call.settings)
    _, finished = await run_whole(model, body.rows)
    return ForecastResponse(model=model.ref, **finished.result)
