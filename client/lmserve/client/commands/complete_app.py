"""The interactive screen of `lmserve complete` (prompt-toolkit, imported only here).

One input line and, under it, the current suggestions with their probabilities. Every edit of
the line becomes one session call: characters added at the end are typed, characters removed
from the end are backspaced, anything else (an edit in the middle) starts the sentence again.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from prompt_toolkit import Application
from prompt_toolkit.application import run_in_terminal
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.document import Document
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.layout import HSplit, Layout, Window
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl

from lmserve.client.commands._complete_session import open_session

if TYPE_CHECKING:
    from lmserve.client import Completion, CompletionSession, LmServeClient


class _Screen:
    """Keeps the session in step with the input line and renders the suggestions."""

    def __init__(self, session: CompletionSession, model: str) -> None:
        self.session = session
        self.model = model
        self.text = ""
        self.found: list[Completion] = session.suggest("")
        self.error = ""

    def follow(self, text: str) -> None:
        """The line changed from `self.text` to `text`: the session calls that say so."""
        old, self.text = self.text, text
        try:
            if text.startswith(old):
                if text != old:
                    self.found = self.session.type(text[len(old) :])
            elif old.startswith(text):
                self.found = self.session.backspace(len(old) - len(text))
            else:
                self.session.reset()
                self.found = self.session.type(text)
            self.error = ""
        except Exception as exc:  # shown on screen; the next keystroke tries again
            self.error = str(exc)

    def accept_best(self, buffer: Buffer) -> None:
        """Tab: the best suggestion replaces the partial word, followed by a space."""
        if not self.found:
            return
        word = self.found[0].word
        partial = self.session.partial
        self.text = self.text[: len(self.text) - len(partial)] + word + " "
        self.found = self.session.accept(word)
        buffer.set_document(Document(self.text, len(self.text)))

    def restart(self) -> None:
        """Enter: a new sentence."""
        self.text = ""
        self.found = self.session.reset()

    def render(self) -> str:
        lines = [
            f"  {c.word:<20} p={math.exp(c.log_prob):.4f}  ({c.log_prob:.3f})" for c in self.found
        ]
        if self.error:
            lines.append(f"  error: {self.error}")
        lines.append(f"  [{self.model}] Tab accepts the best, Enter starts again, Ctrl-D quits")
        return "\n".join(lines)


def interactive(client: LmServeClient, args: argparse.Namespace) -> int:
    with open_session(client, args) as session:
        screen = _Screen(session, args.model)
        buffer = Buffer(multiline=False, on_text_changed=lambda b: screen.follow(b.text))
        keys = KeyBindings()

        @keys.add("tab")
        def _(event: KeyPressEvent) -> None:
            screen.accept_best(buffer)

        @keys.add("enter")
        def _(event: KeyPressEvent) -> None:
            line = buffer.text
            run_in_terminal(lambda: print(line))
            screen.restart()
            buffer.reset()

        @keys.add("c-d")
        @keys.add("c-c")
        def _(event: KeyPressEvent) -> None:
            event.app.exit()

        layout = Layout(
            HSplit(
                [
                    Window(BufferControl(buffer=buffer), height=1),
                    Window(FormattedTextControl(screen.render)),
                ]
            )
        )
        Application(layout=layout, key_bindings=keys, full_screen=False).run()
    return 0
