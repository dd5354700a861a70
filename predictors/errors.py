"""Errors raised by the core, all carrying field paths so that every caller can show them at once."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FieldProblem:
    """One thing wrong with an input: where (dotted path), what, and how to fix it."""

    path: str
    message: str
    hint: str = ""

    def render(self) -> str:
        where = f"`{self.path}` " if self.path else ""
        text = f"{where}{self.message}"
        if self.hint:
            text += f". To fix: {self.hint}"
        return text


# problems one message lists; the rest are counted
MAX_PROBLEMS_SHOWN = 50


@dataclass
class SpecError(Exception):
    """A spec (or other user input) is invalid. Holds every problem found, not just the first."""

    problems: list[FieldProblem] = field(default_factory=list)
    source: str = ""

    def __post_init__(self) -> None:
        super().__init__(self.render())

    def render(self) -> str:
        head = f"invalid input in {self.source}" if self.source else "invalid input"
        if len(self.problems) == 1:
            return f"{head}: {self.problems[0].render()}"
        lines = [f"{head}: {len(self.problems)} problems"]
        lines += [f"  - {p.render()}" for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        if len(self.problems) > MAX_PROBLEMS_SHOWN:  # a file of the wrong kind (a README given as runs) is one mistake
            lines.append(f"  ... and {len(self.problems) - MAX_PROBLEMS_SHOWN} more (the first {MAX_PROBLEMS_SHOWN} "
                         "are shown)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    @classmethod
    def one(cls, path: str, message: str, hint: str = "", source: str = "") -> SpecError:
        return cls([FieldProblem(path, message, hint)], source=source)
