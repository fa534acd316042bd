"""Checks every plugin's options share, at the config stage (before an engine starts).

- ``check_path_options``: the field validator of every path option (``recycle``'s ``matrix_path`` and ``merge_from``, the
  ``suffix`` source's ``responses_path`` and ``merge_from``; ``hybrid`` takes them through its sources'
  options). Refused, naming the field: an empty path, a NUL byte, a folder that does not exist, a
  directory. The file itself may not exist yet (a first start, a peer that has not saved yet).
  A symlink is followed each time the file is opened: freespec reads the file it names then, and a save
  replaces the symlink itself by a regular file (a rename over the path), so a symlinked
  ``matrix_path`` or ``responses_path`` stops being a symlink at the first save.
- ``refuse_string_numbers``: the one coercion rule of every option: a number or a boolean must be written
  as a JSON number or boolean; a string is never converted (``"2"`` is refused for ``min_match`` as for K),
  and a boolean is never a number (``true`` is refused for ``min_match``, not taken as 1).
  An integer is taken where a float is asked and a list where a tuple is; nothing else is converted.
"""
from __future__ import annotations

import json
import os
import types
import typing
from typing import Annotated, Any

from freespec.safe_files import clip, short


def check_path_option(path: str, field: str = "path") -> str:
    """``path`` if it may name a file freespec reads and saves; ``ValueError`` naming ``field`` otherwise."""
    if not path:
        raise ValueError(f"{field} is empty; give a file path, or leave the option out")
    if "\0" in path:
        raise ValueError(f"{field} {short(path)} holds a NUL byte")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"{field} {short(path)}: directory {short(directory)} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{field} {short(path)} is a directory; give a file path")
    return path


def check_path_options(value, field: str):
    """A path option's value (``None``, a path, or a tuple of paths for ``merge_from``), each path checked by
    ``check_path_option``; a field validator of the plugins' options (``field_validator(...)``)."""
    if value is None:
        return None
    if isinstance(value, str):
        return check_path_option(value, field)
    for path in value:
        check_path_option(path, field)
    return value


_NUMBERS = (int, float, bool)


def _takes_only_numbers(annotation) -> bool:
    """True for ``int``, ``float``, ``bool`` and their ``Optional``/``Annotated``/``Literal``-free unions."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _takes_only_numbers(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(_takes_only_numbers(a) for a in args)
    return annotation in _NUMBERS


def _leaf_types(annotation) -> set:
    """The types an annotation admits, through ``Optional``/``Union``/``Annotated`` (``None`` left out)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_leaf_types(a) for a in typing.get_args(annotation) if a is not type(None)))
    return {annotation}


def _takes_a_number_not_a_boolean(annotation) -> bool:
    """True for ``int`` and ``float`` fields (and their optional forms) that do not also take a boolean."""
    leaves = _leaf_types(annotation)
    return bool(leaves) and leaves <= {int, float}


def _boolean_as_number(annotation, value) -> bool:
    """Whether ``value`` holds a boolean where ``annotation`` wants a number (also inside a list or tuple)."""
    if isinstance(value, bool):
        return _takes_a_number_not_a_boolean(annotation)
    if isinstance(value, (list, tuple)):
        for leaf in _leaf_types(annotation):
            if typing.get_origin(leaf) in (list, tuple):
                items = [a for a in typing.get_args(leaf) if a is not Ellipsis]
                if items and any(_boolean_as_number(items[min(i, len(items) - 1)], v) for i, v in enumerate(value)):
                    return True
    return False


def _would_convert(text: str) -> bool:
    """Whether pydantic's lax mode would take ``text`` as a number or boolean."""
    if text.strip().lower() in ("true", "false", "yes", "no", "on", "off", "t", "f", "y", "n"):
        return True
    try:
        float(text.replace("_", ""))
    except ValueError:
        return False
    return True


def refuse_string_numbers(model_cls, data: Any) -> Any:
    """A ``mode="before"`` model check: a numeric or boolean field given a string, or a numeric field given a
    boolean, is refused, naming the field."""
    if isinstance(data, dict):
        for name, value in data.items():
            field = model_cls.model_fields.get(name) if isinstance(name, str) else None
            if field is not None and _boolean_as_number(field.annotation, value):
                raise ValueError(f"option {name!r} takes a JSON number, got {clip(json.dumps(value, default=str))}: "
                                 "a boolean is never taken as a number")
            if (field is not None and isinstance(value, str) and _takes_only_numbers(field.annotation)
                    and _would_convert(value)):  # other strings: pydantic refuses them, naming the field
                raise ValueError(f"option {name!r} takes a JSON number or boolean, got the string {short(value)} "
                                 "(strings are never converted)")
    return data
