"""How a question/answer row becomes the prompt the policy reads.

A :class:`PromptFormat` fills a format string (``prompt_template``) with the row's
question and, optionally, its other columns; with ``chat=True`` the filled template is the
user turn (after an optional system turn) and the tokenizer's own chat template renders
the prompt, generation prompt included (``apply_chat_template(..., tokenize=False,
add_generation_prompt=True)``). The result is plain text: engines tokenize it like any
prompt, so the template's tokens are part of the prompt length they truncate and charge.
"""

from __future__ import annotations

from typing import Any

DEFAULT_TEMPLATE = "Q:{question}\nA:"
DEFAULT_CHAT_TEMPLATE = "{question}"


def template_fields(template: str) -> list[str]:
    """``race.spec.task.template_fields`` (the one parser of prompt templates)."""
    from race.spec.task import template_fields as fields

    return fields(template)


class PromptFormat:
    """Renders prompts (module docstring).

    Args:
        template: format string with a ``{question}`` field (default ``Q:{question}\\nA:``,
            or ``{question}`` with ``chat``).
        chat: render with ``tokenizer``'s chat template.
        system_prompt: system message (``chat`` only).
        tokenizer: needed with ``chat``; it must have a ``chat_template``.
    """

    def __init__(self, template: str | None = None, *, chat: bool = False, system_prompt: str | None = None,
                 tokenizer: Any = None) -> None:
        self.template = template if template is not None else (DEFAULT_CHAT_TEMPLATE if chat else DEFAULT_TEMPLATE)
        self.fields = template_fields(self.template)
        if "question" not in self.fields:
            raise ValueError(f"template {self.template!r} has no {{question}} slot")
        if system_prompt is not None and not chat:
            raise ValueError("system_prompt needs chat=True (task.chat_template: true)")
        self.chat, self.system_prompt, self.tokenizer = chat, system_prompt, tokenizer
        if chat:
            if tokenizer is None:
                raise ValueError("task.chat_template: true needs the policy's tokenizer to render prompts")
            if not getattr(tokenizer, "chat_template", None):
                name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
                raise ValueError(f"task.chat_template: true, but the tokenizer of {name!r} has no chat template "
                                 "(tokenizer_config.json / chat_template.jinja): use a model whose tokenizer has one, "
                                 "or set task.chat_template: false and write the format into task.prompt_template")

    def check_columns(self, available: list[str], answer_column: str, source: Any) -> None:
        """Refuse a template field that is neither ``question`` nor a column (the answer
        column is never a prompt field)."""
        allowed = ["question"] + [c for c in available if c != answer_column and c != "question"]
        unknown = [f for f in self.fields if f not in allowed]
        if unknown:
            raise ValueError(f"prompt_template field {{{unknown[0]}}} is not a column of {source}: use {{question}} "
                             f"or one of the columns {allowed[1:]} (the answer column {answer_column!r} is never "
                             "shown)")

    def render(self, question: str, row: dict[str, Any] | None = None) -> str:
        """The prompt text for ``question`` (``row`` supplies the other template fields)."""
        values = {f: "" if (row or {}).get(f) is None else str((row or {})[f]) for f in self.fields if f != "question"}
        text = self.template.format(question=question, **values)
        if not self.chat:
            return text
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        messages.append({"role": "user", "content": text})
        out = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(out, str):  # pragma: no cover - a tokenizer returning ids for tokenize=False
            raise TypeError(f"apply_chat_template returned {type(out).__name__}, expected text")
        return out

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"template": self.template}
        if self.chat:
            d.update(chat_template=self.tokenizer.chat_template, system_prompt=self.system_prompt)
        return d


__all__ = ["DEFAULT_CHAT_TEMPLATE", "DEFAULT_TEMPLATE", "PromptFormat", "template_fields"]
