"""POST /forecast: series rows -> the next H rows."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.auth import OwnerDep
from service.dependencies import RegistryDep, SettingsDep
from service.errors import BODY, check_rows, responses
from service.runtime.pipeline import run_whole
from service.schemas import ForecastRequest, ForecastResponse

router = APIRouter(tags=["forecast"])


@router.post(
    "/forecast", response_model=ForecastResponse, responses=responses(*BODY, 401, 404),
    summary="Forecast the next H rows of a multivariate series",
    description="Send at least the model's look-back of rows (`GET /models`: `manifest.settings.lookback`) to get "
    "a forecast; with fewer, `forecast` is null and `rows_needed` says how many more. Rows of the wrong width or "
    "holding NaN are refused (422).",
)
async def forecast(
    body: ForecastRequest, request: Request, registry: RegistryDep, settings: SettingsDep, owner: OwnerDep,
) -> ForecastResponse:
    model = registry.resolve(body.model, "forecast")
    request.state.model = model.ref
    check_rows(body.rows, settings)
    _, finished = await run_whole(model, body.rows)
    return ForecastResponse(model=model.ref, **finished.result)
