"""The `rtserve` command's help and errors: every page lists its options and states each default once, an unknown
command is named."""

import argparse
import re
from pathlib import Path

import pytest

from rtserve.cli import COMMANDS, _trainable, main


def test_an_unknown_command_is_named_on_stderr(capsys):
    assert main(["bogus"]) == 2
    captured = capsys.readouterr()
    assert "unknown command 'bogus'" in captured.err and "classify" in captured.err and captured.out == ""


@pytest.mark.parametrize("family", ["rsa", "rmt", "srformer"])
def test_train_help_shows_every_default(family, capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", family, "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--seed SEED", "--epochs EPOCHS", "--lr LR", "--batch-size BATCH_SIZE"):
        after = text.split(option, 2)[-1]  # the option's own help line, after the usage summary
        assert "(default: " in after.split(" --", 1)[0], (option, after[:120])


def test_client_verbs_show_their_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["summarize", "--help"])
    assert "(default: http://127.0.0.1:8000)" in " ".join(capsys.readouterr().out.split())


def test_python_dash_m_rtserve_is_the_rtserve_command():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "rtserve", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: rtserve {serve,train,eval" in done.stdout


# ---- every page of help, walked from the commands down -------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
# a committed checkpoint of each recipe: `rtserve eval <checkpoint> --help` is its recipe's page
CHECKPOINTS = ["weights/rmt-hyperpartisan", "weights/rsa-etth1-h24", "weights/srformer-news"]
PAGES = [[name] for name in COMMANDS] + [["train", name] for name in _trainable()] + [
    ["eval", str(ROOT / folder)] for folder in CHECKPOINTS]
CHOICES = re.compile(r"\{([\w.+-]+(?:,[\w.+-]+)*)\}")


def help_page(argv, capsys, monkeypatch):
    """The text ``rtserve ... --help`` prints and the parser that printed it (None when no parser did)."""
    parsers = []
    parse = argparse.ArgumentParser.parse_known_args

    def recorded(self, args=None, namespace=None):
        parsers.append(self)
        return parse(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", recorded)
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    monkeypatch.undo()
    assert done.value.code == 0, argv
    return capsys.readouterr().out, (parsers[-1] if parsers else None)


def shows_a_default(action):
    """Whether the option has a default worth stating: a value, not a flag's off state or nothing at all."""
    return (not action.required and action.nargs != 0 and action.default not in (None, "", [], ())
            and action.default is not argparse.SUPPRESS and action.help is not argparse.SUPPRESS)


def problems(argv, text, parser):
    if parser is None:
        return [f"rtserve {' '.join(argv)} --help is no parser's help (its options are not listed)"]
    found = []
    flat = " ".join(text.split())
    if "(default: None)" in flat:
        found.append("shows (default: None)")
    choices = [action.choices for action in parser._actions
               if action.choices and action.help is not argparse.SUPPRESS and len(action.choices) > 1]
    for echo in CHOICES.findall(text):
        if not any(echo.split(",") == list(options) for options in choices):
            found.append(f"{{{echo}}} is no choice of this command")
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.help is argparse.SUPPRESS:
            continue
        block = " ".join(formatter._format_action(action).split())
        if isinstance(action, argparse._SubParsersAction):
            found += [f"subcommand {verb} is not listed" for verb in action.choices if verb not in flat]
            continue
        shown = action.metavar or ("{" + ",".join(action.choices) + "}" if action.choices else action.dest)
        names = action.option_strings or [shown]
        if not any(re.search(rf"(?<![\w-]){re.escape(str(name))}(?![\w-])", flat) for name in names):
            found.append(f"{names[0]} is not listed")
        if len(re.findall(r"\(default|default:", block)) > 1:
            found.append(f"{names[0]} states its default twice: {block}")
        if shows_a_default(action) and "default" not in block:
            found.append(f"{names[0]} does not show its default {action.default!r}")
    return found


@pytest.mark.parametrize("argv", PAGES, ids=[" ".join(Path(a).name for a in argv) for argv in PAGES])
def test_every_help_page_lists_its_options_and_states_each_default_once(argv, capsys, monkeypatch):
    """Every command's and subcommand's --help (train <family>, eval, eval <checkpoint>, session stream ...)."""
    queue, seen = [argv], []
    while queue:
        page = queue.pop(0)
        text, parser = help_page(page, capsys, monkeypatch)
        seen += [f"rtserve {' '.join(page)}: {problem}" for problem in problems(page, text, parser)]
        for action in parser._actions if parser else []:
            if isinstance(action, argparse._SubParsersAction):
                queue += [[*page, verb] for verb in action.choices]
    assert not seen, "\n".join(seen)


@pytest.mark.parametrize("verb", ["status", "finish", "delete"])
def test_session_verbs_on_an_existing_session_take_no_model(verb, capsys, monkeypatch):
    text, parser = help_page(["session", verb], capsys, monkeypatch)
    assert parser is not None and "--model" not in text and "session_id" in text


def test_serve_help_states_the_settings_defaults(capsys, monkeypatch):
    from service.settings import Settings

    text, _ = help_page(["serve"], capsys, monkeypatch)
    flat = " ".join(text.split())
    host, port = Settings.model_fields["host"].default, Settings.model_fields["port"].default
    assert f"(default: RTSERVE_HOST, else {host})" in flat and f"(default: RTSERVE_PORT, else {port})" in flat
