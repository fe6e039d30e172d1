"""Attribute docstrings as field descriptions, read once per module.

pydantic's `use_attribute_docstrings` finds each class's source by walking the interpreter's
frames and asking `inspect` for the module of every frame, once per class: about a third of the
time it takes to define the specs. `DocstringFields` reads each module's source once (one
`ast.parse`), takes the string that follows each annotated attribute, and sets it as the field's
description before pydantic builds the schema (the classes are built on first use,
`defer_build`), so JSON schemas and `--help` carry the same text.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys


@functools.cache
def module_docstrings(filename: str) -> dict[str, dict[str, str]]:
    """{class qualname: {attribute: docstring as written}} of every class in a source file."""
    try:
        with open(filename, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    out: dict[str, dict[str, str]] = {}

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                name = prefix + node.name
                docs = {}
                for a, b in zip(node.body, node.body[1:]):
                    if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
                            and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                            and isinstance(b.value.value, str)):
                        docs[a.target.id] = b.value.value
                out[name] = docs
                visit(node.body, name + ".")

    visit(tree.body, "")
    return out


def class_docstrings(cls: type) -> dict[str, str]:
    """The attribute docstrings (as written) of `cls` and its bases that use this mixin (the
    nearest class wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, DocstringFields) or klass is DocstringFields:
            continue
        module = sys.modules.get(getattr(klass, "__module__", ""), None)
        filename = getattr(module, "__file__", None)
        if filename:
            docs |= module_docstrings(filename).get(klass.__qualname__, {})
    return docs


class DocstringFields:
    """Mixin for pydantic models (with `defer_build=True`): attribute docstrings become field
    descriptions (a description given in `Field(...)` is kept)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        docs = class_docstrings(cls)
        for name, field in cls.__pydantic_fields__.items():
            if field.description is None and name in docs:
                field.description = inspect.cleandoc(docs[name])
