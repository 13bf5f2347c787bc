"""The help of rtserve's command lines (the command, export, the recipes): every default shown once, and only
where there is one. Plain argparse, so any layer may use it."""

from __future__ import annotations

import argparse
import copy

NOTHING_TO_SHOW = (None, "", [], ())


class HelpFormatter(argparse.HelpFormatter):
    """argparse's ``ArgumentDefaultsHelpFormatter`` without its noise: ``(default: X)`` follows an option's help
    unless the help already speaks of its default, the option is required, or there is nothing to show (no
    default, or a flag's own off state)."""

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and _shows_default(action):  # argparse writes no help line, default included
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text.lower() or not _shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


def _shows_default(action: argparse.Action) -> bool:
    if action.required or action.nargs == 0 or action.default is argparse.SUPPRESS:
        return False
    if action.default in NOTHING_TO_SHOW:
        return False
    return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
