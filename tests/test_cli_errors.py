"""A user's mistake at the command line is one line on stderr and exit status 1, never a traceback: a file that is
missing, a folder, not UTF-8 or not a CSV file of numbers, a flag out of range, a service that is not there. With
``--debug`` or ``RTSERVE_DEBUG=1`` the traceback is shown instead."""

import pytest

from rtserve import client as client_module
from rtserve.cli import main

NOWHERE = "http://127.0.0.1:9"  # nothing listens there


@pytest.fixture
def files(tmp_path):
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (tmp_path / "prose.txt").write_text("It was a bright cold day in April, and the clocks were striking thirteen.\n")
    (tmp_path / "empty.txt").write_text("\n")
    return tmp_path


def one_line(argv, capsys, monkeypatch, says):
    monkeypatch.delenv("RTSERVE_DEBUG", raising=False)
    monkeypatch.setenv("RTSERVE_URL", NOWHERE)
    assert main(argv) == 1
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.count("\n") == 1 and "Traceback" not in printed.err, printed.err
    assert printed.err.startswith(f"rtserve {argv[0]}: ") and says in printed.err, printed.err
    return printed.err


VERBS = [["classify"], ["summarize"], ["summarize", "--stream"], ["forecast"], ["session", "stream", "--task",
                                                                                  "classify"]]


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_a_missing_file_is_one_line_naming_it(verb, files, capsys, monkeypatch):
    missing = files / "missing.txt"
    one_line([*verb, str(missing)], capsys, monkeypatch, f"{missing}: no such file or folder")


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_a_file_that_is_not_utf8_text_is_one_line_naming_it(verb, files, capsys, monkeypatch):
    one_line([*verb, str(files / "picture.png")], capsys, monkeypatch, f"{files / 'picture.png'} is not UTF-8 text")


def test_a_folder_for_a_file_and_an_empty_file_are_one_line(files, capsys, monkeypatch):
    one_line(["classify", str(files)], capsys, monkeypatch, f"{files}: a folder, not a file")
    one_line(["summarize", str(files / "empty.txt")], capsys, monkeypatch, "empty.txt is empty")


def test_forecast_on_a_text_file_is_one_line(files, capsys, monkeypatch):
    one_line(["forecast", str(files / "prose.txt")], capsys, monkeypatch, "prose.txt holds no rows of numbers")


def test_a_service_that_is_not_there_is_named_with_how_to_point_to_another(files, capsys, monkeypatch):
    monkeypatch.setattr(client_module.time, "sleep", lambda seconds: None)  # the client's retries, without the wait
    said = one_line(["classify", str(files / "prose.txt")], capsys, monkeypatch, f"cannot reach the service at "
                    f"{NOWHERE} ")
    assert "--url" in said and "RTSERVE_URL" in said
    one_line(["forecast", str(files / "prose.txt"), "--url", "127.0.0.1:8000"], capsys, monkeypatch,
                    "prose.txt holds no rows of numbers")  # the file is read first: its mistake comes first


def test_an_address_without_a_scheme_is_one_line(files, capsys, monkeypatch):
    said = one_line(["classify", str(files / "prose.txt"), "--url", "localhost:8000"], capsys, monkeypatch,
                    "http://HOST:PORT")
    assert "--url" in said


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_debug_shows_the_traceback(how, files, capsys, monkeypatch):
    monkeypatch.setenv("RTSERVE_URL", NOWHERE)
    argv = ["summarize", str(files / "missing.txt")]
    if how == "flag":
        argv.append("--debug")
    else:
        monkeypatch.setenv("RTSERVE_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(argv)


def test_a_piece_size_below_one_is_a_usage_error(files, capsys):
    with pytest.raises(SystemExit) as done:
        main(["session", "stream", str(files / "prose.txt"), "--task", "classify", "--piece-chars", "0"])
    assert done.value.code == 2 and "--piece-chars: 0 is not 1 or more" in capsys.readouterr().err


def test_eval_of_a_path_that_is_neither_checkpoint_nor_entry_is_one_line(files, capsys, monkeypatch):
    one_line(["eval", str(files / "nothing"), "--data", "x"], capsys, monkeypatch,
             "is not a checkpoint folder or a model-repository entry")


def test_a_setting_the_service_refuses_is_one_line_naming_its_variable(capsys, monkeypatch):
    monkeypatch.setenv("RTSERVE_PORT", "eighty")
    one_line(["serve"], capsys, monkeypatch, "RTSERVE_PORT: Input should be a valid integer")
