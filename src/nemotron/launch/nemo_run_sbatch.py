"""NeMo-Run's sbatch template (core/execution/templates/slurm.sh.j2 of nemo-run 0.11), filled in. Through jinja2 it
costs a Slurm dry run about a tenth of its time (importing jinja2, compiling the template), so the template is also
filled in here, in Python, where the installed template is the very one this was checked against (its sha256).

No text of the template is written here: its text is read from the installed file at run time and split into
literal segments and tags with jinja2's whitespace rules. Python only decides which segments appear and how often
(its `if` and `for` tags) and what fills its `{{ }}` tags; a tag it does not know (the fault-tolerance macros, a
comment, a filter) sends the template to jinja2, as does any other template, so what a dry run shows is always what
NeMo-Run writes. tests/launch/test_nemo_run_sbatch.py holds the two renderings equal; test_nemo_run_equivalence.py,
ours and NeMo-Run's own.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# sha256 of the slurm.sh.j2 this was checked against (nemo-run 0.11.1)
TEMPLATE_SHA256 = "191474dba5a5fb7ca2ed757c1da4d2542821f7145f92f49351795d1f3245aa6c"

# {{ expression }} or {% statement %}, each side with jinja2's optional `-` (strip the white space on that side)
_TAG = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}|\{%(-?)\s*(.*?)\s*(-?)%\}", re.DOTALL)
_NAME = re.compile(r"[A-Za-z_]\w*")

Scope = dict[str, Any]

# The template's expressions other than plain variable names, as Python; `loop.index` is the enclosing loop's, from 1.
_EXPRESSIONS: dict[str, Callable[[Scope], Any]] = {
    "range(srun_commands|length)": lambda s: range(len(s["srun_commands"])),
    "loop.index": lambda s: s["loop.index"],
    "loop.index <= group_env_vars|length": lambda s: s["loop.index"] <= len(s["group_env_vars"]),
    "group_env_vars[loop.index - 1]": lambda s: s["group_env_vars"][s["loop.index"] - 1],
}


class _Unknown(Exception):
    """A tag or shape of template that this module does not render: jinja2 does."""


# The template as a tree. Plain classes: a frozen dataclass costs the import ~0.5 ms (its methods are exec-ed).
class _Output:
    def __init__(self, expression: str) -> None:
        self.expression = expression


class _Loop:
    def __init__(self, target: str, iterable: str, body: list[_Node]) -> None:
        self.target, self.iterable, self.body = target, iterable, body


class _Branches:
    def __init__(self, arms: list[tuple[str | None, list[_Node]]]) -> None:
        self.arms = arms  # (condition, body) in order; None: the `else` arm


_Node = str | _Output | _Loop | _Branches


def render(templates: Path, variables: dict[str, Any]) -> str:
    """slurm.sh.j2 of `templates` (NeMo-Run's template dir) filled in with `variables`, as jinja2 renders it."""
    source = (templates / "slurm.sh.j2").read_text(encoding="utf-8")
    if hashlib.sha256(source.encode()).hexdigest() == TEMPLATE_SHA256:
        try:
            return "".join(_fill(_parse(_tokens(source))[0], dict(variables)))
        except _Unknown:
            pass
    return render_with_jinja2(templates, source, variables)


def render_with_jinja2(templates: Path, source: str, variables: dict[str, Any]) -> str:
    import jinja2

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)))
    return environment.from_string(source).render(**variables)


def _tokens(source: str) -> Iterator[tuple[str, str]]:
    """("text", literal), ("{{", expression) and ("{%", statement) in the template's order. As jinja2 by default:
    the source's last newline is dropped, and a `-` beside a tag strips all white space on that side of it."""
    source = source.removesuffix("\n")
    position, strip_next = 0, False
    for tag in _TAG.finditer(source):
        text = source[position : tag.start()]
        text = text.lstrip() if strip_next else text
        yield "text", text.rstrip() if tag[1] or tag[4] else text
        yield ("{{", tag[2]) if tag[2] is not None else ("{%", tag[5])
        position, strip_next = tag.end(), bool(tag[3] or tag[6])
    text = source[position:]
    yield "text", text.lstrip() if strip_next else text


def _parse(tokens: Iterator[tuple[str, str]], ends: tuple[str, ...] = ()) -> tuple[list[_Node], str]:
    """The nodes up to the statement whose first word is in `ends` (the end of the source when empty), and that
    statement: an `if` reads its `elif` or `else` there."""
    body: list[_Node] = []
    for kind, value in tokens:
        if kind == "text":
            if "{#" in value or "{{" in value or "{%" in value:
                raise _Unknown(f"a comment or an unclosed tag: {value[:40]!r}")
            body.append(value)
            continue
        if kind == "{{":
            body.append(_Output(value))
            continue
        word, _, rest = value.partition(" ")
        if word in ends:
            return body, value
        if word == "for" and " in " in rest:
            target, _, iterable = rest.partition(" in ")
            body.append(_Loop(target.strip(), iterable.strip(), _parse(tokens, ("endfor",))[0]))
        elif word == "if":
            arms: list[tuple[str | None, list[_Node]]] = []
            condition: str | None = rest
            while True:
                arm, closing = _parse(tokens, ("elif", "else", "endif"))
                arms.append((condition, arm))
                word, _, rest = closing.partition(" ")
                if word == "endif":
                    break
                condition = rest if word == "elif" else None
            body.append(_Branches(arms))
        elif word != "import":  # the fault-tolerance macros' import: only used by tags that send us to jinja2
            raise _Unknown(value)
    if ends:
        raise _Unknown(f"no {ends[-1]}")
    return body, ""


def _fill(nodes: list[_Node], scope: Scope) -> Iterator[str]:
    for node in nodes:
        if isinstance(node, str):
            yield node
        elif isinstance(node, _Output):
            yield str(_value(node.expression, scope))
        elif isinstance(node, _Loop):
            for index, item in enumerate(_value(node.iterable, scope), start=1):
                yield from _fill(node.body, {**scope, node.target: item, "loop.index": index})
        else:
            arm = next((body for cond, body in node.arms if cond is None or _value(cond, scope)), [])
            yield from _fill(arm, scope)


def _value(expression: str, scope: Scope) -> Any:
    """`expression` evaluated in `scope`; where jinja2 would differ (an undefined name, `loop` outside a loop, an
    index out of range all render as jinja2's Undefined), _Unknown."""
    if expression in _EXPRESSIONS:
        try:
            return _EXPRESSIONS[expression](scope)
        except (LookupError, TypeError) as error:
            raise _Unknown(expression) from error
    if _NAME.fullmatch(expression) and expression in scope:
        return scope[expression]
    raise _Unknown(expression)
