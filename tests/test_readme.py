from pathlib import Path

from service.settings import Settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_setting_is_in_the_readme_table():
    missing = [name for name in Settings.model_fields if f"`RTSERVE_{name.upper()}`" not in README]
    assert not missing, f"settings missing from the README table: {missing}"


def test_quick_start_is_make_serve_and_make_test():
    assert "make serve" in README and "make test" in README
