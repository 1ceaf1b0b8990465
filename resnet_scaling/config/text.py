"""A config as the config file a user would write: `get_config()` over `get_base_config()`, one line per
field with its effective value as a Python literal, under the comments `get_base_config` has for it.

What `python -m resnet_scaling.train --print_config` prints (the run itself writes WORKDIR/config.json).
The comments come from `get_base_config`'s own source (`inspect`, `ast`, `tokenize`), so they cannot drift
from it; the wheel ships that source. A value that differs from the base ends with "(default: X)".
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import math
import textwrap
import tokenize
from collections.abc import Iterator, Mapping
from typing import Any

import ml_collections

from resnet_scaling import config as config_lib

LINE_LENGTH = 110  # The project's (ruff's) line length: a long tuple wraps at it.
_INDENT = "    "
_HEADER = ("# The config, overrides applied, as a config file (--config=FILE runs it), with the comments\n"
           '# of get_base_config() (resnet_scaling/config/__init__.py). "(default: X)": the base\'s value '
           'differs.\n')


@dataclasses.dataclass(frozen=True)
class _Line:
    """One line of `get_base_config`'s body that the config file keeps: a comment, a blank, or a field."""

    comment: str = ""  # A whole-line comment's text, or the field's trailing comment.
    field: str = ""  # "model.name"; "" for a comment or a blank line.


def format_config(config: ml_collections.ConfigDict) -> str:
    """`config` as a config file: every field, in `get_base_config`'s order and with its comments, set to
    its value in `config`; fields the base lacks follow in a `with config.unlocked():` block.

    Loading the text as a config file (`config.load_config`) gives back a config equal to `config`.
    """
    values = dict(_leaves(config.to_dict()))
    base = dict(_leaves(config_lib.get_base_config().to_dict()))
    body: list[str] = []
    for line in _base_lines():
        if not line.field:
            if line.comment or (body and body[-1]):  # No blank line at the start or twice.
                body.append(f"# {line.comment}" if line.comment else "")
        elif line.field in values:
            body += _assignment(line.field, values.pop(line.field), base, line.comment)
    # Fields the base has but does not assign in its body, then the ones it does not have.
    for field in [f for f in values if f in base]:
        body += _assignment(field, values.pop(field), base, "")
    added = _added_fields(values, base)
    imports = ("import ml_collections\n\n" if any("ml_collections.ConfigDict(" in line for line in added)
               else "") + "from resnet_scaling.config import get_base_config\n"
    lines = [f"{_INDENT}{line}" if line else "" for line in body + added]
    return (f"{_HEADER}{imports}\n\ndef get_config():\n{_INDENT}config = get_base_config()\n"
            + "\n".join(lines).rstrip() + f"\n{_INDENT}return config\n")


def _added_fields(values: Mapping[str, Any], base: Mapping[str, Any]) -> list[str]:
    """The lines that add the fields of `values` the base lacks: in a section it lacks, that section as one
    ConfigDict; in one of its own, the field alone."""
    if not values:
        return []
    sections = {field.rsplit(".", i)[0] for field in base for i in range(1, field.count(".") + 1)}
    lines = ["", "# Not in get_base_config(): fields this config added.", "with config.unlocked():"]
    new_sections: dict[str, dict[str, Any]] = {}
    for field, value in values.items():
        prefixes = (field.rsplit(".", i)[0] for i in range(field.count("."), 0, -1))  # Shortest first.
        new = next((prefix for prefix in prefixes if prefix not in sections), None)
        if new is None:
            lines += [_INDENT + line for line in _assignment(field, value, base, "")]
        else:
            new_sections.setdefault(new, {})[field[len(new) + 1:]] = value
    lines += [f"{_INDENT}config.{section} = ml_collections.ConfigDict({_literal(_nest(fields))})"
              for section, fields in new_sections.items()]
    return lines


def _base_lines() -> Iterator[_Line]:
    """`get_base_config`'s body as the lines a config file keeps: each field's assignment with its trailing
    comment, the comments above fields and sections, and the blank lines between them. Nothing when its
    source cannot be read (an installation without .py files): the fields then follow in their order."""
    try:
        source = textwrap.dedent(inspect.getsource(config_lib.get_base_config))
    except (OSError, TypeError):
        return
    comments = {token.start[0]: (token.string.lstrip("#").strip(), token.line[:token.start[1]].strip() == "")
                for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT}
    source_lines = source.splitlines()
    (function,) = ast.parse(source).body
    body = function.body[1:] if ast.get_docstring(function) else function.body
    previous_end = body[0].lineno - 1
    for statement in body:
        field = _field(statement)
        kept = field is not None or _is_section(statement)
        for number in range(previous_end + 1, statement.lineno):  # Whole-line comments and blanks above.
            text, whole_line = comments.get(number, ("", False))
            if kept and (whole_line or not source_lines[number - 1].strip()):
                yield _Line(comment=text)
        if field is not None:
            own = " ".join(comments[n][0] for n in range(statement.lineno, statement.end_lineno + 1)
                           if n in comments)
            yield _Line(comment=own, field=field)
        previous_end = statement.end_lineno


def _field(statement: ast.stmt) -> str | None:
    """"model.name" for `config.model.name = ...` (not a section's `= ml_collections.ConfigDict()`)."""
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1 or _is_section(statement):
        return None
    names, node = [], statement.targets[0]
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not (isinstance(node, ast.Name) and node.id == "config" and names):
        return None
    return ".".join(reversed(names))


def _is_section(statement: ast.stmt) -> bool:
    value = getattr(statement, "value", None)
    return (isinstance(statement, ast.Assign) and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute | ast.Name)
            and getattr(value.func, "attr", getattr(value.func, "id", "")) == "ConfigDict"
            and isinstance(statement.targets[0], ast.Attribute))


def _assignment(field: str, value: Any, base: Mapping[str, Any], comment: str) -> list[str]:
    """`config.FIELD = VALUE  # COMMENT (default: X)`; a long tuple or list wraps, one line per row."""
    if field in base and not _same(value, base[field]):
        comment = f"{comment} (default: {_literal(base[field])})".strip()
    suffix = f"  # {comment}" if comment else ""
    line = f"config.{field} = {_literal(value)}"
    if len(_INDENT + line) <= LINE_LENGTH or not isinstance(value, tuple | list) or len(value) < 2:
        return [line + suffix]
    opening, closing = ("(", ")") if isinstance(value, tuple) else ("[", "]")
    rows, row = [], ""
    for item in (_literal(v) + "," for v in value):
        if row and len(2 * _INDENT + row + " " + item) > LINE_LENGTH:
            rows.append(row)
            row = ""
        row = f"{row} {item}".strip()
    return [f"config.{field} = {opening}{suffix}", *(_INDENT + r for r in [*rows, row]), closing]


def _same(value: Any, default: Any) -> bool:
    # 90 epochs are 90.0 epochs; True is not the number 1, nor a tuple the list of its items.
    return value == default and (type(value) is type(default) or {type(value), type(default)} <= {int, float})


def _literal(value: Any) -> str:
    """`value` as the Python literal a config file has: strings in double quotes, tuples as tuples, long
    whole numbers grouped (1_281_167), non-finite floats as float("inf")."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's escapes are Python's too.
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return f"{value:_}" if abs(value) >= 10_000 else repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    if isinstance(value, tuple):
        items = ", ".join(_literal(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """("model.name", "resnet50"), ... for the nested dicts of `ConfigDict.to_dict()`."""
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for field, value in flat.items():
        *sections, name = field.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return tree
