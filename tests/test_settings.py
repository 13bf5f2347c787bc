from pathlib import Path

from service.settings import Settings


def test_settings_come_from_rtserve_environment_variables(monkeypatch):
    monkeypatch.setenv("RTSERVE_PORT", "9123")
    monkeypatch.setenv("RTSERVE_REDIS_URL", "redis://example:6380/2")
    monkeypatch.setenv("RTSERVE_SESSION_TTL_SECONDS", "42")
    monkeypatch.setenv("RTSERVE_MODEL_REPOSITORY", "/srv/models")
    monkeypatch.setenv("RTSERVE_DEFAULT_MODELS", '{"summarize": "srformer-news"}')
    settings = Settings()
    assert settings.port == 9123
    assert settings.redis_url == "redis://example:6380/2"
    assert settings.session_ttl_seconds == 42
    assert settings.model_repository == Path("/srv/models")
    assert settings.default_models == {"summarize": "srformer-news"}


def test_api_keys_accept_a_comma_list_or_json(monkeypatch):
    monkeypatch.setenv("RTSERVE_API_KEYS", "alpha, beta")
    assert Settings().api_keys == ["alpha", "beta"]
    monkeypatch.setenv("RTSERVE_API_KEYS", '["gamma"]')
    assert Settings().api_keys == ["gamma"]


def test_defaults_need_no_environment(monkeypatch):
    for name in ("RTSERVE_PORT", "RTSERVE_REDIS_URL", "RTSERVE_API_KEYS"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.port == 8000 and settings.host == "127.0.0.1"
    assert settings.redis_url is None  # embedded Redis
    assert settings.api_keys == []
