"""The `rtserve` command's help and errors: defaults shown, an unknown command named."""

import pytest

from rtserve.cli import main


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
