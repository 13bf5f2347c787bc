"""POST /forecast: series rows -> the next H rows."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.auth import OwnerDep
from service.dependencies import RegistryDep, SettingsDep
from service.errors import ERROR_RESPONSES, check_rows
from service.runtime.pipeline import run_whole
from service.schemas import ForecastRequest, ForecastResponse

router = APIRouter(tags=["forecast"])


@router.post("/forecast", response_model=ForecastResponse, responses=ERROR_RESPONSES,
             summary="Forecast the next H rows of a multivariate series")
async def forecast(
    body: ForecastRequest, request: Request, registry: RegistryDep, settings: SettingsDep, owner: OwnerDep
) -> ForecastResponse:
    model = registry.resolve(body.model, "forecast")
    request.state.model = model.ref
    check_rows(body.rows, settings)
    _, finished = await run_whole(model.pipeline, body.rows)
    return ForecastResponse(model=model.ref, **finished.result)
