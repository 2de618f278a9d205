"""The shell commands the documentation shows, read from its Markdown: README.md, docs/*.md and experiments/README.md.

    from helpers.documented_commands import documented_commands
    for key, found in documented_commands().items(): ...     # key: the command as one line, its comment dropped

Where a command is:

- a fenced block tagged ``bash``, ``sh``, ``shell`` or ``console``: every line that is not blank or a comment, its
  ``\\`` continuations joined; where the block has ``$ `` prompts (a transcript), only the prompted lines;
- an untagged fenced block: only its ``$ `` prompted lines (the others are output, tables, formulas);
- experiments/README.md's table: the ``command`` column's code span.

A here-document (``python - <<'PY'`` up to ``PY``) is one command: its key is its first line, its text holds the
body. A line that only sets a variable (``C="..."``) is a command too: the commands below it read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from helpers import ROOT

#: Fence tags whose blocks are shell.
SHELL_TAGS = ("bash", "sh", "shell", "console")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_PROMPT = re.compile(r"^\s*\$ ")
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=(\"[^\"]*\"|'[^']*'|\S*)$")


@dataclass(frozen=True)
class DocumentedCommand:
    """One command: ``text`` as a shell runs it (continuations joined, a here-document's body included),
    ``where`` the first ``file:line`` that shows it."""

    text: str
    where: str

    @property
    def assigns(self) -> bool:
        """Whether the command only sets a shell variable."""
        return bool(_ASSIGNMENT.match(self.text))


def doc_files() -> list[Path]:
    """The Markdown files whose commands are collected."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md"]


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, at a word's start)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def command_key(text: str) -> str:
    """The key a command is declared under: its first line (a here-document's), whitespace runs as one space."""
    return " ".join(text.split("\n", 1)[0].split())


def block_commands(lines: list[str], tag: str) -> list[tuple[int, str]]:
    """(index of the first line, text) of each command in a fenced block's ``lines``."""
    prompted = any(_PROMPT.match(line) for line in lines)
    if tag not in SHELL_TAGS and not prompted:
        return []
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        i += 1
        if prompted:
            if not _PROMPT.match(line):
                continue
            line = _PROMPT.sub("", line, count=1)
        line = strip_comment(line)
        if not line.strip():
            continue
        parts = [line]
        while parts[-1].endswith("\\") and i < len(lines):
            parts[-1] = parts[-1][:-1].rstrip()
            parts.append(strip_comment(lines[i]).strip())
            i += 1
        text = " ".join(p.strip() for p in parts)
        heredoc = _HEREDOC.search(text)
        if heredoc:
            body = []
            while i < len(lines) and lines[i].strip() != heredoc[1]:
                body.append(lines[i])
                i += 1
            text = "\n".join([text, *body, heredoc[1]])
            i += 1
        out.append((start, text))
    return out


def _fenced_commands(path: Path) -> list[DocumentedCommand]:
    lines = path.read_text().splitlines()
    rel = path.relative_to(ROOT)
    out: list[DocumentedCommand] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        for j, text in block_commands(lines[i + 1:end], m[2]):
            out.append(DocumentedCommand(text, f"{rel}:{i + 2 + j}"))
        i = end + 1
    return out


def _table_commands(path: Path) -> list[DocumentedCommand]:
    """The ``command`` column of the Markdown tables in ``path`` (a code span each; "—" for none)."""
    rel = path.relative_to(ROOT)
    out: list[DocumentedCommand] = []
    column = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = cells.index("command") if "command" in cells else -1
            continue
        if column < 0 or column >= len(cells) or set(cells[column]) <= set("-—"):
            continue
        for span in re.findall(r"`([^`]+)`", cells[column]):
            out.append(DocumentedCommand(span.strip(), f"{rel}:{n}"))
    return out


def documented_commands() -> dict[str, DocumentedCommand]:
    """Every documented command by :func:`command_key`, in the order the files show them (the first place each
    appears)."""
    found: dict[str, DocumentedCommand] = {}
    for path in doc_files():
        for c in _fenced_commands(path) + _table_commands(path):
            found.setdefault(command_key(c.text), c)
    return found
